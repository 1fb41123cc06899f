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
/// be built is worth retrying: refused or reset connections, timeouts, a body cut off.
pub(crate) fn transport_error(e: &reqwest::Error) -> ProviderError {
    if e.is_builder() {
        ProviderError::InvalidRequest(chain(e))
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
    let status = response.status();
    let retry_after = retry_after(response.headers());
    let body = response.text().await.unwrap_or_default();
    let message = error_message(&body).unwrap_or_else(|| {
        status
            .canonical_reason()
            .unwrap_or("no error message")
            .to_owned()
    });
    ProviderError::Status {
        status: status.as_u16(),
        message,
        retry_after,
    }
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ErrorDetail {
    /// Anthropic (`{"type":"error","error":{"type","message"}}`) and OpenAI
    /// (`{"error":{"message","type","code"}}`) both nest an object with a message.
    Object { message: String },
    /// Some OpenAI-compatible servers answer `{"error":"..."}`.
    Text(String),
}

/// The message of an error body: the JSON error's message, or the body's text, shortened.
pub(crate) fn error_message(body: &str) -> Option<String> {
    if let Ok(parsed) = serde_json::from_str::<ErrorBody>(body) {
        return Some(match parsed.error {
            ErrorDetail::Object { message } | ErrorDetail::Text(message) => message,
        });
    }
    let text = body.trim();
    if text.is_empty() {
        return None;
    }
    let mut short: String = text.chars().take(MAX_MESSAGE_CHARS).collect();
    if short.len() < text.len() {
        short.push('…');
    }
    Some(short)
}

/// How long the server asks us to wait: `retry-after-ms` (OpenAI's, finer) or `retry-after` in
/// seconds. The HTTP-date form is not used by these APIs and is ignored.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let number = |name: &str| {
        headers
            .get(name)?
            .to_str()
            .ok()?
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|n| n.is_finite() && *n >= 0.0)
    };
    if let Some(ms) = number("retry-after-ms") {
        return Duration::try_from_secs_f64(ms / 1000.0).ok();
    }
    number("retry-after").and_then(|s| Duration::try_from_secs_f64(s).ok())
}

/// The HTTP status an Anthropic error type stands for, for errors that arrive inside a stream.
pub(crate) fn status_of_error_type(error_type: &str) -> u16 {
    match error_type {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "overloaded_error" => 529,
        _ => 500,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn error_messages_of_both_shapes() {
        // (body, expected message)
        let cases = [
            (
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}"#,
                Some("bad"),
            ),
            (
                r#"{"error":{"message":"slow down","type":"requests","code":null}}"#,
                Some("slow down"),
            ),
            (r#"{"error":"model not loaded"}"#, Some("model not loaded")),
            (
                "<html>Bad Gateway</html>\n",
                Some("<html>Bad Gateway</html>"),
            ),
            ("  ", None),
        ];
        for (body, expected) in cases {
            assert_eq!(error_message(body).as_deref(), expected, "{body}");
        }
        let long = "x".repeat(2000);
        assert_eq!(
            error_message(&long).map(|m| m.chars().count()),
            Some(MAX_MESSAGE_CHARS + 1)
        );
    }

    #[test]
    fn retry_after_headers() {
        // (headers, expected wait in ms)
        type Headers = &'static [(&'static str, &'static str)];
        let cases: [(Headers, Option<u128>); 5] = [
            (&[("retry-after", "2")], Some(2000)),
            (&[("retry-after", "0.5")], Some(500)),
            (&[("retry-after-ms", "30"), ("retry-after", "9")], Some(30)),
            (&[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")], None),
            (&[], None),
        ];
        for (pairs, expected) in cases {
            let mut headers = HeaderMap::new();
            for (k, v) in pairs {
                headers.insert(*k, HeaderValue::from_static(v));
            }
            assert_eq!(
                retry_after(&headers).map(|d| d.as_millis()),
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
