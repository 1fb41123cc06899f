//! Isolated children on real layers: each sibling sees the snapshot and its own edits alone,
//! through the file tools and through `Bash` alike; its changes are read from the files and
//! applied back with conflicts reported and nothing half-written.
//!
//! These need Landlock, unprivileged user namespaces and overlayfs in them; where the kernel
//! lacks them, they fail with the reason (they do not skip).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use forkd_tools::isolation::{self, ChangeKind, Changes, Repo};
use forkd_tools::sandbox::layer::{LayerDirs, LayerView};
use forkd_tools::sandbox::{ResourceLimits, Sandbox, SandboxMode, SandboxPaths};
use forkd_tools::{SandboxSpec, ToolContext, ToolOutput, Workspace, run_tool};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// A live workspace `ws/`, the daemon's home `home/` (hidden) holding a batch's snapshot and its
/// children's layers.
struct Batch {
    _dir: tempfile::TempDir,
    base: PathBuf,
    ws: PathBuf,
    home: PathBuf,
    snapshot: PathBuf,
}

impl Batch {
    fn new(files: &[(&str, &str)]) -> Batch {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let ws = base.join("ws");
        let home = base.join("home");
        for (rel, content) in files {
            let path = ws.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        if ws.join(".git").exists() {
            // A real repository, its hooks directory already there.
            let out = std::process::Command::new("git")
                .args(["init", "-q"])
                .current_dir(&ws)
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
        }
        let snapshot = home.join("isolation/b1/snapshot");
        let view = git_view(&base, &home, &home.join("isolation/b1"));
        isolation::snapshot::take(Repo::in_view(&ws, &view), &snapshot, "b1", &[]).unwrap();
        Batch {
            _dir: dir,
            base,
            ws,
            home,
            snapshot,
        }
    }

    /// The view forkd's git runs in, lent `tmp`.
    fn git_view(&self, tmp: &str) -> SandboxSpec {
        git_view(&self.base, &self.home, &self.base.join(tmp))
    }

    fn dirs(&self, child: &str) -> LayerDirs {
        let at = self.home.join("isolation/b1").join(child);
        LayerDirs {
            lower: self.snapshot.clone(),
            upper: at.join("upper"),
            work: at.join("work"),
        }
    }

    /// A child's tool context: its layer, its own temporary directory, the home hidden.
    fn child(&self, child: &str) -> ToolContext {
        let spec = SandboxSpec {
            sandbox: Sandbox {
                mode: SandboxMode::WorkspaceWrite,
                allow_network: false,
                unix_sockets: false,
            },
            paths: SandboxPaths {
                hidden: vec![self.home.clone(), self.base.join("tmp")],
                tmp: self.base.join("tmp").join(child),
                home: None,
                limits: ResourceLimits::default(),
                group: None,
            },
        };
        let view = LayerView::open(spec.sandbox, &spec.paths, &self.ws, &self.dirs(child))
            .unwrap_or_else(|e| panic!("the layer could not be made here: {e}"));
        ToolContext::new(Workspace::layered(Arc::new(view)), CancellationToken::new())
            .with_sandbox(spec)
    }

    fn changes(&self, child: &str) -> Changes {
        isolation::changes::collect(&self.dirs(child)).unwrap()
    }

    fn live(&self, rel: &str) -> String {
        std::fs::read_to_string(self.ws.join(rel)).unwrap()
    }
}

/// The view forkd's git runs in for a session of workspace `base/ws`: the home hidden, `tmp`
/// lent (a batch's directory for its snapshot), writes to the workspace allowed.
fn git_view(base: &Path, home: &Path, tmp: &Path) -> SandboxSpec {
    SandboxSpec {
        sandbox: Sandbox {
            mode: SandboxMode::WorkspaceWrite,
            allow_network: false,
            unix_sockets: false,
        },
        paths: SandboxPaths {
            hidden: vec![home.to_path_buf(), base.join("tmp"), base.join("others")],
            tmp: tmp.to_path_buf(),
            home: None,
            limits: ResourceLimits::default(),
            group: None,
        },
    }
}

async fn call(ctx: &ToolContext, tool: &str, input: Value) -> String {
    let out: ToolOutput = run_tool(tool, &input, ctx).await;
    assert!(!out.is_error, "{tool} {input}: {}", out.content);
    out.content
}

async fn call_err(ctx: &ToolContext, tool: &str, input: Value) -> String {
    let out: ToolOutput = run_tool(tool, &input, ctx).await;
    assert!(out.is_error, "{tool} {input} should fail: {}", out.content);
    out.content
}

async fn bash(ctx: &ToolContext, command: &str) -> String {
    call(ctx, "Bash", json!({ "command": command })).await
}

#[tokio::test]
async fn siblings_see_only_their_own_edits_through_every_tool() {
    let batch = Batch::new(&[("a.txt", "first\nsecond\n"), ("src/lib.rs", "fn x() {}\n")]);
    let one = batch.child("c1");
    let two = batch.child("c2");
    // One edits with Edit and reads back with cat; the other the reverse.
    call(
        &one,
        "Edit",
        json!({"file_path": "a.txt", "old_string": "first", "new_string": "one's"}),
    )
    .await;
    bash(&two, "sed -i 's/first/two'\"'\"'s/' a.txt").await;
    assert_eq!(bash(&one, "cat a.txt").await.trim_end(), "one's\nsecond");
    let read = call(&two, "Read", json!({"file_path": "a.txt"})).await;
    assert!(read.contains("two's") && !read.contains("one's"), "{read}");
    // The same path, absolute, in both: the workspace's own.
    let path = batch.ws.join("a.txt");
    let abs = call(&one, "Read", json!({"file_path": path})).await;
    assert!(abs.contains("one's"), "{abs}");
    assert_eq!(batch.live("a.txt"), "first\nsecond\n");
    // A parent edit after the fork does not reach a running child.
    std::fs::write(batch.ws.join("src/lib.rs"), "fn parent() {}\n").unwrap();
    assert_eq!(bash(&one, "cat src/lib.rs").await, "fn x() {}\n");
    let grep = call(&two, "Grep", json!({"pattern": "parent"})).await;
    assert_eq!(grep, "No matches found");
    // Write and Glob work in the layer; a new file is the child's alone.
    call(
        &one,
        "Write",
        json!({"file_path": "src/new.rs", "content": "new\n"}),
    )
    .await;
    let globbed = call(&one, "Glob", json!({"pattern": "src/*.rs"})).await;
    assert!(globbed.contains("src/new.rs"), "{globbed}");
    assert_eq!(bash(&two, "ls src").await, "lib.rs\n");
    // The changes come from the files.
    let changes = batch.changes("c1");
    let got: Vec<(&str, ChangeKind)> = changes
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.kind))
        .collect();
    assert_eq!(
        got,
        vec![
            ("a.txt", ChangeKind::Modified),
            ("src/new.rs", ChangeKind::Added)
        ]
    );
    assert_eq!((changes.files[0].added, changes.files[0].removed), (1, 1));
    assert!(
        changes.diff.contains("-first\n+one's\n"),
        "{}",
        changes.diff
    );
}

#[tokio::test]
async fn a_child_cannot_reach_the_live_workspace_nor_a_siblings_copy() {
    let batch = Batch::new(&[("a.txt", "snap\n")]);
    let one = batch.child("c1");
    let two = batch.child("c2");
    bash(&two, "echo secret > mine.txt").await;
    let upper = batch.dirs("c2").upper;
    let out = run_tool(
        "Bash",
        &json!({"command": format!("cat {}/mine.txt", upper.display())}),
        &one,
    )
    .await;
    assert!(
        out.is_error && !out.content.contains("secret"),
        "{}",
        out.content
    );
    // The live workspace's path is the child's copy; writing there leaves the live one alone.
    bash(&one, &format!("echo child > {}/a.txt", batch.ws.display())).await;
    assert_eq!(batch.live("a.txt"), "snap\n");
    // TMPDIR is the child's own.
    let tmp = bash(&one, "echo $TMPDIR").await;
    assert!(tmp.trim_end().ends_with("tmp/c1"), "{tmp}");
    // The file tools refuse to leave the layer, by `..` or by a symlink.
    bash(&one, "ln -s /etc/hostname host; ln -s ../../home up").await;
    call_err(&one, "Read", json!({"file_path": "host"})).await;
    call_err(&one, "Read", json!({"file_path": "up/isolation"})).await;
    call_err(&one, "Read", json!({"file_path": "../home"})).await;
}

#[tokio::test]
async fn apply_merges_the_first_and_reports_overlapping_siblings_as_conflicts() {
    let batch = Batch::new(&[("a.txt", "line 1\nline 2\nline 3\n")]);
    let mut outcomes = Vec::new();
    for (i, child) in ["c1", "c2", "c3"].iter().enumerate() {
        let ctx = batch.child(child);
        call(
            &ctx,
            "Edit",
            json!({"file_path": "a.txt", "old_string": "line 1", "new_string": format!("child {i}")}),
        )
        .await;
        let own = bash(&ctx, "head -n1 a.txt").await;
        assert_eq!(own.trim_end(), format!("child {i}"));
    }
    for child in ["c1", "c2", "c3"] {
        let changes = batch.changes(child);
        outcomes.push(isolation::apply::apply(&batch.ws, &batch.dirs(child), &changes).unwrap());
    }
    assert_eq!(outcomes[0].applied, vec!["a.txt"]);
    for outcome in &outcomes[1..] {
        assert!(outcome.applied.is_empty(), "{outcome:?}");
        assert_eq!(outcome.conflicts.len(), 1);
        assert_eq!(outcome.conflicts[0].path, "a.txt");
    }
    assert_eq!(batch.live("a.txt"), "child 0\nline 2\nline 3\n");
}

#[tokio::test]
async fn ten_children_editing_different_files_all_apply_and_hunks_that_do_not_overlap_merge() {
    let files: Vec<(String, String)> = (0..10)
        .map(|i| (format!("f{i}.txt"), "a\nb\nc\nd\ne\nf\n".to_owned()))
        .collect();
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_str()))
        .collect();
    let batch = Batch::new(&refs);
    for i in 0..10 {
        let ctx = batch.child(&format!("c{i}"));
        bash(&ctx, &format!("sed -i 's/^f$/child {i}/' f{i}.txt")).await;
    }
    // The parent changed the first line of f0 meanwhile: no overlap with the child's hunk.
    std::fs::write(batch.ws.join("f0.txt"), "parent\nb\nc\nd\ne\nf\n").unwrap();
    for i in 0..10 {
        let child = format!("c{i}");
        let outcome =
            isolation::apply::apply(&batch.ws, &batch.dirs(&child), &batch.changes(&child))
                .unwrap();
        assert_eq!(outcome.applied, vec![format!("f{i}.txt")], "{outcome:?}");
    }
    assert_eq!(batch.live("f0.txt"), "parent\nb\nc\nd\ne\nchild 0\n");
    assert_eq!(batch.live("f9.txt"), "a\nb\nc\nd\ne\nchild 9\n");
}

#[tokio::test]
async fn links_out_fifos_and_git_edits_are_refused_and_nothing_is_written() {
    let batch = Batch::new(&[("a.txt", "a\n"), (".git/hooks/README", "hooks\n")]);
    let ctx = batch.child("c1");
    bash(
        &ctx,
        "echo changed > a.txt; ln -s /etc etc; mkfifo pipe; ln -s a.txt ok-link",
    )
    .await;
    let refused = call_err(
        &ctx,
        "Write",
        json!({"file_path": ".git/hooks/pre-commit", "content": "evil"}),
    )
    .await;
    assert!(refused.contains(".git"), "{refused}");
    let out = run_tool(
        "Bash",
        &json!({"command": "echo evil > .git/hooks/pre-commit"}),
        &ctx,
    )
    .await;
    assert!(out.is_error, "{}", out.content);
    let changes = batch.changes("c1");
    let paths = changes.paths();
    assert_eq!(paths, vec!["a.txt", "etc", "ok-link", "pipe"]);
    let outcome = isolation::apply::apply(&batch.ws, &batch.dirs("c1"), &changes).unwrap();
    assert!(outcome.applied.is_empty());
    let refused: Vec<&str> = outcome.conflicts.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(refused, vec!["etc", "pipe"], "{outcome:?}");
    assert_eq!(batch.live("a.txt"), "a\n");
    assert!(!batch.ws.join("ok-link").exists());
    assert!(!batch.ws.join(".git/hooks/pre-commit").exists());
}

#[tokio::test]
async fn a_layer_made_again_finds_the_childs_earlier_edits() {
    let batch = Batch::new(&[("a.txt", "a\n")]);
    {
        let ctx = batch.child("c1");
        bash(&ctx, "echo mine > a.txt; rm -f gone.txt").await;
    }
    // As after a restart: a new view over the same directories.
    let again = batch.child("c1");
    assert_eq!(bash(&again, "cat a.txt").await, "mine\n");
    let sibling = batch.child("c2");
    assert_eq!(bash(&sibling, "cat a.txt").await, "a\n");
}

#[test]
fn full_access_sessions_are_refused_isolation() {
    let batch = Batch::new(&[("a.txt", "a\n")]);
    let sandbox = Sandbox {
        mode: SandboxMode::FullAccess,
        allow_network: true,
        unix_sockets: false,
    };
    let paths = SandboxPaths {
        tmp: batch.base.join("tmp/c1"),
        ..SandboxPaths::default()
    };
    let err = LayerView::open(sandbox, &paths, &batch.ws, &batch.dirs("c1")).unwrap_err();
    assert!(err.to_string().contains("full-access"), "{err}");
    let _: &Path = &batch.ws;
}

#[tokio::test]
async fn a_git_workspace_merges_with_git_and_its_snapshot_ref_goes_when_dropped() {
    let batch = Batch::new(&[("a.txt", "1\n2\n3\n4\n5\n6\n"), (".git/placeholder", "")]);
    let ctx = batch.child("c1");
    bash(&ctx, "sed -i 's/^6$/six/' a.txt").await;
    std::fs::write(batch.ws.join("a.txt"), "one\n2\n3\n4\n5\n6\n").unwrap();
    let outcome =
        isolation::apply::apply(&batch.ws, &batch.dirs("c1"), &batch.changes("c1")).unwrap();
    assert_eq!(outcome.applied, vec!["a.txt"], "{outcome:?}");
    assert_eq!(batch.live("a.txt"), "one\n2\n3\n4\n5\nsix\n");
    let refs = |ws: &Path| {
        let out = std::process::Command::new("git")
            .args(["for-each-ref", "refs/forkd/"])
            .current_dir(ws)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(refs(&batch.ws).contains("refs/forkd/snapshots/b1"));
    let view = batch.git_view("tmp/session");
    isolation::snapshot::drop_ref(Repo::in_view(&batch.ws, &view), "refs/forkd/snapshots/b1")
        .unwrap();
    assert_eq!(refs(&batch.ws), "");
}

#[tokio::test]
async fn changes_never_read_through_a_snapshot_symlink_and_survive_unreadable_files() {
    let outside_dir = tempfile::tempdir().unwrap();
    let secret = outside_dir.path().join("secret.txt");
    std::fs::write(&secret, "the daemon's secret\n").unwrap();
    let batch = Batch::new(&[("a.txt", "a\n")]);
    // Planted before the fork: a link out of the workspace, and one to a directory outside.
    std::os::unix::fs::symlink(&secret, batch.snapshot.join("leak")).unwrap();
    std::os::unix::fs::symlink(outside_dir.path(), batch.snapshot.join("dir-link")).unwrap();
    let ctx = batch.child("c1");
    bash(
        &ctx,
        "rm leak dir-link; mkdir locked; echo x > locked/f; chmod 000 locked; \
         echo y > unreadable.txt; chmod 000 unreadable.txt",
    )
    .await;
    let changes = batch.changes("c1");
    assert!(
        !changes.diff.contains("the daemon's secret"),
        "{}",
        changes.diff
    );
    let paths = changes.paths();
    assert!(paths.contains(&"leak".to_owned()), "{paths:?}");
    assert!(paths.contains(&"locked/f".to_owned()), "{paths:?}");
    assert!(paths.contains(&"unreadable.txt".to_owned()), "{paths:?}");
    assert!(
        !paths.iter().any(|p| p.starts_with("dir-link/")),
        "{paths:?}"
    );
}

/// A directory the child made where the snapshot has a link to a directory outside: the files
/// it put there are new files, never compared with (nor read from) what the link points at.
#[tokio::test]
async fn a_directory_made_where_the_snapshot_has_a_link_is_never_read_through_it() {
    let outside_dir = tempfile::tempdir().unwrap();
    std::fs::write(
        outside_dir.path().join("secret.txt"),
        "the daemon's secret\n",
    )
    .unwrap();
    std::fs::create_dir(outside_dir.path().join("sub")).unwrap();
    std::fs::write(outside_dir.path().join("sub/key"), "another secret\n").unwrap();
    let batch = Batch::new(&[("a.txt", "a\n")]);
    std::os::unix::fs::symlink(outside_dir.path(), batch.snapshot.join("out")).unwrap();
    let ctx = batch.child("c1");
    // `sub` made a file where the outside has a directory: what is below it there was listed
    // as removed.
    bash(
        &ctx,
        "rm out; mkdir out; echo mine > out/secret.txt; echo mine > out/sub",
    )
    .await;
    let changes = batch.changes("c1");
    assert!(
        !changes.diff.contains("the daemon's secret") && !changes.diff.contains("another secret"),
        "read through the snapshot's link: {}",
        changes.diff
    );
    let kinds: Vec<(String, ChangeKind)> = changes
        .files
        .iter()
        .map(|f| (f.path.clone(), f.kind))
        .collect();
    assert!(
        kinds.contains(&("out/secret.txt".to_owned(), ChangeKind::Added)),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&("out/sub".to_owned(), ChangeKind::Added)),
        "{kinds:?}"
    );
    assert!(
        !kinds.iter().any(|(p, _)| p.starts_with("out/sub/")),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&("out".to_owned(), ChangeKind::Deleted)),
        "the link is gone: {kinds:?}"
    );
}

#[tokio::test]
async fn a_path_in_a_copy_is_named_where_it_really_is() {
    let batch = Batch::new(&[
        ("src/lib.rs", "x\n"),
        ("Cargo.toml", "[package]\n"),
        (".git/placeholder", ""),
    ]);
    let ctx = batch.child("c1");
    bash(&ctx, "ln -s .. src/up").await;
    let ws = &ctx.workspace;
    for (given, real) in [
        ("src/../Cargo.toml", "Cargo.toml"),
        ("src/up/Cargo.toml", "Cargo.toml"),
        ("src/./lib.rs", "src/lib.rs"),
        ("src/../new/file.rs", "new/file.rs"),
    ] {
        let access = if given.contains("new/") {
            forkd_tools::Access::Write
        } else {
            forkd_tools::Access::Read
        };
        let resolved = ws.resolve(given, access).unwrap();
        assert_eq!(ws.relative(&resolved), real, "{given}");
    }
    // Through `..`, .git/ is still .git/: read-only in a copy.
    let git = ws.resolve("src/../.git/config", forkd_tools::Access::Write);
    assert!(git.is_err(), "{git:?}");
}

#[tokio::test]
async fn a_tracked_file_a_gitignore_matches_is_still_a_change() {
    let batch = Batch::new(&[
        (".gitignore", "dist/\n"),
        ("dist/bundle.js", "v1\n"),
        (".git/placeholder", ""),
    ]);
    // `dist/bundle.js` is committed by force, then the snapshot taken again with it tracked.
    let run = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(&batch.ws)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
    };
    run(&["add", "-f", "dist/bundle.js", ".gitignore"]);
    run(&["commit", "-qm", "release"]);
    std::fs::remove_dir_all(&batch.snapshot).unwrap();
    let view = batch.git_view("home/isolation/b1");
    let snap =
        isolation::snapshot::take(Repo::in_view(&batch.ws, &view), &batch.snapshot, "b2", &[])
            .unwrap();
    let commit = snap.git.unwrap().commit;
    let ctx = batch.child("c1");
    bash(
        &ctx,
        "echo v2 > dist/bundle.js; mkdir -p dist/tmp; echo x > dist/tmp/scratch",
    )
    .await;
    let plain = batch.changes("c1");
    assert!(
        plain.files.is_empty(),
        "without the commit both are ignored"
    );
    let view = batch.git_view("tmp/session");
    let repo = Repo::in_view(&batch.ws, &view);
    let changes = isolation::changes::collect_in(&batch.dirs("c1"), Some((repo, &commit))).unwrap();
    assert_eq!(changes.paths(), vec!["dist/bundle.js"]);
}

/// An agent can write `.git/` of its own workspace. What it plants there must not lead the
/// daemon's git to another tenant's files: in the session's view they are covered, so git
/// writes nothing there (a reflog through a symlinked `logs/`).
#[tokio::test]
async fn the_snapshots_git_writes_nothing_outside_what_the_session_can() {
    let batch = Batch::new(&[("a.txt", "a\n"), (".git/placeholder", "")]);
    let others = batch.base.join("others");
    std::fs::create_dir_all(others.join("logs")).unwrap();
    let git = batch.ws.join(".git");
    let config = std::fs::read_to_string(git.join("config")).unwrap();
    let planted = format!("{config}[core]\n\tlogAllRefUpdates = always\n");
    std::fs::write(git.join("config"), planted).unwrap();
    std::os::unix::fs::symlink(others.join("logs"), git.join("logs")).unwrap();

    let view = batch.git_view("home/isolation/b2");
    let snapshot = batch.home.join("isolation/b2/snapshot");
    let taken = isolation::snapshot::take(Repo::in_view(&batch.ws, &view), &snapshot, "b2", &[]);
    // git cannot write its reflog into the cover: the snapshot fails, saying so.
    let err = taken
        .expect_err("a reflog written into a cover")
        .to_string();
    assert!(err.contains("update-ref"), "{err}");
    assert_eq!(
        std::fs::read_dir(others.join("logs")).unwrap().count(),
        0,
        "nothing was written in another tenant's directory"
    );

    // The same repository with git in the daemon's own view: the write lands there.
    let snapshot = batch.home.join("isolation/b3/snapshot");
    isolation::snapshot::take(Repo::unconfined(&batch.ws), &snapshot, "b3", &[]).unwrap();
    assert!(others.join("logs/refs/forkd/snapshots/b3").exists());
}

/// Nor does it read there: a configuration that includes another tenant's file (which names an
/// excludes file, whose patterns would show in what the commit leaves out) finds a cover.
#[tokio::test]
async fn the_snapshots_git_reads_nothing_outside_what_the_session_can() {
    let batch = Batch::new(&[("a.txt", "a\n"), ("b.txt", "b\n"), (".git/placeholder", "")]);
    let others = batch.base.join("others");
    std::fs::create_dir_all(&others).unwrap();
    std::fs::write(others.join("excludes"), "a.txt\n").unwrap();
    let included = format!(
        "[core]\n\texcludesFile = {}\n",
        others.join("excludes").display()
    );
    std::fs::write(others.join("config"), included).unwrap();
    let git = batch.ws.join(".git");
    let config = std::fs::read_to_string(git.join("config")).unwrap();
    let planted = format!(
        "{config}[include]\n\tpath = {}\n",
        others.join("config").display()
    );
    std::fs::write(git.join("config"), planted).unwrap();
    let files = |commit: &str| {
        let out = std::process::Command::new("git")
            .args(["ls-tree", "--name-only", commit])
            .current_dir(&batch.ws)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };

    let view = batch.git_view("home/isolation/b2");
    let snapshot = batch.home.join("isolation/b2/snapshot");
    let repo = Repo::in_view(&batch.ws, &view);
    let snap = isolation::snapshot::take(repo, &snapshot, "b2", &[]).unwrap();
    assert_eq!(files(&snap.git.unwrap().commit), "a.txt\nb.txt\n");

    // In the daemon's own view, the included file's pattern shows in the commit.
    let snapshot = batch.home.join("isolation/b3/snapshot");
    let snap =
        isolation::snapshot::take(Repo::unconfined(&batch.ws), &snapshot, "b3", &[]).unwrap();
    assert_eq!(files(&snap.git.unwrap().commit), "b.txt\n");
}

/// A file name cannot draw a line of the diff: names with newlines, tabs, quotes or control
/// characters are quoted as git quotes them, and apply still writes the file by its real name.
#[tokio::test]
async fn hostile_file_names_are_quoted_in_the_diff_and_applied_by_their_real_name() {
    let batch = Batch::new(&[("a.txt", "one\n")]);
    let ctx = batch.child("c1");
    let hostile = "spoof\n-SPOOFDEL removed line\n+SPOOFADD added line.txt";
    bash(
        &ctx,
        "printf 'x\\n' > \"$(printf 'spoof\\n-SPOOFDEL removed line\\n+SPOOFADD added line.txt')\" \
         && ln -s \"$(printf 'x\\n+LINK')\" link && printf 'two\\n' > a.txt",
    )
    .await;
    let changes = batch.changes("c1");
    let mut paths = changes.paths();
    paths.sort();
    assert_eq!(paths, vec!["a.txt", "link", hostile]);
    for line in changes.diff.lines() {
        assert!(
            !line.starts_with("-SPOOF")
                && !line.starts_with("+SPOOF")
                && !line.starts_with("+LINK"),
            "a file name drew a diff line: {line:?}\n{}",
            changes.diff
        );
    }
    let quoted = r#""b/spoof\n-SPOOFDEL removed line\n+SPOOFADD added line.txt""#;
    assert!(
        changes.diff.contains(&format!(
            "diff --git {} {quoted}\nnew file mode 100644\nindex {}..{}\n--- /dev/null\n\
             +++ {quoted}\n@@ -0,0 +1 @@\n+x\n",
            quoted.replacen("b/", "a/", 1),
            "0".repeat(40),
            "587be6b4c3f93f93c489c0111bba5596147a26cb"
        )),
        "{}",
        changes.diff
    );
    // The diff is a patch git takes as is: applied to a copy of the snapshot, it makes what the
    // child made.
    let copy = patched_copy(&batch.ws, &changes.diff);
    assert_eq!(
        std::fs::read_to_string(copy.path().join(hostile)).unwrap(),
        "x\n"
    );
    assert_eq!(
        std::fs::read_link(copy.path().join("link")).unwrap(),
        Path::new("x\n+LINK")
    );
    let outcome = isolation::apply::apply(&batch.ws, &batch.dirs("c1"), &changes).unwrap();
    assert!(outcome.conflicts.is_empty(), "{outcome:?}");
    assert_eq!(batch.live(hostile), "x\n");
    assert_eq!(batch.live("a.txt"), "two\n");
}

/// A copy of `ws` (the batch's live workspace: still the snapshot's files) with `patch` applied
/// by `git apply`.
fn patched_copy(ws: &Path, patch: &str) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    assert!(
        std::process::Command::new("cp")
            .arg("-a")
            .arg(ws.join("."))
            .arg(copy.path())
            .status()
            .unwrap()
            .success()
    );
    git_apply(copy.path(), patch);
    copy
}

/// Applies `patch` with `git apply` in `dir` (a plain directory: git applies it as `patch` would),
/// checking it first.
fn git_apply(dir: &Path, patch: &str) {
    for check in [true, false] {
        let mut git = std::process::Command::new("git");
        git.arg("apply");
        if check {
            git.arg("--check");
        }
        let mut child = git
            .current_dir(dir)
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(patch.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "git apply{} refused the patch: {}\n{patch}",
            if check { " --check" } else { "" },
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Binary files, modes, removals and empty files: the patch `git apply` takes makes the child's
/// tree from the snapshot's, byte for byte.
#[tokio::test]
async fn the_diff_is_a_patch_git_applies_binary_files_and_modes_included() {
    let batch = Batch::new(&[
        ("a.txt", "one\n"),
        ("gone.txt", "bye\n"),
        ("run.sh", "echo\n"),
    ]);
    let ctx = batch.child("c1");
    bash(
        &ctx,
        "head -c 70000 /dev/urandom > blob.bin && printf 'a\\0b' > small.bin && : > empty \
         && rm gone.txt && chmod +x run.sh && echo more >> run.sh && echo two >> a.txt",
    )
    .await;
    let changes = batch.changes("c1");
    assert!(
        changes.diff.contains("GIT binary patch\nliteral 70000\n"),
        "{}",
        changes.diff
    );
    let copy = patched_copy(&batch.ws, &changes.diff);
    let upper = batch.dirs("c1").upper;
    for file in ["blob.bin", "small.bin", "empty", "run.sh", "a.txt"] {
        assert_eq!(
            std::fs::read(copy.path().join(file)).unwrap(),
            std::fs::read(upper.join(file)).unwrap(),
            "{file}"
        );
    }
    assert!(!copy.path().join("gone.txt").exists());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(copy.path().join("run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o111, 0o111, "run.sh is executable");
}
