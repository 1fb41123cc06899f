//! The errors of the SQLite implementation: the store's errors plus the driver's, converted into
//! [`StoreError`] at the [`crate::Store`] boundary (the interface cannot know sqlx).

use forkd_core::AgentId;
use forkd_core::store::StoreError;

/// What went wrong inside the SQLite store.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DbError {
    #[error("{kind} {id} not found")]
    NotFound { kind: &'static str, id: String },
    #[error("conflict: {0}")]
    Conflict(String),
    #[error(
        "agent {agent} was claimed by a newer run (generation {current}; this run holds {held})"
    )]
    Superseded {
        agent: AgentId,
        held: u64,
        current: u64,
    },
    #[error("corrupt row: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

pub(crate) type Result<T, E = DbError> = std::result::Result<T, E>;

impl From<DbError> for StoreError {
    fn from(err: DbError) -> Self {
        match err {
            DbError::NotFound { kind, id } => StoreError::NotFound { kind, id },
            DbError::Conflict(why) => StoreError::Conflict(why),
            DbError::Superseded {
                agent,
                held,
                current,
            } => StoreError::Superseded {
                agent,
                held,
                current,
            },
            DbError::Corrupt(why) => StoreError::Corrupt(why),
            DbError::Database(e) => StoreError::Database(Box::new(e)),
            DbError::Migrate(e) => StoreError::Database(Box::new(e)),
        }
    }
}
