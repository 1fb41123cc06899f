//! Context windows: no request is sent that would not fit its model's window (input tokens plus
//! `max_tokens`, less a margin), and a client's batch whose children would not fit is refused
//! before any request. Windows come from the price table and the configuration's `[models]`.
//!
//! forkd's count is an estimate (o200k_base), so it keeps a 2 % margin. Near the edge — within
//! 5 % of the window — a provider that counts tokens itself (`/v1/messages/count_tokens`) is
//! asked, and its count is held against the whole window: one extra request, only for the
//! requests where the estimate could be wrong about the answer.
//!
//! Counting a 100k-token request costs milliseconds (its JSON read again, every long text hashed
//! for the token memo), so counts are avoided where they can be: a body shorter in bytes than the
//! room left fits (a token covers at least one byte), and a session's history is counted once
//! per message — transcripts are append-only, so a message's count never changes. A fork child's
//! and a parent turn's requests are checked from those counts; only a body without them (a typed
//! agent's) is counted whole, and only when it is big.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use forkd_core::pricing::Models;
use forkd_core::request::{self, Conversation};
use forkd_core::session::{CacheSafeParams, Session};
use forkd_core::store::Store;
use forkd_core::{Block, Message, SessionId};
use forkd_provider::{CountSource, ModelRequest, Provider, TokenCount, tokens};

use crate::error::{EngineError, Result};

/// The share of a context window kept free: forkd's token count is an estimate of the model's.
pub(crate) const WINDOW_MARGIN: f64 = 0.02;

/// The most sessions whose counts are kept; past it the counts start over (they are a cache).
const MAX_SESSIONS: usize = 10_000;

/// The context-window checks, and the token counts of sessions' transcripts (as the sim and
/// the estimate count them) that keep them cheap.
pub(crate) struct Window {
    store: Arc<dyn Store>,
    /// Asked for its own count near the edge, when it has one.
    provider: Arc<dyn Provider>,
    /// Where the windows come from.
    models: Models,
    counts: Mutex<HashMap<SessionId, SessionCounts>>,
}

struct SessionCounts {
    /// The request's head: its tools and system prompt.
    head: u64,
    /// `prefix[k]`: the tokens of the transcript's first `k + 1` messages.
    prefix: Vec<u64>,
}

/// Where a request's estimate counts as near the edge of its room: within this share of the
/// window, a provider that counts tokens itself is asked (the estimate is not its tokenizer).
const NEAR_EDGE: f64 = 0.05;

/// The room a request's input has in its model's window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Room {
    window: u64,
    max_tokens: u64,
}

impl Room {
    /// The window less the margin kept for an estimate.
    fn usable(self) -> u64 {
        self.window - (self.window as f64 * WINDOW_MARGIN) as u64
    }

    /// The input tokens an estimate may reach.
    fn for_estimate(self) -> u64 {
        self.usable().saturating_sub(self.max_tokens)
    }

    /// The input tokens the model's own count may reach: no margin, it is exact.
    fn for_exact(self) -> u64 {
        self.window.saturating_sub(self.max_tokens)
    }

    /// Whether an estimate is close enough to its limit (over it included) that the
    /// provider's own count should decide.
    pub(crate) fn near_edge(self, estimate: u64) -> bool {
        estimate + (self.window as f64 * NEAR_EDGE) as u64 > self.for_estimate()
    }

    fn refuse(self, model: &str, input_tokens: u64, usable: u64) -> EngineError {
        EngineError::ContextWindow {
            model: model.to_owned(),
            input_tokens,
            max_tokens: self.max_tokens,
            usable,
            window: self.window,
        }
    }

    pub(crate) fn check_estimate(self, model: &str, input_tokens: u64) -> Result<()> {
        if input_tokens > self.for_estimate() {
            return Err(self.refuse(model, input_tokens, self.usable()));
        }
        Ok(())
    }

    fn check_count(self, model: &str, count: TokenCount) -> Result<()> {
        match count.source {
            CountSource::Provider if count.input_tokens > self.for_exact() => {
                Err(self.refuse(model, count.input_tokens, self.window))
            }
            CountSource::Provider => Ok(()),
            CountSource::Estimate => self.check_estimate(model, count.input_tokens),
        }
    }
}

pub(crate) fn block_tokens(block: &Block) -> u64 {
    tokens::block_tokens(block.raw().as_str())
}

pub(crate) fn message_tokens(message: &Message) -> u64 {
    message.blocks.iter().map(block_tokens).sum()
}

impl Window {
    pub(crate) fn new(store: Arc<dyn Store>, provider: Arc<dyn Provider>, models: Models) -> Self {
        Self {
            store,
            provider,
            models,
            counts: Mutex::default(),
        }
    }

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

    /// Whether the provider counts tokens itself (then it decides near the edge).
    pub(crate) fn provider_counts(&self) -> bool {
        self.provider.counts_tokens()
    }

    /// The room of a request on these params; `None` for a model nobody told forkd the window
    /// of (not in the price table, nor in `[models]` of the configuration), which is not checked.
    pub(crate) fn room(&self, params: &CacheSafeParams) -> Option<Room> {
        let window = self.models.get(&params.model)?.context_window;
        Some(Room {
            window,
            max_tokens: u64::from(params.max_tokens),
        })
    }

    /// Checks that a request fits its model's window before it is sent. `estimate` is its
    /// input tokens when the caller knows them from the counts kept; otherwise the body is
    /// counted, and only when it is big (a token covers at least one byte). Near the edge, a
    /// provider with its own count decides, against the window without the margin.
    pub(crate) async fn check_request(
        &self,
        params: &CacheSafeParams,
        body: &str,
        estimate: Option<u64>,
    ) -> Result<()> {
        let Some(room) = self.room(params) else {
            return Ok(());
        };
        let estimate = match estimate {
            Some(tokens) => tokens,
            None if (body.len() as u64) <= room.for_estimate() => return Ok(()),
            None => tokens::request_input_tokens(body)?,
        };
        self.check_near_edge(room, params, estimate, || body.to_owned())
            .await
    }

    /// Refuses an estimate over the room; near the edge, asks a provider that counts tokens
    /// itself (the request body comes from `body`, built only then).
    pub(crate) async fn check_near_edge(
        &self,
        room: Room,
        params: &CacheSafeParams,
        estimate: u64,
        body: impl FnOnce() -> String,
    ) -> Result<()> {
        let provider = &self.provider;
        if !room.near_edge(estimate) || !provider.counts_tokens() {
            return room.check_estimate(&params.model, estimate);
        }
        let request = ModelRequest {
            model: params.model.clone(),
            body: body().into(),
        };
        match provider.count_tokens(request).await {
            Ok(count) => room.check_count(&params.model, count),
            Err(e) => {
                tracing::warn!(error = %e, "the provider could not count a request's tokens; \
                    deciding on the estimate");
                room.check_estimate(&params.model, estimate)
            }
        }
    }

    fn token_counts(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, SessionCounts>> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
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
                head + (all - before) + message_tokens(summary)
            }
            None => all,
        })
    }
}

/// The tokens of a request's tools and system prompt: a request with one empty text message,
/// less that message.
pub(crate) fn head_tokens(params: &CacheSafeParams) -> Result<u64> {
    let probe = Message::user(vec![Block::text("")]);
    let probe_tokens = message_tokens(&probe);
    let body = request::serialize(params, &Conversation::plain(vec![probe]), false).body;
    Ok(tokens::request_input_tokens(&body)?.saturating_sub(probe_tokens))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use forkd_core::fork::ForkBatch;
    use forkd_core::pricing;
    use forkd_core::session::{RenderedSystem, ToolsJson};
    use forkd_core::{BatchId, Directive};
    use forkd_provider::ProviderError;

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

    /// Counts every request as `count` tokens with the model's own tokenizer, and says how
    /// often it was asked.
    struct Counting {
        count: u64,
        own_count: bool,
        asked: std::sync::atomic::AtomicU32,
    }

    impl forkd_provider::Provider for Counting {
        fn name(&self) -> &'static str {
            "counting"
        }

        fn stream(&self, _: ModelRequest) -> forkd_provider::EventStream {
            Box::pin(futures::stream::empty())
        }

        fn counts_tokens(&self) -> bool {
            self.own_count
        }

        fn count_tokens(
            &self,
            _: ModelRequest,
        ) -> futures::future::BoxFuture<'static, std::result::Result<TokenCount, ProviderError>>
        {
            self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let count = TokenCount {
                input_tokens: self.count,
                source: CountSource::Provider,
            };
            Box::pin(async move { Ok(count) })
        }
    }

    /// A configured model's window is the one checked; near its edge the provider's own count
    /// decides, both ways; far from it, or for a provider without a count, nothing is asked.
    #[tokio::test]
    async fn near_the_edge_the_providers_own_count_decides() {
        let local = pricing::ModelSpec {
            name: "local-llama".into(),
            input_per_mtok: 0.0,
            output_per_mtok: 0.0,
            min_cache_tokens: 1024,
            context_window: 10_000,
        };
        let p = CacheSafeParams {
            model: "local-llama".into(),
            max_tokens: 1_000,
            ..params()
        };
        // The estimate may reach 8_800 (10_000 less 2 % less max_tokens), an exact count 9_000.
        let engine = |count, own_count| {
            let local = local.clone();
            async move {
                let provider = Arc::new(Counting {
                    count,
                    own_count,
                    asked: Default::default(),
                });
                let models = pricing::Models::default().with(local);
                let store = forkd_store::SqliteStore::open_in_memory().await.unwrap();
                let window = Window::new(Arc::new(store), provider.clone(), models);
                (window, provider)
            }
        };
        let asked = |p: &Counting| p.asked.load(std::sync::atomic::Ordering::SeqCst);

        // Over the estimate's room, within the exact one: the provider's count lets it go.
        let (e, counting) = engine(8_950, true).await;
        e.check_request(&p, "{}", Some(8_900)).await.unwrap();
        assert_eq!(asked(&counting), 1);
        // Far below the edge: nobody is asked.
        e.check_request(&p, "{}", Some(5_000)).await.unwrap();
        assert_eq!(asked(&counting), 1);

        // Under the estimate's room, but the model counts more than the window holds.
        let (e, counting) = engine(9_500, true).await;
        let err = e.check_request(&p, "{}", Some(8_700)).await.unwrap_err();
        assert_eq!(asked(&counting), 1);
        let text = err.to_string();
        assert!(
            text.contains("9500 input tokens + 1000 max_tokens > 10000"),
            "{text}"
        );

        // A provider without its own count: the estimate and its margin decide.
        let (e, counting) = engine(0, false).await;
        assert!(e.check_request(&p, "{}", Some(8_900)).await.is_err());
        e.check_request(&p, "{}", Some(8_800)).await.unwrap();
        assert_eq!(asked(&counting), 0);

        // A model nobody gave a window is not checked.
        let unknown = CacheSafeParams {
            model: "gpt-2".into(),
            ..p.clone()
        };
        e.check_request(&unknown, "{}", Some(u64::MAX))
            .await
            .unwrap();
    }

    #[test]
    fn estimates_keep_a_margin_and_exact_counts_do_not() {
        let room = Room {
            window: 200_000,
            max_tokens: 8192,
        };
        assert_eq!(room.for_estimate(), 196_000 - 8192);
        assert!(room.check_estimate("m", room.for_estimate()).is_ok());
        let over = room
            .check_estimate("m", room.for_estimate() + 1)
            .unwrap_err();
        assert!(over.to_string().contains("200000-token window"), "{over}");
        // The provider's own count is the model's: it may use the margin an estimate keeps.
        let exact = |input_tokens| TokenCount {
            input_tokens,
            source: CountSource::Provider,
        };
        assert!(
            room.check_count("m", exact(room.for_estimate() + 1))
                .is_ok()
        );
        assert!(room.check_count("m", exact(room.for_exact())).is_ok());
        let over = room
            .check_count("m", exact(room.for_exact() + 1))
            .unwrap_err();
        assert!(over.to_string().contains("> 200000 of its"), "{over}");
        // An estimate counted by the provider's fallback keeps the margin.
        let estimated = TokenCount {
            input_tokens: room.for_estimate() + 1,
            source: CountSource::Estimate,
        };
        assert!(room.check_count("m", estimated).is_err());
        // Near the edge is within 5 % of the window below the limit, and past it.
        assert!(room.near_edge(room.for_estimate() - 9_000));
        assert!(room.near_edge(room.for_estimate() + 1));
        assert!(!room.near_edge(room.for_estimate() - 11_000));
    }
}
