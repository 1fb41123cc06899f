//! Errors as the Messages API answers them: its status codes, its error types, its JSON body
//! (`{"type":"error","error":{"type","message"}}`), and `retry-after` on a 429.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use forkd_provider::ProviderError;
use serde_json::json;

/// An error response.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub status: u16,
    pub message: String,
    pub retry_after: Option<Duration>,
}

impl ApiError {
    pub(crate) fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    /// The API's error type for this status.
    pub(crate) fn kind(&self) -> &'static str {
        match self.status {
            400 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            529 => "overloaded_error",
            _ => "api_error",
        }
    }

    /// The error body, as it is sent alone or inside an SSE `error` event.
    pub(crate) fn body(&self) -> String {
        json!({"type": "error", "error": {"type": self.kind(), "message": self.message}})
            .to_string()
    }
}

impl From<ProviderError> for ApiError {
    fn from(e: ProviderError) -> Self {
        match e {
            ProviderError::Status {
                status,
                message,
                retry_after,
            } => Self {
                status,
                message,
                retry_after,
            },
            ProviderError::InvalidRequest(message) => Self::new(400, message),
            other @ (ProviderError::Stream(_)
            | ProviderError::Unreachable(_)
            | ProviderError::GaveUp { .. }) => Self::new(500, other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (
            status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            self.body(),
        )
            .into_response();
        // The API sends whole seconds; a fraction rounds up so a client never comes back early.
        if let Some(after) = self.retry_after {
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                response.headers_mut().insert("retry-after", v);
            }
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_have_the_api_error_types() {
        // (status, error type)
        let cases = [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (503, "api_error"),
            (529, "overloaded_error"),
        ];
        for (status, kind) in cases {
            assert_eq!(ApiError::new(status, "m").kind(), kind, "{status}");
        }
    }

    #[test]
    fn a_rate_limit_carries_retry_after_in_whole_seconds() {
        let error = ApiError {
            status: 429,
            message: "slow down".into(),
            retry_after: Some(Duration::from_millis(1500)),
        };
        let response = error.into_response();
        assert_eq!(response.status().as_u16(), 429);
        assert_eq!(
            response.headers().get("retry-after").map(|v| v.as_bytes()),
            Some(&b"2"[..])
        );
    }
}
