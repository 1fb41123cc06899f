//! What an isolated child changed, read from the files (its layer), never from its words.
//!
//! The layer's upper directory holds everything the child wrote: a whole file for each file it
//! created or changed, a *whiteout* (a character device 0/0) for each entry it removed, and an
//! *opaque* directory (the `user.overlay.opaque` mark) for a directory it removed and made
//! again. Reading it costs what the child changed, not the size of the workspace. A file copied
//! up unchanged (touched, or its mode changed) is no change.
//!
//! Left out: `.git/` (read-only to the child anyway) and files the workspace's `.gitignore`
//! files ignore (build output), as `git status` leaves them out.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use forkd_core::isolation::{ChangeKind, FileChange, Special, quote_path};
use forkd_core::patch::{self, NO_BLOB, blob_id};
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use serde::{Deserialize, Serialize};

use super::IsolationError;
use super::git::Repo;
use crate::sandbox::layer::LayerDirs;

/// A child's changes: each path, and the unified diff of them all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Changes {
    pub files: Vec<FileChange>,
    pub diff: String,
}

impl Changes {
    /// The changed paths, for the report's "Files changed".
    pub fn paths(&self) -> Vec<String> {
        self.files.iter().map(|f| f.path.clone()).collect()
    }

    /// `3 files (+12 -4)`, or `no changes`.
    pub fn summary(&self) -> String {
        forkd_core::isolation::summary(&self.files)
    }
}

/// What the upper directory says of one path.
enum Upper {
    File(PathBuf),
    Special(Special),
    Removed,
}

/// Reads `dirs`' changes against the snapshot (`dirs.lower`).
pub fn collect(dirs: &LayerDirs) -> Result<Changes, IsolationError> {
    collect_in(dirs, None)
}

/// [`collect`] for a git workspace whose snapshot is commit `git.1` of repository `git.0`: a file
/// the snapshot tracks is reported even where a `.gitignore` matches it (a force-added file), as
/// `git status` would.
pub fn collect_in(
    dirs: &LayerDirs,
    git: Option<(Repo<'_>, &str)>,
) -> Result<Changes, IsolationError> {
    let mut found: BTreeMap<String, Upper> = BTreeMap::new();
    walk_upper(dirs, Path::new(""), true, &mut found)?;
    let ignored = Ignored::new(dirs);
    let mut tracked: Option<std::collections::HashSet<String>> = None;
    let mut changes = Changes::default();
    for (path, upper) in found {
        if path == ".git" || path.starts_with(".git/") {
            continue;
        }
        if ignored.is(&path) {
            let Some((repo, commit)) = git else {
                continue;
            };
            if tracked.is_none() {
                tracked = Some(tracked_files(repo, commit)?);
            }
            if !tracked.as_ref().is_some_and(|t| t.contains(&path)) {
                continue;
            }
        }
        let snapshot = in_snapshot(&dirs.lower, Path::new(&path));
        let base = snapshot
            .as_ref()
            .and_then(|l| std::fs::symlink_metadata(l).ok())
            .filter(|m| !m.is_dir());
        let lower = snapshot.unwrap_or_default();
        let change = match upper {
            Upper::Removed => match base {
                Some(_) => file_change(&path, ChangeKind::Deleted, Some(&lower), None)?,
                None => continue,
            },
            Upper::File(file) => {
                let kind = match &base {
                    Some(_) => ChangeKind::Modified,
                    None => ChangeKind::Added,
                };
                if kind == ChangeKind::Modified && same_content(&lower, &file) {
                    continue;
                }
                file_change(
                    &path,
                    kind,
                    base.as_ref().map(|_| lower.as_path()),
                    Some(&file),
                )?
            }
            Upper::Special(special) => {
                let kind = match &base {
                    Some(_) => ChangeKind::Modified,
                    None => ChangeKind::Added,
                };
                if let (Special::Symlink(target), Some(meta)) = (&special, &base)
                    && meta.file_type().is_symlink()
                    && std::fs::read_link(&lower).is_ok_and(|t| t.as_os_str() == target.as_str())
                {
                    continue;
                }
                match &special {
                    // A link is a file of mode 120000 whose content is its target, as git has it.
                    Special::Symlink(_) => {
                        let upper = dirs.upper.join(&path);
                        let before = base.as_ref().map(|_| lower.as_path());
                        let (mut change, diff) = file_change(&path, kind, before, Some(&upper))?;
                        change.special = Some(special);
                        changes.diff.push_str(&diff);
                        changes.files.push(change);
                    }
                    // Nothing a patch can carry: said in a comment, outside any file's part.
                    Special::Other(what) => {
                        changes.diff.push_str(&format!(
                            "# {}: {what}, which no patch carries\n",
                            quote_path(&path)
                        ));
                        changes.files.push(FileChange {
                            path,
                            kind,
                            added: 0,
                            removed: 0,
                            binary: false,
                            special: Some(special),
                        });
                    }
                }
                continue;
            }
        };
        changes.diff.push_str(&change.1);
        changes.files.push(change.0);
    }
    Ok(changes)
}

/// The files commit `commit` of `repo` tracks.
fn tracked_files(
    repo: Repo<'_>,
    commit: &str,
) -> Result<std::collections::HashSet<String>, IsolationError> {
    let index = repo.workspace.join(".git/index");
    let listed =
        super::git::Git::new(repo, &index).run(&["ls-tree", "-r", "-z", "--name-only", commit])?;
    Ok(listed
        .split('\0')
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect())
}

/// `rel` in the snapshot `lower`, if every directory along it is a directory there. A link along
/// it (one the session planted before the fork, which the snapshot copied) would lead the daemon
/// out of the snapshot to whatever it can read: what the child made beneath such a path has no
/// counterpart in the snapshot. The snapshot is the daemon's alone and never changes, so what
/// this finds holds.
pub(crate) fn in_snapshot(lower: &Path, rel: &Path) -> Option<PathBuf> {
    let mut at = lower.to_path_buf();
    let mut parts = rel.components().peekable();
    while let Some(part) = parts.next() {
        at.push(part);
        if parts.peek().is_some() && !std::fs::symlink_metadata(&at).is_ok_and(|m| m.is_dir()) {
            return None;
        }
    }
    Some(at)
}

/// Collects what `upper/rel` holds, recursively: files, specials and removals (a whiteout, or a
/// lower entry an opaque directory hides). `in_lower`: `rel` is a directory in the snapshot too
/// (every directory along it one: see [`in_snapshot`]).
fn walk_upper(
    dirs: &LayerDirs,
    rel: &Path,
    in_lower: bool,
    found: &mut BTreeMap<String, Upper>,
) -> Result<(), IsolationError> {
    let dir = dirs.upper.join(rel);
    let entries = std::fs::read_dir(&dir).or_else(|e| {
        // A directory the child made unreadable (`chmod 000`): its files are the daemon user's,
        // so it is opened up to be read.
        if e.kind() != std::io::ErrorKind::PermissionDenied {
            return Err(e);
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        std::fs::read_dir(&dir)
    });
    let entries =
        entries.map_err(|e| IsolationError::io(format!("cannot read {}", dir.display()), e))?;
    for entry in entries {
        let entry =
            entry.map_err(|e| IsolationError::io(format!("cannot read {}", dir.display()), e))?;
        let rel = rel.join(entry.file_name());
        let key = rel.to_string_lossy().into_owned();
        let meta = entry
            .metadata()
            .map_err(|e| IsolationError::io(format!("cannot stat {key}"), e))?;
        let kind = meta.file_type();
        let lower = dirs.lower.join(&rel);
        let lower_meta = in_lower
            .then(|| std::fs::symlink_metadata(&lower).ok())
            .flatten();
        if kind.is_char_device() && meta.rdev() == 0 {
            if lower_meta.is_some() {
                removed_below(&lower, &rel, found);
            }
            found.insert(key, Upper::Removed);
        } else if kind.is_dir() {
            let mut mark = [0u8; 4];
            let opaque = rustix::fs::lgetxattr(entry.path(), "user.overlay.opaque", &mut mark)
                .is_ok_and(|n| mark[..n] == *b"y");
            match &lower_meta {
                Some(m) if m.is_dir() && opaque => removed_below(&lower, &rel, found),
                Some(m) if !m.is_dir() => {
                    found.insert(key, Upper::Removed);
                }
                _ => {}
            }
            let beneath = lower_meta.as_ref().is_some_and(|m| m.is_dir());
            walk_upper(dirs, &rel, beneath, found)?;
        } else {
            if lower_meta.as_ref().is_some_and(|m| m.is_dir()) {
                removed_below(&lower, &rel, found);
            }
            let upper = if kind.is_file() {
                Upper::File(entry.path())
            } else if kind.is_symlink() {
                let target = std::fs::read_link(entry.path())
                    .map_err(|e| IsolationError::io(format!("cannot read link {key}"), e))?;
                Upper::Special(Special::Symlink(target.to_string_lossy().into_owned()))
            } else {
                let what = if kind.is_fifo() {
                    "a FIFO"
                } else if kind.is_socket() {
                    "a socket"
                } else {
                    "a device node"
                };
                Upper::Special(Special::Other(what.to_owned()))
            };
            found.insert(key, upper);
        }
    }
    Ok(())
}

/// Marks every non-directory beneath the lower directory `lower` (shown as `rel`) removed.
fn removed_below(lower: &Path, rel: &Path, found: &mut BTreeMap<String, Upper>) {
    // A symlink in the snapshot is an entry of its own, never a directory to list.
    if !std::fs::symlink_metadata(lower).is_ok_and(|m| m.is_dir()) {
        return;
    }
    let Ok(entries) = std::fs::read_dir(lower) else {
        return;
    };
    for entry in entries.flatten() {
        let rel = rel.join(entry.file_name());
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            removed_below(&entry.path(), &rel, found);
        } else {
            found
                .entry(rel.to_string_lossy().into_owned())
                .or_insert(Upper::Removed);
        }
    }
}

fn same_content(a: &Path, b: &Path) -> bool {
    match (std::fs::symlink_metadata(a), std::fs::symlink_metadata(b)) {
        (Ok(ma), Ok(mb)) if ma.is_file() && mb.is_file() && ma.len() == mb.len() => {
            matches!((std::fs::read(a), std::fs::read(b)), (Ok(x), Ok(y)) if x == y)
        }
        _ => false,
    }
}

/// The largest file a binary patch carries; a larger one is only said to differ.
const BINARY_PATCH_LIMIT: usize = 16 << 20;

/// One side of a file's change as git sees it: its content (a link's target, for a link) and
/// its mode.
pub struct Side {
    pub content: Vec<u8>,
    pub mode: u32,
}

impl Side {
    /// The file at `path`, never followed if it is a link (what it points at may be anything the
    /// daemon can read).
    pub fn read(path: &Path) -> Result<Side, String> {
        use std::os::unix::ffi::OsStrExt;
        let meta = std::fs::symlink_metadata(path).map_err(|e| e.to_string())?;
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(path).map_err(|e| e.to_string())?;
            return Ok(Side {
                content: target.as_os_str().as_bytes().to_vec(),
                mode: 0o120_000,
            });
        }
        if !meta.is_file() {
            return Err("not a regular file".to_owned());
        }
        Ok(Side {
            content: std::fs::read(path).map_err(|e| e.to_string())?,
            mode: if meta.mode() & 0o111 == 0 {
                0o100_644
            } else {
                0o100_755
            },
        })
    }
}

impl Side {
    /// The file at `rel` beneath the directory `ws`, which an agent may have changed: no
    /// symbolic link along the path is followed (one is an error), and a link at the end is read
    /// as itself. `None` when nothing is there (or a file stands where a directory was).
    pub fn read_beneath(ws: &Path, rel: &str) -> Result<Option<Side>, String> {
        let live = super::beneath::Root::open(ws)?.read(Path::new(rel))?;
        Ok(live.map(|live| Side {
            mode: if live.link {
                0o120_000
            } else if live.permissions & 0o111 == 0 {
                0o100_644
            } else {
                0o100_755
            },
            content: live.content,
        }))
    }
}

/// One file's change and its part of the diff: git's patch format, which `git apply` and
/// `patch -p1` take as is (a binary file as a `GIT binary patch`).
fn file_change(
    path: &str,
    kind: ChangeKind,
    before: Option<&Path>,
    after: Option<&Path>,
) -> Result<(FileChange, String), IsolationError> {
    let read = |p: Option<&Path>| p.map(Side::read).transpose();
    let (old, new) = match (read(before), read(after)) {
        (Ok(old), Ok(new)) => (old, new),
        // An unreadable file (a child's `chmod 000`) is said, outside any file's part.
        (Err(e), _) | (_, Err(e)) => {
            let diff = format!("# {}: could not be read: {e}\n", quote_path(path));
            let change = FileChange {
                path: path.to_owned(),
                kind,
                added: 0,
                removed: 0,
                binary: true,
                special: None,
            };
            return Ok((change, diff));
        }
    };
    Ok(content_change(path, kind, old, new))
}

/// One file's change from `old` to `new` (`None`: the side does not exist) and its part of the
/// diff, in git's patch format.
pub fn content_change(
    path: &str,
    kind: ChangeKind,
    old: Option<Side>,
    new: Option<Side>,
) -> (FileChange, String) {
    let mut diff = git_header(path);
    let old_id = old
        .as_ref()
        .map_or(NO_BLOB.to_owned(), |o| blob_id(&o.content));
    let new_id = new
        .as_ref()
        .map_or(NO_BLOB.to_owned(), |n| blob_id(&n.content));
    match (&old, &new) {
        (None, Some(new)) => {
            diff.push_str(&format!(
                "new file mode {:o}\nindex {old_id}..{new_id}\n",
                new.mode
            ));
        }
        (Some(old), None) => {
            diff.push_str(&format!(
                "deleted file mode {:o}\nindex {old_id}..{new_id}\n",
                old.mode
            ));
        }
        (Some(old), Some(new)) if old.mode != new.mode => diff.push_str(&format!(
            "old mode {:o}\nnew mode {:o}\nindex {old_id}..{new_id}\n",
            old.mode, new.mode
        )),
        (Some(old), Some(_)) => {
            diff.push_str(&format!("index {old_id}..{new_id} {:o}\n", old.mode));
        }
        (None, None) => {}
    }
    let (old, new) = (
        old.map(|o| o.content).unwrap_or_default(),
        new.map(|n| n.content).unwrap_or_default(),
    );
    let text = |b: &[u8]| {
        if crate::fsutil::looks_binary(b) {
            None
        } else {
            std::str::from_utf8(b).ok().map(str::to_owned)
        }
    };
    let (added, removed, binary) = match (text(&old), text(&new)) {
        (Some(old), Some(new)) => {
            let from = if kind == ChangeKind::Added {
                "/dev/null".to_owned()
            } else {
                side("a", path)
            };
            let to = if kind == ChangeKind::Deleted {
                "/dev/null".to_owned()
            } else {
                side("b", path)
            };
            // diffy names the sides itself only with its default names: its own escaping of a
            // name leaves a newline in it, so the two header lines are forkd's (quoted).
            let patch = diffy::DiffOptions::new().create_patch(&old, &new);
            let (mut added, mut removed) = (0, 0);
            for hunk in patch.hunks() {
                for line in hunk.lines() {
                    match line {
                        diffy::Line::Insert(_) => added += 1,
                        diffy::Line::Delete(_) => removed += 1,
                        diffy::Line::Context(_) => {}
                    }
                }
            }
            // An empty file made or removed has no hunk, and git writes no `---`/`+++` for it.
            if !patch.hunks().is_empty() {
                let text = patch.to_string();
                let hunks = text.splitn(3, '\n').nth(2).unwrap_or_default();
                diff.push_str(&format!("--- {from}\n+++ {to}\n{hunks}"));
            }
            (added, removed, false)
        }
        _ if old.len().max(new.len()) <= BINARY_PATCH_LIMIT => {
            diff.push_str(&patch::binary(&old, &new));
            (0, 0, true)
        }
        _ => {
            diff.push_str(&format!(
                "Binary files {} and {} differ\n",
                side("a", path),
                side("b", path)
            ));
            (0, 0, true)
        }
    };
    (
        FileChange {
            path: path.to_owned(),
            kind,
            added,
            removed,
            binary,
            special: None,
        },
        diff,
    )
}

/// `a/PATH` (or `b/…`) as git writes it in a diff: quoted whole when the name needs it, so no
/// file name can draw a line of the diff.
fn side(prefix: &str, path: &str) -> String {
    quote_path(&format!("{prefix}/{path}")).into_owned()
}

/// The `diff --git` line that starts a file's part of the diff.
fn git_header(path: &str) -> String {
    format!("diff --git {} {}\n", side("a", path), side("b", path))
}

/// The `.gitignore` files of the child's view (its own edits to them included), directory by
/// directory.
struct Ignored {
    dirs: LayerDirs,
    cache: std::cell::RefCell<BTreeMap<PathBuf, Option<Gitignore>>>,
}

impl Ignored {
    fn new(dirs: &LayerDirs) -> Ignored {
        Ignored {
            dirs: dirs.clone(),
            cache: std::cell::RefCell::new(BTreeMap::new()),
        }
    }

    /// Whether `path` (a file) is ignored by a `.gitignore` of a directory above it.
    fn is(&self, path: &str) -> bool {
        let path = Path::new(path);
        let mut dir = PathBuf::new();
        let mut ancestors = vec![PathBuf::new()];
        for part in path.parent().into_iter().flat_map(Path::components) {
            dir.push(part);
            ancestors.push(dir.clone());
        }
        // The deepest .gitignore that has a say decides (a nested `!` re-includes).
        for dir in ancestors.iter().rev() {
            let mut cache = self.cache.borrow_mut();
            let matcher = cache.entry(dir.clone()).or_insert_with(|| self.load(dir));
            if let Some(matcher) = matcher {
                let rel = path.strip_prefix(dir).unwrap_or(path);
                let found = matcher.matched_path_or_any_parents(rel, false);
                if found.is_ignore() {
                    return true;
                }
                if found.is_whitelist() {
                    return false;
                }
            }
        }
        false
    }

    /// The view's `dir/.gitignore`: the child's if it wrote one, else the snapshot's.
    fn load(&self, dir: &Path) -> Option<Gitignore> {
        let upper = self.dirs.upper.join(dir).join(".gitignore");
        let lower = in_snapshot(&self.dirs.lower, &dir.join(".gitignore"));
        // The child's own: its file, or nothing if it removed it (a whiteout there).
        let file = match std::fs::symlink_metadata(&upper) {
            Ok(m) if m.is_file() => upper,
            Ok(_) => return None,
            Err(_) => lower.filter(|l| std::fs::symlink_metadata(l).is_ok_and(|m| m.is_file()))?,
        };
        let mut builder = GitignoreBuilder::new(self.dirs.lower.join(dir));
        builder.add(&file);
        builder.build().ok()
    }
}
