//! The engine's one error type. Each variant names what happened — whose fault it is and whether
//! a retry can help follows from that — and keeps its source error. The server turns it into a
//! gRPC status in one place; the engine never chooses a wire code.

use std::time::Duration;

use forkd_core::store::StoreError;
use forkd_provider::ProviderError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The caller's request is malformed, too large, or names something unknown (a model, an
    /// agent type). Sending it again unchanged cannot help.
    #[error("{0}")]
    InvalidRequest(String),
    /// No such id — or another tenant's, which is answered exactly as a missing one.
    #[error("{kind} {id} not found")]
    NotFound { kind: &'static str, id: String },
    /// The target's state refuses the call: a turn is already running, the agent already ended,
    /// there is no turn to cancel.
    #[error("{0}")]
    WrongState(String),
    /// The fork plan refused the batch: the caller's state (a coordinator, a fork child) or the
    /// batch itself (too many children, an empty or oversized directive).
    #[error("{0}")]
    ForkRefused(#[source] forkd_core::plan::Refusal),
    /// The caller may not ask for this (a remote tenant asking for an unconfined sandbox).
    #[error("{0}")]
    Forbidden(String),
    /// An idempotency key was first used for a call with other parameters.
    #[error(
        "idempotency key {key:?} was first used for a {call} call with other parameters; \
         use a new key for a different request"
    )]
    KeyReused { key: String, call: &'static str },
    /// A batch's or a tenant's budget is spent; `whose` names it.
    #[error("the {what} of {whose} is spent: {spent} of {limit}")]
    BudgetSpent {
        /// `budget` (dollars) or `token budget`.
        what: &'static str,
        whose: String,
        spent: String,
        limit: String,
    },
    /// A request would not fit its model's context window (input plus `max_tokens`, less a
    /// safety margin): forkd never sends one.
    #[error(
        "the request would not fit {model}'s context window: {input_tokens} input tokens + \
         {max_tokens} max_tokens > {usable} of its {window}-token window"
    )]
    ContextWindow {
        model: String,
        input_tokens: u64,
        max_tokens: u64,
        usable: u64,
        window: u64,
    },
    /// The model kept calling tools past the turn limit without ending its turn.
    #[error("the model did not end its turn within {0} requests")]
    TurnLimit(u32),
    /// The model provider failed, after the one retry policy had its tries. What it means
    /// (overloaded, rate limited, credentials refused, request rejected) is
    /// [`ProviderError::kind`].
    #[error("model request failed: {0}")]
    Provider(#[source] ProviderError),
    /// A parent turn ran past its limit (`[agent_limits] timeout`, its tenant's or the
    /// daemon's): it was stopped where it stood.
    #[error("the turn {0}")]
    TurnOverLimit(forkd_core::Limit),
    /// A wait the engine bounds ran out (a parent waiting on a synchronous typed agent).
    #[error("{what} did not end within {} s; it goes on in the background", .after.as_secs())]
    TimedOut { what: String, after: Duration },
    /// An MCP server a new session asked for did not start or list its tools.
    #[error("the session was not created: {0}")]
    McpServer(#[source] forkd_mcp::ServerError),
    /// The session's workspace cannot be used for tools (missing, not a directory, unreadable).
    #[error("the session's workspace is unusable: {0}")]
    Workspace(#[source] forkd_tools::ToolError),
    /// The sandbox cannot be used as configured (its temporary root is not the daemon user's
    /// alone): nothing runs unconfined instead.
    #[error("{0}")]
    Sandbox(String),
    /// An isolated batch's snapshot or a child's copy could not be made, read or applied (the
    /// file system refused: no space, no overlayfs, a path it cannot take).
    #[error("isolation: {0}")]
    Isolation(String),
    /// A hook refused what it was asked about (a UserPromptSubmit hook blocking a message); the
    /// hook's reason.
    #[error("a hook blocked it: {0}")]
    HookBlocked(String),
    /// A hook's `continue: false` stopped the agent; its `stopReason`.
    #[error("a hook stopped the agent: {0}")]
    HookStopped(String),
    /// The operation was stopped by a client (a parent turn cancelled with `Kill`).
    #[error("{0}")]
    Cancelled(String),
    /// A request over a size limit of the daemon's (an upload's size or file count); the
    /// message names the limit.
    #[error("{0}")]
    OverLimit(String),
    /// The daemon is shutting down and starts no new work.
    #[error("forkd is shutting down")]
    Draining,
    /// Too little disk is left under the database for new work (`min_free_disk`): new sessions,
    /// messages and batches are refused, running agents go on.
    #[error(
        "forkd's database is low on disk space: {free} free on the filesystem holding {path}, \
         below min_free_disk ({min}); new sessions, messages and batches are refused until \
         space is freed"
    )]
    LowDisk {
        free: String,
        min: String,
        path: String,
    },
    /// The store failed; the detail is for the log, except for the database's own faults (a
    /// full disk, a server out of reach), which the caller is told.
    #[error(transparent)]
    Store(StoreError),
    /// A bug or a broken invariant inside forkd; the message is for the log.
    #[error("broken invariant: {0}")]
    Invariant(String),
}

impl From<StoreError> for EngineError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::NotFound { kind, id } => EngineError::NotFound { kind, id },
            // Another daemon runs it: the caller asked for something only its holder may do.
            held @ StoreError::Held { .. } => EngineError::WrongState(held.to_string()),
            other => EngineError::Store(other),
        }
    }
}

impl From<ProviderError> for EngineError {
    fn from(err: ProviderError) -> Self {
        EngineError::Provider(err)
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// At most `max` characters of a client's value, for error messages: a huge bogus value echoed
/// whole would not fit in the status trailer.
/// Runs blocking file work (a copy, a mount's holder, a walk) off the runtime's worker threads;
/// a panic in it is an invariant broken.
pub(crate) async fn blocking<T: Send + 'static>(
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(job)
        .await
        .map_err(|e| EngineError::Invariant(format!("a file task failed: {e}")))
}

pub(crate) fn clip(value: &str, max: usize) -> String {
    match value.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &value[..cut]),
        None => value.to_owned(),
    }
}
