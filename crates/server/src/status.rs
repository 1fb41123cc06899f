//! The one mapping from what went wrong to a gRPC status.
//!
//! Handlers return [`ApiError`] and write `?`: an engine error converts into it, and it converts
//! into a [`Status`] here and nowhere else. The code says whose fault it is and whether a retry
//! can help (the table in `docs/contracts.md`, "Errors"):
//!
//! | what happened | code |
//! |---|---|
//! | malformed or oversized request, unknown model or type | `INVALID_ARGUMENT` |
//! | unknown id, or another tenant's | `NOT_FOUND` |
//! | the state forbids it (a coordinator forks, a turn is running, a key reused) | `FAILED_PRECONDITION` |
//! | provider rate limit (429) | `RESOURCE_EXHAUSTED`, with `RetryInfo` when the provider said when |
//! | a budget or the turn limit is spent | `RESOURCE_EXHAUSTED` without `RetryInfo` |
//! | provider overloaded, down or unreachable; the daemon shutting down | `UNAVAILABLE` |
//! | the provider refused the daemon's credentials | `FAILED_PRECONDITION` |
//! | the provider rejected a request forkd built; a broken invariant; the store failed | `INTERNAL` |
//! | a sign-in link asked for by anyone but the Unix socket's owner | `PERMISSION_DENIED` |
//! | a sign-in link from a daemon without a web view | `FAILED_PRECONDITION` |

use forkd_engine::EngineError;
use forkd_engine::FailureKind;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};

use crate::service::SignInLinkError;

/// What a handler can fail with: the engine's error, a request the server could not parse, or
/// a sign-in link it would not make.
#[derive(Debug)]
pub(crate) enum ApiError {
    Engine(EngineError),
    /// A malformed field (an id that does not parse, a required field missing).
    BadRequest(String),
    SignInLink(SignInLinkError),
}

impl From<EngineError> for ApiError {
    fn from(err: EngineError) -> Self {
        ApiError::Engine(err)
    }
}

impl From<SignInLinkError> for ApiError {
    fn from(err: SignInLinkError) -> Self {
        ApiError::SignInLink(err)
    }
}

impl From<ApiError> for Status {
    fn from(err: ApiError) -> Self {
        match err {
            ApiError::BadRequest(msg) => Status::invalid_argument(msg),
            ApiError::Engine(err) => engine_status(err),
            ApiError::SignInLink(err) => sign_in_link_status(err),
        }
    }
}

/// Who may not have a link is refused as such; a daemon without a web view has nothing to link
/// to (the operator's to change); a failed random draw is the daemon's fault.
fn sign_in_link_status(err: SignInLinkError) -> Status {
    let msg = err.to_string();
    match err {
        SignInLinkError::NotTheSocketOwner(_) => Status::permission_denied(msg),
        SignInLinkError::NoWebView => Status::failed_precondition(msg),
        SignInLinkError::Random(_) => {
            tracing::error!(error = %msg, "Cannot make a sign-in link");
            Status::internal("forkd could not make a sign-in link; see the daemon's log")
        }
    }
}

/// An engine error as a status, for streams whose items carry engine errors.
pub(crate) fn status(err: EngineError) -> Status {
    engine_status(err)
}

fn engine_status(err: EngineError) -> Status {
    use EngineError as E;
    let msg = err.to_string();
    match err {
        E::InvalidRequest(_) => Status::invalid_argument(msg),
        E::NotFound { .. } => Status::not_found(msg),
        E::Forbidden(_) => Status::permission_denied(msg),
        E::ForkRefused(refusal) if !refusal.is_state() => Status::invalid_argument(msg),
        E::WrongState(_)
        | E::ForkRefused(_)
        | E::KeyReused { .. }
        | E::Workspace(_)
        | E::McpServer(_)
        | E::ContextWindow { .. } => Status::failed_precondition(msg),
        E::BudgetSpent { .. } | E::TurnLimit(_) => Status::resource_exhausted(msg),
        E::Provider(provider) => provider_status(provider.kind(), msg),
        E::TimedOut { .. } => Status::deadline_exceeded(msg),
        E::Cancelled(_) => Status::cancelled(msg),
        E::Draining => Status::unavailable("forkd is shutting down; retry shortly"),
        E::Store(e) => {
            tracing::error!(error = %e, "Store error");
            Status::internal("forkd could not read or write its database; see the daemon's log")
        }
        E::Invariant(detail) => {
            tracing::error!(error = %detail, "Broken invariant");
            Status::internal("forkd hit an internal error; see the daemon's log")
        }
    }
}

fn provider_status(kind: FailureKind, msg: String) -> Status {
    match kind {
        FailureKind::RateLimited {
            retry_after: Some(after),
        } => Status::with_error_details(
            Code::ResourceExhausted,
            format!("the model provider is rate limiting this daemon ({msg})"),
            ErrorDetails::with_retry_info(Some(after)),
        ),
        FailureKind::RateLimited { retry_after: None } => Status::resource_exhausted(format!(
            "the model provider is rate limiting this daemon ({msg})"
        )),
        FailureKind::Unavailable => Status::unavailable(format!(
            "the model provider is overloaded or unreachable ({msg}); retry later"
        )),
        FailureKind::Unauthorized => Status::failed_precondition(format!(
            "the model provider refused the daemon's credentials ({msg}); \
             the daemon's operator must fix its API key"
        )),
        FailureKind::Rejected => {
            // The provider's own words help whoever reads the log and do not leak forkd's state.
            tracing::error!(error = %msg, "The provider rejected a request forkd built");
            Status::internal(format!(
                "the model provider rejected a request forkd built ({msg}); see the daemon's log"
            ))
        }
    }
}

/// An id from the wire that does not parse.
pub(crate) fn bad_id(field: &str, err: impl std::fmt::Display) -> ApiError {
    ApiError::BadRequest(format!("{field}: {err}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use forkd_core::plan::Refusal;
    use forkd_engine::ProviderError;
    use forkd_store::StoreError;

    use super::*;

    fn provider(status: u16, retry_after: Option<Duration>) -> EngineError {
        EngineError::Provider(ProviderError::Status {
            status,
            message: "from the provider".into(),
            retry_after,
        })
    }

    /// Every engine error, with the code it must reach clients as and whether it carries
    /// `RetryInfo`. A new variant that is missing here fails to compile in `engine_status`, and
    /// should be added here with its row.
    #[test]
    fn every_engine_error_maps_to_its_code() {
        let cases: Vec<(EngineError, Code, Option<Duration>)> = vec![
            (
                EngineError::InvalidRequest("bad".into()),
                Code::InvalidArgument,
                None,
            ),
            (
                EngineError::NotFound {
                    kind: "agent",
                    id: "x".into(),
                },
                Code::NotFound,
                None,
            ),
            (
                EngineError::WrongState("busy".into()),
                Code::FailedPrecondition,
                None,
            ),
            (
                EngineError::ForkRefused(Refusal::Coordinator),
                Code::FailedPrecondition,
                None,
            ),
            (
                EngineError::ForkRefused(Refusal::TooMany { cap: 1, got: 2 }),
                Code::InvalidArgument,
                None,
            ),
            (
                EngineError::KeyReused {
                    key: "k".into(),
                    call: "batch",
                },
                Code::FailedPrecondition,
                None,
            ),
            (
                EngineError::BudgetSpent {
                    what: "budget",
                    whose: "tenant ci".into(),
                    spent: "$1".into(),
                    limit: "$1".into(),
                },
                Code::ResourceExhausted,
                None,
            ),
            (EngineError::TurnLimit(64), Code::ResourceExhausted, None),
            (
                EngineError::ContextWindow {
                    model: "m".into(),
                    input_tokens: 250_000,
                    max_tokens: 8192,
                    usable: 196_000,
                    window: 200_000,
                },
                Code::FailedPrecondition,
                None,
            ),
            (
                provider(429, Some(Duration::from_secs(3))),
                Code::ResourceExhausted,
                Some(Duration::from_secs(3)),
            ),
            (provider(429, None), Code::ResourceExhausted, None),
            (provider(529, None), Code::Unavailable, None),
            (provider(500, None), Code::Unavailable, None),
            (provider(503, None), Code::Unavailable, None),
            (
                EngineError::Provider(ProviderError::Stream("cut".into())),
                Code::Unavailable,
                None,
            ),
            (provider(401, None), Code::FailedPrecondition, None),
            (provider(403, None), Code::FailedPrecondition, None),
            (provider(400, None), Code::Internal, None),
            (provider(501, None), Code::Internal, None),
            (
                EngineError::Provider(ProviderError::InvalidRequest("body".into())),
                Code::Internal,
                None,
            ),
            (
                EngineError::TimedOut {
                    what: "typed agent".into(),
                    after: Duration::from_secs(1),
                },
                Code::DeadlineExceeded,
                None,
            ),
            (
                EngineError::Workspace(forkd_tools::ToolError::EmptyPath),
                Code::FailedPrecondition,
                None,
            ),
            (
                EngineError::Cancelled("killed".into()),
                Code::Cancelled,
                None,
            ),
            (EngineError::Draining, Code::Unavailable, None),
            (
                EngineError::Store(StoreError::Corrupt("row".into())),
                Code::Internal,
                None,
            ),
            (EngineError::Invariant("oops".into()), Code::Internal, None),
        ];
        for (err, code, retry) in cases {
            let shown = err.to_string();
            let status = Status::from(ApiError::from(err));
            assert_eq!(status.code(), code, "{shown}");
            let retry_delay = status.get_details_retry_info().and_then(|r| r.retry_delay);
            assert_eq!(retry_delay, retry, "{shown}");
        }
    }

    /// Internal errors reach the client without their detail.
    #[test]
    fn broken_invariants_and_store_errors_do_not_leak_their_detail() {
        for err in [
            EngineError::Invariant("secret detail".into()),
            EngineError::Store(StoreError::Corrupt("secret detail".into())),
        ] {
            let status = Status::from(ApiError::from(err));
            assert!(!status.message().contains("secret"), "{}", status.message());
        }
    }

    #[test]
    fn bad_requests_are_invalid_arguments() {
        let status = Status::from(bad_id("agent_id", "not a uuid"));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "agent_id: not a uuid");
    }
}
