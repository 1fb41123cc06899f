//! Compaction of a fork child's or a typed agent's own transcript (docs/contracts.md,
//! "Compaction"): when the agent's next request would pass `compact_threshold` of its model's
//! window, or when the provider finds it too long, the agent's own messages before its last
//! reply are replaced, in its requests, by a summary. Its first message — a child's fork message
//! (everything its siblings share, then its directive), a typed agent's prompt — is kept whole:
//! the summary's blocks follow its blocks. The summary request is the agent's request that
//! produced that reply, byte for byte, plus the instruction, so it reads that request's cache;
//! the boundary is stored under the agent's lease in one transaction.

use super::Runs;
use forkd_core::compaction::{self, Compaction};
use forkd_core::request::Conversation;
use forkd_core::store::Lease;
use forkd_provider::StreamEvent;
use std::sync::Arc;

use super::{AgentRun, BatchContext, Shape};
use crate::error::{EngineError, Result};
use crate::model::{Answer, ModelCall, PrefixEnd};
use crate::window::{block_tokens, head_tokens, message_tokens};
use forkd_core::{Block, Message};

/// What an agent's model requests stream to: a warm-up gate opens on the first `MessageStart`.
pub(crate) type OnEvent<'a> = dyn FnMut(&StreamEvent) + Send + 'a;

impl Runs {
    /// The input tokens of a fork child's next request, from the counts kept for its parent's
    /// history: the shared blocks, its directive and `own` (its own messages, from its latest
    /// compaction boundary) are all that is counted.
    pub(crate) async fn fork_child_tokens(
        self: &Arc<Self>,
        ctx: &BatchContext,
        directive: &Block,
        own: &[Message],
    ) -> Result<u64> {
        // A batch forked after a compaction inherits its summary: the history's first message.
        let compaction = ctx.batch.compacted_to.zip(ctx.history.first());
        let history = self
            .window
            .inherited_tokens(&ctx.session, Some(ctx.batch.fork_point), compaction)
            .await?;
        let assistant = ctx.batch.assistant().map_or(0, message_tokens);
        let shared: u64 = ctx.batch.shared_user_blocks.iter().map(block_tokens).sum();
        let own: u64 = own.iter().map(message_tokens).sum();
        Ok(history + assistant + shared + block_tokens(directive) + own)
    }

    /// The input tokens of the agent's next request, from the counts kept per block: a fork
    /// child's from its parent's history's counts, its shared blocks, its directive, the
    /// summary and its messages since the boundary; a typed agent's from its tools and system
    /// prompt (counted once per run), its prompt, the summary and its messages.
    pub(crate) async fn agent_tokens(self: &Arc<Self>, run: &AgentRun) -> Result<u64> {
        let (compaction, own) = run.view_parts();
        let summary = compaction.map_or(0, |c| message_tokens(&c.summary));
        Ok(summary
            + match &run.shape {
                Shape::Fork { ctx } => self.fork_child_tokens(ctx, &run.directive, own).await?,
                Shape::Typed => {
                    let head = match run.head_tokens.get() {
                        Some(head) => *head,
                        None => {
                            let head = head_tokens(&run.params)?;
                            *run.head_tokens.get_or_init(|| head)
                        }
                    };
                    head + block_tokens(&run.directive)
                        + own.iter().map(message_tokens).sum::<u64>()
                }
            })
    }

    /// Compacts the agent's own transcript under its `lease`: the model summarizes its
    /// messages before its last reply since the previous boundary (`WrongState` when it has
    /// not replied since), and the boundary is stored. `run` then holds it.
    pub(crate) async fn compact_agent(
        self: &Arc<Self>,
        run: &mut AgentRun,
        lease: &Lease,
        turn: u32,
        on_event: &mut OnEvent<'_>,
    ) -> Result<Compaction> {
        let previous = run.compactions.last();
        let after = previous.map_or(0, |c| c.to_seq);
        let to_seq = compaction::boundary(&run.own, after).ok_or_else(|| {
            EngineError::WrongState(format!(
                "agent {} has nothing to compact: no reply of the model since {}",
                run.agent.id,
                if previous.is_some() {
                    "its last compaction"
                } else {
                    "it began"
                }
            ))
        })?;
        // The request that produced the reply at the boundary, with the instruction added to
        // its last user message: its breakpoints stay where they were, so it reads that
        // request's cache (the siblings' shared prefix included).
        let upto = usize::try_from(to_seq).unwrap_or(usize::MAX);
        let produced = run.view(previous, upto);
        let conversation = Conversation {
            messages: compaction::summary_request(produced.messages),
            anchors: produced.anchors,
        };
        tracing::info!(agent.id = %run.agent.id, to_seq, "Compacting the agent's transcript");
        let Answer { completion, .. } = self
            .calls
            .call(
                ModelCall {
                    agent: &run.agent,
                    turn,
                    params: &run.params,
                    conversation: &conversation,
                    prefix: PrefixEnd::Before(run.directive_pos()),
                    input_tokens: None,
                    prefix_writer: None,
                },
                on_event,
            )
            .await?;
        let compaction = crate::compact::boundary(&completion.message, after, to_seq)?;
        self.store
            .append_agent_compaction(lease, &compaction)
            .await?;
        tracing::info!(
            agent.id = %run.agent.id,
            to_seq,
            summary_tokens = message_tokens(&compaction.summary),
            "Agent transcript compacted"
        );
        run.compactions.push(compaction.clone());
        Ok(compaction)
    }
}
