//! The one mapping from what went wrong to a gRPC status.
//!
//! Handlers return [`ApiError`] and write `?`: an engine error converts into it, and it converts
//! into a [`Status`] here and nowhere else. What an engine error means is one table,
//! [`Meaning`], which the web view's HTTP statuses come from too. The code says whose fault it is and whether a retry
//! can help (the table in `docs/contracts.md`, "Errors"):
//!
//! | what happened | code |
//! |---|---|
//! | malformed or oversized request, unknown model or type | `INVALID_ARGUMENT` |
//! | unknown id, or another tenant's | `NOT_FOUND` |
//! | the state forbids it (a coordinator forks, a turn is running, a key reused) | `FAILED_PRECONDITION` |
//! | provider rate limit (429) | `RESOURCE_EXHAUSTED`, with `RetryInfo` when the provider said when |
//! | a budget or the turn limit is spent | `RESOURCE_EXHAUSTED` without `RetryInfo` |
//! | the database is out of disk space, or below `min_free_disk` | `RESOURCE_EXHAUSTED` |
//! | the database cannot be reached (its server restarting) | `UNAVAILABLE` |
//! | provider overloaded, down or unreachable; the daemon shutting down | `UNAVAILABLE` |
//! | the provider refused the daemon's credentials | `FAILED_PRECONDITION` |
//! | the provider rejected a request forkd built; a broken invariant; any other store failure | `INTERNAL` |
//! | a sign-in link asked for by anyone but the Unix socket's owner | `PERMISSION_DENIED` |
//! | a sign-in link from a daemon without a web view | `FAILED_PRECONDITION` |

use forkd_core::store::StoreError;
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

/// What an engine error means to whoever called: the one table both front doors answer from,
/// gRPC with its code ([`Meaning::code`]) and the web view with its HTTP status
/// ([`Meaning::http`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Meaning {
    /// A malformed or oversized request, an unknown model or type.
    BadRequest,
    /// An unknown id, or another tenant's.
    NotFound,
    /// The caller may not do this.
    Forbidden,
    /// The state forbids it now (a turn is running, a coordinator forks, the workspace or an MCP
    /// server is not usable, the call was cancelled).
    WrongState,
    /// An idempotency key reused for a different request.
    KeyReused,
    /// The request would not fit the model's context window.
    WindowOverflow,
    /// A budget, the turn limit or a size limit (an upload's) is spent.
    BudgetSpent,
    /// The provider is rate limiting the daemon.
    RateLimited,
    /// The provider is overloaded, down or unreachable; the daemon is shutting down.
    Unavailable,
    /// The provider refused the daemon's credentials: the operator's to fix.
    ProviderCredentials,
    /// A deadline passed.
    TimedOut,
    /// The call was cancelled (an agent killed).
    Cancelled,
    /// forkd's database is out of disk space, or below `min_free_disk`.
    DiskFull,
    /// forkd's own fault: a request the provider rejected, a broken invariant, the store.
    Internal,
}

impl Meaning {
    /// The meaning of `err`.
    pub fn of(err: &EngineError) -> Meaning {
        use EngineError as E;
        match err {
            E::InvalidRequest(_) => Meaning::BadRequest,
            E::NotFound { .. } => Meaning::NotFound,
            E::Forbidden(_) | E::HookBlocked(_) => Meaning::Forbidden,
            E::ForkRefused(refusal) if !refusal.is_state() => Meaning::BadRequest,
            E::WrongState(_)
            | E::ForkRefused(_)
            | E::Workspace(_)
            | E::Isolation(_)
            | E::Sandbox(_)
            | E::McpServer(_) => Meaning::WrongState,
            E::KeyReused { .. } => Meaning::KeyReused,
            E::ContextWindow { .. } => Meaning::WindowOverflow,
            E::BudgetSpent { .. } | E::TurnLimit(_) | E::OverLimit(_) => Meaning::BudgetSpent,
            E::Provider(provider) => match provider.kind() {
                FailureKind::RateLimited { .. } => Meaning::RateLimited,
                FailureKind::Unavailable => Meaning::Unavailable,
                FailureKind::Unauthorized => Meaning::ProviderCredentials,
                FailureKind::Rejected => Meaning::Internal,
            },
            E::TimedOut { .. } | E::TurnOverLimit(_) => Meaning::TimedOut,
            E::Cancelled(_) | E::HookStopped(_) => Meaning::Cancelled,
            E::Draining => Meaning::Unavailable,
            E::LowDisk { .. } | E::Store(StoreError::DiskFull { .. }) => Meaning::DiskFull,
            E::Store(StoreError::Unreachable { .. }) => Meaning::Unavailable,
            E::Store(_) | E::Invariant(_) => Meaning::Internal,
        }
    }

    /// The gRPC code.
    pub fn code(self) -> Code {
        match self {
            Meaning::BadRequest => Code::InvalidArgument,
            Meaning::NotFound => Code::NotFound,
            Meaning::Forbidden => Code::PermissionDenied,
            Meaning::WrongState
            | Meaning::KeyReused
            | Meaning::WindowOverflow
            | Meaning::ProviderCredentials => Code::FailedPrecondition,
            Meaning::BudgetSpent | Meaning::RateLimited | Meaning::DiskFull => {
                Code::ResourceExhausted
            }
            Meaning::Unavailable => Code::Unavailable,
            Meaning::TimedOut => Code::DeadlineExceeded,
            Meaning::Cancelled => Code::Cancelled,
            Meaning::Internal => Code::Internal,
        }
    }

    /// The HTTP status.
    pub fn http(self) -> u16 {
        match self {
            Meaning::BadRequest => 400,
            Meaning::Forbidden => 403,
            Meaning::NotFound => 404,
            Meaning::WrongState | Meaning::KeyReused | Meaning::Cancelled => 409,
            Meaning::WindowOverflow => 413,
            Meaning::BudgetSpent | Meaning::RateLimited => 429,
            Meaning::Internal => 500,
            Meaning::ProviderCredentials => 502,
            Meaning::Unavailable => 503,
            Meaning::TimedOut => 504,
            Meaning::DiskFull => 507,
        }
    }
}

fn engine_status(err: EngineError) -> Status {
    use EngineError as E;
    let meaning = Meaning::of(&err);
    let msg = err.to_string();
    let msg = match err {
        E::Provider(provider) => {
            let kind = provider.kind();
            if let FailureKind::RateLimited {
                retry_after: Some(after),
            } = kind
            {
                return Status::with_error_details(
                    meaning.code(),
                    provider_message(kind, msg),
                    ErrorDetails::with_retry_info(Some(after)),
                );
            }
            provider_message(kind, msg)
        }
        E::Draining => "forkd is shutting down; retry shortly".to_owned(),
        E::Store(e) if e.is_fault() => {
            tracing::warn!(error = %e, "The database refused a call");
            match e {
                StoreError::Unreachable { .. } => format!("{e}; retry shortly"),
                _ => format!("{e}; retry once space is freed"),
            }
        }
        E::Store(e) => {
            tracing::error!(error = %e, "Store error");
            "forkd could not read or write its database; see the daemon's log".to_owned()
        }
        E::Invariant(detail) => {
            tracing::error!(error = %detail, "Broken invariant");
            "forkd hit an internal error; see the daemon's log".to_owned()
        }
        _ => msg,
    };
    Status::new(meaning.code(), msg)
}

/// What a client is told of a provider's failure.
fn provider_message(kind: FailureKind, msg: String) -> String {
    match kind {
        FailureKind::RateLimited { .. } => {
            format!("the model provider is rate limiting this daemon ({msg})")
        }
        FailureKind::Unavailable => {
            format!("the model provider is overloaded or unreachable ({msg}); retry later")
        }
        FailureKind::Unauthorized => format!(
            "the model provider refused the daemon's credentials ({msg}); \
             the daemon's operator must fix its API key"
        ),
        FailureKind::Rejected => {
            // The provider's own words help whoever reads the log and do not leak forkd's state.
            tracing::error!(error = %msg, "The provider rejected a request forkd built");
            format!(
                "the model provider rejected a request forkd built ({msg}); see the daemon's log"
            )
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

    fn window_overflow() -> EngineError {
        EngineError::ContextWindow {
            model: "m".into(),
            input_tokens: 250_000,
            max_tokens: 8192,
            usable: 196_000,
            window: 200_000,
        }
    }

    fn budget_spent() -> EngineError {
        EngineError::BudgetSpent {
            what: "budget",
            whose: "tenant ci".into(),
            spent: "$1".into(),
            limit: "$1".into(),
        }
    }

    fn key_reused() -> EngineError {
        EngineError::KeyReused {
            key: "k".into(),
            call: "batch",
        }
    }

    /// Every engine error, with the code it must reach clients as and whether it carries
    /// `RetryInfo`. A new variant that is missing here fails to compile in `Meaning::of`, and
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
            (key_reused(), Code::FailedPrecondition, None),
            (budget_spent(), Code::ResourceExhausted, None),
            (EngineError::TurnLimit(64), Code::ResourceExhausted, None),
            (
                EngineError::HookBlocked("no".into()),
                Code::PermissionDenied,
                None,
            ),
            (
                EngineError::HookStopped("done".into()),
                Code::Cancelled,
                None,
            ),
            (window_overflow(), Code::FailedPrecondition, None),
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

    /// The web view answers from the same table: each meaning's HTTP status, for one error of
    /// each kind.
    #[test]
    fn every_meaning_has_its_http_status() {
        let cases: Vec<(EngineError, u16)> = vec![
            (EngineError::InvalidRequest("bad".into()), 400),
            (
                EngineError::NotFound {
                    kind: "agent",
                    id: "x".into(),
                },
                404,
            ),
            (EngineError::Forbidden("no".into()), 403),
            (EngineError::WrongState("busy".into()), 409),
            (key_reused(), 409),
            (window_overflow(), 413),
            (budget_spent(), 429),
            (provider(429, None), 429),
            (provider(529, None), 503),
            (provider(401, None), 502),
            (provider(400, None), 500),
            (
                EngineError::TimedOut {
                    what: "typed agent".into(),
                    after: Duration::from_secs(1),
                },
                504,
            ),
            (EngineError::Cancelled("killed".into()), 409),
            (EngineError::Draining, 503),
            (EngineError::Store(StoreError::Corrupt("row".into())), 500),
            (EngineError::Invariant("oops".into()), 500),
            (disk_full(), 507),
            (low_disk(), 507),
            (unreachable(), 503),
        ];
        for (err, http) in cases {
            assert_eq!(Meaning::of(&err).http(), http, "{err}");
        }
    }

    fn disk_full() -> EngineError {
        EngineError::Store(StoreError::DiskFull {
            detail: "12.0 KiB free on the filesystem holding /srv/forkd/forkd.db".into(),
        })
    }

    fn low_disk() -> EngineError {
        EngineError::LowDisk {
            free: "100.0 MiB".into(),
            min: "256.0 MiB".into(),
            path: "/srv/forkd/forkd.db".into(),
        }
    }

    fn unreachable() -> EngineError {
        EngineError::Store(StoreError::Unreachable {
            detail: "connection refused".into(),
        })
    }

    /// The database's faults are said as they are, with what a client can do: never `INTERNAL`.
    #[test]
    fn database_faults_say_what_happened() {
        for (err, code, says) in [
            (
                disk_full(),
                Code::ResourceExhausted,
                "forkd's database is out of disk space (12.0 KiB free on the filesystem \
                 holding /srv/forkd/forkd.db); retry once space is freed",
            ),
            (
                low_disk(),
                Code::ResourceExhausted,
                "forkd's database is low on disk space: 100.0 MiB free on the filesystem \
                 holding /srv/forkd/forkd.db, below min_free_disk (256.0 MiB)",
            ),
            (
                unreachable(),
                Code::Unavailable,
                "forkd's database cannot be reached (connection refused); retry shortly",
            ),
        ] {
            let status = Status::from(ApiError::from(err));
            assert_eq!(status.code(), code);
            assert!(status.message().starts_with(says), "{}", status.message());
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
