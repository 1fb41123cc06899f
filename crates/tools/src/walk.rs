//! The directory walk behind Glob and Grep: `.gitignore`-aware, never inside `.git`, and never
//! following symlinks, so a link to a directory outside the workspace is not descended into,
//! and never into what the session's wall hides ([`crate::Wall`]).

use std::path::Path;

use ignore::{DirEntry, WalkBuilder};
use tokio_util::sync::CancellationToken;

use crate::workspace::Workspace;

/// Calls `visit` for every non-directory entry under `base` (or `base` itself if it is a file),
/// stopping early when `cancel` fires. Unreadable entries are skipped: one bad directory should
/// not fail a whole search; hidden ones are not visited (nor hidden directories entered). Returns
/// false when the walk was cancelled.
pub(crate) fn walk(
    base: &Path,
    workspace: &Workspace,
    cancel: &CancellationToken,
    mut visit: impl FnMut(&DirEntry),
) -> bool {
    let ws = workspace.clone();
    let walker = WalkBuilder::new(base)
        // Dot-files such as `.github/` are ordinary project files for an agent.
        .hidden(false)
        // Honour `.gitignore` in workspaces that are not (yet) git repositories too.
        .require_git(false)
        .follow_links(false)
        .filter_entry(move |entry| {
            entry.file_name() != ".git"
                && if entry.file_type().is_some_and(|t| t.is_dir()) {
                    ws.enters(entry.path())
                } else {
                    !ws.hides(entry.path())
                }
        })
        .build();
    for entry in walker.flatten() {
        if cancel.is_cancelled() {
            return false;
        }
        if entry.file_type().is_some_and(|t| !t.is_dir()) {
            visit(&entry);
        }
    }
    true
}

/// The message for a search that was stopped.
pub(crate) const CANCELLED: &str = "search cancelled";

/// Runs a blocking search off the async runtime's worker threads.
pub(crate) async fn blocking<T: Send + 'static>(
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T, crate::error::ToolError> {
    tokio::task::spawn_blocking(job)
        .await
        .map_err(|e| crate::error::ToolError::rejected(format!("search failed: {e}")))
}
