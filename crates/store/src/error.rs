//! The store's errors: the interface's [`StoreError`] plus the driver's,
//! which become [`StoreError`]s at the [`crate::Store`] boundary (the interface cannot know
//! sqlx). The database's own faults, a full disk and a server out of reach, are told apart there
//! ([`StoreError::DiskFull`], [`StoreError::Unreachable`]); everything else the driver says stays
//! [`StoreError::Database`].

use forkd_core::store::StoreError;
use sqlx::error::DatabaseError as _;

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
            DbError::Database(e) => match Fault::of(&e) {
                Some(Fault::DiskFull) => StoreError::DiskFull {
                    detail: e.to_string(),
                },
                Some(Fault::Unreachable) => StoreError::Unreachable {
                    detail: e.to_string(),
                },
                None => StoreError::Database(Box::new(e)),
            },
            DbError::Migrate(e) => StoreError::Database(Box::new(e)),
        }
    }
}

/// A driver's outcome as the interface's, its error counted.
pub(crate) fn counted<T>(outcome: Result<T>) -> Result<T, StoreError> {
    outcome.map_err(|e| {
        let e = StoreError::from(e);
        count(&e);
        e
    })
}

/// A fault of the database rather than of the statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    DiskFull,
    Unreachable,
}

/// SQLite's primary result code for "database or disk is full" (an extended code keeps it in its
/// low byte).
const SQLITE_FULL: i64 = 13;

impl Fault {
    /// The fault `err` reports, if it is one.
    pub(crate) fn of(err: &sqlx::Error) -> Option<Fault> {
        match err {
            sqlx::Error::Database(db) => {
                if let Some(sqlite) = db.try_downcast_ref::<sqlx::sqlite::SqliteError>() {
                    let code = sqlite.code()?.parse::<i64>().ok()?;
                    return (code & 0xff == SQLITE_FULL).then_some(Fault::DiskFull);
                }
                pg_fault(&db.code()?)
            }
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => Some(Fault::Unreachable),
            _ => None,
        }
    }
}

/// A PostgreSQL SQLSTATE's fault: `53100 disk_full`; the connection exceptions (class `08`), and
/// a server shutting down, crashed or starting (`57P01`–`57P03`), or out of connections (`53300`).
fn pg_fault(code: &str) -> Option<Fault> {
    match code {
        "53100" => Some(Fault::DiskFull),
        "53300" | "57P01" | "57P02" | "57P03" => Some(Fault::Unreachable),
        c if c.starts_with("08") => Some(Fault::Unreachable),
        _ => None,
    }
}

/// Store errors that are the database's (not a write's own outcome such as `Conflict` or
/// `NotFound`), counted by kind: `disk_full`, `unreachable`, `database`, `corrupt`.
pub const STORE_ERRORS: &str = "forkd_store_errors_total";

/// Describes the store's metric.
pub fn describe_metrics() {
    metrics::describe_counter!(
        STORE_ERRORS,
        "Store operations that failed for the database's sake, by kind: disk_full, unreachable, database, corrupt"
    );
    for kind in ["disk_full", "unreachable", "database", "corrupt"] {
        metrics::counter!(STORE_ERRORS, "kind" => kind).absolute(0);
    }
}

/// Counts `err` in [`STORE_ERRORS`] when it is the database's.
pub(crate) fn count(err: &StoreError) {
    if matches!(
        err,
        StoreError::DiskFull { .. }
            | StoreError::Unreachable { .. }
            | StoreError::Database(_)
            | StoreError::Corrupt(_)
    ) {
        metrics::counter!(STORE_ERRORS, "kind" => err.kind()).increment(1);
    }
}

/// The database's fault that a write last met, held until a write probe succeeds (see
/// `Store::fault`). Shared by a store's clones.
#[derive(Debug, Default)]
pub(crate) struct FaultLatch(std::sync::Mutex<Option<String>>);

impl FaultLatch {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds `err` if it is the database's fault.
    pub(crate) fn record(&self, err: &StoreError) {
        if err.is_fault() {
            *self.slot() = Some(err.to_string());
        }
    }

    /// A probe succeeded: the database takes writes.
    pub(crate) fn clear(&self) {
        *self.slot() = None;
    }

    pub(crate) fn get(&self) -> Option<String> {
        self.slot().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::{Fault, pg_fault};

    #[test]
    fn postgres_faults_are_told_apart_by_sqlstate() {
        assert_eq!(pg_fault("53100"), Some(Fault::DiskFull));
        for unreachable in ["08006", "08001", "57P01", "57P02", "57P03", "53300"] {
            assert_eq!(
                pg_fault(unreachable),
                Some(Fault::Unreachable),
                "{unreachable}"
            );
        }
        // A statement's own errors are not the database's fault.
        for other in ["23505", "40001", "42P01", "53200"] {
            assert_eq!(pg_fault(other), None, "{other}");
        }
    }

    #[test]
    fn lost_connections_are_unreachable() {
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(Fault::of(&io), Some(Fault::Unreachable));
        assert_eq!(
            Fault::of(&sqlx::Error::PoolTimedOut),
            Some(Fault::Unreachable)
        );
        assert_eq!(Fault::of(&sqlx::Error::RowNotFound), None);
    }
}
