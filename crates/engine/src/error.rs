//! The engine's one error type. The server maps it to gRPC status codes in one place.

use forkd_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{kind} {id} not found")]
    NotFound { kind: &'static str, id: String },
    #[error("{0}")]
    InvalidArgument(String),
    /// The request is well-formed but the target's state refuses it (a coordinator forking).
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    ResourceExhausted(String),
    #[error(transparent)]
    Store(StoreError),
    /// The operation was stopped by a client (a parent turn cancelled with `Kill`).
    #[error("{0}")]
    Cancelled(String),
    /// The daemon is shutting down and starts no new work.
    #[error("forkd is shutting down")]
    Draining,
    /// A bug or a broken invariant inside forkd; the message is for the log.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<StoreError> for EngineError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::NotFound { kind, id } => EngineError::NotFound { kind, id },
            other => EngineError::Store(other),
        }
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
