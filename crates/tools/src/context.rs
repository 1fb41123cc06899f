//! What a tool call runs with (`ToolContext`, `ToolLimits`) and what it returns (`ToolOutput`).

use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::error::ToolError;
use crate::workspace::Workspace;

/// Bounds on what one tool call may cost, in time and in output the model must read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolLimits {
    /// Bash's timeout when the input gives none.
    pub bash_timeout: Duration,
    /// The most a Bash input's `timeout` may ask for.
    pub bash_max_timeout: Duration,
    /// Output longer than this (in bytes) is cut, keeping its head and tail.
    pub output_cap: usize,
    /// Read's default number of lines.
    pub read_lines: usize,
    /// Longer lines are truncated by Read (and Grep's `content` mode).
    pub line_chars: usize,
    /// The most paths, lines or counts that Glob and Grep list.
    pub max_results: usize,
}

impl Default for ToolLimits {
    fn default() -> Self {
        ToolLimits {
            bash_timeout: Duration::from_secs(120),
            bash_max_timeout: Duration::from_secs(600),
            output_cap: 30_000,
            read_lines: 2000,
            line_chars: 2000,
            max_results: 1000,
        }
    }
}

/// Everything a tool call needs from its caller.
#[derive(Debug, Clone)]
pub struct ToolContext {
    pub workspace: Workspace,
    /// Cancelled when the agent is killed or its run stops; Bash kills its process group then.
    pub cancel: CancellationToken,
    pub limits: ToolLimits,
    /// Told the process group of each Bash command once it is spawned, so the caller can
    /// record it while the command runs (see [`crate::process`]).
    pub process_groups: Option<UnboundedSender<crate::process::ProcessGroup>>,
    /// The sandbox Bash commands run in; `None`: unconfined (`full-access`).
    pub sandbox: Option<SandboxSpec>,
}

/// A session's sandbox and the paths it hides and lends, for Bash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSpec {
    pub sandbox: crate::sandbox::Sandbox,
    pub paths: crate::sandbox::SandboxPaths,
}

impl ToolContext {
    /// A context with default limits that reports no process group.
    pub fn new(workspace: Workspace, cancel: CancellationToken) -> ToolContext {
        ToolContext {
            workspace,
            cancel,
            limits: ToolLimits::default(),
            process_groups: None,
            sandbox: None,
        }
    }

    /// The same context, running Bash commands in `sandbox`.
    #[must_use]
    pub fn with_sandbox(self, sandbox: SandboxSpec) -> ToolContext {
        ToolContext {
            sandbox: Some(sandbox),
            ..self
        }
    }

    /// The same context, telling `groups` the process group of each Bash command it spawns.
    #[must_use]
    pub fn with_process_groups(
        self,
        groups: UnboundedSender<crate::process::ProcessGroup>,
    ) -> ToolContext {
        ToolContext {
            process_groups: Some(groups),
            ..self
        }
    }
}

/// A tool result as the model will see it, plus what the engine records about it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolOutput {
    pub content: String,
    pub is_error: bool,
    /// Workspace-relative paths that Write or Edit changed (for the child's report).
    pub files_changed: Vec<String>,
}

impl ToolOutput {
    /// A successful result that changed no file.
    pub fn ok(content: impl Into<String>) -> ToolOutput {
        ToolOutput {
            content: content.into(),
            ..ToolOutput::default()
        }
    }

    /// An error result for the model.
    pub fn error(content: impl Into<String>) -> ToolOutput {
        ToolOutput {
            content: content.into(),
            is_error: true,
            files_changed: Vec::new(),
        }
    }
}

impl From<ToolError> for ToolOutput {
    fn from(err: ToolError) -> ToolOutput {
        ToolOutput::error(err.to_string())
    }
}

/// Folds a tool's internal `Result` into the one shape the engine consumes.
pub(crate) fn finish(result: Result<ToolOutput, ToolError>) -> ToolOutput {
    result.unwrap_or_else(ToolOutput::from)
}
