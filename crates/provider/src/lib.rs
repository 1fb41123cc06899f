//! Model providers behind one streaming interface, and the embedded simulated model.
//!
//! A provider takes a serialized Messages API request body (the exact bytes forkd built) and
//! returns a stream of events shaped like the Messages API's SSE stream. The engine never looks
//! inside a provider; the sim never looks inside the engine.

pub mod accumulate;
pub mod anthropic;
pub mod limits;
pub mod openai;
pub mod sim;
pub mod tokens;

use std::sync::Arc;
use std::time::Duration;

use forkd_core::Usage;
use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;

pub use accumulate::{Accumulator, Completion};
pub use limits::{Quota, RateLimits};

/// One model request: the body bytes exactly as forkd serialized them.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    pub model: String,
    /// The JSON body. Shared, because a large prefix is big and the body is not changed again.
    pub body: Arc<str>,
}

/// The kind of a content block that starts streaming.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockStart {
    Text,
    Thinking,
    ToolUse { id: String, name: String },
}

/// One event of a streamed response, as in the Messages API's SSE stream.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// The limits the response's headers stated (before `MessageStart`, when the provider sent
    /// any). Not part of the message: accumulators and clients pass over it.
    RateLimits(RateLimits),
    /// The response has started. Carries the input side of usage as known at the start
    /// (output_tokens is 0 here); a provider that learns usage only at the end (chat
    /// completions) says zero here and the whole usage in [`StreamEvent::MessageDelta`].
    MessageStart {
        message_id: String,
        usage: Usage,
    },
    BlockStart {
        index: usize,
        block: BlockStart,
    },
    TextDelta {
        index: usize,
        text: String,
    },
    ThinkingDelta {
        index: usize,
        thinking: String,
    },
    SignatureDelta {
        index: usize,
        signature: String,
    },
    InputJsonDelta {
        index: usize,
        partial_json: String,
    },
    BlockStop {
        index: usize,
    },
    /// The final stop reason and output tokens.
    MessageDelta {
        stop_reason: Option<String>,
        output_tokens: u64,
        /// The response's complete usage (input, cache writes and reads, output), when the
        /// provider reports it at the end; it supersedes what `MessageStart` said, and its
        /// `output_tokens` is the response's. `None`: `MessageStart`'s input side stands.
        usage: Option<Usage>,
    },
    MessageStop,
}

impl StreamEvent {
    /// Whether the model has started its output with this event: a content block, or a delta of
    /// one. What precedes it (`MessageStart`) is the provider's, not the model's.
    pub fn starts_output(&self) -> bool {
        matches!(
            self,
            StreamEvent::BlockStart { .. }
                | StreamEvent::TextDelta { .. }
                | StreamEvent::ThinkingDelta { .. }
                | StreamEvent::SignatureDelta { .. }
                | StreamEvent::InputJsonDelta { .. }
        )
    }
}

/// What went wrong with a request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProviderError {
    /// The provider answered with an error status.
    #[error("provider returned {status}: {message}")]
    Status {
        status: u16,
        message: String,
        retry_after: Option<Duration>,
    },
    /// The stream broke off or could not be read.
    #[error("stream failed: {0}")]
    Stream(String),
    /// The provider could not be reached at all: a refused connection, a name that does not
    /// resolve, a TLS handshake that failed. Worth a retry for a short while only: a wrong
    /// base URL must fail fast.
    #[error("provider unreachable: {0}")]
    Unreachable(String),
    /// The request was tried again and again until the caller's patience ran out; `last` is
    /// the provider's last answer, which decides what the failure means.
    #[error(
        "gave up after waiting {waited} for the provider ({why}): {refusals} refused attempts; \
         last: {last}",
        waited = humantime::format_duration(round_secs(*waited))
    )]
    GaveUp {
        why: String,
        waited: Duration,
        refusals: u32,
        last: Box<ProviderError>,
    },
    /// The request was refused before it was sent (malformed body, unknown model).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

/// What a provider's failure means for whoever made the request: whose fault it is, and whether
/// asking again can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The provider limits the daemon's rate (429); `retry_after` is when it said to come back.
    RateLimited { retry_after: Option<Duration> },
    /// The provider is overloaded, down or unreachable (529, 5xx, a refused connection, a cut
    /// stream): the same request may succeed later.
    Unavailable,
    /// The provider refused the daemon's credentials (401, 403): an operator must fix them.
    Unauthorized,
    /// The provider refused the request itself (400 and other 4xx, or a body refused before it
    /// was sent): sending it again cannot help.
    Rejected,
}

impl ProviderError {
    /// What the failure means; see [`FailureKind`]. A 503 that says when to come back
    /// (`retry-after`) is a limit, as gateways and proxies use it (RFC 9110 gives it that
    /// meaning); without one it is an outage. 501 (not implemented) and 505 (HTTP version not
    /// supported) say the server cannot do what was asked: they are rejections.
    pub fn kind(&self) -> FailureKind {
        match self {
            ProviderError::Status {
                status: 429,
                retry_after,
                ..
            } => FailureKind::RateLimited {
                retry_after: *retry_after,
            },
            ProviderError::Status {
                status: 503,
                retry_after: Some(after),
                ..
            } => FailureKind::RateLimited {
                retry_after: Some(*after),
            },
            ProviderError::Status {
                status: 401 | 403, ..
            } => FailureKind::Unauthorized,
            ProviderError::Status { status, .. }
                if *status == 529
                    || ((500..600).contains(status) && !matches!(status, 501 | 505)) =>
            {
                FailureKind::Unavailable
            }
            ProviderError::Status { .. } | ProviderError::InvalidRequest(_) => {
                FailureKind::Rejected
            }
            ProviderError::Stream(_) | ProviderError::Unreachable(_) => FailureKind::Unavailable,
            ProviderError::GaveUp { last, .. } => last.kind(),
        }
    }

    /// Whether the provider refused the request for not fitting its model's context window:
    /// Anthropic's "prompt is too long" (and its "exceed context limit" for input plus
    /// `max_tokens`), OpenAI's `context_length_exceeded`.
    pub fn is_prompt_too_long(&self) -> bool {
        match self {
            ProviderError::Status {
                status: 400 | 413,
                message,
                ..
            } => {
                message.contains("prompt is too long")
                    || message.contains("exceed context limit")
                    || message.contains("context_length_exceeded")
            }
            _ => false,
        }
    }

    /// Whether sending the same request again may succeed (429, 529, 5xx, dropped streams).
    pub fn is_retryable(&self) -> bool {
        !matches!(self, ProviderError::GaveUp { .. })
            && matches!(
                self.kind(),
                FailureKind::RateLimited { .. } | FailureKind::Unavailable
            )
    }
}

/// A wait as shown in messages: whole seconds past a second, else milliseconds.
fn round_secs(d: Duration) -> Duration {
    if d >= Duration::from_secs(1) {
        Duration::from_secs(d.as_secs())
    } else {
        Duration::from_millis(d.as_millis() as u64)
    }
}

/// Who a provider's limits belong to: its kind, where it is, and whose key it uses. With the
/// model, it names one limit (Anthropic's limits are per model class).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Credential {
    pub provider: &'static str,
    /// The base URL, or empty for a provider with no server (the embedded sim).
    pub endpoint: String,
    /// The first bytes of the key's SHA-256, in hex: never the key itself.
    pub key_fingerprint: String,
}

impl Credential {
    pub fn new(provider: &'static str, endpoint: &str, key: Option<&str>) -> Self {
        use sha2::Digest;
        let key_fingerprint = key
            .map(|k| hex::encode(&sha2::Sha256::digest(k.as_bytes())[..6]))
            .unwrap_or_default();
        Self {
            provider,
            endpoint: endpoint.to_owned(),
            key_fingerprint,
        }
    }
}

/// A stream of response events.
pub type EventStream = BoxStream<'static, Result<StreamEvent, ProviderError>>;

/// Who counted a request's input tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountSource {
    /// The provider's own count (`/v1/messages/count_tokens`): the model's tokenizer, with
    /// whatever the server adds around the blocks (a chat template, a tools preamble).
    Provider,
    /// forkd's local estimate ([`tokens::request_input_tokens`], o200k_base): deterministic, and
    /// what the sim reports as usage, but not the model's tokenizer.
    Estimate,
}

/// A request's input tokens, before it is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenCount {
    pub input_tokens: u64,
    pub source: CountSource,
}

/// A model provider.
pub trait Provider: Send + Sync + 'static {
    /// A short name for logs and metrics (`sim`, `anthropic`, …).
    fn name(&self) -> &'static str;

    /// Sends one request; the stream yields its events, or one error.
    fn stream(&self, request: ModelRequest) -> EventStream;

    /// Whose limits the provider's requests count against. Providers make one attempt per
    /// request: waiting and retrying is the caller's (forkd's limiter), which knows what else
    /// is waiting for the same limit.
    fn credential(&self) -> Credential {
        Credential::new(self.name(), "", None)
    }

    /// Whether [`Provider::count_tokens`] asks the model's side (its tokenizer) rather than
    /// returning the local estimate, so that a caller near a limit should ask it.
    fn counts_tokens(&self) -> bool {
        false
    }

    /// Counts the input tokens a request would have, without running it. A provider that can
    /// ask its server does (the `anthropic` provider, through `/v1/messages/count_tokens`, when
    /// the server has that endpoint); the default is the local estimate, which for the sim is
    /// exactly the usage it would report.
    fn count_tokens(
        &self,
        request: ModelRequest,
    ) -> BoxFuture<'static, Result<TokenCount, ProviderError>> {
        futures::future::ready(estimate(&request)).boxed()
    }
}

/// The local estimate of a request's input tokens.
pub(crate) fn estimate(request: &ModelRequest) -> Result<TokenCount, ProviderError> {
    tokens::request_input_tokens(&request.body).map(|input_tokens| TokenCount {
        input_tokens,
        source: CountSource::Estimate,
    })
}

pub use anthropic::{AnthropicConfig, AnthropicProvider, ConfigError};
pub use openai::{OpenAiConfig, OpenAiProvider};
pub use sim::{Answered, RateLimitSpec, SimConfig, SimProvider};

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16, retry_after: Option<Duration>) -> FailureKind {
        ProviderError::Status {
            status,
            message: String::new(),
            retry_after,
        }
        .kind()
    }

    #[test]
    fn a_503_that_says_when_to_come_back_is_a_limit() {
        let second = Some(Duration::from_secs(1));
        assert_eq!(
            status(503, second),
            FailureKind::RateLimited {
                retry_after: second
            }
        );
        assert_eq!(status(503, None), FailureKind::Unavailable);
        assert_eq!(status(529, second), FailureKind::Unavailable);
        assert_eq!(
            status(429, None),
            FailureKind::RateLimited { retry_after: None }
        );
        assert_eq!(status(501, None), FailureKind::Rejected);
    }
}
