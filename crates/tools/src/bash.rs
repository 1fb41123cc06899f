//! The Bash tool: one `bash -c` command in the workspace, in its own process group, with a
//! scrubbed environment, a timeout and capped output.
//!
//! Exit status convention: a non-zero exit code, a signal, a timeout or a cancellation set
//! `is_error`, and the content ends with a line saying which ("exit code 1"). The output is
//! still all there: a failing test run is an error *and* the model needs its log.
//!
//! Lifetime: the command's whole process group is killed (SIGKILL) when the call ends, however
//! it ends (exit, timeout, cancellation, or the future being dropped), and when the daemon that
//! started it dies, however it dies (SIGKILL included), so nothing it started in the background
//! outlives the tool call or the daemon. Only a process that leaves the group (`setsid`, or
//! `set -m`'s job groups) escapes. Bash is not a sandbox: it runs with the daemon's user rights,
//! and only the file tools are confined to the workspace.
//!
//! The daemon's death is seen by a sentinel inside the group, through a pipe, the *lifeline*:
//! the daemon holds its write end (close-on-exec, so no other program it starts inherits it) and
//! never writes to it; the spawned shell gets the read end as stdin, moves it to fd 3 and sets
//! stdin to `/dev/null`, starts `(read <&3; kill -KILL 0) >/dev/null 2>&1 &` — a subshell in
//! the same group, ignoring the signals a command may send its own group, whose output goes
//! nowhere — and then execs `bash -c COMMAND` without fd 3. The exec keeps the shell's pid, so
//! the group's leader is the command's own shell, whose exit status is the call's; the command
//! and everything it starts never hold the lifeline. The write end closes when the call ends
//! (after its group is killed) or when the daemon dies, since the kernel closes a dead process's
//! files; the sentinel then reads EOF and kills its whole group. (`PR_SET_PDEATHSIG` would only
//! reach the leader, not what it started in the background.) The group is also reported through
//! [`ToolContext::process_groups`], so the engine can record it and a later daemon can stop it
//! should the sentinel itself have been killed ([`crate::process`]).

use std::io::PipeWriter;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;

use crate::cap::HeadTail;
use crate::context::{SandboxSpec, ToolContext, ToolLimits, ToolOutput};
use crate::env::child_env;
use crate::error::ToolError;
use crate::input::{optional_positive, required_str};
use crate::process;
use crate::sandbox::Prepared;
use crate::sandbox::layer::LayerView;

/// How long to keep reading output after the process group is gone. Only a process that left
/// the group (`setsid`) can hold the pipe open past that; its output is not worth a hang.
const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// The script the spawned `bash -c` runs, with the lifeline's read end as stdin and the command
/// as `$1`: the sentinel, then the command's own shell in its place (see the module doc).
const LAUNCHER: &str = "exec 3<&0 </dev/null; \
    (trap '' HUP INT QUIT TERM; read -r _ <&3; kill -KILL 0) >/dev/null 2>&1 & \
    exec bash -c \"$1\" 3<&-";

/// [`LAUNCHER`] for a command that reads its input as stdin: a pipe the daemon passes on the
/// descriptor `$2` names (no file any other process could swap), the lifeline still on fd 0.
/// The descriptor is the pipe's own number in the daemon, kept open across the exec: a fixed
/// number could be one the sandbox's set-up still needs (its namespaces, its Landlock ruleset).
const LAUNCHER_WITH_INPUT: &str = "exec 3<&0; eval \"exec <&$2 $2<&-\"; \
    (trap '' HUP INT QUIT TERM; read -r _ <&3; kill -KILL 0) >/dev/null 2>&1 & \
    exec bash -c \"$1\" 3<&-";

/// What a command gets besides its workspace and sandbox: the Bash tool's commands get nothing
/// ([`Io::default`]); a hook gets its event on stdin, variables of its own, and its stderr apart.
#[derive(Debug, Clone, Default)]
pub(crate) struct Io {
    /// Its stdin, through a pipe: the caller writes it (see [`Spawned::input`]).
    pub input: bool,
    /// Set in its environment, after the ones every command gets.
    pub env: Vec<(String, String)>,
    /// Its stderr on a pipe of its own (otherwise one pipe carries both, as a terminal shows).
    pub split: bool,
}

/// Runs Bash `{command, timeout?}`.
pub async fn run(input: &Value, ctx: &ToolContext) -> ToolOutput {
    let prepared = required_str(input, "command")
        .and_then(|command| Ok((command, timeout(input, &ctx.limits)?)));
    let (command, limit) = match prepared {
        Ok(prepared) => prepared,
        Err(err) => return err.into(),
    };
    if ctx.cancel.is_cancelled() {
        return ToolOutput::error("command was cancelled before it started");
    }
    match execute(command, limit, ctx).await {
        Ok(output) => output,
        Err(err) => ToolOutput::error(format!("could not run bash: {err}")),
    }
}

/// The input's `timeout` (seconds), or the default, never above the maximum. A model used to
/// millisecond timeouts that sends `120000` gets the maximum, not a 33-hour wait.
fn timeout(input: &Value, limits: &ToolLimits) -> Result<Duration, ToolError> {
    let asked =
        optional_positive(input, "timeout")?.map_or(limits.bash_timeout, Duration::from_secs);
    Ok(asked.min(limits.bash_max_timeout))
}

/// How the command's run ended.
enum Ending {
    Exited(ExitStatus),
    TimedOut,
    Cancelled,
}

/// Why [`drive`] stopped: the leader is not reaped yet in any case.
enum Stop {
    Exited,
    TimedOut,
    Cancelled,
}

async fn execute(command: &str, limit: Duration, ctx: &ToolContext) -> std::io::Result<ToolOutput> {
    // Preparing the sandbox and starting the command block (a holder process making the view,
    // the cgroup's files, a fork that returns once the command has exec'd): off the runtime's
    // worker threads, so that one slow start never holds up the daemon's other tasks. A call
    // dropped meanwhile drops what was started (its group killed, see the module doc).
    let started = {
        let command = command.to_owned();
        let root = ctx.workspace.root().to_path_buf();
        let (spec, layer) = (ctx.sandbox.clone(), ctx.workspace.layer().cloned());
        tokio::task::spawn_blocking(move || {
            start(
                &command,
                &root,
                spec.as_ref(),
                layer.as_ref(),
                Io::default(),
            )
        })
        .await
        .map_err(std::io::Error::other)??
    };
    let Spawned {
        child,
        output: mut pipe,
        lifeline,
        cgroup,
        ..
    } = match started {
        Started::Spawned(spawned) => *spawned,
        Started::Refused(why) => return Ok(ToolOutput::error(why)),
    };
    let mut leader = process::Leader::new(child);
    // Declared after the leader, so dropped before it: an abandoned call kills the group while
    // its leader still holds the group's id.
    let group = GroupGuard::new(leader.id(), lifeline)?;
    if let Some(groups) = &ctx.process_groups
        && let Ok(recorded) = process::group_of(group.leader())
    {
        // Without `/proc` nothing is recorded; the sentinel still guards the group. A closed
        // channel means nobody records.
        let _ = groups.send(recorded);
    }
    let mut output = HeadTail::new(ctx.limits.output_cap);
    let stop = drive(&mut leader, &mut pipe, &mut output, limit, &ctx.cancel).await?;
    // Kill the group before reaping its leader: a timed-out shell's children die with it, a
    // normal exit's background processes too, and the group's id cannot have been reused yet.
    group.kill();
    let status = leader.reap().await?;
    let ending = match stop {
        Stop::Exited => Ending::Exited(status),
        Stop::TimedOut => Ending::TimedOut,
        Stop::Cancelled => Ending::Cancelled,
    };
    drain(&mut pipe, &mut output).await;
    drop(cgroup);
    Ok(render(ending, output, limit))
}

/// What starting a command came to.
pub(crate) enum Started {
    Spawned(Box<Spawned>),
    /// It did not run, and why (for the model).
    Refused(String),
}

/// Prepares `spec`'s sandbox (over an isolated child's `layer`) and starts `command` in it,
/// with `io`. Blocking: called off the runtime's workers.
pub(crate) fn start(
    command: &str,
    root: &Path,
    spec: Option<&SandboxSpec>,
    layer: Option<&std::sync::Arc<LayerView>>,
    io: Io,
) -> std::io::Result<Started> {
    let prepared = match spec {
        Some(spec) => match Prepared::new(spec.sandbox, &spec.paths, root, layer) {
            Ok(prepared) => prepared,
            Err(e) => return Ok(Started::Refused(e.to_string())),
        },
        None => None,
    };
    if layer.is_some() && prepared.is_none() {
        // Unconfined, the command would see the live workspace instead of the child's copy.
        return Ok(Started::Refused(
            "an isolated child's commands need the sandbox that mounts its copy; the command \
             did not run"
                .into(),
        ));
    }
    match spawn(command, root, prepared, &io) {
        Ok(spawned) => Ok(Started::Spawned(Box::new(spawned))),
        Err(e) if spec.is_some() => Ok(Started::Refused(format!(
            "the command could not enter its sandbox: {}; the command did not run. A session \
             whose commands may run unconfined is created with --sandbox full-access",
            crate::sandbox::explain(&e)
        ))),
        Err(e) => Err(e),
    }
}

/// A command just started.
pub(crate) struct Spawned {
    /// The command's shell: the leader of its process group.
    pub child: Child,
    /// Its stdout, and its stderr unless [`Io::split`].
    pub output: pipe::Receiver,
    /// Its stderr, with [`Io::split`].
    pub errors: Option<pipe::Receiver>,
    /// The daemon's end of the sentinel's pipe: when it closes, the sentinel kills the group.
    pub lifeline: PipeWriter,
    /// The command's place in its session's cgroup, held until it has been reaped.
    pub cgroup: Option<crate::sandbox::cgroup::Membership>,
    /// The write end of its stdin, with [`Io::input`]: the caller writes the input and drops
    /// it.
    pub input: Option<pipe::Sender>,
}

/// Starts `bash -c command` (behind [`LAUNCHER`]'s sentinel) in a new process group with stdout
/// and stderr on one pipe, so the model sees them interleaved as a terminal would show them.
fn spawn(
    command: &str,
    root: &Path,
    sandbox: Option<Prepared>,
    io: &Io,
) -> std::io::Result<Spawned> {
    let (reader, writer) = std::io::pipe()?;
    let (errors, writer_err) = if io.split {
        let (r, w) = std::io::pipe()?;
        (Some(r), w)
    } else {
        (None, writer.try_clone()?)
    };
    // Both ends are close-on-exec: only the shell's stdin (a copy made for it alone) survives
    // into the group, and the write end stays the daemon's.
    let (lifeline_reader, lifeline) = std::io::pipe()?;
    // The input's read end, passed on its own number (see LAUNCHER_WITH_INPUT).
    let input = if io.input {
        Some(std::io::pipe()?)
    } else {
        None
    };
    let mut cmd = Command::new("bash");
    let launcher = if io.input {
        LAUNCHER_WITH_INPUT
    } else {
        LAUNCHER
    };
    cmd.arg("-c")
        .arg(launcher)
        .arg("forkd-bash")
        .arg(command)
        .args(
            input
                .as_ref()
                .map(|(reader, _)| std::os::fd::AsRawFd::as_raw_fd(reader).to_string()),
        )
        .current_dir(root)
        .env_clear()
        .envs(child_env(|name| std::env::var_os(name), root))
        .envs(io.env.iter().map(|(k, v)| (k, v)))
        .stdin(lifeline_reader)
        .stdout(writer)
        .stderr(writer_err)
        .process_group(0)
        .kill_on_drop(true);
    // The input's read end is kept open across the exec, set before the sandbox is entered (a
    // closure registered first runs first), so that the command two forks down inherits it.
    if let Some((reader, _)) = &input {
        let raw = std::os::fd::AsRawFd::as_raw_fd(reader);
        process::keep_descriptor(cmd.as_std_mut(), raw);
    }
    let cgroup = sandbox.and_then(|sandbox| sandbox.apply(cmd.as_std_mut()));
    let child = cmd.spawn()?;
    // `cmd` holds our copies of the output pipe's write end (until they close, EOF never comes)
    // and of the lifeline's read end.
    drop(cmd);
    let output = pipe::Receiver::from_owned_fd(OwnedFd::from(reader))?;
    let errors = errors
        .map(|r| pipe::Receiver::from_owned_fd(OwnedFd::from(r)))
        .transpose()?;
    // Our copy of the read end goes now: the command holds its own.
    let input = input
        .map(|(reader, writer)| {
            drop(reader);
            pipe::Sender::from_owned_fd(OwnedFd::from(writer))
        })
        .transpose()?;
    Ok(Spawned {
        child,
        output,
        errors,
        lifeline,
        cgroup,
        input,
    })
}

/// Reads output until the shell exits (left unreaped), the deadline passes or the call is
/// cancelled.
async fn drive(
    leader: &mut process::Leader,
    pipe: &mut pipe::Receiver,
    output: &mut HeadTail,
    limit: Duration,
    cancel: &CancellationToken,
) -> std::io::Result<Stop> {
    let deadline = Instant::now() + limit;
    let mut buf = vec![0u8; 16 * 1024];
    let mut open = true;
    loop {
        tokio::select! {
            exited = leader.exited() => return exited.map(|()| Stop::Exited),
            read = pipe.read(&mut buf), if open => match read {
                Ok(n) if n > 0 => output.push(&buf[..n]),
                _ => open = false,
            },
            () = sleep_until(deadline) => return Ok(Stop::TimedOut),
            () = cancel.cancelled() => return Ok(Stop::Cancelled),
        }
    }
}

/// Reads what is left in the pipe once the group is dead, for at most `DRAIN_GRACE`.
pub(crate) async fn drain(pipe: &mut pipe::Receiver, output: &mut HeadTail) {
    let deadline = Instant::now() + DRAIN_GRACE;
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(Ok(n)) = timeout_at(deadline, pipe.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        output.push(&buf[..n]);
    }
}

fn render(ending: Ending, output: HeadTail, limit: Duration) -> ToolOutput {
    let mut text = if output.is_empty() {
        "(no output)".to_owned()
    } else {
        output.finish()
    };
    let status = match ending {
        Ending::Exited(status) => match (status.code(), status.signal()) {
            (Some(0), _) => return ToolOutput::ok(text),
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(signal)) => format!("killed by signal {signal}"),
            (None, None) => "ended without an exit code".to_owned(),
        },
        Ending::TimedOut => {
            format!("command timed out after {limit:?}; its process group was killed")
        }
        Ending::Cancelled => "command was cancelled; its process group was killed".to_owned(),
    };
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&status);
    ToolOutput::error(text)
}

/// Kills the command's process group when dropped, so even an abandoned tool call (its future
/// dropped mid-run) leaves no processes behind; holds the lifeline until then.
pub(crate) struct GroupGuard {
    group: Pid,
    /// Closed only after the group is killed: fields are dropped after [`Drop::drop`] runs.
    _lifeline: PipeWriter,
}

impl GroupGuard {
    pub(crate) fn new(leader: Option<u32>, lifeline: PipeWriter) -> std::io::Result<GroupGuard> {
        let pid =
            leader.ok_or_else(|| std::io::Error::other("bash exited before its pid was read"))?;
        let pid = i32::try_from(pid).map_err(std::io::Error::other)?;
        // `process_group(0)` made the shell the leader of a group with its own pid as id.
        Ok(GroupGuard {
            group: Pid::from_raw(pid),
            _lifeline: lifeline,
        })
    }

    /// The group's leader (and id).
    fn leader(&self) -> u32 {
        self.group.as_raw().unsigned_abs()
    }

    pub(crate) fn kill(self) {
        drop(self);
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        // The leader is unreaped here (a zombie at worst), so the id is still this group's.
        // ESRCH (the group is already empty) is the normal case after a clean exit.
        let _ = killpg(self.group, Signal::SIGKILL);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn timeout_defaults_and_is_capped() {
        let limits = ToolLimits::default();
        let secs = |input: Value| timeout(&input, &limits).unwrap().as_secs();
        assert_eq!(secs(json!({})), 120);
        assert_eq!(secs(json!({"timeout": 5})), 5);
        assert_eq!(secs(json!({"timeout": 120_000})), 600);
        assert!(timeout(&json!({"timeout": 0}), &limits).is_err());
    }

    /// Starts `command` as the tool does, but with no guard: nothing kills its group except the
    /// sentinel. Returns once the command printed `started`.
    async fn started(command: &str, root: &Path) -> Spawned {
        let mut spawned = spawn(command, root, None, &Io::default()).unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&seen).contains("started") {
            let n = timeout_at(
                Instant::now() + Duration::from_secs(10),
                spawned.output.read(&mut buf),
            )
            .await
            .expect("the command never started")
            .unwrap();
            assert!(
                n > 0,
                "output ended early: {}",
                String::from_utf8_lossy(&seen)
            );
            seen.extend_from_slice(&buf[..n]);
        }
        spawned
    }

    fn pgid(child: &Child) -> i32 {
        i32::try_from(child.id().unwrap()).unwrap()
    }

    /// Where the process's fds point (`pipe:[123]`, `/dev/null`…).
    fn fd_targets(pid: i32) -> Vec<String> {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|dir| {
                dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                    .map(|t| t.display().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The daemon's death, simulated: only the daemon's end of the lifeline closes (no guard
    /// kills anything), and the sentinel kills every process of the group, background ones
    /// included.
    #[tokio::test]
    async fn the_sentinel_kills_the_whole_group_when_the_lifeline_closes() {
        let dir = tempfile::tempdir().unwrap();
        let Spawned {
            mut child,
            output: _output,
            lifeline,
            ..
        } = started(
            "sleep 100 & sleep 100 & sleep 100 & echo started; wait",
            dir.path(),
        )
        .await;
        let group = pgid(&child);
        // The shell, its three background sleepers (forked before `started`), and the sentinel.
        let members = process::live_members(group).unwrap();
        assert_eq!(members.len(), 5, "{members:?}");

        drop(lifeline);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = process::live_members(group).unwrap();
            if left.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "processes survived: {left:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The leader (this process's child, reaped only now) was killed too.
        assert_eq!(child.wait().await.unwrap().signal(), Some(9));
    }

    /// Only the sentinel holds the lifeline: the command's shell (and so whatever it starts)
    /// has neither end, and its stdin is `/dev/null`.
    #[tokio::test]
    async fn the_command_never_holds_the_lifeline() {
        use std::os::fd::AsRawFd;

        let dir = tempfile::tempdir().unwrap();
        let spawned = started("echo started; sleep 100", dir.path()).await;
        let lifeline =
            std::fs::read_link(format!("/proc/self/fd/{}", spawned.lifeline.as_raw_fd()))
                .unwrap()
                .display()
                .to_string();
        assert!(lifeline.starts_with("pipe:"), "{lifeline}");
        let leader = pgid(&spawned.child);
        let holders: Vec<i32> = process::live_members(leader)
            .unwrap()
            .into_iter()
            .filter(|pid| fd_targets(*pid).contains(&lifeline))
            .collect();
        assert_eq!(holders.len(), 1, "{holders:?}");
        assert_ne!(holders[0], leader, "the command's shell holds the lifeline");
        let stdin = std::fs::read_link(format!("/proc/{leader}/fd/0")).unwrap();
        assert_eq!(stdin, Path::new("/dev/null"));
        GroupGuard::new(spawned.child.id(), spawned.lifeline)
            .unwrap()
            .kill();
    }

    /// The group is reported once spawned, as the leader it is: the command's own shell.
    #[tokio::test]
    async fn the_group_is_reported_with_the_commands_own_pid() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let ctx = ToolContext::new(
            crate::Workspace::new(dir.path()).unwrap(),
            CancellationToken::new(),
        )
        .with_process_groups(tx);
        let out = run(&json!({"command": "echo $$"}), &ctx).await;
        assert!(!out.is_error, "{}", out.content);
        let group = rx.try_recv().unwrap();
        assert_eq!(out.content.trim(), group.pgid.to_string());
        assert_eq!(group.boot_id, process::boot_id().unwrap());
        assert!(group.start_ticks > 0);
        assert!(rx.try_recv().is_err(), "reported once");
    }
}
