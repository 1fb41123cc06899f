//! forkd's tool layer: the built-in workspace tools (Read, Write, Edit, Glob, Grep, Bash), their
//! confinement to the session's workspace, and permission decisions.
//!
//! This crate knows nothing about the engine, the store, gRPC or models: the engine hands it a
//! tool name, the model's JSON input and a [`ToolContext`], and gets a [`ToolOutput`] back.
//! Tool failures are results (`is_error`), never Rust errors, because the model must read them.
//! The Agent tool is the engine's own business and is not dispatched here.

pub mod bash;
mod cap;
mod context;
pub mod edit;
mod env;
mod error;
mod fsutil;
pub mod glob;
pub mod grep;
pub mod hook;
mod input;
pub mod isolation;
mod pattern;
pub mod permission;
pub mod process;
pub mod read;
mod rule;
pub mod sandbox;
pub mod server;
mod walk;
pub mod wall;
pub mod workspace;
pub mod write;

pub use context::{SandboxSpec, ToolContext, ToolLimits, ToolOutput};
pub use error::ToolError;
pub use permission::{Decision, Policy};
pub use process::{Leftover, ProcessGroup};
pub use rule::{Rule, RuleError};
pub use wall::Wall;
pub use workspace::{Access, Workspace};

use serde_json::Value;

/// The tools that only look: safe to run again after an interruption, allowed in every mode.
const READ_ONLY: [&str; 3] = ["Read", "Glob", "Grep"];

/// The built-in tools that reach the file system: the ones a session's sandbox and its wall
/// ([`Wall`]) confine.
const FILE_TOOLS: [&str; 6] = ["Read", "Write", "Edit", "Glob", "Grep", "Bash"];

/// Whether `name` is a built-in tool that reaches the file system.
pub fn touches_files(name: &str) -> bool {
    FILE_TOOLS.contains(&name)
}

/// Whether `name` is a read-only tool. The engine re-runs a read-only tool whose result was
/// lost to an interruption, but never a mutating one.
pub fn is_read_only(name: &str) -> bool {
    READ_ONLY.contains(&name)
}

/// Runs the built-in tool `name` with the model's `input`.
pub async fn run_tool(name: &str, input: &Value, ctx: &ToolContext) -> ToolOutput {
    if !input.is_object() {
        return ToolOutput::error(format!("{name}'s input must be a JSON object"));
    }
    match name {
        "Read" => read::run(input, ctx).await,
        "Write" => write::run(input, ctx).await,
        "Edit" => edit::run(input, ctx).await,
        "Glob" => glob::run(input, ctx).await,
        "Grep" => grep::run(input, ctx).await,
        "Bash" => bash::run(input, ctx).await,
        _ => ToolOutput::error(format!("unknown tool `{name}`")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    #[test]
    fn only_looking_tools_are_read_only() {
        for name in ["Read", "Glob", "Grep"] {
            assert!(is_read_only(name), "{name}");
        }
        for name in ["Write", "Edit", "Bash", "Agent", "read", ""] {
            assert!(!is_read_only(name), "{name}");
        }
    }

    /// The engine spawns tool calls on a multi-threaded runtime, so the future must be `Send`.
    #[test]
    fn tool_futures_are_send() {
        fn assert_send<T: Send>(_: &T) {}
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(
            Workspace::new(dir.path()).unwrap(),
            CancellationToken::new(),
        );
        let input = json!({});
        assert_send(&run_tool("Bash", &input, &ctx));
    }

    #[tokio::test]
    async fn unknown_tools_and_non_object_inputs_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(
            Workspace::new(dir.path()).unwrap(),
            CancellationToken::new(),
        );
        let out = run_tool("Nope", &json!({}), &ctx).await;
        assert!(out.is_error && out.content.contains("unknown tool `Nope`"));
        let out = run_tool("Read", &json!("a.txt"), &ctx).await;
        assert!(
            out.is_error && out.content.contains("JSON object"),
            "{}",
            out.content
        );
    }
}
