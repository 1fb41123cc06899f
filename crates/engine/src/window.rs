//! Context windows: no request is sent that would not fit its model's window (input tokens plus
//! `max_tokens`, less a margin), and a client's batch whose children would not fit is refused
//! before any request.
//!
//! Counting a 100k-token request costs milliseconds (its JSON read again, every long text hashed
//! for the token memo), so counts are avoided where they can be: a body shorter in bytes than the
//! room left fits (a token covers at least one byte), and a session's history is counted once
//! per message — transcripts are append-only, so a message's count never changes. A fork child's
//! and a parent turn's requests are checked from those counts; only a body without them (a typed
//! agent's) is counted whole, and only when it is big.

use std::collections::HashMap;
use std::sync::Mutex;

use forkd_core::fork::ForkBatch;
use forkd_core::pricing;
use forkd_core::request::{self, Conversation};
use forkd_core::session::{CacheSafeParams, Session};
use forkd_core::{BatchId, Block, Directive, Message, SessionId};
use forkd_provider::tokens;

use crate::Engine;
use crate::error::{EngineError, Result};
use crate::run::BatchContext;

/// The share of a context window kept free: forkd's token count is an estimate of the model's.
pub(crate) const WINDOW_MARGIN: f64 = 0.02;

/// The most sessions whose counts are kept; past it the counts start over (they are a cache).
const MAX_SESSIONS: usize = 10_000;

/// Token counts of sessions' transcripts, as the sim and the estimate count them.
#[derive(Default)]
pub(crate) struct TokenCounts(Mutex<HashMap<SessionId, SessionCounts>>);

struct SessionCounts {
    /// The request's head: its tools and system prompt.
    head: u64,
    /// `prefix[k]`: the tokens of the transcript's first `k + 1` messages.
    prefix: Vec<u64>,
}

/// The room a request's input has in its model's window: the window less the margin and
/// `max_tokens`. `None` for a model the price table does not know (nothing says how big its
/// window is), which is not checked.
fn room(params: &CacheSafeParams) -> Option<(u64, u64, u64)> {
    let window = pricing::model(&params.model)?.context_window;
    let usable = window - (window as f64 * WINDOW_MARGIN) as u64;
    Some((
        usable.saturating_sub(u64::from(params.max_tokens)),
        usable,
        window,
    ))
}

/// Checks that `input_tokens` leave room for `max_tokens` in the model's window.
pub(crate) fn check_tokens(params: &CacheSafeParams, input_tokens: u64) -> Result<()> {
    match room(params) {
        Some((room, usable, window)) if input_tokens > room => Err(EngineError::ContextWindow {
            model: params.model.clone(),
            input_tokens,
            max_tokens: u64::from(params.max_tokens),
            usable,
            window,
        }),
        _ => Ok(()),
    }
}

/// Checks that a request body fits its model's window.
pub(crate) fn check_body(params: &CacheSafeParams, body: &str) -> Result<()> {
    match room(params) {
        Some((room, _, _)) if (body.len() as u64) > room => {
            check_tokens(params, tokens::request_input_tokens(body)?)
        }
        _ => Ok(()),
    }
}

pub(crate) fn block_tokens(block: &Block) -> u64 {
    tokens::block_tokens(block.raw().as_str())
}

pub(crate) fn message_tokens(message: &Message) -> u64 {
    message.blocks.iter().map(block_tokens).sum()
}

impl Engine {
    /// The input tokens of a request on the session's params and its first `upto` messages
    /// (`None`: all it has now).
    pub(crate) async fn history_tokens(&self, session: &Session, upto: Option<u64>) -> Result<u64> {
        let upto = upto.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        if let Some(tokens) = upto.and_then(|n| self.counted(session.id, n)) {
            return Ok(tokens);
        }
        // Only the messages not counted yet are read.
        let known = self
            .token_counts()
            .get(&session.id)
            .map_or(0, |c| c.prefix.len());
        let messages = self
            .inner
            .store
            .session_messages_from(session.id, known as u64, upto.map(|n| n as u64))
            .await?;
        let mut counts = self.token_counts();
        if counts.len() >= MAX_SESSIONS {
            counts.clear();
        }
        let entry = match counts.get_mut(&session.id) {
            Some(entry) => entry,
            None => {
                let head = head_tokens(&session.params)?;
                counts.entry(session.id).or_insert(SessionCounts {
                    head,
                    prefix: Vec::new(),
                })
            }
        };
        for stored in &messages {
            // Another call may have counted some meanwhile: each seq is counted once.
            if stored.seq as usize == entry.prefix.len() {
                let before = entry.prefix.last().copied().unwrap_or(0);
                entry.prefix.push(before + message_tokens(&stored.message));
            }
        }
        let body = match upto {
            None => entry.prefix.last().copied().unwrap_or(0),
            Some(0) => 0,
            Some(n) => entry.prefix.get(n - 1).copied().unwrap_or(0),
        };
        Ok(entry.head + body)
    }

    fn counted(&self, session: SessionId, upto: usize) -> Option<u64> {
        let counts = self.token_counts();
        let entry = counts.get(&session)?;
        let body = match upto {
            0 => 0,
            n => *entry.prefix.get(n - 1)?,
        };
        Some(entry.head + body)
    }

    fn token_counts(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, SessionCounts>> {
        self.inner
            .token_counts
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The input tokens of a fork child's next request, from the counts kept for its parent's
    /// history: the shared blocks, its directive and its own messages are all that is counted.
    pub(crate) async fn fork_child_tokens(
        &self,
        ctx: &BatchContext,
        directive: &Block,
        own: &[Message],
    ) -> Result<u64> {
        let history = self
            .history_tokens(&ctx.session, Some(ctx.batch.fork_point))
            .await?;
        let assistant = ctx.batch.assistant().map_or(0, message_tokens);
        let shared: u64 = ctx.batch.shared_user_blocks.iter().map(block_tokens).sum();
        let own: u64 = own.iter().map(message_tokens).sum();
        Ok(history + assistant + shared + block_tokens(directive) + own)
    }

    /// Refuses a client's batch whose children would not fit their model's window, before any
    /// request is made. A child's first request is the parent's history up to the fork point
    /// (`None`: all of it), the boilerplate and its directive: the longest directive stands for
    /// every child.
    pub(crate) async fn check_children_fit(
        &self,
        session: &Session,
        fork_point: Option<u64>,
        directives: &[&Directive],
    ) -> Result<()> {
        let Some(longest) = directives.iter().max_by_key(|d| d.prompt.len()) else {
            return Ok(());
        };
        if room(&session.params).is_none() {
            return Ok(());
        }
        let probe = ForkBatch::client(BatchId::new(), session.id, 0, 0);
        let shared: u64 = probe.shared_user_blocks.iter().map(block_tokens).sum();
        let directive = block_tokens(&ForkBatch::directive_block(longest));
        let history = self.history_tokens(session, fork_point).await?;
        check_tokens(&session.params, history + shared + directive)
    }
}

/// The tokens of a request's tools and system prompt: a request with one empty text message,
/// less that message.
fn head_tokens(params: &CacheSafeParams) -> Result<u64> {
    let probe = Message::user(vec![Block::text("")]);
    let probe_tokens = message_tokens(&probe);
    let body = request::serialize(params, &Conversation::plain(vec![probe]), false).body;
    Ok(tokens::request_input_tokens(&body)?.saturating_sub(probe_tokens))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use forkd_core::session::{RenderedSystem, ToolsJson};

    use super::*;

    fn params() -> CacheSafeParams {
        CacheSafeParams {
            model: "claude-sonnet-4-5".into(),
            system: RenderedSystem::from_stored("You are careful."),
            tools: ToolsJson::builtin(),
            thinking: None,
            max_tokens: 8192,
        }
    }

    /// The per-message counts add up to what the request's own count says, so the cheap path
    /// and the exact one agree.
    #[test]
    fn head_and_messages_add_up_to_the_request() {
        let p = params();
        let messages = vec![
            Message::user(vec![Block::text("context ".repeat(300).as_str())]),
            Message::assistant(vec![Block::text("a reply with \"quotes\" and ünïcode")]),
            Message::user(vec![Block::text("next")]),
        ];
        let body = request::serialize(&p, &Conversation::plain(messages.clone()), false).body;
        let exact = tokens::request_input_tokens(&body).unwrap();
        let cheap = head_tokens(&p).unwrap() + messages.iter().map(message_tokens).sum::<u64>();
        assert_eq!(cheap, exact);
    }

    /// A fork child's request, counted block by block as `fork_child_tokens` does (the
    /// history, the fork message, the shared blocks, the directive, its own messages), is what
    /// its body counts, in both shapes: the count path and the body path agree.
    #[test]
    fn a_fork_childs_count_is_its_bodys() {
        let p = params();
        let history = vec![
            Message::user(vec![Block::text("context ".repeat(300).as_str())]),
            Message::assistant(vec![Block::text("done")]),
            Message::user(vec![Block::text("<task-notification>…")]),
        ];
        let directive = ForkBatch::directive_block(&Directive {
            description: "d".into(),
            prompt: "Review part 1.".into(),
        });
        let own = vec![Message::assistant(vec![Block::text("my report")])];
        let id = BatchId::new();
        let model_fork = fork_message(id);
        for batch in [
            ForkBatch::client(id, SessionId::new(), 3, 0),
            ForkBatch::new(id, SessionId::new(), 3, model_fork, 0).unwrap(),
        ] {
            let conv = batch.child_conversation(&history, &directive, &own);
            let body = request::serialize(&p, &conv, true).body;
            let counted = head_tokens(&p).unwrap()
                + history.iter().map(message_tokens).sum::<u64>()
                + batch.assistant().map_or(0, message_tokens)
                + batch
                    .shared_user_blocks
                    .iter()
                    .map(block_tokens)
                    .sum::<u64>()
                + block_tokens(&directive)
                + own.iter().map(message_tokens).sum::<u64>();
            assert_eq!(counted, tokens::request_input_tokens(&body).unwrap());
        }
    }

    fn fork_message(id: BatchId) -> Message {
        forkd_core::fork::client_fork_message(
            id,
            &[Directive {
                description: "d".into(),
                prompt: "Review part 1.".into(),
            }],
        )
    }

    #[test]
    fn bodies_and_counts_over_the_room_are_refused() {
        let p = params();
        assert!(check_body(&p, "{}").is_ok());
        let (room, _, _) = room(&p).unwrap();
        assert!(check_tokens(&p, room).is_ok());
        let over = check_tokens(&p, room + 1).unwrap_err();
        assert!(over.to_string().contains("200000-token window"), "{over}");
        let unknown = CacheSafeParams {
            model: "local-llama".into(),
            ..params()
        };
        assert!(check_tokens(&unknown, u64::MAX).is_ok());
    }
}
