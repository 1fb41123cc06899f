//! What an upload sends: DIR listed as git sees it (or as its ignore files say), each file
//! hashed, each symbolic link checked to stay inside.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::Context as _;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::{Match, WalkBuilder};
use indicatif::ProgressBar;
use sha2::{Digest as _, Sha256};

use crate::exit::CliError;

/// A listed tree: what the manifest will say, and where each file's content is on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    /// The directory as the user named it; each file's `source` is under it.
    pub root: PathBuf,
    /// Sorted by path, one per path.
    pub entries: Vec<Entry>,
    /// `HEAD`'s commit when the tree is in a git work tree that has one; else empty.
    pub git_commit: String,
}

#[cfg(test)]
impl Tree {
    /// The file at `path` (a test's lookup: anything else fails it).
    pub(crate) fn file(&self, path: &str) -> &FileEntry {
        match self
            .entries
            .iter()
            .find(|e| e.path == path)
            .map(|e| &e.kind)
        {
            Some(EntryKind::File(file)) => file,
            other => panic!("{path}: expected a file, got {other:?}"),
        }
    }
}

/// One file or symbolic link of a tree; directories are implied by the paths beneath them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Relative to the tree's root, `/`-separated.
    pub path: String,
    pub kind: EntryKind,
}

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    File(FileEntry),
    /// A relative target that stays inside the tree.
    Symlink {
        target: String,
    },
}

/// A regular file as it was when listed; its content stays on disk until it is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    /// The content's SHA-256, lowercase hex.
    pub sha256: String,
    pub size: u64,
    /// Any of the mode's execute bits.
    pub executable: bool,
    /// Where the content is read from when the daemon lacks it.
    pub source: PathBuf,
}

/// Lists and hashes what an upload of `dir` sends: git's files (tracked, and untracked ones it
/// does not ignore) when `dir` is in a git work tree, else a walk that honours `.gitignore` and
/// `.ignore` files; plus the files those rules left out that match an `include` pattern
/// (gitignore syntax). Nothing under a `.git` directory, ever.
#[cfg(test)]
pub fn list(dir: &Path, include: &[String]) -> anyhow::Result<Tree> {
    list_with(dir, include, &ProgressBar::hidden())
}

/// [`list`], counting on `progress`: its length is the paths listed, its position those looked
/// at (each file hashed) so far.
pub fn list_with(dir: &Path, include: &[String], progress: &ProgressBar) -> anyhow::Result<Tree> {
    let meta =
        fs::metadata(dir).map_err(|e| invalid(format!("cannot upload {}: {e}", dir.display())))?;
    if !meta.is_dir() {
        return Err(invalid(format!("cannot upload {}: not a directory", dir.display())).into());
    }
    let (mut paths, git_commit) = match git_listing(dir)? {
        Some(listing) => listing,
        None => (walk_listing(dir)?, String::new()),
    };
    if !include.is_empty() {
        paths.extend(included(dir, include)?);
    }
    // Symbolic links are judged against the tree's real place, which `..` in DIR or a link
    // above it would otherwise hide.
    let real_root = fs::canonicalize(dir)
        .map_err(|e| invalid(format!("cannot upload {}: {e}", dir.display())))?;
    let mut entries = Vec::with_capacity(paths.len());
    progress.set_length(paths.len() as u64);
    for path in paths {
        if let Some(entry) = entry(dir, &real_root, path)? {
            entries.push(entry);
        }
        progress.inc(1);
    }
    Ok(Tree {
        root: dir.to_path_buf(),
        entries,
        git_commit,
    })
}

fn invalid(msg: String) -> CliError {
    CliError::InvalidInput(msg)
}

/// Runs git in `dir`. GIT_DIR and friends are dropped: set by a hook that runs forkctl, they
/// would point git at another repository than the one DIR is in.
fn git(dir: &Path, args: &[&str]) -> io::Result<Output> {
    Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .stdin(Stdio::null())
        .output()
}

/// Git's view of `dir` and `HEAD`'s commit, or `None` when `dir` is in no git work tree (or git
/// is not installed: the walk then applies the same ignore files).
fn git_listing(dir: &Path) -> anyhow::Result<Option<(BTreeSet<String>, String)>> {
    match git(dir, &["rev-parse", "--show-toplevel"]) {
        Ok(out) if out.status.success() => {}
        _ => return Ok(None),
    }
    // Run in DIR, ls-files lists DIR's part of the work tree, relative to DIR. A nested
    // repository it does not track comes as `name/`, a directory: git's view leaves it out.
    let out = git(
        dir,
        &[
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ],
    )
    .with_context(|| format!("cannot run git in {}", dir.display()))?;
    if !out.status.success() {
        anyhow::bail!(
            "cannot list {} with git ls-files: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut paths = BTreeSet::new();
    for raw in out.stdout.split(|&b| b == 0) {
        if raw.is_empty() || raw.ends_with(b"/") {
            continue;
        }
        if let Some(path) = wire_path(dir, Path::new(OsStr::from_bytes(raw)))? {
            paths.insert(path);
        }
    }
    let commit = match git(dir, &["rev-parse", "--verify", "--quiet", "HEAD^{commit}"]) {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        // No commit yet.
        _ => String::new(),
    };
    Ok(Some((paths, commit)))
}

/// The files of `dir` that its own `.gitignore` and `.ignore` files (and the user's global git
/// excludes) keep. Ignore files above DIR are not read: they belong to some other tree.
fn walk_listing(dir: &Path) -> anyhow::Result<BTreeSet<String>> {
    let mut walk = WalkBuilder::new(dir);
    walk.hidden(false).require_git(false).parents(false);
    walk_files(dir, &mut walk, |_| true)
}

/// The files of `dir` that an `include` pattern names (or a directory above them does),
/// whatever the ignore rules say.
fn included(dir: &Path, include: &[String]) -> anyhow::Result<BTreeSet<String>> {
    let matcher = include_matcher(dir, include)?;
    let mut walk = WalkBuilder::new(dir);
    walk.standard_filters(false);
    walk_files(dir, &mut walk, |path| is_included(&matcher, path))
}

fn include_matcher(dir: &Path, include: &[String]) -> anyhow::Result<Gitignore> {
    let mut builder = GitignoreBuilder::new(dir);
    // A pattern typed on the command line with an unclosed `[` is a typo more often than a
    // literal bracket: say so rather than match nothing.
    builder.allow_unclosed_class(false);
    for pattern in include {
        builder
            .add_line(None, pattern)
            .map_err(|e| invalid(format!("invalid --include pattern `{pattern}`: {e}")))?;
    }
    builder
        .build()
        .map_err(|e| invalid(format!("invalid --include patterns: {e}")).into())
}

/// Whether the file at `path` (relative) or a directory above it matches; the nearest match
/// decides, so `!pattern` can take a file back out of a directory's.
fn is_included(matcher: &Gitignore, path: &str) -> bool {
    let mut candidate = Path::new(path);
    let mut is_dir = false;
    loop {
        // A hit of the matcher is an "ignore" in gitignore's terms: here, "include".
        match matcher.matched(candidate, is_dir) {
            Match::Ignore(_) => return true,
            Match::Whitelist(_) => return false,
            Match::None => {}
        }
        match candidate.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => candidate = parent,
            _ => return false,
        }
        is_dir = true;
    }
}

/// Runs `walk` over `dir` (never into `.git`), keeping the non-directories `keep` accepts.
fn walk_files(
    dir: &Path,
    walk: &mut WalkBuilder,
    keep: impl Fn(&str) -> bool,
) -> anyhow::Result<BTreeSet<String>> {
    walk.follow_links(false)
        .filter_entry(|e| e.file_name() != OsStr::new(".git"));
    let mut paths = BTreeSet::new();
    for item in walk.build() {
        let item = item.map_err(|e| invalid(format!("cannot list {}: {e}", dir.display())))?;
        if item.file_type().is_some_and(|t| t.is_dir()) {
            continue;
        }
        let relative = item.path().strip_prefix(dir).with_context(|| {
            format!(
                "{} was listed outside {}",
                item.path().display(),
                dir.display()
            )
        })?;
        if let Some(path) = wire_path(dir, relative)?
            && keep(&path)
        {
            paths.insert(path);
        }
    }
    Ok(paths)
}

/// `relative` as the manifest writes it (`/`-separated UTF-8); `None` for anything under a
/// `.git` directory, or the tree's root itself.
fn wire_path(dir: &Path, relative: &Path) -> anyhow::Result<Option<String>> {
    let mut parts = Vec::new();
    for component in relative.components() {
        let Component::Normal(name) = component else {
            continue;
        };
        if name == ".git" {
            return Ok(None);
        }
        let name = name.to_str().ok_or_else(|| {
            invalid(format!(
                "cannot upload {}: its name is not UTF-8",
                dir.join(relative).display()
            ))
        })?;
        parts.push(name);
    }
    Ok((!parts.is_empty()).then(|| parts.join("/")))
}

/// The entry at `path`: a file (hashed now), a symbolic link (checked to stay inside), or
/// `None` for a directory or a file deleted since git listed it.
fn entry(dir: &Path, real_root: &Path, path: String) -> anyhow::Result<Option<Entry>> {
    let disk = dir.join(&path);
    let meta = match fs::symlink_metadata(&disk) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(invalid(format!("cannot upload {}: {e}", disk.display())).into()),
    };
    let kind = if meta.is_dir() {
        return Ok(None);
    } else if meta.is_file() {
        let (sha256, size) = hash_file(&disk)?;
        EntryKind::File(FileEntry {
            sha256,
            size,
            executable: meta.permissions().mode() & 0o111 != 0,
            source: disk,
        })
    } else if meta.is_symlink() {
        let target = symlink_target(&path, &disk, real_root)?;
        EntryKind::Symlink { target }
    } else {
        return Err(invalid(format!(
            "cannot upload {}: not a regular file, directory or symbolic link (a FIFO, socket \
             or device)",
            disk.display()
        ))
        .into());
    };
    Ok(Some(Entry { path, kind }))
}

/// The content's SHA-256 (lowercase hex) and size, read in pieces.
fn hash_file(disk: &Path) -> anyhow::Result<(String, u64)> {
    let unreadable = |e: io::Error| invalid(format!("cannot read {}: {e}", disk.display()));
    let mut file = File::open(disk).map_err(unreadable)?;
    let mut hasher = Sha256::new();
    let size = io::copy(&mut file, &mut hasher).map_err(unreadable)?;
    Ok((hex::encode(hasher.finalize()), size))
}

/// The link's target, when it is relative, UTF-8 and leads to a place inside the tree (not into
/// `.git`): read from the link's directory without following anything, and, when it resolves
/// on disk, where it really leads (a link inside may lead through another one).
fn symlink_target(path: &str, disk: &Path, real_root: &Path) -> anyhow::Result<String> {
    let target = fs::read_link(disk)
        .map_err(|e| invalid(format!("cannot read link {}: {e}", disk.display())))?;
    let outside = || {
        invalid(format!(
            "cannot upload {}: a symbolic link leading outside the tree (to {})",
            disk.display(),
            target.display()
        ))
    };
    let mut place: Vec<&OsStr> = Path::new(path)
        .components()
        .map(Component::as_os_str)
        .collect();
    place.pop();
    for component in target.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                place.pop().ok_or_else(outside)?;
            }
            // `.git` is never uploaded: such a link would lead nowhere in the daemon's copy,
            // which refuses it.
            Component::Normal(name) if name == ".git" => {
                return Err(invalid(format!(
                    "cannot upload {}: a symbolic link into .git (to {})",
                    disk.display(),
                    target.display()
                ))
                .into());
            }
            Component::Normal(name) => place.push(name),
            Component::RootDir | Component::Prefix(_) => return Err(outside().into()),
        }
    }
    if let Ok(real) = fs::canonicalize(disk)
        && !real.starts_with(real_root)
    {
        return Err(outside().into());
    }
    let text = target.to_str().ok_or_else(|| {
        invalid(format!(
            "cannot upload {}: its target is not UTF-8",
            disk.display()
        ))
    })?;
    Ok(text.to_owned())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    /// Runs git in `dir` as the tests need it: no system configuration, a fixed author.
    fn git_in(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.email=test@example.com", "-c", "user.name=Test"])
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE")
            .env_remove("GIT_INDEX_FILE")
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    fn write(root: &Path, path: &str, content: &str) -> anyhow::Result<()> {
        let path = root.join(path);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(path, content)?;
        Ok(())
    }

    fn paths(tree: &Tree) -> Vec<&str> {
        tree.entries.iter().map(|e| e.path.as_str()).collect()
    }

    fn error(result: anyhow::Result<Tree>) -> String {
        match result {
            Ok(tree) => panic!("expected an error, got {:?}", paths(&tree)),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_git_work_tree_sends_what_git_would_commit() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let root = dir.path();
        git_in(root, &["init", "-q"])?;
        write(root, ".gitignore", "ignored.txt\n")?;
        write(root, "tracked.txt", "tracked\n")?;
        write(root, "gone.txt", "deleted after its commit\n")?;
        git_in(root, &["add", "."])?;
        git_in(root, &["commit", "-q", "-m", "first"])?;
        fs::remove_file(root.join("gone.txt"))?;
        write(root, "ignored.txt", "secret\n")?;
        write(root, "untracked.txt", "new\n")?;
        // Not a repository (no HEAD, no objects): git lists it as files, which stay out.
        write(root, "sub/.git/config", "[core]\n")?;
        write(root, "sub/deep/file.txt", "x\n")?;
        // A repository of its own that the outer one does not track: git leaves it out.
        fs::create_dir(root.join("nested"))?;
        git_in(&root.join("nested"), &["init", "-q"])?;
        write(root, "nested/inner.txt", "inner\n")?;

        let tree = list(root, &[])?;
        assert_eq!(
            paths(&tree),
            [
                ".gitignore",
                "sub/deep/file.txt",
                "tracked.txt",
                "untracked.txt"
            ]
        );
        assert_eq!(tree.git_commit.len(), 40, "{}", tree.git_commit);
        assert!(tree.git_commit.bytes().all(|b| b.is_ascii_hexdigit()));

        // A subdirectory of the work tree: its part, relative to it, and the same commit.
        let sub = list(&root.join("sub"), &[])?;
        assert_eq!(paths(&sub), ["deep/file.txt"]);
        assert_eq!(sub.git_commit, tree.git_commit);

        // --include brings an ignored file back.
        let with = list(root, &["ignored.txt".to_owned()])?;
        assert_eq!(
            paths(&with),
            [
                ".gitignore",
                "ignored.txt",
                "sub/deep/file.txt",
                "tracked.txt",
                "untracked.txt"
            ]
        );
        Ok(())
    }

    #[test]
    fn a_repository_without_a_commit_has_no_commit() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        git_in(dir.path(), &["init", "-q"])?;
        write(dir.path(), "a.txt", "a")?;
        let tree = list(dir.path(), &[])?;
        assert_eq!(paths(&tree), ["a.txt"]);
        assert_eq!(tree.git_commit, "");
        Ok(())
    }

    #[test]
    fn elsewhere_the_ignore_files_decide() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let root = dir.path();
        write(root, ".gitignore", "*.log\nbuild/\n")?;
        write(root, "src/.ignore", "scratch.rs\n")?;
        write(root, "src/main.rs", "fn main() {}\n")?;
        write(root, "src/scratch.rs", "// notes\n")?;
        write(root, ".env.example", "KEY=\n")?;
        write(root, "debug.log", "noise\n")?;
        write(root, "build/out/app", "binary\n")?;
        // A `.git` directory is never entered, repository or not.
        write(root, ".git/config", "[core]\n")?;
        write(root, "vendor/lib/.git/HEAD", "ref: refs/heads/main\n")?;
        write(root, "vendor/lib/lib.rs", "\n")?;

        let tree = list(root, &[])?;
        assert_eq!(tree.git_commit, "");
        assert_eq!(
            paths(&tree),
            [
                ".env.example",
                ".gitignore",
                "src/.ignore",
                "src/main.rs",
                "vendor/lib/lib.rs"
            ]
        );

        // A directory pattern brings what is under it; `!` takes a file back out; `.git` stays
        // out even when asked for.
        let include = ["build".to_owned(), "*.log".to_owned(), ".git".to_owned()];
        let with = list(root, &include)?;
        assert_eq!(
            paths(&with),
            [
                ".env.example",
                ".gitignore",
                "build/out/app",
                "debug.log",
                "src/.ignore",
                "src/main.rs",
                "vendor/lib/lib.rs"
            ]
        );
        let include = ["build/".to_owned(), "!build/out/app".to_owned()];
        assert!(!paths(&list(root, &include)?).contains(&"build/out/app"));
        let msg = error(list(root, &["a[".to_owned()]));
        assert!(msg.starts_with("invalid --include pattern `a[`"), "{msg}");
        Ok(())
    }

    #[test]
    fn files_carry_their_hash_size_and_execute_bit() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let root = dir.path();
        write(root, "b/z.txt", "hello\n")?;
        write(root, "a b/y.sh", "#!/bin/sh\n")?;
        write(root, "a.txt", "")?;
        fs::set_permissions(root.join("a b/y.sh"), fs::Permissions::from_mode(0o755))?;

        let progress = ProgressBar::hidden();
        let tree = list_with(root, &[], &progress)?;
        // Sorted by the `/`-separated path.
        assert_eq!(paths(&tree), ["a b/y.sh", "a.txt", "b/z.txt"]);
        assert_eq!((progress.position(), progress.length()), (3, Some(3)));
        let hello = tree.file("b/z.txt");
        assert_eq!(
            hello.sha256,
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
        assert_eq!((hello.size, hello.executable), (6, false));
        assert_eq!(hello.source, root.join("b/z.txt"));
        assert!(tree.file("a b/y.sh").executable);
        let empty = tree.file("a.txt");
        assert_eq!(
            empty.sha256,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(empty.size, 0);
        Ok(())
    }

    #[test]
    fn links_inside_are_kept_and_links_outside_refused() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("tree");
        write(&root, "docs/guide.md", "# Guide\n")?;
        symlink("docs/guide.md", root.join("README.md"))?;
        symlink("../docs", root.join("docs/self"))?;
        // Dangling, but it would land inside.
        symlink("later.txt", root.join("docs/next"))?;
        let tree = list(&root, &[])?;
        let links: Vec<(&str, &str)> = tree
            .entries
            .iter()
            .filter_map(|e| match &e.kind {
                EntryKind::Symlink { target } => Some((e.path.as_str(), target.as_str())),
                EntryKind::File(_) => None,
            })
            .collect();
        assert_eq!(
            links,
            [
                ("README.md", "docs/guide.md"),
                ("docs/next", "later.txt"),
                ("docs/self", "../docs")
            ]
        );

        let outside = |name: &str, target: &str| -> anyhow::Result<String> {
            let dir = tempfile::tempdir()?;
            let root = dir.path().join("tree");
            write(&root, "a.txt", "a")?;
            symlink(target, root.join(name))?;
            Ok(error(list(&root, &[])))
        };
        for (name, target) in [
            ("etc", "/etc"),
            ("up", "../tree/../elsewhere"),
            ("dot", ".."),
        ] {
            let msg = outside(name, target)?;
            assert!(
                msg.contains(&format!(
                    "/tree/{name}: a symbolic link leading outside the tree (to {target})"
                )),
                "{msg}"
            );
        }

        let msg = outside("hooks", ".git/hooks")?;
        assert!(
            msg.ends_with("/tree/hooks: a symbolic link into .git (to .git/hooks)"),
            "{msg}"
        );

        // Each step inside, together outside: `here` is the tree itself, so `here/..` is not.
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("tree");
        fs::create_dir(&root)?;
        symlink(".", root.join("here"))?;
        symlink("here/..", root.join("parent"))?;
        let msg = error(list(&root, &[]));
        assert!(
            msg.contains("/tree/parent: a symbolic link leading outside"),
            "{msg}"
        );
        Ok(())
    }

    #[test]
    fn other_kinds_of_file_are_refused_by_name() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let fifo = dir.path().join("pipe");
        let made = Command::new("mkfifo").arg(&fifo).status()?;
        anyhow::ensure!(made.success(), "mkfifo failed");
        let msg = error(list(dir.path(), &[]));
        assert!(
            msg.starts_with(&format!("cannot upload {}", fifo.display())),
            "{msg}"
        );
        assert!(msg.contains("not a regular file"), "{msg}");

        let msg = error(list(&dir.path().join("pipe"), &[]));
        assert!(msg.ends_with("not a directory"), "{msg}");
        Ok(())
    }

    #[test]
    fn a_name_that_is_not_utf8_is_named() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        fs::write(dir.path().join(OsStr::from_bytes(b"bad\xff.txt")), "x")?;
        let msg = error(list(dir.path(), &[]));
        assert!(
            msg.contains("bad\u{fffd}.txt: its name is not UTF-8"),
            "{msg}"
        );
        Ok(())
    }
}
