//! Reading agents and their transcripts.

use forkd_core::fork::ForkBatch;
use forkd_core::store::AgentFilter;
use forkd_core::{Agent, AgentId, AgentKind, BatchId, Message};

use crate::Engine;
use crate::attach::AgentEventStream;
use crate::error::{EngineError, Result};

/// One message of an agent's conversation, marked when it was inherited from the parent.
#[derive(Debug, Clone, PartialEq)]
pub struct TranscriptEntry {
    pub message: Message,
    /// True for the parent's history and the fork message: bytes the agent shares with its
    /// siblings.
    pub shared: bool,
    /// A compaction's summary, shown where its boundary is: the requests after it start with
    /// this message instead of everything before it. Not a message of the transcript itself.
    pub compaction: bool,
    /// One of forkd's notes in a session's transcript (a task notification, a batch's launch
    /// note or digest, a branch's report): to be drawn as forkd's by this mark, never by its
    /// text.
    pub note: bool,
    /// A session's main loop's message: its seq in the session's transcript, and the turn it
    /// begins, if it does.
    pub seq: Option<u64>,
    pub turn: Option<u32>,
}

impl Engine {
    /// Resumes, at start, every agent that no live daemon holds: on SQLite every live one a
    /// previous daemon left pending or running; on PostgreSQL those whose holder's lease has
    /// expired. Each resumes under its own id from its stored transcript (its requests carry
    /// the same bytes as before, so they read the cache). A tool call that was cut off is re-run
    /// only if it is read-only. A parent's turn that was cut off continues from its transcript.
    /// Reports that a parent turn was waiting to deliver go to the transcript: that turn's reply
    /// was never stored. A batch's children resume together, behind warm-up gating when its
    /// prefix has gone cold (see [`resume_gating`]). Returns how many agents were resumed.
    pub async fn resume_interrupted(&self) -> Result<usize> {
        self.adopt().await
    }

    /// Starts a batch's resumed children (index, id) together, gated when its prefix is cold.
    pub(crate) async fn resume_batch(&self, batch: BatchId, mut children: Vec<(u32, AgentId)>) {
        let store = &self.inner.store;
        children.sort_unstable();
        let ids: Vec<AgentId> = children
            .into_iter()
            .map(|(_, id)| id)
            .filter(|id| !self.inner.supervisor.is_running(*id))
            .collect();
        let last_request = match store
            .list_requests(&forkd_core::store::RequestFilter {
                batch_id: Some(batch),
                ..Default::default()
            })
            .await
        {
            Ok(records) => records.iter().map(|r| r.created_at_ms).max(),
            // Not knowing, gate: a wait of one response against a cache write per child.
            Err(e) => {
                tracing::warn!(batch.id = %batch, error = %e, "Cannot read the batch's requests");
                None
            }
        };
        let gating = self.inner.config.warmup_gating
            && resume_gating(ids.len(), last_request, crate::clock::now_ms());
        let owner = async {
            let stored = self.get_batch(batch).await?;
            let tenant = self.inner.tenancy.session_owner(stored.session_id).await?;
            Ok::<_, EngineError>((tenant, stored))
        };
        let (tenant, stored) = match owner.await {
            Ok(found) => found,
            Err(e) => {
                tracing::error!(batch.id = %batch, error = %e, "Cannot tell whose batch it is; its children stay for the next start");
                return;
            }
        };
        tracing::info!(batch.id = %batch, children = ids.len(), gating, "Resuming a batch");
        crate::run::resumed_span(Some(&stored))
            .in_scope(|| self.inner.runs.start_batch(batch, &tenant, &ids, gating));
    }

    pub async fn get_agent(&self, id: AgentId) -> Result<Agent> {
        crate::lookup::agent(&*self.inner.store, id).await
    }

    pub async fn get_batch(&self, id: BatchId) -> Result<ForkBatch> {
        crate::lookup::batch(&*self.inner.store, id).await
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
            // A session's main loop speaks in the session's own transcript; its compaction
            // boundaries are marked where they sit.
            let mut boundaries = store
                .compactions(agent.session_id)
                .await?
                .into_iter()
                .peekable();
            // A branch's messages before its point are its origin's.
            let point = self
                .get_session(agent.session_id)
                .await?
                .branch
                .map_or(0, |b| b.point);
            let mut turn = 0_u32;
            for m in store.session_messages(agent.session_id, None).await? {
                while let Some(c) = boundaries.next_if(|c| c.to_seq == m.seq) {
                    out.push(TranscriptEntry {
                        message: c.summary,
                        shared: m.seq < point,
                        compaction: true,
                        note: false,
                        seq: None,
                        turn: None,
                    });
                }
                if m.starts_turn {
                    turn += 1;
                }
                out.push(TranscriptEntry {
                    message: m.message,
                    shared: m.seq < point,
                    compaction: false,
                    note: m.note,
                    seq: Some(m.seq),
                    turn: m.starts_turn.then_some(turn),
                });
            }
            return Ok(out);
        }
        if agent.kind == AgentKind::Fork
            && let Some(batch_id) = agent.batch_id
        {
            let batch = self.get_batch(batch_id).await?;
            if include_shared {
                for (message, note) in self.inner.compaction.inherited_notes(&batch).await? {
                    out.push(TranscriptEntry {
                        message,
                        shared: true,
                        compaction: false,
                        note,
                        seq: None,
                        turn: None,
                    });
                }
                if let Some(assistant) = batch.assistant() {
                    out.push(TranscriptEntry {
                        message: assistant.clone(),
                        shared: true,
                        compaction: false,
                        note: false,
                        seq: None,
                        turn: None,
                    });
                }
            }
            let mut first = batch.shared_user_blocks.clone();
            if let Some(directive) = store.agent_directive_block(id).await? {
                first.push(directive);
            }
            out.push(TranscriptEntry {
                message: Message::user(first),
                shared: false,
                compaction: false,
                note: false,
                seq: None,
                turn: None,
            });
        }
        // A fork child's or typed agent's own boundaries, marked where they sit like the main
        // loop's.
        let mut boundaries = store.agent_compactions(id).await?.into_iter().peekable();
        for m in store.agent_messages(id).await? {
            while let Some(c) = boundaries.next_if(|c| c.to_seq == m.seq) {
                out.push(TranscriptEntry {
                    message: c.summary,
                    shared: false,
                    compaction: true,
                    note: false,
                    seq: None,
                    turn: None,
                });
            }
            out.push(TranscriptEntry {
                message: m.message,
                shared: false,
                compaction: false,
                note: false,
                seq: None,
                turn: None,
            });
        }
        Ok(out)
    }
}

/// How long after a batch's last request its shared prefix is taken to be still cached: the
/// provider's default lifetime of a cache entry (forkd writes 5-minute entries).
const CACHE_LIFETIME_MS: i64 = 5 * 60 * 1000;

/// Whether a batch's resumed children should start behind warm-up gating: when two or more
/// resume and the batch has made no request within the cache's lifetime, so none of them would
/// find the shared prefix cached and each would write it.
fn resume_gating(resuming: usize, last_request_ms: Option<i64>, now_ms: i64) -> bool {
    resuming >= 2 && last_request_ms.is_none_or(|at| now_ms.saturating_sub(at) >= CACHE_LIFETIME_MS)
}

impl Engine {
    /// Hands the agent's attached clients to the background: their streams end with
    /// `AsyncLaunched` at once; the agent carries on.
    pub async fn background(&self, id: AgentId) -> Result<()> {
        let agent = self.get_agent(id).await?;
        if agent.state.is_terminal() {
            return Err(EngineError::WrongState(format!(
                "agent {id} already ended ({})",
                agent.state.as_str()
            )));
        }
        self.inner.attach.background(id).await
    }

    /// Streams the agent's messages with `seq >= since_seq`, then live ones, then its end.
    pub async fn attach(&self, id: AgentId, since_seq: u64) -> Result<AgentEventStream> {
        let agent = self.get_agent(id).await?;
        if agent.kind == forkd_core::AgentKind::Parent {
            return Err(EngineError::WrongState(
                "a session's main loop streams through SendMessage; attach to its children".into(),
            ));
        }
        Ok(self.inner.attach.follow(id, since_seq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resumed_siblings_are_gated_only_when_the_prefix_is_cold() {
        let now = 10 * CACHE_LIFETIME_MS;
        // Never requested, or too long ago: the first child warms the cache for the rest.
        assert!(resume_gating(3, None, now));
        assert!(resume_gating(2, Some(now - CACHE_LIFETIME_MS), now));
        // Recently requested: the prefix is still cached; nobody waits.
        assert!(!resume_gating(3, Some(now - 1_000), now));
        // One child alone has nobody to warm the cache for.
        assert!(!resume_gating(1, None, now));
    }
}
