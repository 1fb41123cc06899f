//! The OpenAI-compatible chat-completions provider (OpenAI, vLLM, SGLang, llama.cpp server,
//! Ollama): the Messages API body forkd built is converted into a streaming chat-completions
//! request, and the chunks that come back into Messages-API-shaped events.
//!
//! A direct reqwest client rather than `async-openai`: the conversion already produces the exact
//! JSON to send, and the response must be read chunk by chunk into forkd's events with its cache
//! usage (`prompt_tokens_details.cached_tokens`) and the non-standard fields local servers add
//! (`reasoning_content`, error chunks, calls without an index). A typed SDK would stand between
//! forkd and those bytes, and bring a retry policy of its own where forkd's limiter must be the
//! one place that decides when a request goes again.
//!
//! Events are yielded as the chunks arrive (see `chunks`): `MessageStart` with the first chunk,
//! with zero usage, and the whole usage in the closing `MessageDelta`, since chat completions
//! report it last. As in the `anthropic` provider, each request is one attempt, its
//! `x-ratelimit-*` headers yielded first as a [`StreamEvent::RateLimits`]; failures go to the
//! caller: an error status with its `retry-after`, a refused connection as
//! [`ProviderError::Unreachable`], a cut or unreadable stream as [`ProviderError::Stream`], an
//! error chunk as the status it names.

mod chunks;
mod convert;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};

use crate::anthropic::{ConfigError, http};
use crate::{
    Credential, EventStream, ModelRequest, Provider, ProviderError, RateLimits, StreamEvent,
};

/// Where the API is when `OPENAI_BASE_URL` is unset.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// How to reach a chat-completions server.
#[derive(Clone, PartialEq)]
pub struct OpenAiConfig {
    /// Including any version path; requests go to `{base_url}/chat/completions`.
    pub base_url: String,
    /// Sent as a bearer token; local servers often need none.
    pub api_key: Option<String>,
    /// Replaces the model named in the body: forkd's sessions name Anthropic models, which an
    /// OpenAI-compatible server does not serve.
    pub model: Option<String>,
    /// Sends a `prompt_cache_key` (a hash of the tools and system bytes) so that siblings are
    /// routed to the same cache. Servers that reject unknown fields need it off.
    pub prompt_cache_key: bool,
    pub connect_timeout: Duration,
    /// The longest silence while reading a response (a local server prefilling a long prompt
    /// says nothing until its first token).
    pub read_timeout: Duration,
}

impl std::fmt::Debug for OpenAiConfig {
    // The key stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("prompt_cache_key", &self.prompt_cache_key)
            .field("connect_timeout", &self.connect_timeout)
            .field("read_timeout", &self.read_timeout)
            .finish()
    }
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        Self {
            base_url: DEFAULT_BASE_URL.to_owned(),
            api_key: None,
            model: None,
            prompt_cache_key: true,
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(300),
        }
    }
}

impl OpenAiConfig {
    /// From `OPENAI_BASE_URL`, `OPENAI_API_KEY` and `OPENAI_MODEL`, all optional.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// As [`from_env`](Self::from_env), reading variables through `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let set = |name: &str| {
            var(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let mut config = Self {
            api_key: set("OPENAI_API_KEY"),
            model: set("OPENAI_MODEL"),
            ..Self::default()
        };
        if let Some(base) = set("OPENAI_BASE_URL") {
            config.base_url = http::base_url("OPENAI_BASE_URL", &base)?;
        }
        Ok(config)
    }
}

/// The chat-completions provider. Clones share one connection pool.
#[derive(Debug, Clone)]
pub struct OpenAiProvider {
    client: reqwest::Client,
    endpoint: String,
    config: Arc<OpenAiConfig>,
}

impl OpenAiProvider {
    pub fn new(config: OpenAiConfig) -> Result<Self, ConfigError> {
        let base = http::base_url("base_url", &config.base_url)?;
        Ok(Self {
            client: http::client(config.connect_timeout, config.read_timeout)?,
            endpoint: format!("{base}/chat/completions"),
            config: Arc::new(config),
        })
    }

    /// Converts, then sends once and reads up to the response's first events (the limits its
    /// headers stated first, when it stated any).
    async fn open(&self, body: &str) -> Result<(Vec<StreamEvent>, Reader), ProviderError> {
        let options = convert::Options {
            model: self.config.model.clone(),
            prompt_cache_key: self.config.prompt_cache_key,
        };
        let converted = Bytes::from(convert::convert(body, &options)?);
        self.attempt(converted).await
    }

    /// One attempt: send, check the status, read up to the first events.
    async fn attempt(&self, body: Bytes) -> Result<(Vec<StreamEvent>, Reader), ProviderError> {
        let mut request = self
            .client
            .post(&self.endpoint)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "text/event-stream");
        if let Some(key) = &self.config.api_key {
            request = request.header(AUTHORIZATION, format!("Bearer {key}"));
        }
        let response = request
            .body(body)
            .send()
            .await
            .map_err(|e| http::transport_error(&e))?;
        if !response.status().is_success() {
            return Err(http::status_error(response).await);
        }
        http::expect_event_stream(&response)?;
        let headers = response.headers();
        let limits =
            RateLimits::from_openai(|name| headers.get(name).and_then(|v| v.to_str().ok()));
        let mut reader = Reader {
            events: Box::pin(response.bytes_stream().eventsource()),
            draft: chunks::Draft::default(),
        };
        match reader.next().await? {
            Some(first) => {
                let head = (!limits.is_empty()).then_some(StreamEvent::RateLimits(limits));
                Ok((head.into_iter().chain(first).collect(), reader))
            }
            None => Err(ProviderError::Stream(
                "the response ended before its first event".into(),
            )),
        }
    }
}

type Events = Pin<
    Box<
        dyn Stream<Item = Result<eventsource_stream::Event, EventStreamError<reqwest::Error>>>
            + Send,
    >,
>;

/// One response's events, as its chunks arrive.
struct Reader {
    events: Events,
    draft: chunks::Draft,
}

impl Reader {
    /// The events that the next chunks make known (never none); `Ok(None)` once the response
    /// is complete.
    async fn next(&mut self) -> Result<Option<Vec<StreamEvent>>, ProviderError> {
        while !self.draft.finished() {
            let events = match self.events.next().await {
                Some(item) => {
                    let event = item.map_err(|e| match e {
                        EventStreamError::Transport(e) => http::transport_error(&e),
                        other => ProviderError::Stream(format!("malformed event stream: {other}")),
                    })?;
                    self.draft.push(&event.data)?
                }
                None => self.draft.end()?,
            };
            if !events.is_empty() {
                return Ok(Some(events));
            }
        }
        Ok(None)
    }
}

/// The rest of a response after its first events, up to `MessageStop` or the error that ended
/// it. Nothing is retried here: the caller has already seen events.
fn rest(reader: Reader) -> EventStream {
    futures::stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        let (items, next) = match reader.next().await {
            Ok(Some(events)) => (events.into_iter().map(Ok).collect(), Some(reader)),
            Ok(None) => return None,
            Err(e) => (vec![Err(e)], None),
        };
        Some((futures::stream::iter::<Vec<_>>(items), next))
    })
    .flatten()
    .boxed()
}

impl Provider for OpenAiProvider {
    fn name(&self) -> &'static str {
        "openai"
    }

    fn credential(&self) -> Credential {
        Credential::new(
            self.name(),
            &self.config.base_url,
            self.config.api_key.as_deref(),
        )
    }

    fn stream(&self, request: ModelRequest) -> EventStream {
        let this = self.clone();
        // Lazy: nothing is sent until the stream is polled, and dropping it cancels the request.
        futures::stream::once(async move { this.open(&request.body).await })
            .flat_map(|opened| match opened {
                Ok((first, reader)) => futures::stream::iter(first.into_iter().map(Ok))
                    .chain(rest(reader))
                    .boxed(),
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
        let none = OpenAiConfig::from_vars(|_| None);
        assert_eq!(none, Ok(OpenAiConfig::default()));
        let local = OpenAiConfig::from_vars(|name| match name {
            "OPENAI_BASE_URL" => Some("http://127.0.0.1:8000/v1/".into()),
            "OPENAI_API_KEY" => Some("  ".into()),
            "OPENAI_MODEL" => Some("qwen2.5".into()),
            _ => None,
        });
        assert!(
            local
                .as_ref()
                .is_ok_and(|c| c.base_url == "http://127.0.0.1:8000/v1"
                    && c.api_key.is_none()
                    && c.model.as_deref() == Some("qwen2.5"))
        );
        let secret = OpenAiConfig {
            api_key: Some("sk-secret".into()),
            ..OpenAiConfig::default()
        };
        assert!(!format!("{secret:?}").contains("sk-secret"));
    }
}
