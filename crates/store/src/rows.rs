//! What the two implementations share: the rows they read, the values they write, and the
//! conversions between those and the domain types. Nothing here touches a connection.
//!
//! Both schemas store the same columns with the same meaning: integers as 64-bit signed
//! (`INTEGER`, `BIGINT`), `REAL` / `DOUBLE PRECISION` as `f64`, the 0/1 columns as `bool`
//! (SQLite's `INTEGER`, PostgreSQL's `BOOLEAN`), text as text. So one row struct decodes from
//! either driver (`sqlx::FromRow` derives for any row type), and one values struct binds to either.
//!
//! The inserts are here too, as statement text with `$N` placeholders (SQLite reads `$N` as the
//! N-th argument, as PostgreSQL does) and a `bind_*!` macro that binds their values in that
//! order. The other statements, and what runs them, are in `shared/`.

pub(crate) mod agent_params;
pub(crate) mod agents;
pub(crate) mod batches;
pub(crate) mod compactions;
pub(crate) mod convert;
pub(crate) mod idempotency;
pub(crate) mod notifications;
pub(crate) mod prompts;
pub(crate) mod requests;
pub(crate) mod schedules;
pub(crate) mod sessions;
pub(crate) mod stats;
pub(crate) mod tool_calls;
pub(crate) mod webhooks;
