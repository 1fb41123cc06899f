//! `forkctl diff` against the real daemon: a batch's isolated children's changes as one patch
//! that `git apply` takes as is, binary files included, applied to a copy of the workspace as
//! it was when the batch was forked.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Output;

use forkd_test_support::{TestDaemon, spawn_daemon};
use serde_json::Value;

async fn forkctl(daemon: &TestDaemon, args: &[&str]) -> Output {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_forkctl"))
        .arg("--addr")
        .arg(daemon.addr())
        .args(args)
        .env_remove("FORKD_TOKEN")
        .output()
        .await
        .unwrap();
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
    let system = daemon.home_path().join("system.md");
    std::fs::write(&system, "You edit files.").unwrap();
    let created = forkctl(
        &daemon,
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
    let bash = |command: &str| {
        format!(
            "Edit.\n@sim tool Bash {}\n@sim say done",
            serde_json::json!({ "command": command })
        )
    };
    let one = bash("echo two >> a.txt && head -c 5000 /dev/urandom > blob.bin");
    let two = bash("rm b.txt && printf 'new\\n' > 'with space.txt'");
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
            &one,
            "-d",
            &two,
        ],
    )
    .await;
    let batch = first_json(&forked)["batch_id"].as_str().unwrap().to_owned();

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
