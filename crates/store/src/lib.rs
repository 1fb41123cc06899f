//! forkd's durable state: the SQLite and PostgreSQL implementations of [`Store`] (the interface
//! and its types live in `forkd_core::store`, re-exported here).
//!
//! Only this crate speaks SQL. Rows are private structs converted into domain types; the rest of
//! forkd sees sessions, batches, agents, messages, requests and notifications. The two
//! implementations share their rows and conversions (`rows`, which knows no driver) and their
//! statements and `Store` methods (`shared/`, compiled once per driver); each keeps its
//! connections, its transactions and a small `dialect` of what it says differently, since that is
//! where SQLite (one writer at a time) and PostgreSQL (row locks, see `postgres.rs`) differ.

mod disk;
mod error;
mod postgres;
mod rows;
mod sqlite;

pub use error::{STORE_ERRORS, describe_metrics};
pub use forkd_core::store::*;
pub use postgres::{DEFAULT_CONNECTIONS, PgStore, redacted_url};
pub use sqlite::{Durability, PageLimit, SqliteStore};

pub(crate) use error::DbError;
