//! The sandbox under load: a view whose holder hangs fails its command after the holder
//! timeout while other sessions' commands run on, and a command that cannot be forked (its
//! session at its process cap) leaves no process behind.
//!
//! Its own test binary: the holder timeout it shortens is the process's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use forkd_tools::sandbox::{ResourceLimits, Sandbox, SandboxMode, SandboxPaths};
use forkd_tools::{SandboxSpec, ToolContext, ToolOutput, Workspace, run_tool};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// A sandboxed session working in `base/NAME`, its temporary directory `base/tmp/NAME`.
fn session(base: &Path, name: &str, limits: ResourceLimits, group: Option<String>) -> ToolContext {
    let ws = base.join(name);
    std::fs::create_dir_all(&ws).unwrap();
    ToolContext::new(Workspace::new(&ws).unwrap(), CancellationToken::new()).with_sandbox(
        SandboxSpec {
            sandbox: Sandbox {
                mode: SandboxMode::WorkspaceWrite,
                allow_network: false,
                unix_sockets: false,
            },
            paths: SandboxPaths {
                hidden: vec![base.join("home")],
                tmp: base.join("tmp").join(name),
                home: None,
                limits,
                group,
            },
        },
    )
}

async fn bash(ctx: &ToolContext, command: &str) -> ToolOutput {
    run_tool("Bash", &json!({ "command": command }), ctx).await
}

fn base() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir_all(base.join("home")).unwrap();
    (dir, base)
}

/// On a runtime of one thread: a command whose view never comes waits off the runtime, so
/// another session's commands run meanwhile, and it fails once the holder timeout passes.
#[tokio::test(flavor = "current_thread")]
async fn a_hung_holder_fails_its_command_and_others_keep_running() {
    let (_dir, base) = base();
    let hung = session(&base, "hung", ResourceLimits::default(), None);
    let fine = session(&base, "fine", ResourceLimits::default(), None);
    forkd_tools::sandbox::testing::set_holder_timeout(Duration::from_secs(3));
    forkd_tools::sandbox::testing::hang_holders_for(&base.join("tmp/hung"));

    let started = Instant::now();
    let waiting = tokio::spawn({
        let hung = hung.clone();
        async move { bash(&hung, "echo never").await }
    });
    let mut ran = 0;
    while !waiting.is_finished() {
        let out = bash(&fine, "echo fine").await;
        assert!(!out.is_error, "{}", out.content);
        ran += 1;
    }
    let out = waiting.await.unwrap();
    assert!(out.is_error, "{}", out.content);
    assert!(
        out.content.contains("did not finish within 3 s"),
        "{}",
        out.content
    );
    assert!(started.elapsed() >= Duration::from_secs(3));
    assert!(ran >= 5, "the other session ran {ran} commands meanwhile");
}

/// A session whose commands leave room for one more process but not two: the command's init
/// starts and its fork fails. The call ends in an error, and the session's group is empty again
/// afterwards (before the fix, the init waited there for good, a process slot lost each time).
#[tokio::test]
async fn a_command_that_cannot_be_forked_leaves_no_process_behind() {
    let hierarchy = match forkd_tools::sandbox::cgroup::hierarchy() {
        Ok(h) => h,
        Err(why) => {
            eprintln!("skipping: no cgroup to count a session's processes in ({why})");
            return;
        }
    };
    let (_dir, base) = base();
    let group = format!("leak-{}", std::process::id());
    let limits = ResourceLimits {
        session_processes: Some(10),
        ..ResourceLimits::default()
    };
    let ctx = session(&base, "capped", limits, Some(group.clone()));
    let current = || {
        std::fs::read_to_string(hierarchy.group_dir(&group).join("pids.current"))
            .map_or(0, |s| s.trim().parse::<u64>().unwrap_or(0))
    };
    // Holding 8 of the 10: its outer process, init, shell, sentinel and 4 sleepers.
    let holder = tokio::spawn({
        let ctx = ctx.clone();
        async move {
            bash(
                &ctx,
                "sleep 30 & sleep 30 & sleep 30 & sleep 30 & echo ok > ready; wait",
            )
            .await
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !base.join("capped/ready").exists() {
        assert!(
            Instant::now() < deadline,
            "the holding command did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(current(), 8, "the holding command's processes");
    for _ in 0..3 {
        let out = bash(&ctx, "echo ran").await;
        assert!(out.is_error, "{}", out.content);
        assert!(
            out.content.contains("Resource temporarily unavailable"),
            "{}",
            out.content
        );
        // Each failed start gave its places back before the call returned: its init was
        // killed and reaped by the process that could not fork, and that process by the call.
        assert_eq!(current(), 8, "a failed start left a process behind");
    }
    ctx.cancel.cancel();
    holder.await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while current() != 0 {
        assert!(Instant::now() < deadline, "{} processes left", current());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
