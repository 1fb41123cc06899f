//! Isolated children (docs/contracts.md, "Isolation"): a snapshot of the session's workspace per
//! batch, a copy-on-write layer per child over it ([`crate::sandbox::layer`]), the child's
//! changes read from its layer, and applying them back to the live workspace.
//!
//! - [`snapshot`]: the batch's snapshot, a copy made once (reflinked where the file system can),
//!   and for a git workspace a commit of the working tree kept by a ref under `refs/forkd/`.
//! - [`changes`]: what a child added, modified and deleted, read from its layer's upper
//!   directory (whiteouts and opaque directories included), with a unified diff. Ignored files
//!   and `.git/` are left out.
//! - [`apply`]: a three-way merge of each changed file into the live workspace, all of a child's
//!   files or none, with strict checks on what a sandboxed child may have written.

pub mod apply;
mod beneath;
pub mod changes;
mod copy;
mod git;
pub mod snapshot;
pub mod tree;

pub use apply::ApplyOutcome;
pub use changes::Changes;
pub use forkd_core::isolation::{ChangeKind, Conflict, FileChange, Special};
pub use git::Repo;
pub use snapshot::{GitSnapshot, Snapshot};

/// Where snapshots and copies go when the daemon names no place: one folder per user under the
/// system's temporary directory.
pub fn default_root() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("forkd-isolation-{}", nix::unistd::getuid()))
}

/// The disk the files beneath `dir` take (their blocks), symlinks not followed: what a child's
/// copy costs, checked against its cap.
pub fn disk_usage(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut total = 0;
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        total += meta.blocks() * 512;
        if meta.is_dir() {
            total += disk_usage(&entry.path());
        }
    }
    total
}

/// Why an isolation step failed (not a conflict: those are outcomes).
#[derive(Debug, thiserror::Error)]
pub enum IsolationError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Git(String),
}

impl IsolationError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> IsolationError {
        IsolationError::Io {
            what: what.into(),
            source,
        }
    }
}
