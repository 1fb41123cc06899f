//! HTTP plumbing shared by the `anthropic` and `openai` providers: the client, the request body
//! without a copy, error statuses with their messages and `retry-after`, transport failures.

use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, HeaderMap};
use serde::Deserialize;

use super::ConfigError;
use crate::ProviderError;

/// An error body longer than this is cut in the message: a proxy's HTML page is not worth more.
const MAX_MESSAGE_CHARS: usize = 500;

/// A request body shared with the caller: the bytes forkd serialized, never copied or re-encoded.
struct SharedBody(Arc<str>);

impl AsRef<[u8]> for SharedBody {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// The body as `Bytes` that point into the caller's `Arc<str>`: cheap to clone for a retry.
pub(crate) fn body_bytes(body: &Arc<str>) -> Bytes {
    Bytes::from_owner(SharedBody(Arc::clone(body)))
}

/// An HTTP client with the given timeouts. There is no whole-request timeout: a long answer may
/// stream for minutes, so only connecting and each read are bounded.
pub(crate) fn client(
    connect_timeout: Duration,
    read_timeout: Duration,
) -> Result<reqwest::Client, ConfigError> {
    reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .read_timeout(read_timeout)
        .user_agent(concat!("forkd/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ConfigError::Client(chain(&e)))
}

/// A base URL from configuration, checked, without its trailing slash.
pub(crate) fn base_url(var: &'static str, value: &str) -> Result<String, ConfigError> {
    let trimmed = value.trim().trim_end_matches('/');
    match reqwest::Url::parse(trimmed) {
        Ok(url) if matches!(url.scheme(), "http" | "https") => Ok(trimmed.to_owned()),
        _ => Err(ConfigError::BadUrl {
            var,
            value: value.to_owned(),
        }),
    }
}

/// An error and its sources in one line: reqwest's own message names only the outermost layer
/// ("error sending request"), the cause (connection refused, reset) is further down.
fn chain(e: &reqwest::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// A failure to send a request or read its response. Everything but a request that could not
/// be built is worth retrying: refused or reset connections, timeouts, a body cut off. A
/// connection that could not be made at all (refused, a name that does not resolve, a failed
/// TLS handshake) is [`ProviderError::Unreachable`]: a wrong address must fail fast.
pub(crate) fn transport_error(e: &reqwest::Error) -> ProviderError {
    if e.is_builder() {
        ProviderError::InvalidRequest(chain(e))
    } else if e.is_connect() {
        ProviderError::Unreachable(chain(e))
    } else {
        ProviderError::Stream(chain(e))
    }
}

/// Checks that a successful response is an event stream; anything else (a JSON message because
/// the body asked for `"stream": false`, a proxy's page) cannot be read as one.
pub(crate) fn expect_event_stream(response: &reqwest::Response) -> Result<(), ProviderError> {
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type.starts_with("text/event-stream") {
        Ok(())
    } else {
        Err(ProviderError::InvalidRequest(format!(
            "expected an event stream, got content-type {content_type:?} (does the body set \
             \"stream\": true?)"
        )))
    }
}

/// The error for a response with an error status, its body read for the message.
pub(crate) async fn status_error(response: reqwest::Response) -> ProviderError {
    let status = response.status().as_u16();
    let retry_after = retry_after(response.headers());
    let body = response.text().await.unwrap_or_default();
    error_from_body(status, &body, retry_after)
}

/// The error an error response stands for: its JSON error (either shape) or its text, else the
/// status's reason phrase.
pub(crate) fn error_from_body(
    status: u16,
    body: &str,
    retry_after: Option<Duration>,
) -> ProviderError {
    match ApiError::parse(body) {
        Some(error) => error.into_provider_error(status, retry_after),
        None => ProviderError::Status {
            status,
            message: short_text(body).unwrap_or_else(|| {
                reqwest::StatusCode::from_u16(status)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or("no error message")
                    .to_owned()
            }),
            retry_after,
        },
    }
}

/// An error body: Anthropic's `{"type":"error","error":{"type","message"}}`, the OpenAI shape
/// `{"error":{"message","type","code"}}` (llama.cpp's server, vLLM, proxies), `{"error":"..."}`,
/// or, inside an SSE `error` event from llama.cpp's server, the bare `{"code","message","type"}`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub message: String,
    /// `invalid_request_error`, `server_error`, …; empty when the body names none.
    pub kind: String,
    /// OpenAI's `code` (a string such as `context_length_exceeded`, or a number), as text.
    pub code: Option<String>,
}

#[derive(Deserialize)]
struct Wrapped {
    error: Detail,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Detail {
    Object(Bare),
    Text(String),
}

#[derive(Deserialize)]
struct Bare {
    message: String,
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    code: Option<serde_json::Value>,
}

impl From<Bare> for ApiError {
    fn from(bare: Bare) -> Self {
        let code = match bare.code {
            Some(serde_json::Value::String(s)) if !s.is_empty() => Some(s),
            Some(serde_json::Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        Self {
            message: bare.message,
            kind: bare.kind.unwrap_or_default(),
            code,
        }
    }
}

impl ApiError {
    /// The error a JSON body describes, wrapped in `error` or bare; `None` for anything else.
    pub(crate) fn parse(body: &str) -> Option<Self> {
        if let Ok(wrapped) = serde_json::from_str::<Wrapped>(body) {
            return Some(match wrapped.error {
                Detail::Object(bare) => bare.into(),
                Detail::Text(message) => Self {
                    message,
                    kind: String::new(),
                    code: None,
                },
            });
        }
        serde_json::from_str::<Bare>(body).ok().map(Self::from)
    }

    /// The status error this stands for. A 5xx whose body says the request itself is at fault
    /// (`invalid_request_error`, `exceed_context_size_error`, …) takes the 4xx its type stands
    /// for: sending the same request again cannot help, so it must not be retried. The message
    /// keeps the server's words and says what kind of error it was.
    pub(crate) fn into_provider_error(
        self,
        http_status: u16,
        retry_after: Option<Duration>,
    ) -> ProviderError {
        let typed = status_of_error_type(&self.kind);
        let blames_request = (400..500).contains(&typed) && !self.kind.is_empty();
        let status = if http_status >= 500 && blames_request {
            typed
        } else {
            http_status
        };
        let mut message = self.describe(status);
        if status != http_status {
            message.push_str(&format!("; the server answered HTTP {http_status}"));
        }
        ProviderError::Status {
            status,
            message,
            retry_after,
        }
    }

    /// `message (type, code X)`: the server's words, then what kind of error it called it. A
    /// numeric code equal to the status adds nothing and is left out.
    pub(crate) fn describe(&self, status: u16) -> String {
        let mut message = short_text(&self.message).unwrap_or_else(|| "no error message".into());
        let mut notes = Vec::new();
        if !self.kind.is_empty() {
            notes.push(self.kind.clone());
        }
        if let Some(code) = self.code.as_deref()
            && code != self.kind
            && code != status.to_string()
        {
            notes.push(format!("code {code}"));
        }
        if !notes.is_empty() {
            message.push_str(&format!(" ({})", notes.join(", ")));
        }
        message
    }
}

/// A text trimmed and cut to [`MAX_MESSAGE_CHARS`]; `None` when it is blank.
fn short_text(text: &str) -> Option<String> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut short: String = text.chars().take(MAX_MESSAGE_CHARS).collect();
    if short.len() < text.len() {
        short.push('…');
    }
    Some(short)
}

/// How long the server asks us to wait: `retry-after-ms` (OpenAI's, finer), or `retry-after` in
/// seconds or as an HTTP date (RFC 9110; a date already past is no wait).
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    retry_after_at(headers, std::time::SystemTime::now())
}

fn retry_after_at(headers: &HeaderMap, now: std::time::SystemTime) -> Option<Duration> {
    let text = |name: &str| headers.get(name)?.to_str().ok().map(str::trim);
    let number = |name: &str| {
        text(name)?
            .parse::<f64>()
            .ok()
            .filter(|n| n.is_finite() && *n >= 0.0)
    };
    if let Some(ms) = number("retry-after-ms") {
        return Duration::try_from_secs_f64(ms / 1000.0).ok();
    }
    if let Some(secs) = number("retry-after") {
        return Duration::try_from_secs_f64(secs).ok();
    }
    let at = httpdate::parse_http_date(text("retry-after")?).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The HTTP status an error type stands for (Anthropic's types, and llama.cpp's server's), for
/// errors that arrive inside a stream and for error bodies whose status contradicts their type.
pub(crate) fn status_of_error_type(error_type: &str) -> u16 {
    match error_type {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "overloaded_error" => 529,
        // llama.cpp's server.
        "exceed_context_size_error" => 400,
        "not_supported_error" => 501,
        "unavailable_error" => 503,
        _ => 500,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn error_bodies_of_every_shape() {
        // (HTTP status, body, expected status, expected message)
        let cases = [
            (
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}"#,
                400,
                "bad (invalid_request_error)",
            ),
            // OpenAI's shape; a string code is worth showing.
            (
                429,
                r#"{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}"#,
                429,
                "slow down (requests, code rate_limit_exceeded)",
            ),
            // llama.cpp's server: a numeric code that repeats the status adds nothing.
            (
                500,
                r#"{"error":{"code":500,"message":"'messages' is required","type":"server_error"}}"#,
                500,
                "'messages' is required (server_error)",
            ),
            (
                400,
                r#"{"error":{"code":400,"message":"request (40000 tokens) exceeds the available context size (32768 tokens)","type":"exceed_context_size_error","n_prompt_tokens":40000,"n_ctx":32768}}"#,
                400,
                "request (40000 tokens) exceeds the available context size (32768 tokens) \
                 (exceed_context_size_error)",
            ),
            // A 5xx whose body blames the request is that request's 4xx: not worth retrying.
            (
                500,
                r#"{"error":{"message":"tools: invalid schema","type":"invalid_request_error","code":null}}"#,
                400,
                "tools: invalid schema (invalid_request_error); the server answered HTTP 500",
            ),
            (
                529,
                r#"{"error":{"message":"upstream overloaded"}}"#,
                529,
                "upstream overloaded",
            ),
            (
                503,
                r#"{"error":"model not loaded"}"#,
                503,
                "model not loaded",
            ),
            (
                502,
                "<html>Bad Gateway</html>\n",
                502,
                "<html>Bad Gateway</html>",
            ),
            (500, "  ", 500, "Internal Server Error"),
        ];
        for (http_status, body, expected_status, expected) in cases {
            match error_from_body(http_status, body, None) {
                ProviderError::Status {
                    status, message, ..
                } => assert_eq!(
                    (status, message.as_str()),
                    (expected_status, expected),
                    "{body}"
                ),
                other => panic!("{body}: {other:?}"),
            }
        }
        let long = "x".repeat(2000);
        assert!(matches!(
            error_from_body(500, &long, None),
            ProviderError::Status { message, .. } if message.chars().count() == MAX_MESSAGE_CHARS + 1
        ));
        // The bare error object llama.cpp's server puts in an SSE `error` event.
        assert_eq!(
            ApiError::parse(r#"{"code":500,"message":"boom","type":"server_error"}"#),
            Some(ApiError {
                message: "boom".into(),
                kind: "server_error".into(),
                code: Some("500".into()),
            })
        );
        assert_eq!(ApiError::parse(r#"{"type":"ping"}"#), None);
    }

    #[test]
    fn retry_after_headers() {
        // (headers, expected wait in ms)
        type Headers = &'static [(&'static str, &'static str)];
        let cases: [(Headers, Option<u128>); 8] = [
            (&[("retry-after", "2")], Some(2000)),
            (&[("retry-after", "0.5")], Some(500)),
            (&[("retry-after-ms", "30"), ("retry-after", "9")], Some(30)),
            // An HTTP date, 3 s after `now` below; one already past is no wait.
            (
                &[("retry-after", "Wed, 21 Oct 2015 07:28:03 GMT")],
                Some(3000),
            ),
            (&[("retry-after", "Wed, 21 Oct 2015 07:27:00 GMT")], Some(0)),
            (&[("retry-after", "soon")], None),
            (&[("retry-after", "-1")], None),
            (&[], None),
        ];
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        for (pairs, expected) in cases {
            let mut headers = HeaderMap::new();
            for (k, v) in pairs {
                headers.insert(*k, HeaderValue::from_static(v));
            }
            assert_eq!(
                retry_after_at(&headers, now).map(|d| d.as_millis()),
                expected,
                "{pairs:?}"
            );
        }
    }

    #[test]
    fn base_urls_are_checked_and_trimmed() {
        assert_eq!(
            base_url("X", "http://127.0.0.1:8080/").ok().as_deref(),
            Some("http://127.0.0.1:8080")
        );
        assert!(base_url("X", "not a url").is_err());
        assert!(base_url("X", "ftp://host").is_err());
    }
}
