//! forkd's durable state: the SQLite implementation of [`Store`] (the interface
//! and its types live in `forkd_core::store`, re-exported here).
//!
//! Only this crate speaks SQL. Rows are private structs converted into domain types; the rest of
//! forkd sees sessions, batches, agents, messages, requests and notifications. The rows and
//! their conversions (`rows`) know no driver, so that another implementation can share them.

mod error;
mod rows;
mod sqlite;

pub use forkd_core::store::*;
pub use sqlite::{Durability, SqliteStore};

pub(crate) use error::DbError;
