//! `forkctl diff` against the real daemon: a batch's isolated children's changes as one patch
//! that `git apply` takes as is, binary files included, applied to a copy of the workspace as
//! it was when the batch was forked.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Output;

use forkd_test_support::{TestDaemon, spawn_daemon};
use serde_json::Value;

async fn run(daemon: &TestDaemon, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_forkctl"))
        .arg("--addr")
        .arg(daemon.addr())
        .args(args)
        .env_remove("FORKD_TOKEN")
        .output()
        .await
        .unwrap()
}

async fn forkctl(daemon: &TestDaemon, args: &[&str]) -> Output {
    let out = run(daemon, args).await;
    assert!(
        out.status.success(),
        "forkctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn first_json(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().next().unwrap()).unwrap()
}

/// Runs `git apply` (checked first) of `patch` in `dir`.
fn git_apply(dir: &Path, patch: &[u8]) {
    let patch_file = dir.join("../changes.patch");
    std::fs::write(&patch_file, patch).unwrap();
    for args in [&["apply", "--check"][..], &["apply"][..]] {
        let out = std::process::Command::new("git")
            .args(args)
            .arg(&patch_file)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(patch)
        );
    }
}

/// The sim's script for a child that runs `command` with Bash.
fn bash(command: &str) -> String {
    format!(
        "Edit.\n@sim tool Bash {}\n@sim say done",
        serde_json::json!({ "command": command })
    )
}

/// A session on the daemon's workspace whose tools need no approval, and an isolated batch of
/// `directives` forked from it and waited for; returns the batch's id.
async fn fork(daemon: &TestDaemon, directives: &[&str]) -> String {
    let ws = daemon.workspace_path();
    let system = daemon.home_path().join("system.md");
    std::fs::write(&system, "You edit files.").unwrap();
    let created = forkctl(
        daemon,
        &[
            "--json",
            "session",
            "create",
            "--system-file",
            system.to_str().unwrap(),
            "--workspace",
            ws.to_str().unwrap(),
            "--permission-mode",
            "bypassPermissions",
        ],
    )
    .await;
    let sid = first_json(&created)["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut args = vec![
        "--json",
        "fork",
        sid.as_str(),
        "--isolation",
        "copy",
        "--wait",
    ];
    for d in directives {
        args.extend(["-d", d]);
    }
    let forked = forkctl(daemon, &args).await;
    first_json(&forked)["batch_id"].as_str().unwrap().to_owned()
}

/// A copy of `from`'s files in a new directory.
fn copy_of(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().unwrap();
    assert!(
        std::process::Command::new("cp")
            .arg("-a")
            .arg(from.join("."))
            .arg(to.path())
            .status()
            .unwrap()
            .success()
    );
    to
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_s_patch_applies_with_git_to_the_snapshot_it_was_forked_from() {
    let daemon = spawn_daemon().await.unwrap();
    let ws = daemon.workspace_path();
    std::fs::write(ws.join("a.txt"), "one\n").unwrap();
    std::fs::write(ws.join("b.txt"), "keep\n").unwrap();
    let base = tempfile::tempdir().unwrap();
    let snapshot = base.path().join("ws");
    std::fs::create_dir(&snapshot).unwrap();
    for file in ["a.txt", "b.txt"] {
        std::fs::copy(ws.join(file), snapshot.join(file)).unwrap();
    }
    let one = bash("echo two >> a.txt && head -c 5000 /dev/urandom > blob.bin");
    let two = bash("rm b.txt && printf 'new\\n' > 'with space.txt'");
    let batch = fork(&daemon, &[&one, &two]).await;

    let patch = forkctl(&daemon, &["diff", "--batch", &batch, "--format", "patch"]).await;
    git_apply(&snapshot, &patch.stdout);
    assert_eq!(
        std::fs::read_to_string(snapshot.join("a.txt")).unwrap(),
        "one\ntwo\n"
    );
    assert!(!snapshot.join("b.txt").exists());
    assert_eq!(
        std::fs::read_to_string(snapshot.join("with space.txt")).unwrap(),
        "new\n"
    );
    assert_eq!(
        std::fs::read(snapshot.join("blob.bin")).unwrap().len(),
        5000
    );
    // The live workspace is untouched until an apply.
    assert!(!ws.join("blob.bin").exists());

    // What people read leaves the binary patch's body out, and says so.
    let shown = forkctl(&daemon, &["diff", "--batch", &batch]).await;
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("GIT binary patch (not shown"), "{shown}");
    assert!(!shown.contains("literal 5000"), "{shown}");
    assert_eq!(shown.matches("# agent ").count(), 2, "{shown}");
}

/// `apply --to`: each child all or nothing, in order; a file changed here since the snapshot
/// still takes a child's hunks away from the change; an overlapping sibling is a conflict (exit
/// 1) and nothing of it is written; odd names are written by their real name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_to_a_checkout_follows_the_daemon_s_rules() {
    let daemon = spawn_daemon().await.unwrap();
    let ws = daemon.workspace_path();
    std::fs::write(ws.join("a.txt"), "1\n2\n3\n4\n5\n6\n7\n8\n9\n").unwrap();
    std::fs::write(ws.join("b.txt"), "keep\n").unwrap();
    let checkout = copy_of(&ws);
    let batch = fork(
        &daemon,
        &[
            &bash("sed -i 's/^9$/nine/' a.txt && head -c 3000 /dev/urandom > blob.bin"),
            &bash("sed -i 's/^9$/NINE/' a.txt && echo sibling > sibling.txt"),
            &bash("rm b.txt && mkdir d && printf x > \"d/$(printf 'odd\\nname')\""),
        ],
    )
    .await;
    // Changed here after the snapshot, far from the children's hunks.
    std::fs::write(
        checkout.path().join("a.txt"),
        "one\n2\n3\n4\n5\n6\n7\n8\n9\n",
    )
    .unwrap();
    let dir = checkout.path().to_str().unwrap();
    let out = run(
        &daemon,
        &["--json", "apply", "--batch", &batch, "--to", dir],
    )
    .await;
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results = first_json(&out)["results"].as_array().unwrap().clone();
    assert_eq!(results.len(), 3);
    assert_eq!(results[0]["conflicts"], serde_json::json!([]));
    assert_eq!(results[1]["applied"], serde_json::json!([]));
    assert_eq!(results[1]["conflicts"][0]["path"], "a.txt");
    assert_eq!(results[2]["conflicts"], serde_json::json!([]));

    let file = |name: &str| std::fs::read_to_string(checkout.path().join(name)).unwrap();
    assert_eq!(file("a.txt"), "one\n2\n3\n4\n5\n6\n7\n8\nnine\n");
    assert_eq!(
        std::fs::read(checkout.path().join("blob.bin"))
            .unwrap()
            .len(),
        3000
    );
    assert!(
        !checkout.path().join("sibling.txt").exists(),
        "nothing of a conflicted child"
    );
    assert!(!checkout.path().join("b.txt").exists());
    assert_eq!(file("d/odd\nname"), "x");
    // The daemon's workspace is as it was: only the checkout changed.
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "1\n2\n3\n4\n5\n6\n7\n8\n9\n"
    );
}

fn git(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A git checkout (one commit) of `files` in a new runner directory: `(runner, checkout)`.
fn committed_checkout(files: &[(&str, &str)]) -> (tempfile::TempDir, std::path::PathBuf) {
    let runner = tempfile::tempdir().unwrap();
    let checkout = runner.path().join("checkout");
    for (path, content) in files {
        let path = checkout.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    git(&checkout, &["init", "-q"]);
    git(&checkout, &["add", "-A"]);
    git(&checkout, &["commit", "-q", "-m", "base"]);
    (runner, checkout)
}

/// `session create --upload CHECKOUT --json` whose tools need no approval: what it printed.
/// Where a test reads the files of a session just made from an upload (`forkctl --json session
/// get`'s object): the tree the daemon keeps, for a session working in a layer over it (seen at
/// `/forkd/workspaces/ID`, a path only its views have); else its own copy, at its workspace.
fn session_files(daemon: &TestDaemon, session: &Value) -> std::path::PathBuf {
    let ws = Path::new(session["workspace"].as_str().unwrap());
    if !ws.starts_with("/forkd/workspaces") {
        return ws.to_path_buf();
    }
    let upload = session["upload"]["upload_id"].as_str().unwrap();
    daemon.home_path().join("trees").join(upload)
}

async fn upload_session(
    daemon: &TestDaemon,
    runner: &tempfile::TempDir,
    checkout: &Path,
) -> Output {
    let system = runner.path().join("system.md");
    std::fs::write(&system, "You edit files.").unwrap();
    forkctl(
        daemon,
        &[
            "--json",
            "session",
            "create",
            "--upload",
            checkout.to_str().unwrap(),
            "--system-file",
            system.to_str().unwrap(),
            "--permission-mode",
            "bypassPermissions",
        ],
    )
    .await
}

/// The remote CI flow: a checkout uploaded, an isolated batch forked in the uploaded tree, and its
/// changes brought back into a fresh clone of the same commit, as a patch git checks and by
/// `apply --to`; a change made in the checkout after the upload is not in the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uploaded_checkout_s_children_come_back_to_a_fresh_clone() {
    let daemon = spawn_daemon().await.unwrap();
    let (runner, checkout) = committed_checkout(&[
        ("a.txt", "1\n2\n3\n"),
        ("b.txt", "as committed\n"),
        (".gitignore", "target/\n"),
        ("target/build.o", "not sent"),
    ]);
    let created = upload_session(&daemon, &runner, &checkout).await;
    let created = first_json(&created);
    let sid = created["session_id"].as_str().unwrap().to_owned();
    assert_eq!(created["upload"]["files"], 3, "{created}");
    assert_eq!(created["upload"]["git_commit"].as_str().unwrap().len(), 40);
    // Changed on the runner after the upload: the session keeps the uploaded tree.
    std::fs::write(checkout.join("b.txt"), "changed after\n").unwrap();
    let got = forkctl(&daemon, &["--json", "session", "get", &sid]).await;
    let ws = session_files(&daemon, &first_json(&got));
    assert_eq!(
        std::fs::read_to_string(ws.join("b.txt")).unwrap(),
        "as committed\n"
    );
    assert!(!ws.join("target").exists(), "ignored files are not sent");

    let edit = bash("sed -i 's/^2$/two/' a.txt");
    let add = bash("mkdir -p docs && printf 'new\\n' > docs/new.md");
    let forked = forkctl(
        &daemon,
        &[
            "--json",
            "fork",
            &sid,
            "--isolation",
            "copy",
            "--wait",
            "-d",
            &edit,
            "-d",
            &add,
        ],
    )
    .await;
    let batch = first_json(&forked)["batch_id"].as_str().unwrap().to_owned();

    let clone = runner.path().join("clone");
    git(
        runner.path(),
        &[
            "clone",
            "-q",
            checkout.to_str().unwrap(),
            clone.to_str().unwrap(),
        ],
    );
    let patch = forkctl(&daemon, &["diff", "--batch", &batch, "--format", "patch"]).await;
    let patch_file = runner.path().join("batch.patch");
    std::fs::write(&patch_file, &patch.stdout).unwrap();
    git(&clone, &["apply", "--check", patch_file.to_str().unwrap()]);
    let applied = run(
        &daemon,
        &[
            "--json",
            "apply",
            "--batch",
            &batch,
            "--to",
            clone.to_str().unwrap(),
        ],
    )
    .await;
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(clone.join("a.txt")).unwrap(),
        "1\ntwo\n3\n"
    );
    assert_eq!(
        std::fs::read_to_string(clone.join("docs/new.md")).unwrap(),
        "new\n"
    );
    assert_eq!(
        std::fs::read_to_string(clone.join("b.txt")).unwrap(),
        "as committed\n"
    );
}

/// `session diff`: children that share an uploaded session's workspace (not isolated) change it,
/// and the session's changes since the upload are a patch that takes a fresh clone there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uploaded_session_s_own_changes_come_back_as_a_patch() {
    let daemon = spawn_daemon().await.unwrap();
    let (runner, checkout) = committed_checkout(&[("a.txt", "1\n2\n3\n"), ("gone.txt", "bye\n")]);
    let created = upload_session(&daemon, &runner, &checkout).await;
    let sid = first_json(&created)["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let unchanged = forkctl(&daemon, &["session", "diff", &sid]).await;
    assert_eq!(
        String::from_utf8_lossy(&unchanged.stdout),
        "no changes
"
    );
    let edit = bash("sed -i 's/^3$/three/' a.txt && rm gone.txt && printf 'n\\n' > new.txt");
    forkctl(&daemon, &["--json", "fork", &sid, "--wait", "-d", &edit]).await;

    let stat = forkctl(&daemon, &["--json", "session", "diff", &sid]).await;
    let stat = first_json(&stat);
    let mut files: Vec<(String, String)> = stat["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_owned(),
                f["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            ("a.txt", "modified"),
            ("gone.txt", "deleted"),
            ("new.txt", "added")
        ]
        .map(|(p, k)| (p.to_owned(), k.to_owned()))
    );
    let patch = forkctl(&daemon, &["session", "diff", &sid, "--format", "patch"]).await;
    let clone = runner.path().join("clone");
    git(
        runner.path(),
        &[
            "clone",
            "-q",
            checkout.to_str().unwrap(),
            clone.to_str().unwrap(),
        ],
    );
    let patch_file = runner.path().join("session.patch");
    std::fs::write(&patch_file, &patch.stdout).unwrap();
    git(&clone, &["apply", patch_file.to_str().unwrap()]);
    assert_eq!(
        std::fs::read_to_string(clone.join("a.txt")).unwrap(),
        "1\n2\nthree\n"
    );
    assert!(!clone.join("gone.txt").exists());
    assert_eq!(
        std::fs::read_to_string(clone.join("new.txt")).unwrap(),
        "n\n"
    );
}
