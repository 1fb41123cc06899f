//! Compaction of a session's transcript (docs/contracts.md, "Compaction"): when the parent's
//! next request would pass `compact_threshold` of its model's window, or when a client asks,
//! the older messages are replaced in the requests by a summary the model writes. The summary
//! request is the request that produced the last assistant reply, byte for byte, plus the
//! instruction (so it reads that request's cache); the boundary is stored beside the transcript
//! in one transaction, and nothing of the transcript is deleted.

use forkd_core::compaction::{self, Compaction};
use forkd_core::request::Conversation;
use forkd_core::session::Session;
use forkd_core::store::Lease;
use forkd_core::{Agent, Block, Message, SessionId};

use crate::error::{EngineError, Result};
use crate::model::{ModelCall, PrefixEnd};
use crate::{Engine, now_ms};

/// What the parent's requests see of its transcript.
pub(crate) struct ParentView {
    /// The summary and the messages since the latest boundary, or the whole transcript.
    pub messages: Vec<Message>,
    /// The latest boundary, if the transcript was ever compacted.
    pub compaction: Option<Compaction>,
    /// The transcript's length.
    pub len: u64,
}

impl Engine {
    /// The parent's conversation as its next request sees it.
    pub(crate) async fn parent_view(&self, session: &Session) -> Result<ParentView> {
        let store = &self.inner.store;
        let compaction = store.compactions(session.id).await?.pop();
        let all = store.session_messages(session.id, None).await?;
        let len = all.len() as u64;
        let messages = match &compaction {
            Some(c) => std::iter::once(c.summary.clone())
                .chain(
                    all.into_iter()
                        .filter(|m| m.seq >= c.to_seq)
                        .map(|m| m.message),
                )
                .collect(),
            None => all.into_iter().map(|m| m.message).collect(),
        };
        Ok(ParentView {
            messages,
            compaction,
            len,
        })
    }

    /// The input tokens of the parent's request on `view`, from the counts kept per message.
    pub(crate) async fn view_tokens(&self, session: &Session, view: &ParentView) -> Result<u64> {
        let all = self.history_tokens(session, Some(view.len)).await?;
        Ok(match &view.compaction {
            Some(c) => {
                let before = self.history_tokens(session, Some(c.to_seq)).await?;
                all - before + crate::window::message_tokens(&c.summary)
            }
            None => all,
        })
    }

    /// Whether the parent's next request, `input_tokens` of it, passes the compaction threshold
    /// of its model's window (input plus `max_tokens` against `compact_threshold` × window).
    pub(crate) fn needs_compaction(&self, session: &Session, input_tokens: u64) -> bool {
        let Some(model) = self.config().models.get(&session.params.model) else {
            return false;
        };
        let threshold = model.context_window as f64 * self.config().compact_threshold;
        (input_tokens + u64::from(session.params.max_tokens)) as f64 > threshold
    }

    /// Compacts the session's transcript under the parent's `lease`: the model summarizes
    /// everything before the last assistant reply since the previous boundary, and the boundary
    /// is stored. `instructions` are the client's, added to forkd's.
    pub(crate) async fn compact(
        &self,
        session: &Session,
        parent: &Agent,
        lease: &Lease,
        request: u32,
        instructions: Option<&str>,
    ) -> Result<Compaction> {
        let store = &self.inner.store;
        let previous = store.compactions(session.id).await?.pop();
        let all: Vec<Message> = store
            .session_messages(session.id, None)
            .await?
            .into_iter()
            .map(|m| m.message)
            .collect();
        let after = previous.as_ref().map_or(0, |c| c.to_seq);
        let to_seq = compaction::boundary(&all, after).ok_or_else(|| {
            EngineError::WrongState(format!(
                "session {} has nothing to compact: no reply of the model since {}",
                session.id,
                if previous.is_some() {
                    "the last compaction"
                } else {
                    "it began"
                }
            ))
        })?;
        let cut = usize::try_from(to_seq).unwrap_or(all.len()).min(all.len());
        let from = usize::try_from(after).unwrap_or(0).min(cut);
        let before: Vec<Message> = match &previous {
            Some(c) => std::iter::once(c.summary.clone())
                .chain(all[from..cut].iter().cloned())
                .collect(),
            None => all[..cut].to_vec(),
        };
        let mut conversation = compaction::summary_request(before);
        if let Some(extra) = instructions.map(str::trim).filter(|i| !i.is_empty())
            && let Some(last) = conversation.last_mut()
        {
            last.blocks
                .push(Block::text(&format!("Also, from the user: {extra}")));
        }
        tracing::info!(session.id = %session.id, to_seq, "Compacting the transcript");
        let answer = self
            .call_model(
                ModelCall {
                    agent: parent,
                    turn: request,
                    params: &session.params,
                    conversation: &Conversation::plain(conversation),
                    prefix: PrefixEnd::LastBlock,
                    input_tokens: None,
                },
                &mut |_| {},
            )
            .await?;
        let text = answer.completion.message.text();
        if text.trim().is_empty() {
            return Err(EngineError::Invariant(
                "the model's compaction summary was empty".into(),
            ));
        }
        let compaction = Compaction {
            from_seq: after,
            to_seq,
            summary: compaction::summary_message(&text),
            created_at_ms: now_ms(),
        };
        store
            .append_compaction(lease, session.id, &compaction)
            .await?;
        tracing::info!(
            session.id = %session.id,
            to_seq,
            summary_tokens = crate::window::message_tokens(&compaction.summary),
            "Transcript compacted"
        );
        Ok(compaction)
    }

    /// Compacts a session now, at a client's request: refused while a turn runs.
    pub async fn compact_session(
        &self,
        session_id: SessionId,
        instructions: Option<String>,
    ) -> Result<Compaction> {
        let session = self.get_session(session_id).await?;
        let turn_lock = self.turn_lock(session.id);
        let _guard = turn_lock.try_lock_owned().map_err(|_| {
            EngineError::WrongState(format!(
                "session {session_id} is running a turn; compact it once the turn has ended"
            ))
        })?;
        let parent = self.parent_agent(&session).await?;
        let lease = self.inner.store.claim_agent(parent.id).await?;
        let outcome = self
            .compact(&session, &parent, &lease, 0, instructions.as_deref())
            .await;
        if let Err(e) = self.inner.store.end_turn(&lease, None).await {
            tracing::warn!(error = %e, "Cannot mark the parent idle after a compaction");
        }
        outcome
    }
}
