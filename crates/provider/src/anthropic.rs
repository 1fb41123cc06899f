//! The Anthropic Messages API provider: the body forkd serialized, POSTed unchanged to
//! `/v1/messages`, its SSE stream read into [`StreamEvent`]s.
//!
//! The body is never parsed or re-encoded here: prompt caching matches prefixes byte for byte, so
//! the bytes that leave are the bytes forkd built. Each request is one attempt: a failure (429,
//! 529, 5xx, a refused connection, a cut stream) goes to the caller, whose limiter decides when
//! to ask again. The response's `anthropic-ratelimit-*` headers come first in the stream, as a
//! [`StreamEvent::RateLimits`].
//!
//! Servers that emulate the API are spoken to as they are. llama.cpp's `llama-server`, for one,
//! answers as its own model whatever the request names (logged once, and kept in
//! [`AnthropicProvider::served_model`]; prices and statistics stay with the session's model),
//! never reports `cache_creation_input_tokens` (zero), sends its error bodies in the OpenAI shape
//! and its stream errors as bare error objects (both read, see `http` and `sse`), and answers 500
//! to a request it cannot template (the engine's limiter retries a plain 500 only a little).
//!
//! [`Provider::count_tokens`] asks the server's `/v1/messages/count_tokens`; where the server
//! has none (404, 405, 501), the local estimate answers, and the endpoint is not asked again.
//!
//! The HTTP plumbing in this module's children is shared with the `openai` provider.

pub(crate) mod http;
mod sse;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::{
    CountSource, Credential, EventStream, ModelRequest, Provider, ProviderError, RateLimits,
    StreamEvent, TokenCount,
};

/// Where the API is when `ANTHROPIC_BASE_URL` is unset.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The `anthropic-version` header forkd speaks.
pub const API_VERSION: &str = "2023-06-01";

/// A provider's configuration that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{0} is not set")]
    Missing(&'static str),
    #[error("{var} is not an http(s) URL: {value:?}")]
    BadUrl { var: &'static str, value: String },
    #[error("the HTTP client could not be built: {0}")]
    Client(String),
}

/// How to reach the Messages API.
#[derive(Clone, PartialEq)]
pub struct AnthropicConfig {
    /// Without `/v1`; requests go to `{base_url}/v1/messages`.
    pub base_url: String,
    pub api_key: String,
    /// The `anthropic-version` header.
    pub version: String,
    pub connect_timeout: Duration,
    /// The longest silence while reading a response. The API pings during long waits, so a
    /// silence this long means the connection is dead.
    pub read_timeout: Duration,
}

impl std::fmt::Debug for AnthropicConfig {
    // The key stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnthropicConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .field("version", &self.version)
            .field("connect_timeout", &self.connect_timeout)
            .field("read_timeout", &self.read_timeout)
            .finish()
    }
}

impl AnthropicConfig {
    /// The defaults with this key: the public API, 10 s to connect, 5 minutes of silence.
    pub fn new(api_key: impl Into<String>) -> Self {
        Self {
            base_url: DEFAULT_BASE_URL.to_owned(),
            api_key: api_key.into(),
            version: API_VERSION.to_owned(),
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(300),
        }
    }

    /// From `ANTHROPIC_API_KEY` (required) and `ANTHROPIC_BASE_URL`.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// As [`from_env`](Self::from_env), reading variables through `var` (tests pass a map
    /// instead of changing the process environment).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let api_key = set("ANTHROPIC_API_KEY").ok_or(ConfigError::Missing("ANTHROPIC_API_KEY"))?;
        let mut config = Self::new(api_key.trim());
        if let Some(base) = set("ANTHROPIC_BASE_URL") {
            config.base_url = http::base_url("ANTHROPIC_BASE_URL", &base)?;
        }
        Ok(config)
    }
}

/// The Messages API provider. Clones share one connection pool, and what they learned about the
/// server.
#[derive(Debug, Clone)]
pub struct AnthropicProvider {
    client: reqwest::Client,
    endpoint: String,
    count_endpoint: String,
    config: Arc<AnthropicConfig>,
    server: Arc<ServerFacts>,
}

/// What the responses told about the server.
#[derive(Debug, Default)]
struct ServerFacts {
    /// The model the last response named, when it differed from the request's.
    served_model: Mutex<Option<String>>,
    /// The server answered `count_tokens` with "no such endpoint": estimate locally from now on.
    no_count_endpoint: AtomicBool,
}

/// The fields of a Messages request that `count_tokens` takes; the API refuses the others
/// (`max_tokens`, `stream`, `temperature`, `metadata`, …).
const COUNT_FIELDS: [&str; 7] = [
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "mcp_servers",
];

#[derive(Deserialize)]
struct CountReply {
    input_tokens: u64,
}

impl AnthropicProvider {
    pub fn new(config: AnthropicConfig) -> Result<Self, ConfigError> {
        let base = http::base_url("base_url", &config.base_url)?;
        Ok(Self {
            client: http::client(config.connect_timeout, config.read_timeout)?,
            endpoint: format!("{base}/v1/messages"),
            count_endpoint: format!("{base}/v1/messages/count_tokens"),
            config: Arc::new(config),
            server: Arc::default(),
        })
    }

    /// The model the server last said answered, when that was not the model requested (a
    /// local server serves its own model under its own name); `None` while they agree.
    pub fn served_model(&self) -> Option<String> {
        self.server
            .served_model
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Notes the model a response named. A different name than requested is fine (the server
    /// decides what runs); it is logged once per name, since costs and cache statistics are
    /// still reckoned with the requested model's prices.
    fn note_model(&self, requested: &str, served: Option<&str>) {
        let Some(served) = served.filter(|s| !s.is_empty() && *s != requested) else {
            return;
        };
        let mut last = self
            .server
            .served_model
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if last.as_deref() != Some(served) {
            tracing::info!(
                requested,
                served,
                "The server answers with another model than requested; prices and cache \
                 statistics use the requested model's"
            );
            *last = Some(served.to_owned());
        }
    }

    /// Sends the request and reads its response up to the first event; the limits its headers
    /// stated come with it.
    async fn open(
        &self,
        model: &str,
        body: Bytes,
    ) -> Result<(RateLimits, StreamEvent, sse::Reader), ProviderError> {
        let opened = self.attempt(body).await?;
        self.note_model(model, opened.2.model());
        Ok(opened)
    }

    fn post(&self, url: &str, body: Bytes) -> reqwest::RequestBuilder {
        self.client
            .post(url)
            .header("x-api-key", &self.config.api_key)
            .header("anthropic-version", &self.config.version)
            .header(CONTENT_TYPE, "application/json")
            .body(body)
    }

    /// One attempt: send, check the status, read up to the first event.
    async fn attempt(
        &self,
        body: Bytes,
    ) -> Result<(RateLimits, StreamEvent, sse::Reader), ProviderError> {
        let response = self
            .post(&self.endpoint, body)
            .header(ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(|e| http::transport_error(&e))?;
        if !response.status().is_success() {
            return Err(http::status_error(response).await);
        }
        http::expect_event_stream(&response)?;
        let headers = response.headers();
        let limits = RateLimits::from_anthropic(
            |name| headers.get(name).and_then(|v| v.to_str().ok()),
            std::time::SystemTime::now(),
        );
        let mut reader = sse::Reader::new(response);
        match reader.next().await? {
            Some(first) => Ok((limits, first, reader)),
            None => Err(ProviderError::Stream(
                "the response ended before its first event".into(),
            )),
        }
    }

    /// The server's count of a request's input tokens; `Ok(None)` when it has no such endpoint.
    async fn count_remote(&self, body: &str) -> Result<Option<u64>, ProviderError> {
        if self.server.no_count_endpoint.load(Ordering::Relaxed) {
            return Ok(None);
        }
        // One attempt: a count that fails leaves the decision to forkd's estimate.
        self.count_attempt(Bytes::from(count_body(body)?)).await
    }

    async fn count_attempt(&self, body: Bytes) -> Result<Option<u64>, ProviderError> {
        let response = self
            .post(&self.count_endpoint, body)
            .header(ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| http::transport_error(&e))?;
        let status = response.status().as_u16();
        if matches!(status, 404 | 405 | 501) {
            tracing::info!(
                status,
                endpoint = %self.count_endpoint,
                "The server does not count tokens; forkd estimates them locally"
            );
            self.server.no_count_endpoint.store(true, Ordering::Relaxed);
            return Ok(None);
        }
        if !response.status().is_success() {
            return Err(http::status_error(response).await);
        }
        let text = response
            .text()
            .await
            .map_err(|e| http::transport_error(&e))?;
        let reply: CountReply = serde_json::from_str(&text).map_err(|e| {
            ProviderError::Stream(format!("unreadable count_tokens answer {text:?}: {e}"))
        })?;
        Ok(Some(reply.input_tokens))
    }
}

/// A Messages request body cut down to what `count_tokens` accepts. Each kept field's bytes are
/// copied as they are; only the object around them is new (this request is not cached).
fn count_body(body: &str) -> Result<String, ProviderError> {
    let fields: BTreeMap<String, &RawValue> = serde_json::from_str(body)
        .map_err(|e| ProviderError::InvalidRequest(format!("the request body: {e}")))?;
    let kept: BTreeMap<&str, &RawValue> = fields
        .iter()
        .filter(|(k, _)| COUNT_FIELDS.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    serde_json::to_string(&kept).map_err(|e| ProviderError::InvalidRequest(e.to_string()))
}

/// The rest of a response after its first event: every event up to `message_stop`, or the
/// error that ended it. Nothing is retried here: the caller has already seen events.
fn rest(limits: RateLimits, first: StreamEvent, reader: sse::Reader) -> EventStream {
    let more = (first != StreamEvent::MessageStop).then_some(reader);
    let tail = futures::stream::unfold(more, |reader| async move {
        let mut reader = reader?;
        let (item, next) = match reader.next().await {
            Ok(Some(StreamEvent::MessageStop)) => (Ok(StreamEvent::MessageStop), None),
            Ok(Some(event)) => (Ok(event), Some(reader)),
            Ok(None) => (
                Err(ProviderError::Stream(
                    "the response ended before message_stop".into(),
                )),
                None,
            ),
            Err(e) => (Err(e), None),
        };
        Some((item, next))
    });
    let head = (!limits.is_empty()).then_some(Ok(StreamEvent::RateLimits(limits)));
    futures::stream::iter(head)
        .chain(futures::stream::once(async move { Ok(first) }))
        .chain(tail)
        .boxed()
}

impl Provider for AnthropicProvider {
    fn name(&self) -> &'static str {
        "anthropic"
    }

    fn credential(&self) -> Credential {
        Credential::new(
            self.name(),
            &self.config.base_url,
            Some(&self.config.api_key),
        )
    }

    fn stream(&self, request: ModelRequest) -> EventStream {
        let this = self.clone();
        let body = http::body_bytes(&request.body);
        // Lazy: nothing is sent until the stream is polled, and dropping it cancels the request.
        futures::stream::once(async move { this.open(&request.model, body).await })
            .flat_map(|opened| match opened {
                Ok((limits, first, reader)) => rest(limits, first, reader),
                Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
            })
            .boxed()
    }

    /// Until the server has said it has no `count_tokens` endpoint.
    fn counts_tokens(&self) -> bool {
        !self.server.no_count_endpoint.load(Ordering::Relaxed)
    }

    /// The server's count (`/v1/messages/count_tokens`: the model's own tokenizer and chat
    /// template), or the local estimate where the server has no such endpoint.
    fn count_tokens(
        &self,
        request: ModelRequest,
    ) -> BoxFuture<'static, Result<TokenCount, ProviderError>> {
        let this = self.clone();
        async move {
            match this.count_remote(&request.body).await? {
                Some(input_tokens) => Ok(TokenCount {
                    input_tokens,
                    source: CountSource::Provider,
                }),
                None => crate::estimate(&request),
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_from_vars() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            AnthropicConfig::from_vars(vars(&[])),
            Err(ConfigError::Missing("ANTHROPIC_API_KEY"))
        );
        let config = AnthropicConfig::from_vars(vars(&[
            ("ANTHROPIC_API_KEY", "sk-1"),
            ("ANTHROPIC_BASE_URL", "http://127.0.0.1:9/"),
        ]));
        assert_eq!(
            config
                .as_ref()
                .map(|c| (c.api_key.as_str(), c.base_url.as_str())),
            Ok(("sk-1", "http://127.0.0.1:9"))
        );
        assert!(config.is_ok_and(|c| !format!("{c:?}").contains("sk-1")));
        let bad = AnthropicConfig::from_vars(vars(&[
            ("ANTHROPIC_API_KEY", "k"),
            ("ANTHROPIC_BASE_URL", "api.anthropic.com"),
        ]));
        assert!(matches!(bad, Err(ConfigError::BadUrl { .. })));
    }

    #[test]
    fn count_bodies_keep_only_what_count_tokens_takes() {
        let body = r#"{"model":"m","max_tokens":9,"stream":true,"system":[{"type":"text","text":"S"}],"tools":[],"messages":[{"role":"user","content":"hi  there"}],"temperature":0.5}"#;
        assert_eq!(
            count_body(body).as_deref(),
            Ok(
                r#"{"messages":[{"role":"user","content":"hi  there"}],"model":"m","system":[{"type":"text","text":"S"}],"tools":[]}"#
            )
        );
        assert!(matches!(
            count_body("[1]"),
            Err(ProviderError::InvalidRequest(_))
        ));
    }
}
