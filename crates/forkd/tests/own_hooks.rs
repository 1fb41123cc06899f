//! A session's own hooks (docs/contracts.md, "Hooks"): `hooks_json` at creation, run after the
//! operator's for that session only, inherited by its children and branches, stored only
//! sealed (back after a restart), and refused when asked to run outside the sandbox.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use forkd_proto::v1 as pb;
use forkd_test_support::{
    TestDaemon, create_session, session_request, spawn_daemon, transcript_text,
};
use hooks_support::{one_child, python};
use serde_json::json;

mod hooks_support;

/// What the validator says when it blocks `grep`.
const BLOCKED: &str = "Use 'rg' (ripgrep) instead of 'grep'";

/// Marks the hook's command, to look for it in the database.
const MARKER: &str = "own-hook-marker-7f3a";

fn validator_settings() -> String {
    let command = format!("{} # {MARKER}", python("bash_command_validator.py"));
    json!({
        "permissions": {"allow": ["Bash"]},
        "hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": command}]}]}
    })
    .to_string()
}

/// Forks one child of `session` that runs `grep`; its transcript's text.
async fn grep_child(daemon: &TestDaemon, session: &str) -> String {
    let mut client = daemon.client().await.unwrap();
    let script = "Look.\n@sim tool Bash {\"command\":\"grep needle notes.txt\"}\n@sim say looked";
    let child = one_child(&mut client, session, script).await;
    transcript_text(&mut client, &child).await.unwrap()
}

fn workspace() -> tempfile::TempDir {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("notes.txt"), "needle\n").unwrap();
    ws
}

fn request(ws: &Path, hooks: Option<String>) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        permission_mode: "bypassPermissions".into(),
        hooks_json: hooks.unwrap_or_default(),
        ..session_request(ws)
    }
}

/// Every file of the daemon's database (with its write-ahead log).
fn database_files(home: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(home)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains(".db"))
        })
        .collect()
}

#[tokio::test]
async fn a_sessions_own_hooks_run_for_it_its_children_and_branches_and_survive_a_restart() {
    let mut daemon = spawn_daemon().await.unwrap();
    let ws = workspace();
    let mut client = daemon.client().await.unwrap();
    let hooked = create_session(&mut client, request(ws.path(), Some(validator_settings())))
        .await
        .unwrap();
    assert_eq!(hooked.hook_events, ["PreToolUse"]);
    let plain = create_session(&mut client, request(ws.path(), None))
        .await
        .unwrap();
    assert!(plain.hook_events.is_empty());

    let text = grep_child(&daemon, &hooked.session_id).await;
    assert!(text.contains(BLOCKED), "the session's hook blocks: {text}");
    let text = grep_child(&daemon, &plain.session_id).await;
    assert!(!text.contains(BLOCKED), "another session has none: {text}");
    assert!(text.contains("needle"), "{text}");

    // A branch inherits them.
    let branch = client
        .branch_session(pb::BranchSessionRequest {
            session_id: hooked.session_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    assert_eq!(branch.hook_events, ["PreToolUse"]);
    let text = grep_child(&daemon, &branch.session_id).await;
    assert!(text.contains(BLOCKED), "the branch's: {text}");

    // Never in the clear in the database: sealed with the daemon's key, opened after a restart.
    daemon.stop().await.unwrap();
    let files = database_files(daemon.home_path());
    assert!(!files.is_empty(), "the database is in the home");
    for file in &files {
        let bytes = std::fs::read(file).unwrap();
        assert!(
            !bytes.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()),
            "{} holds the hook's command in the clear",
            file.display()
        );
    }
    daemon.restart(|_| {}).await.unwrap();
    let text = grep_child(&daemon, &hooked.session_id).await;
    assert!(text.contains(BLOCKED), "after a restart: {text}");
}

#[tokio::test]
async fn a_sessions_own_hooks_are_checked_and_stay_in_the_sandbox() {
    let daemon = spawn_daemon().await.unwrap();
    let ws = workspace();
    let mut client = daemon.client().await.unwrap();
    let refused = |settings: serde_json::Value| {
        let mut client = client.clone();
        let req = request(ws.path(), Some(settings.to_string()));
        async move { client.create_session(req).await.unwrap_err() }
    };
    let outside = json!({"hooks": {"Stop": [{"hooks": [
        {"type": "command", "command": "true", "sandbox": false}
    ]}]}});
    let status = refused(outside).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("outside the sandbox"),
        "{status:?}"
    );
    let unknown = json!({"hooks": {"SessionEnd": []}});
    let status = refused(unknown).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("not a hook event"), "{status:?}");
    let matcher = json!({"hooks": {"PreToolUse": [{"matcher": "(", "hooks": []}]}});
    let status = refused(matcher).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    // A settings file with no hooks block is a session without hooks.
    let none = create_session(
        &mut client,
        request(ws.path(), Some(json!({"model": "x"}).to_string())),
    )
    .await
    .unwrap();
    assert!(none.hook_events.is_empty());
}
