//! Hooks across a crash (docs/contracts.md, "Hooks"): the real `forkd serve` binary is killed
//! with SIGKILL while a hook runs and started again. A PreToolUse hook cut off runs again (its
//! call had not been decided) and the call runs once; a PostToolUse hook cut off is not run
//! twice, and its call, which ran, is answered as interrupted rather than run again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use binary::{Daemon, client};
use forkd_proto::v1 as pb;
use forkd_test_support::{
    create_session, eventually, fork, transcript_text, trusted_session_request, wait_for_batch,
};
use serde_json::json;

mod binary;

/// A hook that logs its run in the workspace's `LOG`, then hangs until the test says the daemon
/// was restarted (a `restarted` file in the workspace).
fn hanging(log: &str) -> String {
    format!(
        "cat >/dev/null; echo run >> \"$CLAUDE_PROJECT_DIR/{log}\"; \
         while [ ! -e \"$CLAUDE_PROJECT_DIR/restarted\" ]; do sleep 0.1; done"
    )
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// Runs one child of a session whose own `event` hook on Bash hangs until the daemon, killed
/// while it hangs, is back; the child's transcript, the hook's runs and the command's.
async fn crash_during(event: &str) -> (String, usize, usize) {
    let home = tempfile::Builder::new()
        .prefix("forkd-hooks-crash-")
        .tempdir()
        .unwrap();
    let files = tempfile::tempdir().unwrap();
    let ws = files.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let daemon = Daemon::start(home.path(), "0");
    let mut c = client(home.path()).await;
    let hooks = json!({"hooks": {event: [{"matcher": "Bash", "hooks": [
        {"type": "command", "command": hanging("hook.log")}
    ]}]}});
    let session = create_session(
        &mut c,
        pb::CreateSessionRequest {
            hooks_json: hooks.to_string(),
            ..trusted_session_request(&ws)
        },
    )
    .await
    .unwrap();
    let script = "Run it.\n@sim tool Bash {\"command\":\"echo ran >> ran.txt\"}\n@sim say done";
    let batch = fork(&mut c, &session.session_id, &[script], None)
        .await
        .unwrap();
    let log = ws.join("hook.log");
    eventually(Duration::from_secs(30), "the hook to start", || {
        let log = log.clone();
        async move { (lines(&log) == 1).then_some(()) }
    })
    .await;
    daemon.kill9();
    std::fs::write(ws.join("restarted"), "").unwrap();
    let _daemon = Daemon::start(home.path(), "0");
    let mut c = client(home.path()).await;
    wait_for_batch(&mut c, &batch.batch_id, 1, Duration::from_secs(60))
        .await
        .unwrap();
    let text = transcript_text(&mut c, &batch.agent_ids[0]).await.unwrap();
    (text, lines(&log), lines(&ws.join("ran.txt")))
}

#[tokio::test]
async fn a_pre_tool_use_hook_cut_off_by_a_crash_runs_again_and_its_call_runs_once() {
    let (text, hook_runs, command_runs) = crash_during("PreToolUse").await;
    assert_eq!(hook_runs, 2, "the undecided call's hook ran again");
    assert_eq!(command_runs, 1, "the call ran once: {text}");
    assert!(!text.contains("Interrupted"), "{text}");
}

#[tokio::test]
async fn a_post_tool_use_hook_cut_off_by_a_crash_is_not_run_twice() {
    let (text, hook_runs, command_runs) = crash_during("PostToolUse").await;
    assert_eq!(hook_runs, 1, "the hook ran once");
    assert_eq!(command_runs, 1, "the call ran once");
    assert!(
        text.contains("Interrupted: this call was started but its result was never recorded"),
        "{text}"
    );
}
