//! The one mapping from engine errors to gRPC status codes.

use forkd_engine::EngineError;
use tonic::Status;

/// Maps an engine error to a status. Internal errors reach the client as a short, non-leaky
/// message; the log gets the detail.
pub(crate) fn to_status(err: EngineError) -> Status {
    match err {
        EngineError::NotFound { kind, id } => Status::not_found(format!("{kind} {id} not found")),
        EngineError::InvalidArgument(msg) => Status::invalid_argument(msg),
        EngineError::FailedPrecondition(msg) => Status::failed_precondition(msg),
        EngineError::ResourceExhausted(msg) => Status::resource_exhausted(msg),
        EngineError::Cancelled(msg) => Status::cancelled(msg),
        EngineError::Draining => Status::unavailable("forkd is shutting down; retry shortly"),
        EngineError::Internal(msg) => {
            tracing::error!(error = %msg, "Internal error");
            Status::internal("forkd hit an internal error; see the daemon's log")
        }
        EngineError::Store(e) => {
            tracing::error!(error = %e, "Store error");
            Status::internal("forkd could not read or write its database; see the daemon's log")
        }
    }
}

/// An id from the wire that does not parse.
pub(crate) fn bad_id(field: &str, err: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("{field}: {err}"))
}
