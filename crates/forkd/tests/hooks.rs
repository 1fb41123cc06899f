//! Hooks around tool calls (docs/contracts.md, "Hooks"): the operator's `hooks.json` in Claude
//! Code's format, its PreToolUse and PostToolUse hooks run unchanged in the session's sandbox
//! view — a Bash validator that exits 2, a formatter after writes, JSON decisions (deny with a
//! reason, allow past the rules, `updatedInput`), and hostile hooks (one that hangs, one that
//! reads the daemon's home).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_test_support::{
    TestDaemon, create_session, session_request, spawn_daemon_with, transcript_text,
};
use hooks_support::{fixture, hook_runs, on as command, one_child};
use serde_json::json;

mod hooks_support;

/// A daemon with `hooks` as its operator's `hooks.json`.
async fn daemon_with_hooks(hooks: serde_json::Value) -> TestDaemon {
    spawn_daemon_with(|c| {
        std::fs::write(c.home.join("hooks.json"), hooks.to_string()).unwrap();
    })
    .await
    .unwrap()
}

/// Runs one child with `script` on a session of `mode`; its transcript's text.
async fn child(daemon: &TestDaemon, ws: &Path, mode: &str, script: &str) -> String {
    let mut client = daemon.client().await.unwrap();
    let session = create_session(
        &mut client,
        pb::CreateSessionRequest {
            permission_mode: mode.into(),
            ..session_request(ws)
        },
    )
    .await
    .unwrap();
    let child = one_child(&mut client, &session.session_id, script).await;
    transcript_text(&mut client, &child).await.unwrap()
}

#[tokio::test]
async fn a_bash_validator_that_exits_2_blocks_the_call_and_the_model_reads_why() {
    let validator = format!("python3 {}", fixture("bash_command_validator.py").display());
    let daemon =
        daemon_with_hooks(json!({ "hooks": command("PreToolUse", "Bash", &validator) })).await;
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("notes.txt"), "needle\n").unwrap();
    let text = child(
        &daemon,
        ws.path(),
        "bypassPermissions",
        "Look.\n@sim tool Bash {\"command\":\"grep needle notes.txt\"}\n\
         @sim tool Bash {\"command\":\"rg -c needle notes.txt || cat notes.txt\"}\n@sim say looked",
    )
    .await;
    assert!(
        text.contains("Use 'rg' (ripgrep) instead of 'grep'"),
        "the validator's reason reaches the model: {text}"
    );
    // The second command breaks no rule: it ran.
    assert_eq!(text.matches("Use 'rg' (ripgrep)").count(), 1, "{text}");
    assert_eq!(text.matches("\"is_error\":true").count(), 1, "{text}");
}

#[tokio::test]
async fn json_decisions_deny_allow_past_the_rules_and_change_the_input() {
    let decide = |decision: serde_json::Value| format!("cat >/dev/null; echo '{}'", decision);
    let deny = decide(json!({"hookSpecificOutput": {
        "hookEventName": "PreToolUse",
        "permissionDecision": "deny",
        "permissionDecisionReason": "writes to secrets/ are not allowed"
    }}));
    let allow = decide(json!({"hookSpecificOutput": {
        "hookEventName": "PreToolUse",
        "permissionDecision": "allow",
        "permissionDecisionReason": "echo is harmless",
        "updatedInput": {"command": "echo changed by the hook"}
    }}));
    let hooks = json!({ "hooks": { "PreToolUse": [
        { "matcher": "Write", "hooks": [{ "type": "command", "command": deny }] },
        { "matcher": "Bash", "hooks": [{ "type": "command", "command": allow }] }
    ]}});
    let daemon = daemon_with_hooks(hooks).await;
    let ws = tempfile::tempdir().unwrap();
    // `dontAsk` refuses Bash; the hook's allow runs it, with the input it gave.
    let text = child(
        &daemon,
        ws.path(),
        "dontAsk",
        "Go.\n@sim tool Write {\"file_path\":\"secrets/key\",\"content\":\"x\"}\n\
         @sim tool Bash {\"command\":\"echo as the model wrote it\"}\n@sim say done",
    )
    .await;
    assert!(
        text.contains("writes to secrets/ are not allowed"),
        "{text}"
    );
    assert!(!ws.path().join("secrets/key").exists());
    assert!(text.contains("changed by the hook"), "{text}");
    // The model's own message is as it wrote it; what ran is what the hook gave.
    assert!(text.contains("echo as the model wrote it"), "{text}");
    assert!(!text.contains("Permission denied: Bash"), "{text}");
}

#[tokio::test]
async fn a_formatter_runs_after_each_write_and_tells_the_model() {
    let formatter = format!("python3 {}", fixture("format_after_write.py").display());
    let daemon = daemon_with_hooks(json!({
        "hooks": command("PostToolUse", "Write|Edit", &formatter)
    }))
    .await;
    let ws = tempfile::tempdir().unwrap();
    let text = child(
        &daemon,
        ws.path(),
        "bypassPermissions",
        "Write.\n@sim tool Write {\"file_path\":\"a.txt\",\"content\":\"one   \\ntwo  \"}\n@sim say wrote",
    )
    .await;
    assert!(text.contains("formatted a.txt"), "{text}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("a.txt")).unwrap(),
        "one\ntwo"
    );
}

#[tokio::test]
async fn a_hook_that_hangs_is_cut_off_and_one_that_reads_the_home_sees_nothing() {
    let daemon = spawn_daemon_with(|c| {
        let home = c.home.display().to_string();
        let hooks = json!({ "hooks": { "PreToolUse": [{ "matcher": "Bash", "hooks": [
            { "type": "command", "command": "sleep 600", "timeout": 1 },
            { "type": "command", "command": format!("echo \"saw: $(ls -A {home} 2>&1)\" >&2; exit 2") }
        ]}]}});
        std::fs::write(c.home.join("hooks.json"), hooks.to_string()).unwrap();
    })
    .await
    .unwrap();
    let ws = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let text = child(
        &daemon,
        ws.path(),
        "bypassPermissions",
        "Run.\n@sim tool Bash {\"command\":\"echo ran\"}\n@sim say done",
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the hang was cut off"
    );
    // The second hook blocked with what it saw of the home: nothing (it is hidden).
    assert!(text.contains("a hook denied it: saw:"), "{text}");
    assert!(
        !text.contains("forkd.db") && !text.contains("hooks.json"),
        "{text}"
    );
}

/// A hook's `allow` skips the question, never a deny rule; a hook's deny holds for an `Agent`
/// call too (no typed agent starts).
#[tokio::test]
async fn a_hooks_allow_never_beats_a_deny_rule_and_its_deny_stops_agent_calls() {
    let allow = "cat >/dev/null; echo '{\"hookSpecificOutput\": {\"hookEventName\": \"PreToolUse\", \"permissionDecision\": \"allow\"}}'";
    let deny = "cat >/dev/null; echo 'no agents here' >&2; exit 2";
    let hooks = json!({ "hooks": { "PreToolUse": [
        { "matcher": "Bash", "hooks": [{ "type": "command", "command": allow }] },
        { "matcher": "Agent", "hooks": [{ "type": "command", "command": deny }] }
    ]}});
    let daemon = daemon_with_hooks(hooks).await;
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(
        &mut client,
        pb::CreateSessionRequest {
            permission_mode: "dontAsk".into(),
            deny_rules: vec!["Bash(rm:*)".into()],
            ..session_request(ws.path())
        },
    )
    .await
    .unwrap();
    let script = "Go.\n@sim tool Bash {\"command\":\"rm -f nothing\"}\n\
                  @sim tool Bash {\"command\":\"echo allowed by the hook\"}\n\
                  @sim tool Agent {\"description\":\"look\",\"prompt\":\"Look.\",\"subagent_type\":\"Explore\"}\n\
                  @sim say done";
    let child = one_child(&mut client, &session.session_id, script).await;
    let text = transcript_text(&mut client, &child).await.unwrap();
    assert!(
        text.contains("denied by the permission rule `Bash(rm:*)`"),
        "{text}"
    );
    assert!(text.contains("allowed by the hook\\n"), "{text}");
    assert!(text.contains("a hook denied it: no agents here"), "{text}");
}

/// A SubagentStop hook that blocks once: the child goes on with the hook's reason as its next
/// message, and ends when the hook, told `stop_hook_active`, lets it.
#[tokio::test]
async fn a_subagent_stop_hook_that_blocks_once_keeps_the_child_going_once() {
    let once = "input=$(cat); case \"$input\" in *'\"stop_hook_active\":true'*) exit 0;; esac; \
                echo 'run the tests first' >&2; exit 2";
    let daemon = daemon_with_hooks(json!({ "hooks": { "SubagentStop": [
        { "hooks": [{ "type": "command", "command": once }] }
    ]}}))
    .await;
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(ws.path()))
        .await
        .unwrap();
    let child = one_child(
        &mut client,
        &session.session_id,
        "Answer.\n@sim say first answer",
    )
    .await;
    let agent = forkd_test_support::get_agent(&mut client, &child).await;
    assert_eq!(agent.state, pb::AgentState::Completed as i32);
    let text = transcript_text(&mut client, &child).await.unwrap();
    assert_eq!(
        text.matches("A hook kept you from ending here:\\nrun the tests first")
            .count(),
        1,
        "{text}"
    );
    // Two final replies: the one the hook stopped, and the one after its note.
    assert_eq!(text.matches("Scope: Answer.").count(), 2, "{text}");
    let note = text.find("A hook kept you from ending here").unwrap();
    assert!(
        text[note..].contains("Scope: "),
        "a reply follows the note: {text}"
    );
}

/// An operator's hook is the operator's: one that does not answer denies the call (its policy
/// fails closed), one outside the sandbox gets no `transcript_path` (it would follow a link a
/// session's command left), and the session sees its decision, not its command nor its errors.
#[tokio::test]
async fn an_operators_hook_fails_closed_and_keeps_its_words() {
    let guard = "cat > \"$FORKD_WORKSPACE/seen.json\"; echo 'operator-secret-path' >&2; exit 1";
    let daemon = daemon_with_hooks(json!({ "hooks": { "PreToolUse": [{ "matcher": "Bash",
        "hooks": [{ "type": "command", "command": guard, "sandbox": false }] }] }}))
    .await;
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(
        &mut client,
        pb::CreateSessionRequest {
            permission_mode: "bypassPermissions".into(),
            ..session_request(ws.path())
        },
    )
    .await
    .unwrap();
    let script = "Go.\n@sim tool Bash {\"command\":\"echo ran > ran.txt\"}\n@sim say done";
    let child = one_child(&mut client, &session.session_id, script).await;
    assert!(!ws.path().join("ran.txt").exists(), "the call was denied");
    let text = transcript_text(&mut client, &child).await.unwrap();
    assert!(
        text.contains("the operator's hook #1 did not answer"),
        "{text}"
    );
    let seen: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ws.path().join("seen.json")).unwrap())
            .unwrap();
    assert_eq!(seen["transcript_path"], serde_json::Value::Null);
    let runs = hook_runs(&mut client, &child).await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(
        (runs[0].program.as_str(), runs[0].decision.as_str()),
        ("(operator)", "deny")
    );
    assert!(
        !format!("{runs:?}").contains("operator-secret-path"),
        "{runs:?}"
    );
}
