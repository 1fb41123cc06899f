//! Compaction of a session's transcript (docs/contracts.md, "Compaction"): when the parent's
//! next request would pass `compact_threshold` of its model's window, or when a client asks,
//! the older messages are replaced in the requests by a summary the model writes. The summary
//! request is the request that produced the last assistant reply, byte for byte, plus the
//! instruction (so it reads that request's cache); the boundary is stored beside the transcript
//! in one transaction, and nothing of the transcript is deleted. Fork children and typed agents
//! compact their own transcripts the same way (`agent`).

mod agent;

use forkd_core::compaction::{self, Compaction};
use forkd_core::request::Conversation;
use forkd_core::session::{CacheSafeParams, Session};
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
    /// The session's latest compaction whose boundary is at or before `seq`: what the parent's
    /// requests saw of the transcript's first `seq` messages.
    pub(crate) async fn compaction_before(
        &self,
        session: SessionId,
        seq: u64,
    ) -> Result<Option<Compaction>> {
        Ok(self
            .inner
            .store
            .compactions(session)
            .await?
            .into_iter()
            .rfind(|c| c.to_seq <= seq))
    }

    /// The history a batch's children inherit: the parent's transcript up to the fork point, or,
    /// for a batch forked after a compaction, that compaction's summary and the messages from
    /// its boundary to the fork point.
    pub(crate) async fn inherited_history(
        &self,
        batch: &forkd_core::fork::ForkBatch,
    ) -> Result<Vec<Message>> {
        let store = &self.inner.store;
        let summary = match batch.compacted_to {
            Some(to) => Some(
                store
                    .compactions(batch.session_id)
                    .await?
                    .into_iter()
                    .find(|c| c.to_seq == to)
                    .ok_or_else(|| {
                        EngineError::Invariant(format!(
                            "batch {} was forked after a compaction at message {to} of session \
                             {}, which is not stored",
                            batch.id, batch.session_id
                        ))
                    })?
                    .summary,
            ),
            None => None,
        };
        let from = batch.compacted_to.unwrap_or(0);
        let messages = store
            .session_messages_from(batch.session_id, from, Some(batch.fork_point))
            .await?
            .into_iter()
            .map(|m| m.message);
        Ok(summary.into_iter().chain(messages).collect())
    }

    /// The input tokens of a request on the transcript's first `upto` messages (tools and
    /// system prompt included), from the counts kept per message; after a compaction
    /// (`(to_seq, summary)`), its summary and the messages from its boundary.
    pub(crate) async fn inherited_tokens(
        &self,
        session: &Session,
        upto: Option<u64>,
        compaction: Option<(u64, &Message)>,
    ) -> Result<u64> {
        let all = self.history_tokens(session, upto).await?;
        Ok(match compaction {
            Some((to_seq, summary)) => {
                let head = self.history_tokens(session, Some(0)).await?;
                let before = self.history_tokens(session, Some(to_seq)).await?;
                head + (all - before) + crate::window::message_tokens(summary)
            }
            None => all,
        })
    }

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
        let compaction = view.compaction.as_ref().map(|c| (c.to_seq, &c.summary));
        self.inherited_tokens(session, Some(view.len), compaction)
            .await
    }

    /// Whether an agent's next request on `params`, `input_tokens` of it, passes the compaction
    /// threshold of its model's window (input plus `max_tokens` against `compact_threshold` ×
    /// window).
    pub(crate) fn needs_compaction(&self, params: &CacheSafeParams, input_tokens: u64) -> bool {
        let Some(model) = self.config().models.get(&params.model) else {
            return false;
        };
        let threshold = model.context_window as f64 * self.config().compact_threshold;
        (input_tokens + u64::from(params.max_tokens)) as f64 > threshold
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
        let lease = self.claim_main_loop(&parent).await?;
        // Like a run, it stops where it stands when the daemon stops: no boundary is stored
        // unless the summary came back whole.
        let shutdown = self.inner.shutdown.clone();
        let outcome = tokio::select! {
            outcome = self.compact(&session, &parent, &lease, 0, instructions.as_deref()) => outcome,
            () = shutdown.cancelled() => return Err(EngineError::Draining),
        };
        if let Err(e) = self.inner.store.end_turn(&lease, None).await {
            tracing::warn!(error = %e, "Cannot mark the parent idle after a compaction");
        }
        outcome
    }
}

/// The provider's "prompt is too long", saying what forkd did about it.
pub(crate) fn too_long(e: &forkd_provider::ProviderError, what: &str) -> EngineError {
    let message = match e {
        forkd_provider::ProviderError::Status { message, .. } => message.clone(),
        other => other.to_string(),
    };
    EngineError::Provider(forkd_provider::ProviderError::Status {
        status: 400,
        message: format!("{message} ({what})"),
        retry_after: None,
    })
}
