//! Real escape attempts from a sandboxed `Bash` command, each refused in `workspace-write` and
//! allowed in `full-access`: reading the daemon's home through its path and through
//! `/proc/self/root`, writing beside the workspace, writing through a symlink an earlier command
//! planted, reading another session's workspace, a background process that writes after the
//! call, and a TCP connection to a listener on 127.0.0.1. A build in the workspace still works.
//!
//! These need Landlock and unprivileged user namespaces; where the kernel lacks them, they fail
//! with the reason (they do not skip).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::Env;
use forkd_tools::sandbox::{Sandbox, SandboxMode, SandboxPaths};
use forkd_tools::{SandboxSpec, ToolContext, ToolOutput, run_tool};
use serde_json::json;

const SECRET: &str = "the-daemon's-secret";

/// A workspace `ws/` beside a daemon home `home/` (its database a secret, its private temporary
/// directories under `sandbox-tmp/`), another session's workspace `other/`, and `outside/`.
struct World {
    env: Env,
    home: PathBuf,
    other: PathBuf,
    outside: PathBuf,
}

impl World {
    fn new() -> World {
        let env = Env::new();
        let home = env.base.join("home");
        let other = env.base.join("other");
        let outside = env.base.join("outside");
        for dir in [&home, &other, &outside] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(home.join("forkd.db"), SECRET).unwrap();
        std::fs::write(other.join("notes.md"), SECRET).unwrap();
        // Another session's private temporary directory.
        let theirs = env.base.join("sandbox-tmp").join("session-2");
        std::fs::create_dir_all(&theirs).unwrap();
        std::fs::write(theirs.join("scratch"), SECRET).unwrap();
        World {
            env,
            home,
            other,
            outside,
        }
    }

    fn ctx(&self, mode: SandboxMode, allow_network: bool) -> ToolContext {
        self.env.ctx.clone().with_sandbox(SandboxSpec {
            sandbox: Sandbox {
                mode,
                allow_network,
            },
            paths: SandboxPaths {
                hidden: vec![self.home.clone(), self.other.clone(), self.tmp_root()],
                tmp: self.tmp_root().join("session-1"),
            },
        })
    }

    /// Where the sessions' private temporary directories live: hidden but for the session's own.
    fn tmp_root(&self) -> PathBuf {
        self.env.base.join("sandbox-tmp")
    }

    async fn bash(&self, mode: SandboxMode, command: &str) -> ToolOutput {
        bash_in(&self.ctx(mode, false), command).await
    }
}

async fn bash_in(ctx: &ToolContext, command: &str) -> ToolOutput {
    run_tool("Bash", &json!({ "command": command }), ctx).await
}

/// Fails with the sandbox's own error when this machine cannot sandbox at all, so that a missing
/// kernel feature reads as that, not as a confusing escape.
async fn sandbox_works(world: &World) {
    let out = world.bash(SandboxMode::WorkspaceWrite, "echo inside").await;
    assert!(
        !out.is_error && out.content.contains("inside"),
        "sandboxed commands cannot run here: {}",
        out.content
    );
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

#[tokio::test]
async fn reads_of_the_daemons_home_and_other_workspaces_are_refused() {
    let world = World::new();
    sandbox_works(&world).await;
    let db = world.home.join("forkd.db");
    let other = world.other.join("notes.md");
    // Each command, and what it shows only if it read what it must not.
    for (command, leak) in [
        (format!("cat {}", path(&db)), SECRET),
        (format!("cat /proc/self/root{}", path(&db)), SECRET),
        (format!("cat {}", path(&other)), SECRET),
        (
            format!(
                "cat {}/sandbox-tmp/session-2/scratch",
                path(&world.env.base)
            ),
            SECRET,
        ),
        (format!("ls -1 {}", path(&world.home)), "forkd.db"),
    ] {
        let confined = world.bash(SandboxMode::WorkspaceWrite, &command).await;
        assert!(
            !confined.content.contains(leak),
            "{command}: {}",
            confined.content
        );
        let open = world.bash(SandboxMode::FullAccess, &command).await;
        assert!(
            open.content.contains(leak),
            "{command} in full-access: {}",
            open.content
        );
    }
}

#[tokio::test]
async fn writes_outside_the_workspace_are_refused_even_through_a_planted_symlink() {
    let world = World::new();
    sandbox_works(&world).await;
    let beside = world.outside.join("pwned.txt");
    let out = world
        .bash(
            SandboxMode::WorkspaceWrite,
            &format!(
                "echo pwned > ../outside/pwned.txt; echo pwned > {}",
                path(&beside)
            ),
        )
        .await;
    assert!(out.is_error, "{}", out.content);
    assert!(!beside.exists());

    // An earlier command plants a symlink in the workspace; a later one writes through it.
    let target = world.outside.join("through-link.txt");
    let planted = world
        .bash(
            SandboxMode::WorkspaceWrite,
            &format!("ln -s {} link", path(&target)),
        )
        .await;
    assert!(!planted.is_error, "{}", planted.content);
    let through = world
        .bash(SandboxMode::WorkspaceWrite, "echo pwned > link")
        .await;
    assert!(through.is_error, "{}", through.content);
    assert!(!target.exists());

    // Inside the workspace and the private temporary directory, writes work.
    let inside = world
        .bash(
            SandboxMode::WorkspaceWrite,
            "echo ok > mine.txt && echo ok > \"$TMPDIR/scratch\" && cat mine.txt \"$TMPDIR/scratch\"",
        )
        .await;
    assert!(!inside.is_error, "{}", inside.content);
    // Read-only: not even the workspace, still the temporary directory.
    let ro = world.bash(SandboxMode::ReadOnly, "echo x > ro.txt").await;
    assert!(ro.is_error, "{}", ro.content);
    let ro_tmp = world
        .bash(
            SandboxMode::ReadOnly,
            "echo x > \"$TMPDIR/ro\" && cat mine.txt",
        )
        .await;
    assert!(!ro_tmp.is_error, "{}", ro_tmp.content);

    // full-access writes where it likes.
    let open = world
        .bash(SandboxMode::FullAccess, "echo pwned > ../outside/pwned.txt")
        .await;
    assert!(!open.is_error, "{}", open.content);
    assert!(world.outside.join("pwned.txt").exists());
}

#[tokio::test]
async fn a_background_process_that_writes_later_is_still_confined() {
    let world = World::new();
    sandbox_works(&world).await;
    for (mode, written) in [
        (SandboxMode::WorkspaceWrite, false),
        (SandboxMode::FullAccess, true),
    ] {
        let late = world.outside.join(format!("late-{}.txt", mode.as_str()));
        let tried = world
            .env
            .root()
            .join(format!("tried-{}.txt", mode.as_str()));
        // `setsid` leaves the call's process group, so the call's end does not kill it: only the
        // sandbox stands between it and the write. The call ends once it has left.
        let command = format!(
            "setsid sh -c 'echo $$ > started; sleep 0.3; echo late > {}; echo tried > {}' \
             >/dev/null 2>&1 & while [ ! -s started ]; do sleep 0.01; done; rm started",
            path(&late),
            path(&tried),
        );
        let out = world.bash(mode, &command).await;
        assert!(!out.is_error, "{}", out.content);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !tried.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "{mode:?}: the background process never ran"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(late.exists(), written, "{mode:?}");
    }
}

#[tokio::test]
async fn the_network_is_off_unless_the_session_allows_it() {
    let world = World::new();
    sandbox_works(&world).await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let connect = format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected");
    let off = bash_in(&world.ctx(SandboxMode::WorkspaceWrite, false), &connect).await;
    assert!(
        off.is_error && !off.content.contains("connected"),
        "{}",
        off.content
    );
    let on = bash_in(&world.ctx(SandboxMode::WorkspaceWrite, true), &connect).await;
    assert!(on.content.contains("connected"), "{}", on.content);
    let open = world.bash(SandboxMode::FullAccess, &connect).await;
    assert!(open.content.contains("connected"), "{}", open.content);
}

/// A crate with a build script builds (offline, no dependencies) inside the sandbox: the
/// toolchain reads where it is installed, the build writes only in the workspace.
#[tokio::test]
async fn a_build_with_a_build_script_works_in_the_workspace() {
    let world = World::new();
    sandbox_works(&world).await;
    world.env.file(
        "tiny/Cargo.toml",
        "[package]\nname = \"tiny\"\nversion = \"0.1.0\"\nedition = \"2021\"\nbuild = \"build.rs\"\n",
    );
    world.env.file(
        "tiny/build.rs",
        "fn main() { println!(\"cargo:rustc-env=TINY=built\"); }\n",
    );
    world.env.file(
        "tiny/src/main.rs",
        "fn main() { println!(\"{}\", env!(\"TINY\")); }\n",
    );
    let ctx = world.ctx(SandboxMode::WorkspaceWrite, false);
    let mut ctx = ctx;
    ctx.limits.bash_timeout = Duration::from_secs(120);
    let out = bash_in(&ctx, "cd tiny && cargo run --offline --quiet 2>&1").await;
    assert!(
        !out.is_error && out.content.contains("built"),
        "{}",
        out.content
    );
}

/// A sandbox that cannot be set up fails the call with the reason; the command never runs
/// unconfined.
#[tokio::test]
async fn a_sandbox_that_cannot_be_set_up_never_runs_the_command() {
    let world = World::new();
    let blocker = world.env.base.join("not-a-dir");
    std::fs::write(&blocker, "").unwrap();
    let ctx = world.env.ctx.clone().with_sandbox(SandboxSpec {
        sandbox: Sandbox {
            mode: SandboxMode::WorkspaceWrite,
            allow_network: false,
        },
        paths: SandboxPaths {
            hidden: Vec::new(),
            // Its parent is a file: the temporary directory cannot be made.
            tmp: blocker.join("tmp"),
        },
    });
    let out = bash_in(&ctx, "echo ran > ran.txt").await;
    assert!(out.is_error, "{}", out.content);
    assert!(out.content.contains("sandbox"), "{}", out.content);
    assert!(!world.env.root().join("ran.txt").exists());
}
