//! Compaction of a session's transcript (docs/contracts.md, "Compaction"): when the parent's
//! next request would pass `compact_threshold` of its model's window, or when a client asks,
//! the older messages are replaced in the requests by a summary the model writes. The summary
//! request is the request that produced the last assistant reply, byte for byte, plus the
//! instruction (so it reads that request's cache); the boundary is stored beside the transcript
//! in one transaction, and nothing of the transcript is deleted. Fork children and typed agents
//! compact their own transcripts the same way (`run/compact.rs`).

use forkd_core::compaction::{self, Compaction};
use forkd_core::request::Conversation;
use forkd_core::session::{CacheSafeParams, Session};
use forkd_core::store::Lease;
use forkd_core::{Agent, Block, Message, SessionId};

use std::sync::Arc;

use forkd_core::pricing::Models;
use forkd_core::store::Store;

use crate::clock::now_ms;
use crate::error::{EngineError, Result};
use crate::model::{ModelCall, ModelCalls, PrefixEnd};
use crate::window::Window;

/// What the parent's requests see of its transcript.
pub(crate) struct ParentView {
    /// The summary and the messages since the latest boundary, or the whole transcript.
    pub messages: Vec<Message>,
    /// The latest boundary, if the transcript was ever compacted.
    pub compaction: Option<Compaction>,
    /// The transcript's length.
    pub len: u64,
}

/// Requests on a transcript that compacts itself when it must: a session's main loop, or a
/// fork child's or typed agent's own transcript. [`Compactor::request_compacting`] is the one
/// place that decides when to compact and what to do when the provider says the prompt is too
/// long.
pub(crate) trait Compacting {
    /// What one request answers.
    type Answer;
    /// What is compacted, for the log and for errors: "the transcript", "the agent's
    /// transcript".
    const WHAT: &'static str;
    /// The params the requests go with (their model's window and `max_tokens`).
    fn params(&self) -> &CacheSafeParams;
    /// The next request's input tokens, from the counts kept.
    async fn tokens(&mut self) -> Result<u64>;
    /// Compacts the transcript; `WrongState` when there is nothing to compact yet.
    async fn compact(&mut self) -> Result<()>;
    /// Builds and sends the next request; `counted` is what [`Compacting::tokens`] said.
    async fn request(&mut self, counted: u64) -> Result<Self::Answer>;
}

/// Compaction: when a transcript compacts, its boundary and summary, and what requests see of a
/// compacted transcript.
pub(crate) struct Compactor {
    store: Arc<dyn Store>,
    calls: Arc<ModelCalls>,
    window: Arc<Window>,
    /// The models' windows, for the threshold.
    models: Models,
    /// The share of its model's window past which a request compacts its transcript first.
    threshold: f64,
}

impl Compactor {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        calls: Arc<ModelCalls>,
        window: Arc<Window>,
        models: Models,
        threshold: f64,
    ) -> Self {
        Self {
            store,
            calls,
            window,
            models,
            threshold,
        }
    }

    /// The next request of `transcript`. Past the compaction threshold it compacts first; a
    /// provider that finds the prompt too long (its count is not forkd's) makes it compact and
    /// ask once more.
    pub(crate) async fn request_compacting<C: Compacting>(
        &self,
        transcript: &mut C,
    ) -> Result<C::Answer> {
        let mut counted = transcript.tokens().await?;
        if self.needs_compaction(transcript.params(), counted) {
            match transcript.compact().await {
                Ok(()) => counted = transcript.tokens().await?,
                // Nothing to compact yet: the window check decides.
                Err(EngineError::WrongState(why)) => {
                    tracing::warn!(%why, what = C::WHAT, "The request passes the compaction threshold");
                }
                Err(e) => return Err(e),
            }
        }
        let e = match transcript.request(counted).await {
            Err(EngineError::Provider(e)) if e.is_prompt_too_long() => e,
            other => return other,
        };
        tracing::warn!(error = %e, what = C::WHAT, "The provider says the prompt is too long; compacting");
        match transcript.compact().await {
            Ok(()) => {}
            Err(EngineError::WrongState(why)) => {
                return Err(too_long(&e, &format!("and it cannot be compacted: {why}")));
            }
            Err(other) => return Err(other),
        }
        let counted = transcript.tokens().await?;
        transcript
            .request(counted)
            .await
            .map_err(|again| match again {
                EngineError::Provider(e) if e.is_prompt_too_long() => {
                    too_long(&e, &format!("even after {} was compacted", C::WHAT))
                }
                other => other,
            })
    }

    /// The session's latest compaction whose boundary is at or before `seq`: what the parent's
    /// requests saw of the transcript's first `seq` messages.
    pub(crate) async fn compaction_before(
        &self,
        session: SessionId,
        seq: u64,
    ) -> Result<Option<Compaction>> {
        Ok(self
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
        Ok(self
            .inherited_notes(batch)
            .await?
            .into_iter()
            .map(|(message, _)| message)
            .collect())
    }

    /// [`Self::inherited_history`], each message with whether it is one of forkd's notes
    /// ([`forkd_core::store::StoredMessage::note`]).
    pub(crate) async fn inherited_notes(
        &self,
        batch: &forkd_core::fork::ForkBatch,
    ) -> Result<Vec<(Message, bool)>> {
        let store = &self.store;
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
            .map(|m| (m.message, m.note));
        Ok(summary
            .map(|s| (s, false))
            .into_iter()
            .chain(messages)
            .collect())
    }

    /// The parent's conversation as its next request sees it.
    pub(crate) async fn parent_view(&self, session: &Session) -> Result<ParentView> {
        let store = &self.store;
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
        self.window
            .inherited_tokens(session, Some(view.len), compaction)
            .await
    }

    /// Whether an agent's next request on `params`, `input_tokens` of it, passes the compaction
    /// threshold of its model's window (input plus `max_tokens` against `compact_threshold` ×
    /// window).
    pub(crate) fn needs_compaction(&self, params: &CacheSafeParams, input_tokens: u64) -> bool {
        let Some(model) = self.models.get(&params.model) else {
            return false;
        };
        let threshold = model.context_window as f64 * self.threshold;
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
        let store = &self.store;
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
        // A branch's boundary lies among its own messages: what it inherited is its origin's.
        if let Some(branch) = session.branch
            && to_seq < branch.point
        {
            return Err(EngineError::WrongState(format!(
                "branch {} has no reply of its own to compact at yet (its last is its origin's, \
                 message {to_seq}); compact its origin {}, or this branch after its first turn",
                session.id, branch.origin
            )));
        }
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
            .calls
            .call(
                ModelCall {
                    agent: parent,
                    turn: request,
                    params: &session.params,
                    conversation: &Conversation::main_loop(conversation, session.reply_breakpoint),
                    prefix: PrefixEnd::LastBlock,
                    input_tokens: None,
                    prefix_writer: None,
                },
                &mut |_| {},
            )
            .await?;
        let compaction = boundary(&answer.completion.message, after, to_seq)?;
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
}

/// The boundary a compaction stores: the model's summary (`reply`) of the messages from `after`
/// to `to_seq`. An empty summary is refused: it would drop what it stands for.
pub(crate) fn boundary(reply: &Message, after: u64, to_seq: u64) -> Result<Compaction> {
    let text = reply.text();
    if text.trim().is_empty() {
        return Err(EngineError::Invariant(
            "the model's compaction summary was empty".into(),
        ));
    }
    Ok(Compaction {
        from_seq: after,
        to_seq,
        summary: compaction::summary_message(&text),
        created_at_ms: now_ms(),
    })
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
