//! Helpers shared by the integration tests: a temporary workspace and a tool context on it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use forkd_tools::{ToolContext, ToolOutput, Workspace, run_tool};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// A temporary directory whose `ws/` subdirectory is the workspace, so tests can put things
/// beside the workspace (outside it) in `base()`.
pub struct Env {
    _dir: tempfile::TempDir,
    pub base: PathBuf,
    pub ctx: ToolContext,
}

impl Env {
    pub fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(base.join("ws")).unwrap();
        let workspace = Workspace::new(base.join("ws")).unwrap();
        let ctx = ToolContext::new(workspace, CancellationToken::new());
        Env {
            _dir: dir,
            base,
            ctx,
        }
    }

    pub fn root(&self) -> &Path {
        self.ctx.workspace.root()
    }

    /// Writes `content` at `rel` under the workspace, creating directories.
    pub fn file(&self, rel: &str, content: &str) -> PathBuf {
        let path = self.root().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, content).unwrap();
        path
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.root().join(rel)).unwrap()
    }

    pub async fn call(&self, tool: &str, input: Value) -> ToolOutput {
        run_tool(tool, &input, &self.ctx).await
    }
}

/// Asserts a successful output and returns its content.
pub fn ok(out: ToolOutput) -> String {
    assert!(!out.is_error, "unexpected error: {}", out.content);
    out.content
}

/// Asserts an error output whose message contains `needle`.
pub fn err(out: ToolOutput, needle: &str) {
    assert!(
        out.is_error,
        "expected an error containing {needle:?}, got: {}",
        out.content
    );
    assert!(
        out.content.contains(needle),
        "expected {needle:?} in: {}",
        out.content
    );
}
