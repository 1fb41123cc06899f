//! Tool calls of this build: the `Agent` tool's recursion guard. The workspace tools (Read,
//! Write, Edit, Glob, Grep, Bash) and typed agents are not implemented yet; a call to one gets a
//! clear tool error, so the model can carry on without it.

use forkd_core::fork::fork_refusal;
use forkd_core::tools::AGENT_TOOL;
use forkd_core::{Agent, Block, Message};

use crate::Engine;

impl Engine {
    /// Answers every tool_use of `assistant` with one tool_result each, in order.
    pub(crate) fn run_tools(
        &self,
        agent: &Agent,
        conversation: &[Message],
        assistant: Option<&Message>,
    ) -> Message {
        let Some(assistant) = assistant else {
            return Message::user(Vec::new());
        };
        let blocks = assistant
            .tool_uses()
            .map(|(id, name, block)| {
                if name == AGENT_TOOL {
                    let typed = block
                        .tool_input()
                        .and_then(|i| i.get("subagent_type").cloned())
                        .is_some_and(|t| !t.is_null());
                    if !typed
                        && let Some(refusal) =
                            fork_refusal(agent.query_source.as_deref(), conversation)
                    {
                        tracing::info!(?refusal, "Refused a fork from a fork child");
                        return Block::tool_result(id, refusal.message(), true);
                    }
                    return Block::tool_result(
                        id,
                        "The Agent tool is not available to this agent in this forkd build; do \
                         the work yourself.",
                        true,
                    );
                }
                Block::tool_result(
                    id,
                    &format!(
                        "Tool {name} is not available in this forkd build yet; continue without \
                         it and say so in your report's Issues."
                    ),
                    true,
                )
            })
            .collect();
        Message::user(blocks)
    }
}
