//! The fork (docs/contracts.md, “The fork request”): the batch's assistant message, the shared
//! user blocks, each child's directive block, and the recursion guard.
//!
//! Two shapes. A model's reply that forks keeps the seed's: `[...history, A, U]` where
//! `U = [placeholder tool_result per tool_use in A] + [boilerplate] + [directive]`. A client's batch
//! invents no message: `[...history, U]` with `U = [boilerplate] + [directive]`, appended to the
//! history's last message when that is a user message — so a child's request does not grow with
//! its siblings, and a session with extended thinking gets no assistant message without a
//! thinking block. Everything but the directive block is built once per batch and shared by
//! reference, so siblings cannot differ anywhere else.

use crate::agent::{Directive, FORK_QUERY_SOURCE};
use crate::ids::{AgentId, BatchId, SessionId};
use crate::json::RawJson;
use crate::message::{Block, BlockKind, Message, Role};
use crate::output::OutputSchema;
use crate::plan::AgentCall;
use crate::request::{BlockPos, Conversation, positions_between};
use crate::tools::AGENT_TOOL;

/// The tool_result every child sees for every tool_use of the fork message: constant, so the
/// placeholders are byte-identical across siblings.
pub const FORK_PLACEHOLDER_RESULT: &str = "Fork started -- processing in background";

/// The tag around forkd's fork boilerplate; also the fallback recursion check's marker.
pub const BOILERPLATE_TAG: &str = "forkd-fork-child";

/// The boilerplate every child of a model's fork reads before its directive. Same for every
/// sibling; it has a text block of its own so it belongs to the cached shared prefix.
pub fn boilerplate_text() -> String {
    boilerplate(Some(&format!(
        "The tool results just above that read \"{FORK_PLACEHOLDER_RESULT}\" stand for every tool \
         call of the message above, yours included: they are not real results; ignore them."
    )))
}

/// The boilerplate of a client's batch, whose children see no fork message and no placeholders.
pub fn client_boilerplate_text() -> String {
    boilerplate(None)
}

fn boilerplate(placeholders: Option<&str>) -> String {
    let mut rules = vec![
        "Do not fork: an Agent call without subagent_type is refused for you. You may start a \
         typed agent (Agent with a subagent_type) when your directive needs one; otherwise do \
         the work yourself."
            .to_owned(),
        "Work silently: call tools without commentary between them, and report once, at the end."
            .to_owned(),
        "Stay inside your directive. Do not widen its scope, and do not redo your siblings' \
         directives."
            .to_owned(),
    ];
    rules.extend(placeholders.map(str::to_owned));
    rules.push(
        "End with this report and nothing after it:\n\
         Scope: <what you were asked to do, one line>\n\
         Result: <what you found or did>\n\
         Key files: <comma-separated paths that matter, or none>\n\
         Files changed: <comma-separated paths you wrote or edited, or none>\n\
         Issues: <problems, risks or open questions, or none>"
            .to_owned(),
    );
    let numbered: Vec<String> = rules
        .iter()
        .enumerate()
        .map(|(i, rule)| format!("{}. {rule}", i + 1))
        .collect();
    format!(
        "<{BOILERPLATE_TAG}>\n\
         You are a fork child: a copy of the agent above, started to carry out one directive, which \
         follows this block. The instructions above about forking were written for your parent; \
         they do not apply to you.\n{}\n</{BOILERPLATE_TAG}>",
        numbered.join("\n")
    )
}

/// How many positions a provider's cache lookup checks back from a breakpoint, itself included.
pub const LOOKBACK_POSITIONS: usize = 20;

/// The last block of the first `len` messages.
fn last_block(messages: &[Message], len: usize) -> Option<BlockPos> {
    let m = messages[..len].iter().rposition(|m| !m.blocks.is_empty())?;
    Some(BlockPos {
        message: m,
        block: messages[m].blocks.len() - 1,
    })
}

/// The history's end as an earlier fork batch saw it: the last block before the most recent
/// assistant message that forked. That batch's children wrote a cache entry there; after many
/// `<task-notification>` blocks it can lie beyond the lookback of this batch's history end.
fn prior_fork_anchor(history: &[Message]) -> Option<BlockPos> {
    let fork = history
        .iter()
        .rposition(|m| m.role == Role::Assistant && !fork_directives(m).is_empty())?;
    last_block(history, fork)
}

/// A fork batch that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForkError {
    #[error("a fork batch needs at least one directive")]
    NoDirectives,
    #[error("directive {index} is empty")]
    EmptyDirective { index: usize },
    #[error("directive {index} is {len} bytes; the limit is {max}")]
    DirectiveTooLarge {
        index: usize,
        len: usize,
        max: usize,
    },
    #[error("the fork message must be an assistant message")]
    NotAssistant,
    #[error("the fork message holds no Agent tool_use without subagent_type")]
    NoForkToolUse,
}

/// Where a batch came from, which decides what its children's requests look like.
#[derive(Debug, Clone, PartialEq)]
pub enum ForkShape {
    /// A model's reply forked (the seed's shape): `A`, the reply, cloned whole, then one user
    /// message with a placeholder result for each of `A`'s tool calls, the boilerplate and the
    /// child's directive.
    Model {
        /// `A`: the parent's assistant message, cloned whole.
        assistant: Message,
    },
    /// A client's directives: nothing is invented; the boilerplate and the child's directive
    /// follow the parent's history (in its last message when that is a user message).
    Client,
}

/// One fork batch: what its children share besides the parent's history.
#[derive(Debug, Clone, PartialEq)]
pub struct ForkBatch {
    pub id: BatchId,
    pub session_id: SessionId,
    /// How many of the parent's messages the children inherit: the shared history.
    pub fork_point: u64,
    /// The compaction boundary of the parent's transcript the fork point was taken after: the
    /// children's history is that compaction's summary and the messages from `compacted_to` up
    /// to the fork point — what the parent's own requests saw. `None`: the transcript from its
    /// start (no compaction before the fork point, or a batch stored before compaction existed).
    pub compacted_to: Option<u64>,
    pub shape: ForkShape,
    /// The blocks before each child's directive in its first user message: the placeholder
    /// tool_results for every tool_use in `A` (model forks), then the boilerplate block.
    pub shared_user_blocks: Vec<Block>,
    /// The JSON Schema the children's final replies must match; its block is the last of
    /// `shared_user_blocks`.
    pub output_schema: Option<OutputSchema>,
    /// The W3C trace context (`traceparent`) of the span that forked the batch: its children's
    /// spans, resumed after a restart or on another daemon, stay in that trace.
    pub trace_parent: Option<String>,
    pub created_at_ms: i64,
}

/// Checks client-submitted directives against the size limit.
pub fn validate_directives(directives: &[Directive], max_bytes: usize) -> Result<(), ForkError> {
    if directives.is_empty() {
        return Err(ForkError::NoDirectives);
    }
    directives
        .iter()
        .enumerate()
        .try_for_each(|(index, d)| check_directive(index, d, max_bytes))
}

/// Checks the `index`-th directive of a batch: a prompt that says something, within the limit.
pub(crate) fn check_directive(
    index: usize,
    d: &Directive,
    max_bytes: usize,
) -> Result<(), ForkError> {
    if d.prompt.trim().is_empty() {
        return Err(ForkError::EmptyDirective { index });
    }
    let len = d.prompt.len() + d.description.len();
    if len > max_bytes {
        return Err(ForkError::DirectiveTooLarge {
            index,
            len,
            max: max_bytes,
        });
    }
    Ok(())
}

/// The tool_use id forkd gives the `index`-th Agent call of a client-submitted batch.
pub fn client_tool_use_id(batch: BatchId, index: usize) -> String {
    format!("toolu_{}_{index:03}", batch.as_uuid().simple())
}

/// The assistant message a client-submitted batch appends to the parent: one `Agent` tool_use per
/// directive, exactly as if the parent model had written it.
pub fn client_fork_message(batch: BatchId, directives: &[Directive]) -> Message {
    let blocks = directives
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let input = RawJson::encode(&serde_json::json!({
                "description": d.description,
                "prompt": d.prompt,
            }));
            // The input is an object we just built, so this cannot fail; a text block keeps the
            // message well-formed if it ever did.
            Block::tool_use(&client_tool_use_id(batch, i), AGENT_TOOL, &input)
                .unwrap_or_else(|_| Block::text(&d.prompt))
        })
        .collect();
    Message::assistant(blocks)
}

/// The children an assistant message forks: its `Agent` tool_uses without `subagent_type`.
pub fn fork_directives(assistant: &Message) -> Vec<(String, Directive)> {
    assistant
        .tool_uses()
        .filter(|(_, name, _)| *name == AGENT_TOOL)
        .filter_map(
            |(id, _, block)| match AgentCall::read(&block.tool_input()?) {
                Ok(AgentCall::Fork(directive)) => Some((id.to_owned(), directive)),
                _ => None,
            },
        )
        .collect()
}

impl ForkBatch {
    /// Builds a batch from the parent's assistant message `A`, which is cloned whole.
    pub fn new(
        id: BatchId,
        session_id: SessionId,
        fork_point: u64,
        assistant: Message,
        created_at_ms: i64,
    ) -> Result<Self, ForkError> {
        if assistant.role != Role::Assistant {
            return Err(ForkError::NotAssistant);
        }
        if fork_directives(&assistant).is_empty() {
            return Err(ForkError::NoForkToolUse);
        }
        let mut shared_user_blocks: Vec<Block> = assistant
            .tool_uses()
            .map(|(tool_use_id, _, _)| {
                Block::tool_result(tool_use_id, FORK_PLACEHOLDER_RESULT, false)
            })
            .collect();
        shared_user_blocks.push(Block::text(&boilerplate_text()));
        Ok(Self {
            id,
            session_id,
            fork_point,
            compacted_to: None,
            shape: ForkShape::Model { assistant },
            shared_user_blocks,
            output_schema: None,
            trace_parent: None,
            created_at_ms,
        })
    }

    /// A client's batch: its children inherit the parent's first `fork_point` messages and then
    /// read the boilerplate and their own directive.
    pub fn client(id: BatchId, session_id: SessionId, fork_point: u64, created_at_ms: i64) -> Self {
        Self {
            id,
            session_id,
            fork_point,
            compacted_to: None,
            shape: ForkShape::Client,
            shared_user_blocks: vec![Block::text(&client_boilerplate_text())],
            output_schema: None,
            trace_parent: None,
            created_at_ms,
        }
    }

    /// The batch with an output schema: its block follows the boilerplate, so the bytes before
    /// it are the same with or without one, and the shared breakpoint moves onto it.
    pub fn with_output_schema(mut self, schema: Option<OutputSchema>) -> Self {
        if let Some(schema) = schema {
            self.shared_user_blocks.push(schema.block());
            self.output_schema = Some(schema);
        }
        self
    }

    /// `A`, for a model's fork.
    pub fn assistant(&self) -> Option<&Message> {
        match &self.shape {
            ForkShape::Model { assistant } => Some(assistant),
            ForkShape::Client => None,
        }
    }

    /// Where a child's directive block sits in its conversation on `history`: request
    /// fingerprints cover everything before it.
    pub fn directive_pos(&self, history: &[Message]) -> BlockPos {
        let shared = self.shared_user_blocks.len();
        match (&self.shape, history.last()) {
            (ForkShape::Model { .. }, _) => BlockPos {
                message: history.len() + 1,
                block: shared,
            },
            (ForkShape::Client, Some(last)) if last.role == Role::User => BlockPos {
                message: history.len() - 1,
                block: last.blocks.len() + shared,
            },
            (ForkShape::Client, _) => BlockPos {
                message: history.len(),
                block: shared,
            },
        }
    }

    /// The child's own directive block: the only bytes that differ between siblings.
    pub fn directive_block(directive: &Directive) -> Block {
        Block::text(&directive.prompt)
    }

    /// A child's whole conversation: the parent's history up to the fork point, `A` (model forks),
    /// `U`, then the child's own later messages. Anchors mark the shared breakpoints (the
    /// boilerplate block and the history's end).
    pub fn child_conversation(
        &self,
        history: &[Message],
        directive_block: &Block,
        own: &[Message],
    ) -> Conversation {
        let mut messages = Vec::with_capacity(history.len() + 2 + own.len());
        messages.extend_from_slice(history);
        if let ForkShape::Model { assistant } = &self.shape {
            messages.push(assistant.clone());
        }
        let mut user_blocks = self.shared_user_blocks.clone();
        user_blocks.push(directive_block.clone());
        let boilerplate = self.directive_pos(history);
        match messages.last_mut() {
            // A client's batch on a history that ends with a user message: roles keep
            // alternating, and the history's own blocks keep their bytes and positions.
            Some(last) if self.shape == ForkShape::Client && last.role == Role::User => {
                last.blocks.extend(user_blocks);
            }
            _ => messages.push(Message::user(user_blocks)),
        }
        messages.extend_from_slice(own);

        // In priority order: the boilerplate (the siblings' shared entry), the history's end (the
        // parent's own entry), and an earlier batch's history end when the lookback cannot reach it.
        let mut anchors = vec![BlockPos {
            message: boilerplate.message,
            block: boilerplate.block - 1,
        }];
        if let Some(end) = last_block(history, history.len()) {
            anchors.push(end);
            if let Some(prior) = prior_fork_anchor(history)
                && positions_between(history, prior, end) >= LOOKBACK_POSITIONS
            {
                anchors.push(prior);
            }
        }
        Conversation { messages, anchors }
    }

    /// The results the parent's own transcript gets for `A`'s tool_uses: `async_launched` for each
    /// child, and the placeholder for anything else `A` called. Empty for a client's batch.
    pub fn parent_results(&self, children: &[(String, AgentId)]) -> Message {
        self.parent_results_with(children, &[])
    }

    /// Like [`ForkBatch::parent_results`], with the real results of `A`'s other tool calls (a
    /// parent model may call other tools in the message that forks).
    pub fn parent_results_with(
        &self,
        children: &[(String, AgentId)],
        others: &[(String, Block)],
    ) -> Message {
        let Some(assistant) = self.assistant() else {
            return Message::user(Vec::new());
        };
        let blocks = assistant
            .tool_uses()
            .map(|(tool_use_id, _, _)| {
                if let Some((_, agent)) = children.iter().find(|(id, _)| id == tool_use_id) {
                    return Block::tool_result(
                        tool_use_id,
                        &format!(
                            "async_launched: fork child {agent} is working in the background; \
                             its <task-notification> will arrive when it ends."
                        ),
                        false,
                    );
                }
                match others.iter().find(|(id, _)| id == tool_use_id) {
                    Some((_, result)) => result.clone(),
                    None => Block::tool_result(tool_use_id, FORK_PLACEHOLDER_RESULT, false),
                }
            })
            .collect();
        Message::user(blocks)
    }
}

/// Why an agent may not fork.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForkRefusal {
    /// The agent's query source says it is a fork child.
    QuerySource,
    /// Its messages hold the fork boilerplate (the check that survives a lost query source).
    BoilerplateInMessages,
}

impl ForkRefusal {
    /// The tool_result error text the refused child sees.
    pub fn message(self) -> &'static str {
        "Refused: you are a fork child and cannot fork. Do this part of the work yourself, then \
         finish with your report."
    }
}

/// The recursion guard: two independent checks, either of which refuses a fork.
pub fn fork_refusal(query_source: Option<&str>, messages: &[Message]) -> Option<ForkRefusal> {
    if query_source == Some(FORK_QUERY_SOURCE) {
        return Some(ForkRefusal::QuerySource);
    }
    let open = format!("<{BOILERPLATE_TAG}>");
    let tagged = messages
        .iter()
        .filter(|m| m.role == Role::User)
        .flat_map(|m| m.blocks.iter())
        .filter(|b| matches!(b.kind(), BlockKind::Text))
        .filter_map(Block::as_text)
        .any(|t| t.trim_start().starts_with(&open));
    tagged.then_some(ForkRefusal::BoilerplateInMessages)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn directives(n: usize) -> Vec<Directive> {
        (0..n)
            .map(|i| Directive {
                description: format!("part {i}"),
                prompt: format!("do part {i}"),
            })
            .collect()
    }

    fn batch(n: usize) -> ForkBatch {
        let id = BatchId::new();
        let a = client_fork_message(id, &directives(n));
        match ForkBatch::new(id, SessionId::new(), 1, a, 0) {
            Ok(b) => b,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn validation_names_the_bad_directive() {
        assert_eq!(validate_directives(&[], 10), Err(ForkError::NoDirectives));
        let mut d = directives(2);
        d[1].prompt = " ".into();
        assert_eq!(
            validate_directives(&d, 100),
            Err(ForkError::EmptyDirective { index: 1 })
        );
        d[1].prompt = "x".repeat(200);
        assert!(matches!(
            validate_directives(&d, 100),
            Err(ForkError::DirectiveTooLarge { index: 1, .. })
        ));
    }

    #[test]
    fn a_placeholder_per_tool_use_then_the_boilerplate() {
        let b = batch(3);
        assert_eq!(b.shared_user_blocks.len(), 4);
        assert_eq!(fork_directives(b.assistant().unwrap()).len(), 3);
        let last = b.shared_user_blocks.last().and_then(Block::as_text);
        assert!(last.is_some_and(|t| t.starts_with("<forkd-fork-child>")));
    }

    #[test]
    fn typed_agent_calls_are_not_forks() {
        let input = RawJson::encode(
            &serde_json::json!({"prompt": "p", "description": "d", "subagent_type": "Explore"}),
        );
        let typed = Block::tool_use("t", AGENT_TOOL, &input).ok();
        let msg = Message::assistant(typed.into_iter().collect());
        assert!(fork_directives(&msg).is_empty());
        assert_eq!(
            ForkBatch::new(BatchId::new(), SessionId::new(), 0, msg, 0).err(),
            Some(ForkError::NoForkToolUse)
        );
    }

    #[test]
    fn the_guard_has_two_independent_checks() {
        let b = batch(1);
        let d = ForkBatch::directive_block(&directives(1)[0]);
        let conv = b.child_conversation(&[Message::user(vec![Block::text("hi")])], &d, &[]);
        assert_eq!(
            fork_refusal(Some(FORK_QUERY_SOURCE), &[]),
            Some(ForkRefusal::QuerySource)
        );
        assert_eq!(
            fork_refusal(None, &conv.messages),
            Some(ForkRefusal::BoilerplateInMessages)
        );
        assert_eq!(fork_refusal(None, &conv.messages[..1]), None);
    }

    #[test]
    fn parent_gets_async_launched_for_each_child() {
        let b = batch(2);
        let ids: Vec<_> = fork_directives(b.assistant().unwrap())
            .into_iter()
            .map(|(t, _)| (t, AgentId::new()))
            .collect();
        let results = b.parent_results(&ids);
        assert_eq!(results.blocks.len(), 2);
        assert!(results.text().is_empty());
        assert!(results.content_json().contains("async_launched"));
    }
}
