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
use forkd_tools::sandbox::{HomeView, ResourceLimits, Sandbox, SandboxMode, SandboxPaths};
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
    /// The daemon user's home: credential files, a toolchain, a `.gitconfig`.
    user: PathBuf,
    limits: ResourceLimits,
    /// The session's `unix_sockets` grant.
    unix_sockets: bool,
}

/// Credential files a deny list does not name, in the daemon user's home.
const CREDENTIALS: [&str; 5] = [
    ".git-credentials",
    ".pgpass",
    ".config/gh/hosts.yml",
    ".npmrc",
    ".cargo/credentials.toml",
];

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
        let user = env.base.join("user");
        for file in CREDENTIALS {
            let path = user.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, SECRET).unwrap();
        }
        std::fs::create_dir_all(user.join(".cargo/bin")).unwrap();
        std::fs::write(user.join(".cargo/bin/tool"), "a tool\n").unwrap();
        std::fs::write(user.join(".gitconfig"), "[user]\n").unwrap();
        World {
            env,
            home,
            other,
            outside,
            user,
            limits: ResourceLimits::default(),
            unix_sockets: false,
        }
    }

    fn ctx(&self, mode: SandboxMode, allow_network: bool) -> ToolContext {
        self.env.ctx.clone().with_sandbox(SandboxSpec {
            sandbox: Sandbox {
                mode,
                allow_network,
                unix_sockets: self.unix_sockets,
            },
            paths: SandboxPaths {
                hidden: vec![self.home.clone(), self.other.clone(), self.tmp_root()],
                tmp: self.tmp_root().join("session-1"),
                home: Some(HomeView {
                    dir: self.user.clone(),
                    allow: vec![self.user.join(".cargo/bin"), self.user.join(".gitconfig")],
                }),
                limits: self.limits,
                group: Some(self.group()),
            },
        })
    }

    /// The stand-in session's cgroup (where the test may make one: a root test).
    fn group(&self) -> String {
        let base = self.env.base.file_name().unwrap_or_default();
        format!("test-{}", base.to_string_lossy())
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
        // sandbox stands between it and the write. (A sandboxed call waits for it: its PID
        // namespace, and so the process, ends with the call.)
        let wait = if mode == SandboxMode::FullAccess {
            ""
        } else {
            "; sleep 1"
        };
        let command = format!(
            "setsid sh -c 'echo $$ > started; sleep 0.3; echo late > {}; echo tried > {}' \
             >/dev/null 2>&1 & while [ ! -s started ]; do sleep 0.01; done; rm started{wait}",
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
            unix_sockets: false,
        },
        paths: SandboxPaths {
            hidden: Vec::new(),
            // Its parent is a file: the temporary directory cannot be made.
            tmp: blocker.join("tmp"),
            ..SandboxPaths::default()
        },
    });
    let out = bash_in(&ctx, "echo ran > ran.txt").await;
    assert!(out.is_error, "{}", out.content);
    assert!(out.content.contains("sandbox"), "{}", out.content);
    assert!(!world.env.root().join("ran.txt").exists());
}

/// A process outside the sandbox, owned by the same user (as the daemon is), survives a
/// sandboxed `kill`; inside, `/proc` lists only the command's own processes.
#[tokio::test]
async fn the_command_sees_and_signals_only_its_own_processes() {
    let world = World::new();
    sandbox_works(&world).await;
    let mut outside = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = outside.id();
    let out = world
        .bash(
            SandboxMode::WorkspaceWrite,
            &format!("kill -TERM {pid}; echo kill=$?; ls /proc | grep -c '^[0-9]'"),
        )
        .await;
    assert!(out.content.contains("kill=1"), "{}", out.content);
    assert_eq!(
        outside.try_wait().unwrap(),
        None,
        "the process outside died"
    );
    outside.kill().unwrap();
    outside.wait().unwrap();
    // The init, the sentinel, the command's shell and what it runs: a handful, not the host's.
    let count: usize = out
        .content
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("{}", out.content));
    assert!(count < 10, "{count} processes visible: {}", out.content);
    // A command that ends by a signal still reads so, and its exit code still comes through.
    let killed = world
        .bash(SandboxMode::WorkspaceWrite, "kill -KILL $$")
        .await;
    assert!(
        killed.content.ends_with("killed by signal 9"),
        "{}",
        killed.content
    );
    let exited = world.bash(SandboxMode::WorkspaceWrite, "exit 3").await;
    assert!(
        exited.content.ends_with("exit code 3"),
        "{}",
        exited.content
    );
    // Nothing it starts outlives it, not even a process that left its group.
    let left = world
        .bash(
            SandboxMode::WorkspaceWrite,
            "setsid sleep 31.5 >/dev/null 2>&1 & echo started",
        )
        .await;
    assert!(!left.is_error, "{}", left.content);
    let survivors = std::process::Command::new("pgrep")
        .args(["-c", "-f", "sleep 31.5"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&survivors.stdout).trim(), "0");
}

/// A session's commands enter one view of the machine, made once: they share its network
/// namespace, each in a PID namespace of its own. What appears under a hidden path after the
/// view was made (a path that did not exist, a new entry beside the session's own temporary
/// directory) is hidden all the same.
#[tokio::test]
async fn commands_share_their_view_and_what_appears_later_stays_hidden() {
    let world = World::new();
    let late = world.env.base.join("late");
    let ctx = |world: &World| {
        let mut ctx = world.ctx(SandboxMode::WorkspaceWrite, false);
        if let Some(spec) = ctx.sandbox.as_mut() {
            spec.paths.hidden.push(late.clone());
        }
        ctx
    };
    // The view of a directory changed this very second is not kept (its time stamp may not show
    // the next change yet): one a while old is.
    let backdate = |dir: &Path, secs| {
        std::fs::File::open(dir)
            .unwrap()
            .set_modified(std::time::SystemTime::now() - Duration::from_secs(secs))
            .unwrap();
    };
    std::fs::create_dir_all(world.tmp_root().join("session-1")).unwrap();
    backdate(&world.tmp_root(), 60);
    let names = "readlink /proc/self/ns/net /proc/self/ns/pid";
    let first = bash_in(&ctx(&world), names).await;
    let second = bash_in(&ctx(&world), names).await;
    assert!(!first.is_error, "{}", first.content);
    let lines = |out: &ToolOutput| -> Vec<String> {
        out.content
            .lines()
            .filter(|l| l.starts_with("net:") || l.starts_with("pid:"))
            .map(str::to_owned)
            .collect()
    };
    let (first, second) = (lines(&first), lines(&second));
    assert_eq!(first.len(), 2, "{first:?}");
    assert_eq!(first[0], second[0], "the network namespace is the view's");
    assert_ne!(
        first[1], second[1],
        "each command has its own PID namespace"
    );
    let host = std::fs::read_link("/proc/self/ns/net").unwrap();
    assert_ne!(first[0], host.display().to_string());

    let hidden = |file: PathBuf| {
        let ctx = ctx(&world);
        async move {
            let out = bash_in(&ctx, &format!("cat {}", path(&file))).await;
            assert!(
                !out.content.contains(SECRET),
                "{}: {}",
                file.display(),
                out.content
            );
        }
    };
    std::fs::create_dir_all(&late).unwrap();
    std::fs::write(late.join("notes.md"), SECRET).unwrap();
    hidden(late.join("notes.md")).await;
    let newcomer = world.tmp_root().join("session-3");
    std::fs::create_dir_all(&newcomer).unwrap();
    std::fs::write(newcomer.join("scratch"), SECRET).unwrap();
    // Old enough to key a view again: the new entry shows in the time stamp alone.
    backdate(&world.tmp_root(), 30);
    hidden(newcomer.join("scratch")).await;
}

/// The daemon user's home is covered: credential files the deny list does not name are gone,
/// while the allow list (a toolchain, `.gitconfig`) reads as before.
#[tokio::test]
async fn credentials_in_the_home_are_hidden_and_the_allow_list_is_not() {
    let world = World::new();
    sandbox_works(&world).await;
    for file in CREDENTIALS {
        let target = world.user.join(file);
        let out = world
            .bash(
                SandboxMode::WorkspaceWrite,
                &format!("cat '{}'", path(&target)),
            )
            .await;
        assert!(
            out.is_error && !out.content.contains(SECRET),
            "{file}: {}",
            out.content
        );
    }
    let allowed = world
        .bash(
            SandboxMode::WorkspaceWrite,
            &format!(
                "cat '{}' '{}'",
                path(&world.user.join(".cargo/bin/tool")),
                path(&world.user.join(".gitconfig"))
            ),
        )
        .await;
    assert!(!allowed.is_error, "{}", allowed.content);
    assert!(allowed.content.contains("a tool"), "{}", allowed.content);
    let readonly = world
        .bash(
            SandboxMode::WorkspaceWrite,
            &format!("echo x >> '{}'", path(&world.user.join(".gitconfig"))),
        )
        .await;
    assert!(readonly.is_error, "{}", readonly.content);
    // Full access sees the home as it is.
    let full = world
        .bash(
            SandboxMode::FullAccess,
            &format!("cat '{}'", path(&world.user.join(".pgpass"))),
        )
        .await;
    assert!(full.content.contains(SECRET), "{}", full.content);
}

/// A Python one-liner in the sandbox, with what it printed or the exception's class.
async fn python(world: &World, code: &str) -> ToolOutput {
    let script = format!("python3 - <<'EOF'\n{code}\nEOF");
    world.bash(SandboxMode::WorkspaceWrite, &script).await
}

/// A Unix-socket listener outside the workspace (as PostgreSQL's or Docker's) cannot be reached;
/// nor can `ptrace`, a nested namespace or an `AF_VSOCK` socket be had.
#[tokio::test]
async fn unix_sockets_ptrace_namespaces_and_vsock_are_refused() {
    let world = World::new();
    sandbox_works(&world).await;
    let socket = world.outside.join("listener.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let probes = [
        format!(
            "import socket\ntry:\n    s = socket.socket(socket.AF_UNIX)\n    s.connect({:?})\n    print('connected')\nexcept OSError as e:\n    print('refused', e.errno)",
            path(&socket)
        ),
        "import socket\ntry:\n    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\n    print('vsock')\nexcept OSError as e:\n    print('refused', e.errno)".to_owned(),
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nrc = libc.ptrace(0, 0, 0, 0)\nprint('refused', ctypes.get_errno()) if rc != 0 else print('traced')".to_owned(),
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nrc = libc.unshare(0x10000000)\nprint('refused', ctypes.get_errno()) if rc != 0 else print('unshared')".to_owned(),
    ];
    for probe in probes {
        let out = python(&world, &probe).await;
        assert!(
            out.content.contains(&format!("refused {}", libc::EPERM)),
            "{probe}\n{}",
            out.content
        );
    }
    // Pipes and socketpairs still work: shells and Python's own machinery need them.
    let pair = python(
        &world,
        "import socket\na, b = socket.socketpair()\na.send(b'ok')\nprint(b.recv(2).decode())",
    )
    .await;
    assert!(pair.content.contains("ok"), "{}", pair.content);
}

/// The `unix_sockets` grant reaches the listener the sandbox otherwise keeps out of reach, and
/// nothing else changes: `ptrace` stays refused.
#[tokio::test]
async fn the_unix_sockets_grant_reaches_a_listener() {
    let mut world = World::new();
    world.unix_sockets = true;
    sandbox_works(&world).await;
    let socket = world.outside.join("listener.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let accepted = std::thread::spawn(move || {
        use std::io::Read;
        let (mut conn, _) = listener.accept().unwrap();
        let mut said = String::new();
        conn.read_to_string(&mut said).unwrap();
        said
    });
    let out = python(
        &world,
        &format!(
            "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({:?})\n\
             s.sendall(b'hello')\ns.close()\nprint('connected')",
            path(&socket)
        ),
    )
    .await;
    assert!(out.content.contains("connected"), "{}", out.content);
    assert_eq!(accepted.join().unwrap(), "hello");
    let traced = python(
        &world,
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nrc = libc.ptrace(0, 0, 0, 0)\n\
         print('refused', ctypes.get_errno()) if rc != 0 else print('traced')",
    )
    .await;
    assert!(
        traced.content.contains(&format!("refused {}", libc::EPERM)),
        "{}",
        traced.content
    );
}

/// A fork bomb meets the process cap and the call ends in an error, leaving nothing behind; a
/// memory hog fails under the address-space limit.
#[tokio::test]
async fn a_fork_bomb_and_a_memory_hog_end_in_tool_errors() {
    let mut world = World::new();
    world.limits = ResourceLimits {
        processes: Some(64),
        session_processes: Some(64),
        address_space: Some(1 << 30),
        ..ResourceLimits::default()
    };
    sandbox_works(&world).await;
    let hog = python(&world, "b = bytearray(4 << 30)\nprint('allocated')").await;
    assert!(hog.is_error, "{}", hog.content);
    assert!(hog.content.contains("MemoryError"), "{}", hog.content);
    if nix::unistd::getuid().is_root()
        && let Err(why) = forkd_tools::sandbox::cgroup::hierarchy()
    {
        // The kernel exempts uid 0 from RLIMIT_NPROC: a root daemon's commands are capped by
        // their session's pids cgroup, and here there is none.
        eprintln!("skipping the fork bomb: a root test with no cgroup to cap it ({why})");
        return;
    }
    let ctx = world.ctx(SandboxMode::WorkspaceWrite, false);
    let bomb = run_tool(
        "Bash",
        &json!({ "command": ":(){ :|:& };:; sleep 3; echo survived", "timeout": 2 }),
        &ctx,
    )
    .await;
    assert!(bomb.is_error, "{}", bomb.content);
    // The cap bound (RLIMIT_NPROC, or the session's pids cgroup for a root test): forks failed.
    assert!(
        bomb.content.contains("Resource temporarily unavailable"),
        "{}",
        bomb.content
    );
    // After it, the machine's own processes are the only ones left of this user's: the bomb's
    // namespace ended with its init.
    let left = std::process::Command::new("pgrep")
        .args(["-c", "-f", "sleep 3; echo survived"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&left.stdout).trim(), "0");
}

/// A hook command runs as the session's Bash commands do — the same walls — and gets its event
/// on stdin, its variables, its stderr apart and its exit code; one that hangs is killed at its
/// timeout, and one that prints without end is capped.
#[tokio::test]
async fn a_hook_runs_behind_the_same_walls_with_its_event_on_stdin() {
    use forkd_tools::hook::{HookCall, run};
    let world = World::new();
    sandbox_works(&world).await;
    let ctx = world.ctx(SandboxMode::WorkspaceWrite, false);
    let call = |command: &str, timeout: u64| HookCall {
        command: command.to_owned(),
        input: br#"{"tool_name":"Bash","tool_input":{"command":"rm -rf /"}}"#.to_vec(),
        env: vec![("FORKD_WORKSPACE".into(), path(ctx.workspace.root()))],
        timeout: std::time::Duration::from_secs(timeout),
        sandboxed: true,
    };
    let blocked = run(
        call(
            "input=$(cat); case \"$input\" in *'rm -rf'*) echo \"no rm -rf in $FORKD_WORKSPACE\" >&2; exit 2;; esac",
            10,
        ),
        &ctx,
    )
    .await;
    assert_eq!(blocked.exit, Some(2), "{blocked:?}");
    assert_eq!(
        blocked.stderr.trim(),
        format!("no rm -rf in {}", path(ctx.workspace.root()))
    );
    assert!(blocked.stdout.is_empty());
    let hidden = run(call(&format!("ls {}", path(&world.home)), 10), &ctx).await;
    assert!(!hidden.stdout.contains("forkd.db"), "{hidden:?}");
    let hung = run(call("sleep 60", 1), &ctx).await;
    assert_eq!(hung.exit, None);
    assert!(hung.failure.unwrap().contains("did not end"));
    let flood = run(call("head -c 100000000 /dev/zero | tr '\\0' x", 60), &ctx).await;
    assert_eq!(flood.exit, Some(0), "{:?}", flood.failure);
    assert!(
        flood.stdout.len() < 100_000,
        "capped: {}",
        flood.stdout.len()
    );
    assert!(flood.stdout_cut);
    // A JSON answer past the cap is said to be cut, and its deny is not lost: it denies.
    let long_deny = "printf '{\"hookSpecificOutput\":{\"permissionDecision\":\"deny\",\"additionalContext\":\"'; \
                     head -c 100000 /dev/zero | tr '\\0' x; printf '\"}}'";
    let long = run(call(long_deny, 60), &ctx).await;
    assert!(long.stdout_cut, "{:?}", long.failure);
    let read = forkd_core::hooks::HookOutput::of(forkd_core::hooks::HookEvent::PreToolUse, &long);
    assert_eq!(
        read.permission,
        Some(forkd_core::hooks::Permission::Deny),
        "{read:?}"
    );
    let short = run(call("echo '{}'", 10), &ctx).await;
    assert!(!short.stdout_cut);
}
