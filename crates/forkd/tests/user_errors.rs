//! A user's error is one clear message with its causes, never a stack backtrace, whatever
//! `RUST_BACKTRACE` says: the real `forkd` binary, refusing to start.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Output;
use std::time::Duration;

/// Runs the real `forkd` on `home` with backtraces requested every way the standard library and
/// anyhow read them; the settings' variables are cleared so only the arguments count.
async fn forkd_with_backtraces(home: &std::path::Path, args: &[&str]) -> Output {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_forkd"))
        .args(args)
        .arg("--home")
        .arg(home)
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .env_remove("FORKD_HOME")
        .env_remove("FORKD_LISTEN")
        .env_remove("FORKD_PROVIDER")
        .env_remove("RUST_LOG")
        .env("FORKD_SIM_SPEED", "0")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .unwrap_or_else(|_| panic!("forkd {args:?} did not exit"))
        .unwrap()
}

/// True when `stderr` looks like a backtrace: its header, or a numbered frame line (`  3: foo`).
fn has_backtrace(stderr: &str) -> bool {
    stderr.to_ascii_lowercase().contains("stack backtrace")
        || stderr.lines().any(|line| {
            let line = line.trim_start();
            line.split_once(": ")
                .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
}

#[tokio::test]
async fn a_refused_start_says_why_without_a_backtrace() {
    let home = tempfile::tempdir().unwrap();
    let out = forkd_with_backtraces(home.path(), &["serve", "--listen", "0.0.0.0:0"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("error: refusing to listen on 0.0.0.0:0 without bearer tokens"),
        "{stderr}"
    );
    assert!(!has_backtrace(&stderr), "{stderr}");
}

#[tokio::test]
async fn causes_are_listed_one_per_line_without_a_backtrace() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("config.toml"), "sim_sped = 0\n").unwrap();
    let out = forkd_with_backtraces(home.path(), &["serve"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("error: invalid "), "{stderr}");
    assert!(
        stderr.contains("\n  caused by: ") && stderr.contains("unknown field `sim_sped`"),
        "{stderr}"
    );
    assert!(!has_backtrace(&stderr), "{stderr}");
}

#[test]
fn the_backtrace_detector_recognises_frames() {
    let backtrace = "Stack backtrace:\n   0: anyhow::error::<impl anyhow::Error>::msg\n";
    assert!(has_backtrace(backtrace));
    assert!(has_backtrace("   12: forkd::main\n"));
    assert!(!has_backtrace(
        "forkd: error: refusing to listen on 0.0.0.0:0 without bearer tokens"
    ));
}
