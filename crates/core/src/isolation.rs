//! Isolated children (docs/contracts.md, "Isolation"): what a batch's `isolation` asks for, the
//! batch's snapshot, and the changes each isolated child made, as the store keeps them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{AgentId, BatchId};

/// Whether a batch's children work in the session's workspace or each in its own copy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// The session's workspace, shared (the default).
    #[default]
    None,
    /// A copy-on-write layer per child over a snapshot of the workspace taken at the fork.
    Copy,
}

impl Isolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::None => "none",
            Isolation::Copy => "copy",
        }
    }
}

impl fmt::Display for Isolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Isolation {
    type Err = String;

    fn from_str(s: &str) -> Result<Isolation, String> {
        match s {
            "" | "none" => Ok(Isolation::None),
            "copy" => Ok(Isolation::Copy),
            other => Err(format!(
                "unknown isolation {other:?}: expected \"copy\" or \"none\""
            )),
        }
    }
}

/// A batch's snapshot of its session's workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchSnapshot {
    pub batch_id: BatchId,
    /// The copy the children's layers lie over (on this daemon's machine).
    pub dir: String,
    /// The children that work in copies; `None`: every child of the batch.
    pub agents: Option<Vec<AgentId>>,
    /// For a git workspace: the ref that keeps the snapshot commit, and the commit.
    pub git_ref: Option<String>,
    pub git_commit: Option<String>,
    pub files: u64,
    pub bytes: u64,
    pub took_ms: u64,
    pub created_at_ms: i64,
}

/// What happened to one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "added",
            ChangeKind::Modified => "modified",
            ChangeKind::Deleted => "deleted",
        }
    }
}

/// What a child's file is where it is not a regular file: a symlink is applied as a link (and
/// only if it points inside the workspace); anything else is refused at apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Special {
    /// A symbolic link and its target.
    Symlink(String),
    /// A FIFO, socket or device node, in words.
    Other(String),
}

/// One changed path, relative to the workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChange {
    pub path: String,
    pub kind: ChangeKind,
    /// Lines added and removed (0 for a binary file).
    pub added: u64,
    pub removed: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub binary: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub special: Option<Special>,
}

/// Why one file of a child was not applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conflict {
    pub path: String,
    pub reason: String,
}

/// Where an isolated child's copy stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CopyState {
    /// Its changes are kept, not applied.
    Kept,
    /// Applied to the session's workspace; the copy is gone.
    Applied,
    /// Apply found conflicts (kept, with them).
    Conflicted,
    /// Discarded; the copy is gone.
    Discarded,
}

impl CopyState {
    pub fn as_str(self) -> &'static str {
        match self {
            CopyState::Kept => "kept",
            CopyState::Applied => "applied",
            CopyState::Conflicted => "conflicted",
            CopyState::Discarded => "discarded",
        }
    }
}

impl FromStr for CopyState {
    type Err = String;

    fn from_str(s: &str) -> Result<CopyState, String> {
        match s {
            "kept" => Ok(CopyState::Kept),
            "applied" => Ok(CopyState::Applied),
            "conflicted" => Ok(CopyState::Conflicted),
            "discarded" => Ok(CopyState::Discarded),
            other => Err(format!("unknown copy state {other:?}")),
        }
    }
}

/// An isolated child's changes against its batch's snapshot, computed when it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentChanges {
    pub agent_id: AgentId,
    pub batch_id: BatchId,
    pub files: Vec<FileChange>,
    /// The unified diff of them all.
    pub diff: String,
    /// The child called an MCP tool not marked read-only: it may have changed things outside
    /// its copy that no diff shows.
    pub outside_possible: bool,
    pub state: CopyState,
    /// The last apply's conflicts (for `Conflicted`).
    pub conflicts: Vec<Conflict>,
    pub updated_at_ms: i64,
}

/// Where an agent's snapshot is kept: its batch's, or for a typed agent (which has none) its own,
/// under the id its own id gives.
pub fn snapshot_key(agent: &crate::Agent) -> Option<BatchId> {
    match (agent.batch_id, agent.kind) {
        (Some(batch), _) => Some(batch),
        (None, crate::AgentKind::Typed) => Some(typed_key(agent.id)),
        (None, _) => None,
    }
}

/// The snapshot key of typed agent `id`.
pub fn typed_key(id: AgentId) -> BatchId {
    BatchId::from_uuid(id.as_uuid())
}

impl BatchSnapshot {
    /// Whether child `agent` of the batch works in a copy.
    pub fn isolates(&self, agent: AgentId) -> bool {
        self.agents.as_ref().is_none_or(|a| a.contains(&agent))
    }
}

impl AgentChanges {
    /// `3 files (+12 -4)`, or `no changes`.
    pub fn summary(&self) -> String {
        summary(&self.files)
    }
}

/// `3 files (+12 -4)`, or `no changes`.
pub fn summary(files: &[FileChange]) -> String {
    if files.is_empty() {
        return "no changes".to_owned();
    }
    let added: u64 = files.iter().map(|f| f.added).sum();
    let removed: u64 = files.iter().map(|f| f.removed).sum();
    let n = files.len();
    format!(
        "{n} file{} (+{added} -{removed})",
        if n == 1 { "" } else { "s" }
    )
}

/// `path` as git writes a file name with `core.quotePath` on (its default): unchanged when it
/// holds only printable ASCII other than `"` and `\`; otherwise in double quotes, with `\n`,
/// `\t`, `\"`, `\\` and the like, and every other control or non-ASCII byte as three octal
/// digits. So no file name can draw a line of a diff, a list or a notification, or hide itself
/// behind invisible or right-to-left characters; `git apply` and `patch` read the quoted form.
pub fn quote_path(path: &str) -> std::borrow::Cow<'_, str> {
    let plain = |b: u8| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\';
    if path.bytes().all(plain) {
        return std::borrow::Cow::Borrowed(path);
    }
    let mut out = String::with_capacity(path.len() + 8);
    out.push('"');
    for b in path.bytes() {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x07 => out.push_str("\\a"),
            0x08 => out.push_str("\\b"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            0x0b => out.push_str("\\v"),
            0x0c => out.push_str("\\f"),
            b'\r' => out.push_str("\\r"),
            b if plain(b) => out.push(char::from(b)),
            b => out.push_str(&format!("\\{b:03o}")),
        }
    }
    out.push('"');
    std::borrow::Cow::Owned(out)
}

/// `diff` with each `GIT binary patch` body (zlib and base85: no use to a reader) replaced by a
/// line saying it is there: what `forkctl diff` and the web view show. The patch itself keeps
/// them (`forkctl diff --format patch`).
pub fn without_binary_patches(diff: &str) -> std::borrow::Cow<'_, str> {
    if !diff.contains("\nGIT binary patch\n") {
        return std::borrow::Cow::Borrowed(diff);
    }
    let mut out = String::with_capacity(diff.len());
    let mut skipping = false;
    for line in diff.split_inclusive('\n') {
        if line == "GIT binary patch\n" {
            out.push_str("GIT binary patch (not shown: forkctl diff --format patch prints it)\n");
            skipping = true;
            continue;
        }
        // A binary patch's lines begin with a length letter, or are empty; a file's part or a
        // comment of forkd's ends it.
        if skipping && !(line.starts_with("diff --git ") || line.starts_with("# ")) {
            continue;
        }
        skipping = false;
        out.push_str(line);
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn isolation_parses_its_two_words_and_names_a_bad_one() {
        assert_eq!("copy".parse(), Ok(Isolation::Copy));
        assert_eq!("none".parse(), Ok(Isolation::None));
        assert_eq!("".parse(), Ok(Isolation::None));
        let err = "worktree".parse::<Isolation>().unwrap_err();
        assert!(err.contains("\"worktree\""), "{err}");
    }

    #[test]
    fn a_summary_counts_files_and_lines() {
        let f = |added, removed| FileChange {
            path: "a".into(),
            kind: ChangeKind::Modified,
            added,
            removed,
            binary: false,
            special: None,
        };
        assert_eq!(summary(&[]), "no changes");
        assert_eq!(summary(&[f(2, 1)]), "1 file (+2 -1)");
        assert_eq!(summary(&[f(2, 1), f(0, 3)]), "2 files (+2 -4)");
    }

    #[test]
    fn binary_patch_bodies_are_left_out_of_what_is_shown() {
        let diff = "diff --git a/x b/x\nindex 1..2\nGIT binary patch\nliteral 3\nHcmZ\n\n\
                    literal 0\nHcmV\n\ndiff --git a/y b/y\n--- a/y\n+++ b/y\n@@ -1 +1 @@\n-a\n+b\n";
        assert_eq!(
            without_binary_patches(diff),
            "diff --git a/x b/x\nindex 1..2\nGIT binary patch (not shown: forkctl diff --format \
             patch prints it)\ndiff --git a/y b/y\n--- a/y\n+++ b/y\n@@ -1 +1 @@\n-a\n+b\n"
        );
        assert_eq!(without_binary_patches("--- a\n+++ b\n"), "--- a\n+++ b\n");
    }

    #[test]
    fn file_names_are_quoted_as_git_quotes_them() {
        assert_eq!(quote_path("src/main.rs"), "src/main.rs");
        assert_eq!(quote_path("with space.txt"), "with space.txt");
        assert_eq!(
            quote_path("spoof\n-SPOOFDEL removed line\n+SPOOFADD added line.txt"),
            "\"spoof\\n-SPOOFDEL removed line\\n+SPOOFADD added line.txt\""
        );
        assert_eq!(quote_path("a\tb\"c\\d"), "\"a\\tb\\\"c\\\\d\"");
        assert_eq!(quote_path("bell\u{7}\u{1b}[31m"), "\"bell\\a\\033[31m\"");
        // Non-ASCII (a right-to-left override included) as octal bytes, as git does.
        assert_eq!(quote_path("é"), "\"\\303\\251\"");
        assert_eq!(quote_path("a\u{202e}b"), "\"a\\342\\200\\256b\"");
    }
}
