//! The user's message of a turn: stored once, with its idempotency key when the client gave one,
//! so a client that retries after `UNAVAILABLE` never stores its message twice.

use super::Turns;
use forkd_core::Message;
use forkd_core::request::fingerprint;
use forkd_core::session::Session;
use forkd_core::store::{IdempotencyRecord, IdempotentCall, Lease};
use std::sync::Arc;

use crate::clock::now_ms;
use crate::error::{EngineError, Result};
use crate::tenancy::Idempotent;

/// What storing a turn's user message found.
pub(super) enum Stored {
    /// The message is stored now, at `seq`.
    New { seq: u64 },
    /// An earlier call with the same key stored it, at `seq`; `reply` ended its turn, if that
    /// turn has ended.
    Earlier { seq: u64, reply: Option<String> },
}

impl Turns {
    /// Stores the user's message of a turn: once per idempotency key when the client gave one.
    /// `prepare` makes the message from `text` (its hooks run there), only when it is stored
    /// now; the key's digest is of `text` alone, whatever the hooks add.
    pub(super) async fn store_message<F, Fut>(
        self: &Arc<Self>,
        session: &Session,
        lease: &Lease,
        text: &str,
        prepare: F,
        idempotency_key: Option<String>,
    ) -> Result<Stored>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Message>>,
    {
        match idempotency_key.filter(|k| !k.is_empty()) {
            None => {
                let message = prepare().await?;
                let seq = self.append_user(session, lease, &message, None).await?;
                Ok(Stored::New { seq })
            }
            Some(key) => self.append_keyed(session, lease, text, prepare, &key).await,
        }
    }

    /// Appends the user's message to the transcript (with its idempotency key, if any); returns
    /// its seq.
    async fn append_user(
        self: &Arc<Self>,
        session: &Session,
        lease: &Lease,
        message: &Message,
        idempotency: Option<&mut IdempotencyRecord>,
    ) -> Result<u64> {
        let lock = self.session_locks.get(session.id);
        let _guard = lock.lock().await;
        let store = &self.store;
        let record = match idempotency {
            Some(record) => {
                // The key names the message it stored, by its position: read under the session
                // lock, so no notification can take that position first.
                let seq = store.session_message_count(session.id).await?;
                record.resource_id = format!("{}/{seq}", session.id);
                Some(&*record)
            }
            None => None,
        };
        Ok(store
            .append_user_message(lease, session.id, message, record, now_ms())
            .await?)
    }

    /// Stores the user's message under its idempotency key, or finds the message an earlier
    /// call with the key stored (and its turn's reply, if that turn has ended).
    async fn append_keyed<F, Fut>(
        self: &Arc<Self>,
        session: &Session,
        lease: &Lease,
        text: &str,
        prepare: F,
        key: &str,
    ) -> Result<Stored>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Message>>,
    {
        // The user's message as the client sent it (what keys recorded before hooks came were
        // digests of).
        let sent = Message::user(vec![forkd_core::Block::text(text)]);
        let canonical = serde_json::json!([session.id.to_string(), sent.content_json()]);
        let digest = fingerprint(canonical.to_string().as_bytes());
        let outcome = self
            .tenancy
            .idempotent(
                &session.tenant,
                key,
                IdempotentCall::SendMessage,
                digest,
                String::new(),
                |mut record| async move {
                    let message = prepare().await?;
                    self.append_user(session, lease, &message, Some(&mut record))
                        .await
                },
            )
            .await?;
        match outcome {
            Idempotent::Created(seq) => Ok(Stored::New { seq }),
            Idempotent::Earlier(resource) => self.turn_reply(session.id, &resource).await,
        }
    }

    /// Where a stored user message (`SESSION_ID/SEQ`) is, and the reply that ended its turn, if
    /// that turn has ended.
    async fn turn_reply(
        self: &Arc<Self>,
        session: forkd_core::SessionId,
        resource: &str,
    ) -> Result<Stored> {
        let seq = resource
            .rsplit_once('/')
            .and_then(|(_, seq)| seq.parse::<u64>().ok())
            .ok_or_else(|| {
                EngineError::Invariant(format!("stored message key {resource:?} does not parse"))
            })?;
        let messages = self.store.session_messages(session, None).await?;
        let reply = messages
            .iter()
            .filter(|m| m.seq > seq)
            .map(|m| &m.message)
            .find(|m| m.role == forkd_core::Role::Assistant && m.tool_uses().next().is_none());
        if let Some(reply) = reply {
            return Ok(Stored::Earlier {
                seq,
                reply: Some(reply.text()),
            });
        }
        // A turn whose last reply was empty (and so not stored) ended too.
        let ended = messages
            .last()
            .is_some_and(|m| m.message.role == forkd_core::Role::Assistant);
        Ok(Stored::Earlier {
            seq,
            reply: ended.then(String::new),
        })
    }
}
