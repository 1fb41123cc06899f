//! The Bash tool: one `bash -c` command in the workspace, in its own process group, with a
//! scrubbed environment, a timeout and capped output.
//!
//! Exit status convention: a non-zero exit code, a signal, a timeout or a cancellation set
//! `is_error`, and the content ends with a line saying which ("exit code 1"). The output is
//! still all there: a failing test run is an error *and* the model needs its log.
//!
//! Lifetime: the command's whole process group is killed (SIGKILL) when the call ends, however
//! it ends (exit, timeout, cancellation, or the future being dropped), so nothing it started in
//! the background outlives the tool call. Bash is not a sandbox: it runs with the daemon's user
//! rights, and only the file tools are confined to the workspace.

use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
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
use crate::context::{ToolContext, ToolLimits, ToolOutput};
use crate::env::child_env;
use crate::error::ToolError;
use crate::input::{optional_positive, required_str};

/// How long to keep reading output after the process group is gone. Only a process that left
/// the group (`setsid`) can hold the pipe open past that; its output is not worth a hang.
const DRAIN_GRACE: Duration = Duration::from_secs(1);

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

async fn execute(command: &str, limit: Duration, ctx: &ToolContext) -> std::io::Result<ToolOutput> {
    let (mut child, mut pipe) = spawn(command, ctx.workspace.root())?;
    let group = GroupGuard::new(&child)?;
    let mut output = HeadTail::new(ctx.limits.output_cap);
    let ending = drive(&mut child, &mut pipe, &mut output, limit, &ctx.cancel).await?;
    // Kill the group before reaping, so a timed-out shell's children die with it; on a normal
    // exit this kills whatever the command left running in the background.
    group.kill();
    if !matches!(ending, Ending::Exited(_)) {
        child.wait().await?;
    }
    drain(&mut pipe, &mut output).await;
    Ok(render(ending, output, limit))
}

/// Starts `bash -c command` in a new process group with stdout and stderr on one pipe, so the
/// model sees them interleaved as a terminal would show them.
fn spawn(command: &str, root: &Path) -> std::io::Result<(Child, pipe::Receiver)> {
    let (reader, writer) = std::io::pipe()?;
    let writer_err = writer.try_clone()?;
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(command)
        .current_dir(root)
        .env_clear()
        .envs(child_env(|name| std::env::var_os(name), root))
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(writer_err)
        .process_group(0)
        .kill_on_drop(true);
    let child = cmd.spawn()?;
    // `cmd` holds our copies of the pipe's write end; until they close, EOF never comes.
    drop(cmd);
    let reader = pipe::Receiver::from_owned_fd(OwnedFd::from(reader))?;
    Ok((child, reader))
}

/// Reads output until the shell exits, the deadline passes or the call is cancelled.
async fn drive(
    child: &mut Child,
    pipe: &mut pipe::Receiver,
    output: &mut HeadTail,
    limit: Duration,
    cancel: &CancellationToken,
) -> std::io::Result<Ending> {
    let deadline = Instant::now() + limit;
    let mut buf = vec![0u8; 16 * 1024];
    let mut open = true;
    loop {
        tokio::select! {
            status = child.wait() => return Ok(Ending::Exited(status?)),
            read = pipe.read(&mut buf), if open => match read {
                Ok(n) if n > 0 => output.push(&buf[..n]),
                _ => open = false,
            },
            () = sleep_until(deadline) => return Ok(Ending::TimedOut),
            () = cancel.cancelled() => return Ok(Ending::Cancelled),
        }
    }
}

/// Reads what is left in the pipe once the group is dead, for at most `DRAIN_GRACE`.
async fn drain(pipe: &mut pipe::Receiver, output: &mut HeadTail) {
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
/// dropped mid-run) leaves no processes behind.
struct GroupGuard {
    group: Pid,
}

impl GroupGuard {
    fn new(child: &Child) -> std::io::Result<GroupGuard> {
        let pid = child
            .id()
            .ok_or_else(|| std::io::Error::other("bash exited before its pid was read"))?;
        let pid = i32::try_from(pid).map_err(std::io::Error::other)?;
        // `process_group(0)` made the shell the leader of a group with its own pid as id.
        Ok(GroupGuard {
            group: Pid::from_raw(pid),
        })
    }

    fn kill(self) {
        drop(self);
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
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
}
