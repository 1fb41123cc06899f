//! Failed connections, as the real forkctl binary reports them: one clear message that says what
//! to do, never a stack backtrace.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Output;

/// Runs the real forkctl against `addr`, with backtraces requested every way the standard library
/// and anyhow read them, and none of forkctl's own variables inherited.
async fn forkctl(addr: &str, args: &[&str]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_forkctl"));
    command
        .arg("--addr")
        .arg(addr)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .env_remove("FORKD_ADDR")
        .env_remove("FORKD_TOKEN")
        .env_remove("FORKD_CA_CERT")
        .kill_on_drop(true);
    tokio::time::timeout(std::time::Duration::from_secs(60), command.output())
        .await
        .expect("forkctl exited")
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// True when `stderr` looks like a backtrace: its header, or a numbered frame line (`  3: foo`).
fn has_backtrace(stderr: &str) -> bool {
    stderr.to_ascii_lowercase().contains("stack backtrace")
        || stderr.lines().any(|line| {
            line.trim_start()
                .split_once(": ")
                .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
}

#[tokio::test]
async fn a_missing_socket_is_one_message_and_a_hint_without_a_backtrace() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("unix:{}", dir.path().join("forkd.sock").display());
    let out = forkctl(&addr, &["ps"]).await;
    let message = stderr(&out);
    assert_eq!(out.status.code(), Some(5), "{message}");
    assert!(
        message.starts_with(&format!("forkctl: cannot connect to forkd at {addr}")),
        "{message}"
    );
    assert!(
        message.contains("forkctl: hint: is forkd running?"),
        "{message}"
    );
    assert!(!has_backtrace(&message), "{message}");
}
