//! The tool layer's one error type. Its `Display` text is what the model reads in an `is_error`
//! tool result, so every message names the path or field at fault and says why.

use std::io;
use std::path::PathBuf;

/// Why a tool call (or a workspace path resolution) failed.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("the path is empty")]
    EmptyPath,

    #[error("path {path:?} contains a NUL byte")]
    NulByte { path: String },

    #[error("{}", outside_message(path, resolved, root))]
    OutsideWorkspace {
        path: String,
        /// Where the path actually leads once `..` and symlinks are resolved.
        resolved: PathBuf,
        root: PathBuf,
    },

    #[error(
        "path {path} uses `..` below a directory that does not exist; \
         refusing it because it cannot be checked against the workspace {}",
        root.display()
    )]
    UncheckableDotDot { path: String, root: PathBuf },

    #[error("path {path} cannot be resolved (a dangling or looping symlink?): {source}")]
    Unresolvable { path: String, source: io::Error },

    #[error(
        "path {path} is hidden from this session, from its tools as from its commands (forkd's \
         home, another session's workspace, or a secret); work without it"
    )]
    Hidden { path: String },

    #[error("the workspace {} was replaced since its session was created ({reason}); \
             forkd works only in the directory it was given", root.display())]
    Replaced { root: PathBuf, reason: String },

    #[error("file {path} does not exist")]
    NotFound { path: String },

    #[error("the workspace root {} is unusable: {source}", root.display())]
    BadRoot { root: PathBuf, source: io::Error },

    #[error("missing required field `{field}`")]
    MissingField { field: &'static str },

    #[error("field `{field}` must be {expected}")]
    WrongType {
        field: &'static str,
        expected: &'static str,
    },

    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },

    /// A tool refused the call for a reason of its own (e.g. Edit's `old_string` not found).
    #[error("{0}")]
    Rejected(String),
}

impl ToolError {
    /// A rejection with a message for the model.
    pub fn rejected(message: impl Into<String>) -> Self {
        ToolError::Rejected(message.into())
    }

    pub(crate) fn io(path: &str, source: io::Error) -> Self {
        ToolError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

fn outside_message(path: &str, resolved: &std::path::Path, root: &std::path::Path) -> String {
    let mut message = format!("path {path} is outside the workspace {}", root.display());
    // Only mention the resolved target when it differs from what the model wrote: that is the
    // case that needs explaining (a `..` or a symlink leading out).
    if resolved != std::path::Path::new(path) {
        message.push_str(&format!(" (it resolves to {})", resolved.display()));
    }
    message
}
