//! Hooks around a tool call (docs/contracts.md, "Hooks"): the session's tenant's PreToolUse
//! hooks before the call is decided — they may deny it, ask a person, allow it past the
//! permission rules, or change its input (what runs and what is recorded, never the stored
//! assistant message) — and its PostToolUse hooks once it ran, whose feedback joins its result.
//! Hooks of one event run in parallel, each in the session's sandbox view as its Bash commands
//! run, with Claude Code's JSON on stdin.

use std::sync::Arc;

use forkd_core::hooks::runs::{HookDecision, HookRunRecord, said, said_to_session};
use forkd_core::hooks::{
    HookCommand, HookEvent, HookOutput, HookSet, Permission, PreToolVerdict, pre_tool_verdict,
};
use forkd_tools::ToolContext;
use forkd_tools::hook::HookCall;
use serde_json::{Value, json};

use super::Runs;
use super::tools::ToolTurn;

impl Runs {
    /// The hooks that run for `turn`'s session: the operator's for every tenant, its tenant's,
    /// then its own.
    pub(super) fn hooks_of(&self, turn: &ToolTurn<'_>) -> crate::error::Result<Arc<HookSet>> {
        self.sessions.hooks().for_session(turn.session)
    }

    /// What the call's PreToolUse hooks decide; `updated_input` is refused for an `Agent` call,
    /// whose input starts an agent the call's id names.
    pub(super) async fn pre_tool_hooks(
        &self,
        hooks: &HookSet,
        turn: &ToolTurn<'_>,
        call: CallRef<'_>,
        ctx: &ToolContext,
    ) -> PreToolVerdict {
        let name = call.name;
        let commands = hooks.commands(HookEvent::PreToolUse, Some(name));
        if commands.is_empty() {
            return PreToolVerdict {
                permission: None,
                reason: None,
                updated_input: None,
                stop: None,
                context: None,
            };
        }
        let payload = event(turn, HookEvent::PreToolUse, &call, None);
        let about = About::call(turn, &call);
        let outputs = self
            .run_all(&commands, HookEvent::PreToolUse, &payload, about, ctx)
            .await;
        let mut verdict = pre_tool_verdict(&outputs);
        if verdict.updated_input.is_some() && name == forkd_core::tools::AGENT_TOOL {
            verdict = PreToolVerdict {
                permission: Some(Permission::Deny),
                reason: Some("a hook may not change an Agent call's input".into()),
                updated_input: None,
                stop: verdict.stop,
                context: None,
            };
        }
        verdict.context = feedback(&outputs, false);
        if verdict.permission == Some(Permission::Deny)
            && let Some(context) = verdict.context.take()
        {
            // A denied call's result is its refusal: the context goes with the reason.
            verdict.reason = Some(match verdict.reason {
                Some(reason) => format!("{reason}\n{context}"),
                None => context,
            });
        }
        verdict
    }

    /// What the call's PostToolUse hooks say once it ran: feedback for the model (a block's
    /// reason, exit 2's stderr, additional context) to follow its result, and whether one
    /// stops the agent.
    pub(super) async fn post_tool_hooks(
        &self,
        hooks: &HookSet,
        turn: &ToolTurn<'_>,
        call: CallRef<'_>,
        response: &str,
        ctx: &ToolContext,
    ) -> AfterCall {
        let commands = hooks.commands(HookEvent::PostToolUse, Some(call.name));
        if commands.is_empty() {
            return AfterCall::default();
        }
        let payload = event(turn, HookEvent::PostToolUse, &call, Some(response));
        let about = About::call(turn, &call);
        let outputs = self
            .run_all(&commands, HookEvent::PostToolUse, &payload, about, ctx)
            .await;
        AfterCall {
            feedback: feedback(&outputs, true),
            stop: forkd_core::hooks::stopped(&outputs),
        }
    }
}

impl Runs {
    /// The Notification hooks of `turn`'s session, as a permission prompt waits: what they say
    /// is logged, never the model's.
    pub(super) async fn notification_hooks(self: &Arc<Self>, turn: &ToolTurn<'_>, message: &str) {
        let fields =
            json!({ "message": message, "permission_mode": turn.permission_mode.as_str() });
        let ran = self
            .event_hooks(
                turn.agent,
                turn.session,
                HookEvent::Notification,
                fields,
                &turn.cancel,
            )
            .await;
        if let Err(e) = ran {
            tracing::warn!(error = %e, "Notification hooks did not run");
        }
    }

    /// A parent's `Agent` call's PreToolUse hooks, before the call forks or starts an agent
    /// (`run/tools.rs`'s `call` asks them for everyone else's calls): the refusal its result
    /// reads when they deny it (or a person, asked, does), and why they stop the turn if one
    /// does. A hook may not change its input: every child's request copies the call.
    pub(crate) async fn agent_call_hooks(
        self: &Arc<Self>,
        turn: &ToolTurn<'_>,
        id: &str,
        input: &Value,
    ) -> crate::error::Result<(Option<String>, Option<String>)> {
        let name = forkd_core::tools::AGENT_TOOL;
        let hooks = self.hooks_of(turn)?;
        if hooks.commands(HookEvent::PreToolUse, Some(name)).is_empty() {
            return Ok((None, None));
        }
        let ctx = self
            .tool_context(turn.agent, turn.session, &turn.cancel, true)
            .await?;
        let call = CallRef { id, name, input };
        let verdict = self.pre_tool_hooks(&hooks, turn, call, &ctx).await;
        let refused = self
            .hook_gate(turn, name, input, &verdict)
            .await
            .and_then(Result::err);
        Ok((refused, verdict.stop))
    }

    /// What a call's PreToolUse verdict decides before the permission rules: its denial, or a
    /// person's answer to its question; `None` when the hooks allowed it or said nothing.
    pub(super) async fn hook_gate(
        self: &Arc<Self>,
        turn: &ToolTurn<'_>,
        name: &str,
        input: &Value,
        verdict: &PreToolVerdict,
    ) -> Option<Result<(), String>> {
        match verdict.permission {
            Some(Permission::Deny) => Some(Err(format!(
                "Permission denied: a hook denied it: {}",
                verdict.reason.as_deref().unwrap_or("no reason given")
            ))),
            Some(Permission::Ask) => {
                let why = verdict.reason.as_deref().unwrap_or("a hook asks");
                Some(
                    self.ask_person(turn, name, input, format!("{name}: {why}"))
                        .await,
                )
            }
            Some(Permission::Allow) | None => None,
        }
    }
}

impl crate::session::SessionStart for Arc<Runs> {
    /// A new session's SessionStart hooks (`source: "startup"`), before it is stored: what
    /// they add for the model. They cannot block; the session has no agent yet.
    fn context<'a>(
        &'a self,
        session: &'a forkd_core::session::Session,
    ) -> futures::future::BoxFuture<'a, crate::error::Result<Option<String>>> {
        Box::pin(async move {
            let hooks = self.sessions.hooks().for_session(session)?;
            if hooks
                .commands(HookEvent::SessionStart, Some("startup"))
                .is_empty()
            {
                return Ok(None);
            }
            // Its sandbox view is made for an agent: one that is never stored.
            let agent = forkd_core::Agent::new(
                forkd_core::AgentId::new(),
                session.id,
                forkd_core::AgentKind::Parent,
                forkd_core::AgentState::Idle,
                session.created_at_ms,
            );
            let fields = json!({ "source": "startup", "agent_id": Value::Null });
            let cancel = tokio_util::sync::CancellationToken::new();
            let said = self
                .event_hooks(&agent, session, HookEvent::SessionStart, fields, &cancel)
                .await?;
            Ok(said.context)
        })
    }
}

impl Runs {
    /// The PreCompact hooks of `agent`'s session, before its transcript compacts (`trigger`:
    /// `manual` or `auto`): what they say is logged; they cannot stop a compaction.
    pub(crate) async fn pre_compact_hooks(
        self: &Arc<Self>,
        agent: &forkd_core::Agent,
        session: &forkd_core::session::Session,
        trigger: &str,
        instructions: Option<&str>,
        cancel: &tokio_util::sync::CancellationToken,
    ) {
        let fields = json!({
            "trigger": trigger,
            "custom_instructions": instructions.unwrap_or(""),
        });
        let ran = self
            .event_hooks(agent, session, HookEvent::PreCompact, fields, cancel)
            .await;
        if let Err(e) = ran {
            tracing::warn!(error = %e, "PreCompact hooks did not run");
        }
    }
}

/// What a call's PostToolUse hooks say.
#[derive(Debug, Default)]
pub(super) struct AfterCall {
    /// For the model, after the call's result.
    pub feedback: Option<String>,
    /// `continue: false`: the agent stops once the call's result is stored.
    pub stop: Option<String>,
}

/// The tag of the message a blocking SubagentStop hook adds: what the agent goes on with, and
/// how a later run (a restart) knows that a stop hook is active.
const STOP_HOOK_TAG: &str = "forkd-stop-hook";

/// Whether `message` is the note a blocking stop hook added.
pub(crate) fn is_stop_hook_note(message: &forkd_core::Message) -> bool {
    message.role == forkd_core::Role::User
        && message.text().starts_with(&format!("<{STOP_HOOK_TAG}>"))
}

/// The note the agent goes on with when its stop hooks block: their reasons.
pub(crate) fn stop_hook_note(reasons: &str) -> forkd_core::Message {
    forkd_core::Message::user(vec![forkd_core::Block::text(&format!(
        "<{STOP_HOOK_TAG}>\nA hook kept you from ending here:\n{reasons}\n</{STOP_HOOK_TAG}>"
    ))])
}

impl Runs {
    /// Runs `event`'s hooks for `agent` outside a tool call (a stop, a prompt, a compaction, a
    /// notification), in its session's sandbox view; `fields` join Claude Code's common input.
    /// Nothing runs, and nothing is built, when the event has no hooks.
    pub(crate) async fn event_hooks(
        self: &Arc<Self>,
        agent: &forkd_core::Agent,
        session: &forkd_core::session::Session,
        event: HookEvent,
        fields: Value,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> crate::error::Result<EventHooks> {
        let hooks = self.sessions.hooks().for_session(session)?;
        // What a matcher is read against, for the events that have one besides tools'.
        let subject = match event {
            HookEvent::PreCompact => fields.get("trigger").and_then(Value::as_str),
            HookEvent::SessionStart => fields.get("source").and_then(Value::as_str),
            _ => None,
        };
        let commands = hooks.commands(event, subject);
        if commands.is_empty() {
            return Ok(EventHooks::default());
        }
        let ctx = self.tool_context(agent, session, cancel, true).await?;
        let mut payload = json!({
            "session_id": session.id.to_string(),
            "transcript_path": Value::Null,
            "cwd": session.workspace.display().to_string(),
            "hook_event_name": event.as_str(),
            "permission_mode": session.permission_mode.as_str(),
            "agent_id": agent.id.to_string(),
            "batch_id": agent.batch_id.map(|b| b.to_string()),
        });
        if let (Some(map), Value::Object(fields)) = (payload.as_object_mut(), fields) {
            map.extend(fields);
        }
        let about = About {
            agent: agent.id,
            kind: agent.kind,
            session: session.id,
            workspace: session.workspace.display().to_string(),
            tool: None,
            // A new session's SessionStart runs for an agent that is not stored.
            keep: event != HookEvent::SessionStart,
        };
        let outputs = self.run_all(&commands, event, &payload, about, &ctx).await;
        Ok(EventHooks {
            blocked: forkd_core::hooks::blocked(&outputs),
            stopped: forkd_core::hooks::stopped(&outputs),
            context: forkd_core::hooks::context(&outputs),
        })
    }

    /// A child's or typed agent's SubagentStop hooks, as it ends its last turn: the reasons to
    /// go on when one blocks (exit 2, `decision: "block"`), `None` when it may end (`continue:
    /// false` ends it whatever blocks). `active`: it goes on already because of one.
    pub(super) async fn subagent_stop_hooks(
        self: &Arc<Self>,
        agent: &forkd_core::Agent,
        session: &forkd_core::session::Session,
        permission_mode: forkd_core::session::PermissionMode,
        active: bool,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> crate::error::Result<Option<String>> {
        let fields = json!({
            "permission_mode": permission_mode.as_str(),
            "stop_hook_active": active,
        });
        let said = self
            .event_hooks(agent, session, HookEvent::SubagentStop, fields, cancel)
            .await?;
        Ok(said.blocked.filter(|_| said.stopped.is_none()))
    }
}

/// What one event's hooks said together.
#[derive(Debug, Default)]
pub(crate) struct EventHooks {
    /// Why they block what the event is about (a prompt, a stop).
    pub blocked: Option<String>,
    /// Why they stop the agent (`continue: false`).
    pub stopped: Option<String>,
    /// What they add for the model.
    pub context: Option<String>,
}

/// The tool call hooks are about.
pub(super) struct CallRef<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub input: &'a Value,
}

/// Whom one event's hooks run for: where, and how their runs are kept.
struct About {
    agent: forkd_core::AgentId,
    kind: forkd_core::AgentKind,
    session: forkd_core::SessionId,
    workspace: String,
    /// The tool call they are about: its id and name.
    tool: Option<(String, String)>,
    /// Their runs are kept (for `forkctl logs` and the web view).
    keep: bool,
}

impl About {
    fn call(turn: &ToolTurn<'_>, call: &CallRef<'_>) -> Self {
        About {
            agent: turn.agent.id,
            kind: turn.agent.kind,
            session: turn.session.id,
            workspace: turn.session.workspace.display().to_string(),
            tool: Some((call.id.to_owned(), call.name.to_owned())),
            keep: true,
        }
    }
}

/// Claude Code's hook input, with forkd's ids beside it.
fn event(
    turn: &ToolTurn<'_>,
    event: HookEvent,
    call: &CallRef<'_>,
    response: Option<&str>,
) -> Value {
    let CallRef { id, name, input } = call;
    let mut payload = json!({
        "session_id": turn.session.id.to_string(),
        "transcript_path": Value::Null,
        // The workspace as the session names it (and its sandbox view shows it).
        "cwd": turn.session.workspace.display().to_string(),
        "hook_event_name": event.as_str(),
        "permission_mode": turn.permission_mode.as_str(),
        "tool_name": name,
        "tool_input": input,
        "tool_use_id": id,
        "agent_id": turn.agent.id.to_string(),
        "batch_id": turn.agent.batch_id.map(|b| b.to_string()),
    });
    if let (Some(response), Some(map)) = (response, payload.as_object_mut()) {
        map.insert("tool_response".into(), json!(response));
    }
    payload
}

impl Runs {
    /// Runs every command of one event at once; their outputs in the commands' order. Each
    /// run is logged and, when `about` says so, kept with its decision and what it said.
    async fn run_all<'h>(
        &self,
        commands: &[&'h HookCommand],
        event: HookEvent,
        payload: &Value,
        about: About,
        ctx: &ToolContext,
    ) -> Vec<(&'h HookCommand, HookOutput)> {
        let workspace = about.workspace.clone();
        let mut payload = payload.clone();
        if about.keep {
            // The agent's transcript as Claude Code writes it, brought up to date in the view.
            let owner = super::transcript_file::Owner {
                agent: about.agent,
                kind: about.kind,
                session: about.session,
                workspace: &about.workspace,
            };
            match self.transcript_file(&owner, ctx).await {
                Ok(path) => {
                    if let Some(map) = payload.as_object_mut() {
                        map.insert("transcript_path".into(), json!(path.display().to_string()));
                    }
                }
                Err(e) => tracing::warn!(error = %e, "No transcript file for the hooks"),
            }
        }
        let input = payload.to_string().into_bytes();
        // An unsandboxed hook (the operator's) would open the path as the daemon, following any
        // link a session's command left in its TMPDIR: it gets none.
        let unsandboxed_input = match payload.as_object() {
            Some(map) if map.contains_key("transcript_path") => {
                let mut map = map.clone();
                map.insert("transcript_path".into(), Value::Null);
                Value::Object(map).to_string().into_bytes()
            }
            _ => input.clone(),
        };
        let about = &about;
        let runs = commands.iter().map(|hook| {
            let call = HookCall {
                command: hook.command.clone(),
                input: if hook.sandboxed {
                    input.clone()
                } else {
                    unsandboxed_input.clone()
                },
                env: vec![
                    ("CLAUDE_PROJECT_DIR".into(), workspace.clone()),
                    ("FORKD_WORKSPACE".into(), workspace.clone()),
                ],
                timeout: hook.timeout,
                sandboxed: hook.sandboxed,
            };
            async move {
                let started = crate::clock::now_ms();
                let run = forkd_tools::hook::run(call, ctx).await;
                let output = HookOutput::of_command(hook, event, &run);
                tracing::info!(
                    hook.event = event.as_str(),
                    // Its program only: a session's own command may hold a secret.
                    hook.program = program(&hook.command),
                    hook.exit = ?run.exit,
                    hook.blocked = output.block.is_some(),
                    hook.error = output.error.as_deref().unwrap_or(""),
                    hook.message = output.system_message.as_deref().unwrap_or(""),
                    "Hook ran"
                );
                let record = HookRunRecord {
                    agent_id: about.agent,
                    event,
                    tool_use_id: about.tool.as_ref().map(|(id, _)| id.clone()),
                    tool_name: about.tool.as_ref().map(|(_, name)| name.clone()),
                    // The operator's hooks are the operator's: the session sees their decision
                    // and what its model was told, not their command nor their errors.
                    program: if hook.operator {
                        "(operator)".to_owned()
                    } else {
                        program(&hook.command).to_owned()
                    },
                    exit_code: run.exit,
                    decision: HookDecision::of(&output),
                    output: if hook.operator {
                        said_to_session(&output)
                    } else {
                        said(&output)
                    },
                    started_at_ms: started,
                    finished_at_ms: crate::clock::now_ms(),
                };
                ((*hook, output), record)
            }
        });
        let (outputs, records): (Vec<_>, Vec<_>) =
            futures::future::join_all(runs).await.into_iter().unzip();
        if about.keep
            && let Err(e) = self.store.record_hook_runs(&records).await
        {
            tracing::warn!(error = %e, "Cannot keep the hooks' runs");
        }
        outputs
    }
}

/// What the model reads of hooks' outputs: a block's reason (when `blocks` count, as after a
/// call that ran) and any additional context, one line per hook that said something.
fn feedback(outputs: &[(&HookCommand, HookOutput)], blocks: bool) -> Option<String> {
    let lines: Vec<String> = outputs
        .iter()
        .flat_map(|(hook, out)| {
            let block = out
                .block
                .as_ref()
                .filter(|_| blocks)
                .map(|b| format!("PostToolUse hook ({}) says: {b}", hook.label()));
            let context = out.additional_context.clone();
            block.into_iter().chain(context)
        })
        .filter(|l| !l.trim().is_empty())
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// A hook command's program (its first word after any `NAME=value` settings, clipped), for the
/// log: never a setting's value, which may be a secret.
fn program(command: &str) -> &str {
    let word = command
        .split_whitespace()
        .find(|w| !w.contains('='))
        .unwrap_or("");
    match word.char_indices().nth(64) {
        Some((end, _)) => &word[..end],
        None => word,
    }
}
