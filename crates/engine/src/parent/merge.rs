//! A branch's conclusion brought back to its origin (docs/contracts.md, "Branches"): one
//! `<branch-report>` note appended to the origin's transcript — the branch's point, its turns,
//! and its last reply or, when asked, a summary its own model writes in a request that reads the
//! branch's cache (the branch's next request, plus the instruction, as a compaction's summary
//! request is).

use std::sync::Arc;

use forkd_core::branch::Branch;
use forkd_core::digest::{BranchReport, Conclusion, branch_report};
use forkd_core::request::{Conversation, fingerprint};
use forkd_core::session::Session;
use forkd_core::store::{IdempotencyRecord, IdempotentCall};
use forkd_core::{Block, Message, Role, SessionId};

use super::Turns;
use crate::clock::now_ms;
use crate::error::{EngineError, Result};
use crate::model::{ModelCall, PrefixEnd};
use crate::tenancy::Idempotent;

/// What a merge did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    /// The session the note went to.
    pub origin: SessionId,
    /// The note's seq in the origin's transcript.
    pub seq: u64,
    /// The note's text, as the origin's model reads it.
    pub note: String,
}

/// What the branch's model is asked for a summary of it.
fn instruction(point: u64) -> String {
    format!(
        "This conversation branched from another one at message {point}. Summarize what was \
         asked and done here since then — what was decided or found, what changed, what is left \
         open — for that other conversation, which will read your summary as a note. Write only \
         the summary."
    )
}

impl Turns {
    /// Appends `branch`'s report to its origin. Refused while the branch runs a turn, and for a
    /// branch with no turn of its own. With an idempotency key, a retry appends nothing (and asks
    /// for no summary): it answers with the note the key first appended.
    pub(crate) async fn merge_branch(
        self: &Arc<Self>,
        branch: Session,
        summary: bool,
        idempotency_key: Option<String>,
    ) -> Result<Merged> {
        let Some(point) = branch.branch else {
            return Err(EngineError::InvalidRequest(format!(
                "session {} is not a branch (forkctl session branch makes one)",
                branch.id
            )));
        };
        let Some(key) = idempotency_key.filter(|k| !k.is_empty()) else {
            return self.merge_now(&branch, point, summary, None).await;
        };
        let canonical = serde_json::json!(["merge", branch.id.to_string(), summary]);
        let outcome = self
            .tenancy
            .idempotent(
                &branch.tenant,
                &key,
                // A merge stores one message, in the origin's transcript.
                IdempotentCall::SendMessage,
                fingerprint(canonical.to_string().as_bytes()),
                String::new(),
                |record| self.merge_now(&branch, point, summary, Some(record)),
            )
            .await?;
        let resource = match outcome {
            Idempotent::Created(merged) => return Ok(merged),
            Idempotent::Earlier(resource) => resource,
        };
        let seq = resource
            .rsplit_once('/')
            .and_then(|(_, seq)| seq.parse::<u64>().ok())
            .ok_or_else(|| {
                EngineError::Invariant(format!("stored merge key {resource:?} does not parse"))
            })?;
        let note = self
            .store
            .session_messages_from(point.origin, seq, Some(seq + 1))
            .await?
            .pop()
            .ok_or_else(|| {
                EngineError::Invariant(format!("the note {resource} of a merge is not stored"))
            })?;
        Ok(Merged {
            origin: point.origin,
            seq,
            note: note.message.text(),
        })
    }

    async fn merge_now(
        self: &Arc<Self>,
        branch: &Session,
        point: Branch,
        summary: bool,
        record: Option<IdempotencyRecord>,
    ) -> Result<Merged> {
        let turn_lock = self.turn_locks.get(branch.id);
        let _guard = turn_lock.try_lock_owned().map_err(|_| {
            EngineError::WrongState(format!(
                "branch {} is running a turn; merge it once the turn has ended",
                branch.id
            ))
        })?;
        // A turn on another daemon (its main loop is running there) has not concluded either.
        if self.batches.turns(branch.id).await?.in_flight.is_some() {
            return Err(EngineError::WrongState(format!(
                "branch {} is running a turn on another daemon; merge it once the turn has ended",
                branch.id
            )));
        }
        let messages = self.store.session_messages(branch.id, None).await?;
        let inherited_turns = messages
            .iter()
            .filter(|m| m.seq < point.point && m.starts_turn)
            .count();
        let own: Vec<&Message> = messages
            .iter()
            .filter(|m| m.seq >= point.point)
            .map(|m| &m.message)
            .collect();
        let turns: Vec<String> = messages
            .iter()
            .filter(|m| m.seq >= point.point && m.starts_turn)
            .map(|m| m.message.text())
            .collect();
        if turns.is_empty() {
            return Err(EngineError::WrongState(format!(
                "branch {} has no turn of its own yet: there is nothing to merge",
                branch.id
            )));
        }
        let last_reply = own
            .iter()
            .rev()
            .find(|m| m.role == Role::Assistant)
            .map(|m| m.text())
            .unwrap_or_default();
        let summary_text = if summary {
            Some(self.summarize(branch, point).await?)
        } else {
            None
        };
        let conclusion = match &summary_text {
            Some(text) => Conclusion::Summary(text),
            None => Conclusion::LastReply(&last_reply),
        };
        let note = branch_report(&BranchReport {
            branch: branch.id,
            after_turn: u32::try_from(inherited_turns).unwrap_or(u32::MAX),
            point: point.point,
            turns: turns.iter().map(String::as_str).collect(),
            conclusion,
        });
        // Under the origin's lock, as a batch's digest: no other append takes its place.
        let lock = self.session_locks.get(point.origin);
        let seq = {
            let _appending = lock.lock().await;
            self.store
                .append_note(point.origin, &note, record.as_ref(), now_ms())
                .await?
        };
        tracing::info!(
            branch = %branch.id,
            origin = %point.origin,
            seq,
            summary,
            "Branch merged"
        );
        Ok(Merged {
            origin: point.origin,
            seq,
            note: note.text(),
        })
    }

    /// The branch's model's summary of it since its point: its next request's messages (the
    /// view its turns send, breakpoints and all) and the instruction, under its main loop's lease.
    async fn summarize(self: &Arc<Self>, branch: &Session, point: Branch) -> Result<String> {
        let parent = self.parent_agent(branch).await?;
        let lease = self.claim_main_loop(&parent).await?;
        let view = self.compaction.parent_view(branch).await?;
        let mut messages = view.messages;
        messages.push(Message::user(vec![Block::text(&instruction(point.point))]));
        let call = ModelCall {
            agent: &parent,
            turn: 0,
            params: &branch.params,
            conversation: &Conversation::main_loop(messages, branch.reply_breakpoint),
            prefix: PrefixEnd::LastBlock,
            input_tokens: None,
            prefix_writer: None,
        };
        let shutdown = self.shutdown.clone();
        let mut ignore = |_: &forkd_provider::StreamEvent| {};
        let outcome = tokio::select! {
            outcome = self.calls.call(call, &mut ignore) => outcome,
            () = shutdown.cancelled() => Err(EngineError::Draining),
        };
        if let Err(e) = self.store.end_turn(&lease, None).await {
            tracing::warn!(error = %e, "Cannot mark the branch's main loop idle after its summary");
        }
        let text = outcome?.completion.message.text();
        if text.trim().is_empty() {
            return Err(EngineError::Invariant(
                "the branch's model wrote an empty summary".into(),
            ));
        }
        Ok(text)
    }
}
