//! The store's errors: the interface's [`StoreError`] plus the driver's,
//! which become [`StoreError::Database`] at the [`crate::Store`] boundary (the interface cannot
//! know sqlx).

use forkd_core::store::StoreError;

/// What went wrong inside a store.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DbError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

pub(crate) type Result<T, E = DbError> = std::result::Result<T, E>;

impl From<DbError> for StoreError {
    fn from(err: DbError) -> Self {
        match err {
            DbError::Store(e) => e,
            DbError::Database(e) => StoreError::Database(Box::new(e)),
            DbError::Migrate(e) => StoreError::Database(Box::new(e)),
        }
    }
}
