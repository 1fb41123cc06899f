//! The fork plan: which `Agent` calls of a message fork, which start typed agents, and which are
//! refused and why. One decision for both paths — a client's directives and a model's reply —
//! so the two can never disagree about what forks.

use serde_json::Value;

use crate::agent::Directive;
use crate::fork::{self, ForkError, ForkRefusal, fork_refusal};
use crate::ids::BatchId;
use crate::isolation::Isolation;
use crate::message::Message;
use crate::output::OutputSchema;
use crate::tools::AGENT_TOOL;

/// What one `Agent` call asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentCall {
    /// No `subagent_type` (absent or null): a fork of the caller.
    Fork(Directive),
    /// A typed agent with its own prompt and tools.
    Typed {
        subagent_type: String,
        directive: Directive,
    },
}

impl AgentCall {
    /// Reads an `Agent` call's input. `subagent_type` absent or null forks; a string names a
    /// type; anything else is refused rather than guessed at.
    pub fn read(input: &Value) -> Result<Self, Refusal> {
        let directive = Directive::from_agent_input(input);
        // Checked for every call, fork or typed: each says for its own agent.
        isolation_of(input)?;
        timeout_of(input)?;
        let schema = output_schema_of(input)?;
        match input.get("subagent_type") {
            // Each fork call would carry its own schema, and the schema block is part of what
            // siblings share: their prefixes would differ.
            None | Some(Value::Null) if schema.is_some() => Err(Refusal::SchemaOnFork),
            None | Some(Value::Null) => Ok(AgentCall::Fork(directive)),
            Some(Value::String(ty)) => Ok(AgentCall::Typed {
                subagent_type: ty.clone(),
                directive,
            }),
            Some(_) => Err(Refusal::SubagentTypeNotText),
        }
    }
}

/// An `Agent` call's `isolation` input: absent or null is `none`; anything but `copy` or `none`
/// is refused.
pub fn isolation_of(input: &Value) -> Result<Isolation, Refusal> {
    match input.get("isolation") {
        None | Some(Value::Null) => Ok(Isolation::None),
        Some(Value::String(text)) => text
            .parse()
            .map_err(|_| Refusal::BadIsolation(text.clone())),
        Some(other) => Err(Refusal::BadIsolation(other.to_string())),
    }
}

/// An `Agent` call's `output_schema` input: absent or null is none; anything else must be a
/// JSON Schema the daemon accepts.
pub fn output_schema_of(input: &Value) -> Result<Option<OutputSchema>, Refusal> {
    match input.get("output_schema") {
        None | Some(Value::Null) => Ok(None),
        Some(schema) => OutputSchema::from_value(schema)
            .map(Some)
            .map_err(|e| Refusal::BadOutputSchema(e.to_string())),
    }
}

/// The most seconds an `Agent` call's `timeout` may give: a week.
pub const MAX_AGENT_TIMEOUT_SECS: u64 = 7 * 24 * 3600;

/// An `Agent` call's `timeout` input, in seconds: absent or null is none (the daemon's); a whole
/// number from 1 to a week is the agent's limits' `timeout`; anything else is refused.
pub fn timeout_of(input: &Value) -> Result<crate::Limits, Refusal> {
    let secs = match input.get("timeout") {
        None | Some(Value::Null) => return Ok(crate::Limits::default()),
        Some(Value::Number(n)) => n.as_u64(),
        Some(_) => None,
    };
    match secs {
        Some(secs @ 1..=MAX_AGENT_TIMEOUT_SECS) => Ok(crate::Limits {
            timeout_ms: Some(secs * 1000),
            ..crate::Limits::default()
        }),
        _ => Err(Refusal::BadTimeout(
            input
                .get("timeout")
                .map(Value::to_string)
                .unwrap_or_default(),
        )),
    }
}

/// The limits a batch is planned under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForkLimits {
    /// The most children one batch may fork; the calls beyond it are refused.
    pub max_children: usize,
    /// The most bytes of a directive's prompt and description together.
    pub max_directive_bytes: usize,
}

/// Who is forking.
#[derive(Debug, Clone, Copy)]
pub struct Forker<'a> {
    /// A coordinator never forks: it delegates with typed agents.
    pub coordinator: bool,
    /// For an agent that may be a fork child: its query source and its conversation, which the
    /// recursion guard checks. `None` for a session's own turn or a client's batch, which are
    /// never a fork child's.
    pub child: Option<(Option<&'a str>, &'a [Message])>,
    pub limits: ForkLimits,
}

/// Why a fork call is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("a coordinator session never forks: delegate with typed agents (subagent_type)")]
    Coordinator,
    /// The recursion guard: the caller is a fork child.
    #[error("a fork child cannot fork")]
    Recursion(ForkRefusal),
    #[error("a batch may fork at most {cap} children; got {got}")]
    TooMany { cap: usize, got: usize },
    #[error("{0}")]
    Directive(ForkError),
    #[error("subagent_type must be a string naming an agent type")]
    SubagentTypeNotText,
    #[error("isolation must be \"copy\" or \"none\", not {0}")]
    BadIsolation(String),
    #[error(
        "timeout must be a whole number of seconds from 1 to {MAX_AGENT_TIMEOUT_SECS}, not {0}"
    )]
    BadTimeout(String),
    #[error("output_schema is for typed agents: a fork's children share one schema block")]
    SchemaOnFork,
    #[error("{0}")]
    BadOutputSchema(String),
}

impl Refusal {
    /// Whether the caller's state refuses the fork (it is a coordinator, or a fork child), as
    /// opposed to a call that is malformed or too big.
    pub fn is_state(&self) -> bool {
        matches!(self, Refusal::Coordinator | Refusal::Recursion(_))
    }

    /// The tool_result error a model sees for a refused call: what happened and what to do.
    pub fn to_model(&self) -> String {
        match self {
            Refusal::Coordinator => {
                "A coordinator never forks: delegate with subagent_type instead.".to_owned()
            }
            Refusal::Recursion(guard) => guard.message().to_owned(),
            Refusal::TooMany { cap, .. } => {
                format!("This fork call was refused: a batch may fork at most {cap} children.")
            }
            Refusal::Directive(e) => format!("This fork call was refused: {e}; give it a prompt."),
            Refusal::SubagentTypeNotText => {
                "This Agent call was refused: subagent_type must be a string naming an agent \
                 type, or left out to fork."
                    .to_owned()
            }
            Refusal::SchemaOnFork => {
                "This fork call was refused: output_schema is for typed agents (with a \
                 subagent_type). A fork's children share everything before their directives, \
                 and each fork call's own schema would make them differ; fork without it and \
                 say in the prompt what the report should hold."
                    .to_owned()
            }
            Refusal::BadOutputSchema(e) => format!("This Agent call was refused: {e}."),
            Refusal::BadTimeout(value) => format!(
                "This Agent call was refused: timeout must be a whole number of seconds from 1 \
                 to {MAX_AGENT_TIMEOUT_SECS}, not {value}; leave it out for the daemon's."
            ),
            Refusal::BadIsolation(value) => format!(
                "This Agent call was refused: isolation must be \"copy\" (the agent works in \
                 its own copy of the workspace) or \"none\", not {value}."
            ),
        }
    }
}

/// What a message's `Agent` calls do, each named by its tool_use id, in message order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub forks: Vec<(String, Directive)>,
    /// Tool_use id, agent type, directive.
    pub typed: Vec<(String, String, Directive)>,
    pub refused: Vec<(String, Refusal)>,
}

/// The `Agent` calls to plan.
#[derive(Debug, Clone, Copy)]
pub enum Calls<'a> {
    /// A client's batch: each directive is a fork call, under the tool_use id forkd gives it.
    Directives {
        batch: BatchId,
        directives: &'a [Directive],
    },
    /// A model's reply: its `Agent` tool_use blocks (its other tool calls are not the plan's
    /// business).
    Reply(&'a Message),
}

/// Plans `Agent` calls: which fork, which start typed agents, which are refused and why.
pub fn plan(calls: Calls<'_>, forker: &Forker<'_>) -> Plan {
    let read: Vec<(String, Result<AgentCall, Refusal>)> = match calls {
        Calls::Directives { batch, directives } => directives
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let id = fork::client_tool_use_id(batch, i);
                (id, Ok(AgentCall::Fork(d.clone())))
            })
            .collect(),
        Calls::Reply(message) => message
            .tool_uses()
            .filter(|(_, name, _)| *name == AGENT_TOOL)
            .map(|(id, _, block)| {
                let input = block.tool_input().unwrap_or_default();
                (id.to_owned(), AgentCall::read(&input))
            })
            .collect(),
    };
    let mut plan = Plan::default();
    // Checked once: the caller's state refuses every fork call alike.
    let state = if forker.coordinator {
        Some(Refusal::Coordinator)
    } else {
        forker
            .child
            .and_then(|(source, messages)| fork_refusal(source, messages))
            .map(Refusal::Recursion)
    };
    for (id, call) in read {
        let refusal = match call {
            Ok(AgentCall::Typed {
                subagent_type,
                directive,
            }) => {
                plan.typed.push((id, subagent_type, directive));
                continue;
            }
            Ok(AgentCall::Fork(directive)) => {
                let index = plan.forks.len();
                let max = forker.limits.max_directive_bytes;
                match (&state, fork::check_directive(index, &directive, max)) {
                    (Some(refusal), _) => refusal.clone(),
                    (None, Err(e)) => Refusal::Directive(e),
                    (None, Ok(())) => {
                        plan.forks.push((id, directive));
                        continue;
                    }
                }
            }
            Err(refusal) => refusal,
        };
        plan.refused.push((id, refusal));
    }
    // The calls beyond the cap are refused, not dropped: each gets its own answer.
    let cap = forker.limits.max_children;
    let got = plan.forks.len();
    if got > cap {
        for (id, _) in plan.forks.split_off(cap) {
            plan.refused.push((id, Refusal::TooMany { cap, got }));
        }
    }
    plan
}

/// Plans a client's batch: its children in order (each under the id forkd gives its call). A
/// client's batch is all or nothing: the first refusal refuses it whole.
pub fn plan_client(
    batch: BatchId,
    directives: &[Directive],
    forker: &Forker<'_>,
) -> Result<Vec<(String, Directive)>, Refusal> {
    if directives.is_empty() {
        return Err(Refusal::Directive(ForkError::NoDirectives));
    }
    let plan = plan(Calls::Directives { batch, directives }, forker);
    match plan.refused.into_iter().next() {
        Some((_, refusal)) => Err(refusal),
        None => Ok(plan.forks),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;
    use crate::json::RawJson;
    use crate::message::Block;

    const LIMITS: ForkLimits = ForkLimits {
        max_children: 2,
        max_directive_bytes: 100,
    };

    fn parent() -> Forker<'static> {
        Forker {
            coordinator: false,
            child: None,
            limits: LIMITS,
        }
    }

    fn reply(calls: &[(&str, Value)]) -> Message {
        Message::assistant(
            calls
                .iter()
                .enumerate()
                .map(|(i, (name, input))| {
                    Block::tool_use(&format!("t{i}"), name, &RawJson::encode(input)).unwrap()
                })
                .collect(),
        )
    }

    fn ids<T>(pairs: &[(String, T)]) -> Vec<&str> {
        pairs.iter().map(|(id, _)| id.as_str()).collect()
    }

    /// Data-driven: each reply, and which of its calls fork, start typed agents, or are refused.
    #[test]
    fn an_agent_call_s_timeout_is_whole_seconds_up_to_a_week() {
        assert_eq!(timeout_of(&json!({})).unwrap(), crate::Limits::default());
        assert_eq!(
            timeout_of(&json!({"timeout": 90})).unwrap().timeout_ms,
            Some(90_000)
        );
        for bad in [
            json!(0),
            json!(-5),
            json!(1.5),
            json!("10m"),
            json!(700_000),
        ] {
            let refused = timeout_of(&json!({ "timeout": bad })).unwrap_err();
            assert!(matches!(refused, Refusal::BadTimeout(_)), "{bad}");
            assert!(refused.to_model().contains("whole number of seconds"));
        }
        // Checked on every call, fork or typed.
        assert!(AgentCall::read(&json!({"prompt": "p", "timeout": "soon"})).is_err());
    }

    #[test]
    fn each_call_is_forked_typed_or_refused_once() {
        let fork = |p: &str| json!({"description": "d", "prompt": p});
        // The calls, then the ids that fork, start typed agents, and are refused.
        type Case<'a> = (
            Vec<(&'a str, Value)>,
            Vec<&'a str>,
            Vec<&'a str>,
            Vec<&'a str>,
        );
        let cases: Vec<Case<'_>> = vec![
            (
                vec![("Agent", fork("a")), ("Agent", fork("b"))],
                vec!["t0", "t1"],
                vec![],
                vec![],
            ),
            (
                vec![
                    ("Agent", json!({"prompt": "x", "subagent_type": "Explore"})),
                    ("Agent", json!({"prompt": "y", "subagent_type": null})),
                    ("Read", json!({"file_path": "a"})),
                ],
                vec!["t1"],
                vec!["t0"],
                vec![],
            ),
            // A subagent_type that is not a string neither forks nor starts a type.
            (
                vec![("Agent", json!({"prompt": "x", "subagent_type": 5}))],
                vec![],
                vec![],
                vec!["t0"],
            ),
            // Past the cap, and an empty prompt.
            (
                vec![
                    ("Agent", fork("a")),
                    ("Agent", fork(" ")),
                    ("Agent", fork("b")),
                    ("Agent", fork("c")),
                ],
                vec!["t0", "t2"],
                vec![],
                vec!["t1", "t3"],
            ),
        ];
        for (calls, forks, typed, refused) in cases {
            let plan = plan(Calls::Reply(&reply(&calls)), &parent());
            assert_eq!(ids(&plan.forks), forks, "{calls:?}");
            let typed_ids: Vec<&str> = plan.typed.iter().map(|(id, _, _)| id.as_str()).collect();
            assert_eq!(typed_ids, typed, "{calls:?}");
            assert_eq!(ids(&plan.refused), refused, "{calls:?}");
            // The fork batch built from the same message agrees on what forks.
            let forked: Vec<String> = fork::fork_directives(&reply(&calls))
                .into_iter()
                .map(|(id, _)| id)
                .collect();
            let valid_or_capped: Vec<&str> = plan
                .forks
                .iter()
                .map(|(id, _)| id.as_str())
                .chain(plan.refused.iter().filter_map(|(id, r)| match r {
                    Refusal::TooMany { .. } | Refusal::Directive(_) => Some(id.as_str()),
                    _ => None,
                }))
                .collect();
            let mut expected = valid_or_capped;
            expected.sort_unstable();
            assert_eq!(forked, expected, "{calls:?}");
        }
    }

    #[test]
    fn a_coordinator_refuses_forks_but_starts_typed_agents() {
        let calls = [
            ("Agent", json!({"prompt": "a"})),
            ("Agent", json!({"prompt": "b", "subagent_type": "Plan"})),
        ];
        let forker = Forker {
            coordinator: true,
            ..parent()
        };
        let plan = plan(Calls::Reply(&reply(&calls)), &forker);
        assert!(plan.forks.is_empty());
        assert_eq!(plan.typed.len(), 1);
        assert_eq!(plan.refused, vec![("t0".to_owned(), Refusal::Coordinator)]);
        assert!(Refusal::Coordinator.is_state());
    }

    /// The child-side recursion guard: by query source, and by the boilerplate in the child's
    /// messages when the query source was lost.
    #[test]
    fn a_fork_child_is_refused_by_either_guard() {
        let batch = BatchId::new();
        let directive = Directive {
            description: "d".into(),
            prompt: "p".into(),
        };
        let boilerplate = Message::user(vec![Block::text(&fork::boilerplate_text())]);
        let calls = [("Agent", json!({"prompt": "again"}))];
        let messages = [boilerplate];
        for child in [
            (Some(crate::agent::FORK_QUERY_SOURCE), &[][..]),
            (None, &messages[..]),
        ] {
            let forker = Forker {
                child: Some(child),
                ..parent()
            };
            let plan = plan(Calls::Reply(&reply(&calls)), &forker);
            assert!(plan.forks.is_empty());
            assert!(matches!(plan.refused[0].1, Refusal::Recursion(_)));
        }
        // An agent that is no fork child forks.
        let forker = Forker {
            child: Some((None, &[])),
            ..parent()
        };
        assert_eq!(plan(Calls::Reply(&reply(&calls)), &forker).forks.len(), 1);
        // A client's batch goes through the same plan, whole or not at all.
        let forks = plan_client(batch, std::slice::from_ref(&directive), &parent()).unwrap();
        assert_eq!(forks.len(), 1);
        assert_eq!(forks[0].1, directive);
        let too_many = vec![directive; 3];
        assert_eq!(
            plan_client(batch, &too_many, &parent()).err(),
            Some(Refusal::TooMany { cap: 2, got: 3 })
        );
        assert_eq!(
            plan_client(batch, &[], &parent()).err(),
            Some(Refusal::Directive(ForkError::NoDirectives))
        );
    }
}
