//! Hook commands (Claude Code's hooks, docs/contracts.md "Hooks"): `bash -c COMMAND` started as
//! a session's Bash command is — in its sandbox view (unless the operator's hook says otherwise),
//! its own process group behind the sentinel, killed whole when it ends or times out — with the
//! event's JSON on stdin, variables of its own, stdout and stderr read apart and each capped, and
//! its exit code as it is.

use std::time::Duration;

use forkd_core::hooks::HookRun;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::time::{Instant, sleep_until};

use crate::bash::{GroupGuard, Io, Spawned, Started, drain, start};
use crate::cap::HeadTail;
use crate::context::ToolContext;
use crate::process;

/// One hook command to run.
#[derive(Debug, Clone)]
pub struct HookCall {
    pub command: String,
    /// The event's JSON, its stdin.
    pub input: Vec<u8>,
    /// `CLAUDE_PROJECT_DIR`, `FORKD_WORKSPACE` and the like.
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
    /// In the context's sandbox (`false`: an operator's hook run outside it).
    pub sandboxed: bool,
}

/// Runs a hook command in `ctx`'s workspace; never fails: a command that could not start or
/// did not end is a [`HookRun`] saying so.
pub async fn run(call: HookCall, ctx: &ToolContext) -> HookRun {
    let failed = |why: String| HookRun {
        exit: None,
        stdout: String::new(),
        stderr: String::new(),
        stdout_cut: false,
        failure: Some(why),
        started: false,
    };
    let started = {
        let command = call.command;
        let root = ctx.workspace.root().to_path_buf();
        let spec = if call.sandboxed {
            ctx.sandbox.clone()
        } else {
            None
        };
        // Outside the sandbox there is no view to mount a layer in: the command works where the
        // daemon reaches the workspace.
        let layer = if call.sandboxed {
            ctx.workspace.layer().cloned()
        } else {
            None
        };
        let io = Io {
            input: true,
            env: call.env,
            split: true,
        };
        tokio::task::spawn_blocking(move || {
            start(&command, &root, spec.as_ref(), layer.as_ref(), io)
        })
        .await
    };
    let spawned = match started {
        Ok(Ok(Started::Spawned(spawned))) => *spawned,
        Ok(Ok(Started::Refused(why))) => return failed(format!("could not run the hook: {why}")),
        Ok(Err(e)) => return failed(format!("could not run the hook: {e}")),
        Err(e) => return failed(format!("could not run the hook: {e}")),
    };
    match drive(spawned, call.input, call.timeout, ctx).await {
        Ok(run) => run,
        Err(e) => failed(format!("the hook's process failed: {e}")),
    }
}

async fn drive(
    spawned: Spawned,
    input: Vec<u8>,
    limit: Duration,
    ctx: &ToolContext,
) -> std::io::Result<HookRun> {
    let Spawned {
        child,
        output: mut out_pipe,
        errors,
        lifeline,
        cgroup,
        input: input_pipe,
    } = spawned;
    let mut err_pipe = errors.ok_or_else(|| std::io::Error::other("no stderr pipe"))?;
    // The input is written while the outputs are read (a hook may answer before it reads all
    // of it, or never read it: the write then ends with the pipe).
    if let Some(mut sender) = input_pipe {
        tokio::spawn(async move {
            let _ = tokio::io::AsyncWriteExt::write_all(&mut sender, &input).await;
        });
    }
    let mut leader = process::Leader::new(child);
    let group = GroupGuard::new(leader.id(), lifeline)?;
    let (mut stdout, mut stderr) = (
        HeadTail::new(ctx.limits.output_cap),
        HeadTail::new(ctx.limits.output_cap),
    );
    let deadline = Instant::now() + limit;
    let (mut out_open, mut err_open) = (true, true);
    let (mut buf_out, mut buf_err) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    let mut timed_out = false;
    loop {
        tokio::select! {
            done = leader.exited() => { done?; break; }
            read = read(&mut out_pipe, &mut buf_out), if out_open => match read {
                Some(n) => stdout.push(&buf_out[..n]),
                None => out_open = false,
            },
            read = read(&mut err_pipe, &mut buf_err), if err_open => match read {
                Some(n) => stderr.push(&buf_err[..n]),
                None => err_open = false,
            },
            () = sleep_until(deadline) => { timed_out = true; break; }
            () = ctx.cancel.cancelled() => { timed_out = true; break; }
        }
    }
    // The group goes (its background processes with it), then what is left in the pipes is read.
    group.kill();
    let status = leader.reap().await?;
    drain(&mut out_pipe, &mut stdout).await;
    drain(&mut err_pipe, &mut stderr).await;
    drop(cgroup);
    let text = |h: HeadTail| {
        if h.is_empty() {
            String::new()
        } else {
            h.finish()
        }
    };
    Ok(HookRun {
        exit: if timed_out { None } else { status.code() },
        stdout_cut: stdout.omitted() > 0,
        stdout: text(stdout),
        stderr: text(stderr),
        failure: timed_out.then(|| format!("the hook did not end within {limit:?}; it was killed")),
        started: true,
    })
}

/// Bytes read, or `None` at the end (or an error, which ends the stream too).
async fn read(pipe: &mut pipe::Receiver, buf: &mut [u8]) -> Option<usize> {
    match pipe.read(buf).await {
        Ok(n) if n > 0 => Some(n),
        _ => None,
    }
}
