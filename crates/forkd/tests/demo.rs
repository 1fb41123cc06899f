//! `forkd demo --json` keeps its promises: the siblings read the shared prefix from cache, the
//! measured cost matches the calculator's prediction, and a newcomer's first run warns of
//! nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;

#[tokio::test]
async fn the_demo_reads_the_prefix_from_cache_and_matches_the_calculator() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_forkd"))
        .args(["demo", "--json"])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!log.contains("WARN"), "the demo warned: {log}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let children = report["children"].as_array().unwrap();
    assert_eq!(children.len(), 5);
    assert!(children.iter().all(|c| c["status"] == "completed"));
    let prefix = report["shared_prefix_tokens"].as_u64().unwrap();
    assert!((47_000..=50_000).contains(&prefix), "prefix {prefix}");
    assert!(report["min_sibling_prefix_read_share"].as_f64().unwrap() >= 0.99);
    assert!(report["prediction_error"].as_f64().unwrap().abs() < 0.01);
    let measured = report["measured_input_cost_usd"].as_f64().unwrap();
    let independent = report["independent_cost_usd"].as_f64().unwrap();
    assert!(measured < independent / 2.0, "{measured} vs {independent}");
}

/// A log written to a pipe or a file (a journal, a CI log) holds no colour codes.
#[tokio::test]
async fn a_log_that_is_not_a_terminal_has_no_colour() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_forkd"))
        .args(["demo", "--json"])
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("INFO"), "nothing was logged: {log}");
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a piped log: {log:?}"
    );
}
