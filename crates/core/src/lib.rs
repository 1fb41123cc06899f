//! forkd's domain model and the fork construction.
//!
//! This crate is pure: no I/O, no runtime, no tonic, no sqlx (the store interface declares async
//! methods but runs nothing). Everything that decides the bytes of a model request lives here, so
//! the byte-identity invariants can be property-tested in isolation.

pub mod agent;
pub mod branch;
pub mod calc;
pub mod compaction;
pub mod digest;
pub mod fork;
pub mod hooks;
pub mod ids;
pub mod isolation;
pub mod json;
pub mod limits;
pub mod message;
pub mod output;
pub mod patch;
pub mod plan;
pub mod pricing;
pub mod prompt;
pub mod query;
pub mod report;
pub mod request;
pub mod schedule;
pub mod session;
pub mod store;
pub mod tenant;
pub mod tools;
pub mod upload;
pub mod usage;
pub mod webhook;

pub use agent::{
    Agent, AgentKind, AgentState, Directive, Notification, NotificationKind, NotificationStatus,
    ReportTo,
};
pub use ids::{
    AgentId, BatchId, DaemonId, DeliveryId, PromptId, RequestId, SessionId, UploadId, WebhookId,
};
pub use json::RawJson;
pub use limits::{Limit, Limits};
pub use message::{Block, BlockKind, Message, Role};
pub use tenant::Tenant;
pub use usage::Usage;

/// `names` as a list a sentence can end with: `a, b or c`.
pub fn choices<const N: usize>(names: [&str; N]) -> String {
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}
