//! Long-lived tool servers (MCP stdio servers): a program started with piped stdin and stdout,
//! in its own process group, in the sandbox the operator chose, dying with the daemon.
//!
//! The death of the daemon is seen the way Bash commands see it ([`crate::bash`]): a sentinel in
//! the server's process group reads a pipe whose write end only the daemon holds and kills the
//! group when it reads EOF — which happens when the daemon closes it (the server is stopped) or
//! when the kernel closes the dead daemon's files, however it died. Not `PR_SET_PDEATHSIG`: that
//! fires when the *thread* that forked the child exits (a tokio worker thread, or a blocking-pool
//! thread that ends after ten idle seconds), which would kill a healthy server under a healthy
//! daemon, and it reaches only the server's own process, not the helpers it started.
//!
//! Here stdin and stdout carry the protocol, so the lifeline's read end is handed over as the
//! launcher's stderr (a pipe's read end is still a readable file descriptor): the launcher moves
//! it to fd 3 for the sentinel, points its own stderr at a log file, and execs the server without
//! fd 3. The server's stderr lands in that log, which the caller may read to explain a server that
//! would not start.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::PipeWriter;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{ChildStdin, ChildStdout, Command};

use crate::env::child_env;
use crate::process::Leader;
use crate::sandbox::{Prepared, Sandbox, SandboxPaths};

/// The launcher `bash -c` runs: `$1` is the log file, the rest the server's command line.
const LAUNCHER: &str = "log=$1; shift; exec 3<&2 2>>\"$log\"; \
    (trap '' HUP INT QUIT TERM; read -r _ <&3; kill -KILL 0) </dev/null >/dev/null 2>&1 & \
    exec \"$@\" 3<&-";

/// What a server is started with.
#[derive(Debug, Clone)]
pub struct ServerCommand {
    pub program: String,
    pub args: Vec<String>,
    /// Added to the scrubbed environment (which never carries the daemon's own secrets).
    pub env: BTreeMap<String, String>,
    /// The server's own directory: its working directory and `HOME`, and where it may write.
    pub dir: PathBuf,
    /// Its sandbox; `None` runs it unconfined (`full-access`).
    pub sandbox: Option<(Sandbox, SandboxPaths)>,
}

impl ServerCommand {
    /// Where the server's stderr is appended.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("stderr.log")
    }
}

/// A started server. Dropping it kills the server's whole process group.
pub struct ServerProcess {
    pipes: Option<(ChildStdin, ChildStdout)>,
    leader: Leader,
    group: Pid,
    /// Closed after the group is killed (fields drop after [`Drop::drop`]), or when the daemon
    /// dies: either way the sentinel then kills the group. An `Option` only for a test.
    #[allow(dead_code, reason = "held, never read: its closing is what it is for")]
    lifeline: Option<PipeWriter>,
    /// The server's place in its session's cgroup, let go once the group is killed.
    #[allow(dead_code, reason = "held, never read: its drop is what it is for")]
    cgroup: Option<crate::sandbox::cgroup::Membership>,
}

impl ServerProcess {
    /// The server's stdin and stdout, the protocol's channel (once).
    pub fn take_pipes(&mut self) -> Option<(ChildStdin, ChildStdout)> {
        self.pipes.take()
    }

    /// The process group's id (its leader's pid).
    pub fn pgid(&self) -> i32 {
        self.group.as_raw()
    }

    /// Waits until the server's leader exits, kills what is left of its group (before the
    /// leader is reaped, while the group's id is still its own) and returns how it ended.
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.leader.exited().await?;
        let _ = killpg(self.group, Signal::SIGKILL);
        self.leader.reap().await
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = killpg(self.group, Signal::SIGKILL);
    }
}

/// Why a server did not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerSpawnError {
    #[error("cannot prepare its directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),
    #[error(
        "it could not start{}: {}",
        if *.sandboxed { " in its sandbox" } else { "" },
        crate::sandbox::explain(source)
    )]
    Spawn {
        sandboxed: bool,
        source: std::io::Error,
    },
}

/// Starts `cmd` behind the sentinel, in a new process group, sandboxed as asked.
pub fn spawn_server(cmd: &ServerCommand) -> Result<ServerProcess, ServerSpawnError> {
    let dir_err = |source| ServerSpawnError::Dir {
        path: cmd.dir.clone(),
        source,
    };
    std::fs::create_dir_all(&cmd.dir).map_err(dir_err)?;
    let prepared = match &cmd.sandbox {
        Some((sandbox, paths)) => Prepared::new(*sandbox, paths, &cmd.dir, None)?,
        None => None,
    };
    let spawn_err = |source| ServerSpawnError::Spawn {
        sandboxed: cmd.sandbox.is_some(),
        source,
    };
    let (lifeline_reader, lifeline) = std::io::pipe().map_err(spawn_err)?;
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(LAUNCHER)
        .arg("forkd-mcp")
        .arg(cmd.log_path())
        .arg(&cmd.program)
        .args(&cmd.args)
        .current_dir(&cmd.dir)
        .env_clear()
        .envs(server_env(&cmd.dir))
        .envs(&cmd.env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(lifeline_reader)
        .process_group(0)
        .kill_on_drop(true);
    let cgroup = prepared.and_then(|prepared| prepared.apply(command.as_std_mut()));
    let mut child = command.spawn().map_err(spawn_err)?;
    drop(command);
    let missing = || spawn_err(std::io::Error::other("the server's pipes were not set up"));
    let stdin = child.stdin.take().ok_or_else(missing)?;
    let stdout = child.stdout.take().ok_or_else(missing)?;
    let pid = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .ok_or_else(|| spawn_err(std::io::Error::other("the server exited at once")))?;
    Ok(ServerProcess {
        pipes: Some((stdin, stdout)),
        leader: Leader::new(child),
        group: Pid::from_raw(pid),
        lifeline: Some(lifeline),
        cgroup,
    })
}

/// The scrubbed environment of a server, with `HOME` its own directory.
fn server_env(dir: &Path) -> Vec<(&'static str, OsString)> {
    child_env(|name| std::env::var_os(name), dir)
}

/// The last `lines` lines of a server's log, for an error message (empty if there is none). The
/// log lies in the server's own directory, which the server writes: a link there (to whatever
/// the daemon can read: its environment, its key) is not followed, a FIFO not waited on, and
/// only the log's last 64 KiB are read.
pub fn log_tail(path: &Path, lines: usize) -> String {
    use std::io::{Read as _, Seek as _, SeekFrom};
    use std::os::unix::fs::OpenOptionsExt as _;
    const TAIL: u64 = 64 * 1024;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let Ok(mut file) = opened else {
        return String::new();
    };
    match file.metadata() {
        Ok(meta) if meta.is_file() => {
            if meta.len() > TAIL && file.seek(SeekFrom::End(-(TAIL as i64))).is_err() {
                return String::new();
            }
        }
        _ => return String::new(),
    }
    let mut text = Vec::new();
    if file.take(TAIL).read_to_end(&mut text).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&text);
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    #[test]
    fn a_logs_tail_never_follows_a_link_nor_waits_on_a_fifo() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("stderr.log");
        std::fs::write(&log, "one\n\ntwo\nthree\nfour\n").unwrap();
        assert_eq!(log_tail(&log, 3), "two\nthree\nfour");
        let long = "x".repeat(100_000) + "\nlast\n";
        std::fs::write(&log, long).unwrap();
        assert_eq!(log_tail(&log, 1), "last");
        let secret = dir.path().join("secret.key");
        std::fs::write(&secret, "the daemon's key").unwrap();
        std::fs::remove_file(&log).unwrap();
        std::os::unix::fs::symlink(&secret, &log).unwrap();
        assert_eq!(log_tail(&log, 3), "");
        std::fs::remove_file(&log).unwrap();
        nix::unistd::mkfifo(&log, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(log_tail(&log, 3), "");
    }

    fn cat(dir: &Path) -> ServerCommand {
        ServerCommand {
            program: "bash".into(),
            args: vec![
                "-c".into(),
                "echo started >&2; sleep 600 & echo $! > bg.pid; cat".into(),
            ],
            env: BTreeMap::from([("GREETING".into(), "hi".into())]),
            dir: dir.to_path_buf(),
            sandbox: None,
        }
    }

    fn alive(pid: i32) -> bool {
        nix::sys::signal::kill(Pid::from_raw(pid), None).is_ok()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .unwrap_or_default()
                .contains(") Z")
    }

    #[tokio::test]
    async fn a_server_speaks_over_stdio_and_its_group_dies_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let cmd = cat(dir.path());
        let server = spawn_server(&cmd).unwrap();
        let mut server = server;
        let (mut stdin, stdout) = server.take_pipes().unwrap();
        stdin.write_all(b"ping\n").await.unwrap();
        let mut lines = BufReader::new(stdout).lines();
        assert_eq!(lines.next_line().await.unwrap().as_deref(), Some("ping"));
        let bg: i32 = std::fs::read_to_string(dir.path().join("bg.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(alive(bg));
        assert_eq!(log_tail(&cmd.log_path(), 5), "started");
        drop(server);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while alive(bg) {
            assert!(
                std::time::Instant::now() < deadline,
                "background process survived"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn the_sentinel_kills_the_group_when_the_lifeline_closes() {
        let dir = tempfile::tempdir().unwrap();
        let mut server = spawn_server(&cat(dir.path())).unwrap();
        // Only the lifeline closes (as when the daemon dies): nothing signals the group.
        drop(server.lifeline.take());
        let leader = server.pgid();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while alive(leader) {
            assert!(
                std::time::Instant::now() < deadline,
                "the server survived its lifeline"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        server.wait().await.unwrap();
    }
}
