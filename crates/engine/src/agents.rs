//! Reading agents and their transcripts.

use forkd_core::fork::ForkBatch;
use forkd_core::{Agent, AgentId, AgentKind, AgentState, BatchId, Message};
use forkd_store::AgentFilter;

use crate::Engine;
use crate::error::{EngineError, Result};

/// One message of an agent's conversation, marked when it was inherited from the parent.
#[derive(Debug, Clone, PartialEq)]
pub struct TranscriptEntry {
    pub message: Message,
    /// True for the parent's history and the fork message: bytes the agent shares with its
    /// siblings.
    pub shared: bool,
}

impl Engine {
    /// Resumes every agent a previous daemon left pending or running, each under its own id
    /// from its stored transcript (its requests carry the same bytes as before, so they read
    /// the cache). A tool call that was cut off is re-run only if it is read-only. A parent's
    /// turn that was cut off continues from its transcript. Reports that a parent turn was
    /// waiting to deliver go to the transcript: that turn's reply was never stored. Returns how
    /// many agents were resumed.
    pub async fn resume_interrupted(&self) -> Result<usize> {
        let store = &self.inner.store;
        let undelivered = store.caller_reports().await?;
        if !undelivered.is_empty() {
            let appended = store.redirect_reports(&undelivered).await?;
            tracing::info!(
                agents = undelivered.len(),
                appended,
                "Reports of an interrupted parent turn go to the transcript"
            );
        }
        let live = store.list_agents(&AgentFilter::default()).await?;
        let mut resumed = 0;
        for agent in &live {
            if agent.kind == AgentKind::Parent {
                if agent.state == AgentState::Running {
                    // One session's broken turn must not keep the others from resuming.
                    match self.resume_turn(agent.clone()).await {
                        Ok(()) => resumed += 1,
                        Err(e) => tracing::error!(
                            agent.id = %agent.id,
                            error = %e,
                            "Cannot resume the parent's turn; it stays running for the next start"
                        ),
                    }
                }
                continue;
            }
            tracing::info!(agent.id = %agent.id, state = agent.state.as_str(), "Resuming an agent");
            self.start_agent(agent.id);
            resumed += 1;
        }
        Ok(resumed)
    }

    pub async fn get_agent(&self, id: AgentId) -> Result<Agent> {
        self.inner
            .store
            .get_agent(id)
            .await?
            .ok_or_else(|| EngineError::NotFound {
                kind: "agent",
                id: id.to_string(),
            })
    }

    pub async fn get_batch(&self, id: BatchId) -> Result<ForkBatch> {
        self.inner
            .store
            .get_batch(id)
            .await?
            .ok_or_else(|| EngineError::NotFound {
                kind: "batch",
                id: id.to_string(),
            })
    }

    pub async fn list_agents(&self, filter: &AgentFilter) -> Result<Vec<Agent>> {
        Ok(self.inner.store.list_agents(filter).await?)
    }

    /// An agent's conversation as the model sees it. Without `include_shared` it starts at the
    /// child's own first user message (the placeholders, the boilerplate and its directive).
    pub async fn transcript(
        &self,
        id: AgentId,
        include_shared: bool,
    ) -> Result<Vec<TranscriptEntry>> {
        let agent = self.get_agent(id).await?;
        let store = &self.inner.store;
        let mut out = Vec::new();
        if agent.kind == AgentKind::Parent {
            // A session's main loop speaks in the session's own transcript.
            return Ok(store
                .session_messages(agent.session_id, None)
                .await?
                .into_iter()
                .map(|m| TranscriptEntry {
                    message: m.message,
                    shared: false,
                })
                .collect());
        }
        if agent.kind == AgentKind::Fork
            && let Some(batch_id) = agent.batch_id
        {
            let batch = store
                .get_batch(batch_id)
                .await?
                .ok_or_else(|| EngineError::NotFound {
                    kind: "batch",
                    id: batch_id.to_string(),
                })?;
            if include_shared {
                for m in store
                    .session_messages(agent.session_id, Some(batch.fork_point))
                    .await?
                {
                    out.push(TranscriptEntry {
                        message: m.message,
                        shared: true,
                    });
                }
                out.push(TranscriptEntry {
                    message: batch.assistant.clone(),
                    shared: true,
                });
            }
            let mut first = batch.shared_user_blocks.clone();
            if let Some(directive) = store.agent_directive_block(id).await? {
                first.push(directive);
            }
            out.push(TranscriptEntry {
                message: Message::user(first),
                shared: false,
            });
        }
        for m in store.agent_messages(id).await? {
            out.push(TranscriptEntry {
                message: m.message,
                shared: false,
            });
        }
        Ok(out)
    }
}
