//! The write transaction every store method runs in ([`write_tx`]), and how a failed one's error
//! reaches the interface.

use super::dialect::{self, DriverStore};
use crate::StoreError;
use crate::error::Result;

pub(super) type StoreResult<T> = std::result::Result<T, StoreError>;

/// A store operation's outcome at the interface: the driver's errors become [`StoreError`].
pub(super) fn db<T>(outcome: Result<T>) -> StoreResult<T> {
    crate::error::counted(outcome)
}

/// Runs `$body` (which uses the transaction as `$tx`) in a write transaction of `$store`, and
/// commits it if `$body` succeeds; dropping it uncommitted rolls it back. A write that failed
/// leaves its connection settled before the error returns (see [`settle`]), and the error
/// explained by the store (a full disk says how much space is left).
macro_rules! write_tx {
    ($store:expr, |$tx:ident| $body:expr) => {
        async move {
            let mut conn = $store
                .write_connection()
                .await
                .map_err(|e| super::tx::failed(&$store, e))?;
            let outcome: crate::error::Result<_> = async {
                let mut $tx = super::dialect::DriverStore::begin_write(&mut conn).await?;
                let out = $body;
                $tx.commit().await?;
                Ok(out)
            }
            .await;
            match outcome {
                Ok(out) => Ok(out),
                Err(e) => {
                    super::tx::settle(conn).await;
                    Err(super::tx::failed(&$store, e))
                }
            }
        }
        .await
    };
}

/// A failed write's error as the store explains it (see `explain`), counted.
pub(super) fn failed(store: &DriverStore, err: crate::DbError) -> StoreError {
    let err = store.explain(err);
    crate::error::count(&err);
    store.faults.record(&err);
    err
}

/// A connection whose write failed, made safe to use again: the failed transaction's rollback
/// (queued when it was dropped) runs now, and a connection that it did not leave outside every
/// transaction is closed instead of going back to the pool.
///
/// A fault can end a transaction by itself: SQLite rolls the whole transaction back on some
/// `SQLITE_FULL`s, and the queued `ROLLBACK` then fails ("no transaction is active"). sqlx's count
/// of open transactions stays at one, and the next `BEGIN` on that connection would fail ("at
/// non-zero transaction depth") for as long as the daemon runs. Closed, the pool opens a fresh
/// connection for the next write instead.
pub(super) async fn settle(mut conn: sqlx::pool::PoolConnection<dialect::Db>) {
    use sqlx::Connection as _;
    match conn.ping().await {
        Ok(()) if !conn.is_in_transaction() => {}
        // Debug: the fault behind it is logged where it is met, and a failing probe meets it
        // every half second.
        Ok(()) => {
            tracing::debug!("A failed write left its connection inside a transaction; closing it");
            conn.close_on_drop();
        }
        Err(e) => {
            tracing::debug!(error = %e, "A failed write left its connection broken; closing it");
            conn.close_on_drop();
        }
    }
}
