//! The Anthropic Messages API provider: the body forkd serialized, POSTed unchanged to
//! `/v1/messages`, its SSE stream read into [`StreamEvent`]s.
//!
//! The body is never parsed or re-encoded here: prompt caching matches prefixes byte for byte, so
//! the bytes that leave are the bytes forkd built. Failures before the first event (429, 529,
//! 5xx, refused connections, a stream cut before it said anything) are retried inside the
//! provider with jittered exponential backoff, honouring `retry-after`; a stream cut after events
//! were yielded is a [`ProviderError::Stream`] for the caller, which re-requests the turn.
//!
//! The HTTP plumbing and the retry policy in this module's children are shared with the
//! `openai` provider.

pub(crate) mod http;
mod retry;
mod sse;

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use reqwest::header::{ACCEPT, CONTENT_TYPE};

pub use retry::RetryPolicy;
pub(crate) use retry::retrying;

use crate::{EventStream, ModelRequest, Provider, ProviderError, StreamEvent};

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
    pub retry: RetryPolicy,
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
            .field("retry", &self.retry)
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
            retry: RetryPolicy::default(),
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

/// The Messages API provider. Clones share one connection pool.
#[derive(Debug, Clone)]
pub struct AnthropicProvider {
    client: reqwest::Client,
    endpoint: String,
    config: std::sync::Arc<AnthropicConfig>,
}

impl AnthropicProvider {
    pub fn new(config: AnthropicConfig) -> Result<Self, ConfigError> {
        let base = http::base_url("base_url", &config.base_url)?;
        Ok(Self {
            client: http::client(config.connect_timeout, config.read_timeout)?,
            endpoint: format!("{base}/v1/messages"),
            config: std::sync::Arc::new(config),
        })
    }

    /// Sends the request, retrying, until its response yields a first event.
    async fn open(&self, body: Bytes) -> Result<(StreamEvent, sse::Reader), ProviderError> {
        retrying("anthropic", &self.config.retry, || {
            self.attempt(body.clone())
        })
        .await
    }

    /// One attempt: send, check the status, read up to the first event.
    async fn attempt(&self, body: Bytes) -> Result<(StreamEvent, sse::Reader), ProviderError> {
        let response = self
            .client
            .post(&self.endpoint)
            .header("x-api-key", &self.config.api_key)
            .header("anthropic-version", &self.config.version)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "text/event-stream")
            .body(body)
            .send()
            .await
            .map_err(|e| http::transport_error(&e))?;
        if !response.status().is_success() {
            return Err(http::status_error(response).await);
        }
        http::expect_event_stream(&response)?;
        let mut reader = sse::Reader::new(response);
        match reader.next().await? {
            Some(first) => Ok((first, reader)),
            None => Err(ProviderError::Stream(
                "the response ended before its first event".into(),
            )),
        }
    }
}

/// The rest of a response after its first event: every event up to `message_stop`, or the
/// error that ended it. Nothing is retried here: the caller has already seen events.
fn rest(first: StreamEvent, reader: sse::Reader) -> EventStream {
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
    futures::stream::once(async move { Ok(first) })
        .chain(tail)
        .boxed()
}

impl Provider for AnthropicProvider {
    fn name(&self) -> &'static str {
        "anthropic"
    }

    fn stream(&self, request: ModelRequest) -> EventStream {
        let this = self.clone();
        let body = http::body_bytes(&request.body);
        // Lazy: nothing is sent until the stream is polled, and dropping it cancels the request.
        futures::stream::once(async move { this.open(body).await })
            .flat_map(|opened| match opened {
                Ok((first, reader)) => rest(first, reader),
                Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
            })
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
}
