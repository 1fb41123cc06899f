//! The store's statements and methods, written once for both drivers.
//!
//! This folder is not a module of the crate: `sqlite.rs` and `postgres.rs` each include it as
//! their own `shared` module (`#[path = "shared/mod.rs"]`), so everything here is compiled twice,
//! once per driver, with no generic code. The two copies differ only in what `super::dialect`
//! (`sqlite/dialect.rs` or `postgres/dialect.rs`, the same items in both) gives them:
//!
//! - the driver's types: `Db`, `Conn`, `Pool`, and `DriverStore`, the store `store.rs`
//!   implements [`crate::Store`] for;
//! - the locking: `FOR_UPDATE` and `SKIP_LOCKED` (row-lock clauses, empty on SQLite, whose
//!   single writer already serializes writes), `lock_agents` and `lock_sessions_of` (no-ops on
//!   SQLite), `begin_snapshot` for reads that must see one snapshot;
//! - the notification counter (`next_notification_seq`) and `LISTEN`/`NOTIFY` (`notify`,
//!   `listen`, `signal_background`: no-ops on SQLite, where one daemon uses the database);
//! - the clock leases are written and compared on (`NOW_MS`, SQL), whether a prompt's daemon
//!   still holds its agent (`PROMPT_HELD`), lists of ids (`push_ids`), the tool output column's
//!   type (`output_param`) and the insertion order of tool calls (`INSERTION_ORDER`).
//!
//! Everything else is one SQL text for both: placeholders are `$N` (SQLite reads `$N` as the
//! N-th argument), upserts are `ON CONFLICT`, casts are `CAST(… AS …)`, booleans `TRUE`/`FALSE`.
//! A statement that takes a dialect item is built with `format!` and [`sql`].

#[macro_use]
mod tx;
pub(super) mod agent_params;
pub(super) mod agents;
pub(super) mod batches;
pub(super) mod compactions;
mod hook_runs;
pub(super) mod idempotency;
pub(super) mod isolation;
pub(super) mod notifications;
pub(super) mod pending;
pub(super) mod probes;
pub(super) mod prompts;
pub(super) mod requests;
mod schedules;
pub(super) mod sessions;
pub(super) mod stats;
mod store;
pub(super) mod tool_calls;
pub(super) mod uploads;
mod webhooks;

use super::dialect;
use sqlx::AssertSqlSafe;

/// A statement built from text and dialect items (none of it from a caller).
fn sql(text: String) -> AssertSqlSafe<String> {
    AssertSqlSafe(text)
}

/// `LIMIT` with 0 meaning none: a limit past every table's size, which both databases read.
fn limit_param(limit: u32) -> i64 {
    if limit == 0 {
        i64::MAX
    } else {
        i64::from(limit)
    }
}

/// Narrows a listing to a session, a tenant's sessions and a batch, each when given: the scope
/// the agent and notification filters share.
fn push_scope(
    q: &mut sqlx::QueryBuilder<dialect::Db>,
    session: Option<forkd_core::SessionId>,
    tenant: Option<&forkd_core::Tenant>,
    batch: Option<forkd_core::BatchId>,
) {
    if let Some(session_id) = session {
        q.push(" AND session_id = ")
            .push_bind(session_id.to_string());
    }
    if let Some(tenant) = tenant {
        q.push(" AND session_id IN (SELECT id FROM sessions WHERE tenant = ")
            .push_bind(tenant.name().to_owned())
            .push(")");
    }
    if let Some(batch_id) = batch {
        q.push(" AND batch_id = ").push_bind(batch_id.to_string());
    }
}
