//! The Bash tool end to end: output capture and capping, exit codes, the timeout and
//! cancellation killing the whole process group, the scrubbed environment and the working dir.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Env, err, ok};
use nix::sys::signal::kill;
use nix::unistd::Pid;
use serde_json::json;

/// A command that starts two background sleepers and a foreground one, recording all pids
/// (including the shell's own) in `pids`.
const SLEEPERS: &str = "sleep 100 & echo $! > pids; sleep 100 & echo $! >> pids; \
                        echo $$ >> pids; echo started; sleep 100";

/// Whether the process is gone: no such pid, or a zombie waiting for its (new) parent to reap
/// it, which can no longer run.
fn gone(pid: i32) -> bool {
    if kill(Pid::from_raw(pid), None).is_err() {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

fn pids(env: &Env) -> Vec<i32> {
    std::fs::read_to_string(env.root().join("pids"))
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

/// Polls (no fixed sleep) until every recorded process is gone.
async fn assert_all_gone(pids: &[i32]) {
    assert_eq!(pids.len(), 3, "expected three recorded pids, got {pids:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pids.iter().all(|pid| gone(*pid)) {
        assert!(Instant::now() < deadline, "processes survived: {pids:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn stdout_and_stderr_are_captured() {
    let env = Env::new();
    let out = ok(env
        .call(
            "Bash",
            json!({"command": "echo out; echo err >&2; echo again"}),
        )
        .await);
    assert_eq!(out, "out\nerr\nagain\n");
    let out = ok(env.call("Bash", json!({"command": "true"})).await);
    assert_eq!(out, "(no output)");
}

#[tokio::test]
async fn a_non_zero_exit_is_an_error_that_keeps_the_output() {
    let env = Env::new();
    let out = env
        .call("Bash", json!({"command": "echo failing; exit 3"}))
        .await;
    assert_eq!(out.content, "failing\nexit code 3");
    err(out, "exit code 3");
}

#[tokio::test]
async fn long_output_is_capped_keeping_head_and_tail() {
    let mut env = Env::new();
    env.ctx.limits.output_cap = 1000;
    let out = ok(env.call("Bash", json!({"command": "seq 1 100000"})).await);
    assert!(out.starts_with("1\n2\n3\n"), "{out}");
    assert!(out.ends_with("99999\n100000\n"), "{out}");
    assert!(out.contains("bytes omitted …"), "{out}");
    assert!(out.len() < 1100, "{} bytes", out.len());
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let env = Env::new();
    let started = Instant::now();
    let out = env
        .call("Bash", json!({"command": SLEEPERS, "timeout": 1}))
        .await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(out.content.starts_with("started\n"), "{}", out.content);
    err(out, "timed out after 1s; its process group was killed");
    assert_all_gone(&pids(&env)).await;
}

#[tokio::test]
async fn the_context_limit_applies_without_an_input_timeout() {
    let mut env = Env::new();
    env.ctx.limits.bash_timeout = Duration::from_millis(300);
    let out = env.call("Bash", json!({"command": "sleep 100"})).await;
    err(out, "timed out after 300ms");
}

#[tokio::test]
async fn cancellation_kills_the_whole_process_group() {
    let env = Env::new();
    let ctx = env.ctx.clone();
    let task = tokio::spawn(async move {
        forkd_tools::run_tool("Bash", &json!({"command": SLEEPERS}), &ctx).await
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids(&env).len() < 3 {
        assert!(Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    env.ctx.cancel.cancel();
    let out = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
    err(out, "command was cancelled; its process group was killed");
    assert_all_gone(&pids(&env)).await;

    let out = env.call("Bash", json!({"command": "echo never"})).await;
    err(out, "cancelled before it started");
}

#[tokio::test]
async fn background_leftovers_are_killed_when_the_command_exits() {
    let env = Env::new();
    let command =
        "sleep 100 & echo $! > pids; sleep 100 & echo $! >> pids; echo $$ >> pids; echo done";
    let started = Instant::now();
    let out = ok(env.call("Bash", json!({"command": command})).await);
    assert_eq!(out, "done\n");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_all_gone(&pids(&env)).await;
}

#[tokio::test]
async fn the_environment_is_scrubbed() {
    let env = Env::new();
    let out = ok(env.call("Bash", json!({"command": "env"})).await);
    let seen: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    assert!(
        out.contains(&format!("HOME={}\n", env.root().display())),
        "{out}"
    );
    assert!(out.contains("TERM=dumb\n"), "{out}");
    // Every variable of this test process that is not on the allowlist (cargo's own, any
    // token a developer exported…) must be missing. Bash sets a few itself.
    let allowed = [
        "PATH",
        "HOME",
        "LANG",
        "TERM",
        "PAGER",
        "GIT_PAGER",
        "GIT_TERMINAL_PROMPT",
        "CARGO_HOME",
        "RUSTUP_HOME",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
    ];
    let mut checked = 0;
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if !allowed.contains(&name.as_ref()) {
            assert!(
                !seen.contains(&name.as_ref()),
                "{name} leaked into the command"
            );
            checked += 1;
        }
    }
    // cargo runs tests with CARGO_MANIFEST_DIR and friends set, so the check has teeth.
    assert!(checked > 0);
}

#[tokio::test]
async fn it_runs_in_the_workspace() {
    let env = Env::new();
    let out = ok(env
        .call("Bash", json!({"command": "pwd; echo hi > made.txt"}))
        .await);
    assert_eq!(out.trim(), env.root().display().to_string());
    assert_eq!(env.read("made.txt"), "hi\n");
}

#[tokio::test]
async fn input_errors_name_the_field() {
    let env = Env::new();
    err(
        env.call("Bash", json!({})).await,
        "missing required field `command`",
    );
    err(
        env.call("Bash", json!({"command": 1})).await,
        "field `command` must be a string",
    );
    err(
        env.call("Bash", json!({"command": "true", "timeout": "soon"}))
            .await,
        "field `timeout` must be a positive integer",
    );
}
