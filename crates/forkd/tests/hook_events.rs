//! Hooks on a parent turn and `continue: false` (docs/contracts.md, "Hooks"): UserPromptSubmit
//! adds context to the message being submitted or blocks it (nothing stored, the client told
//! why; run once per idempotency key), Stop keeps a turn going once with its reason, and a
//! hook's `continue: false` stops a child and a turn after the call's result is stored.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_test_support::{
    create_session, fork, get_agent, run_turn, session_request, session_transcript, spawn_daemon,
    transcript_text, turn_text, wait_for_batch,
};
use serde_json::json;

use hooks_support::{Client, hook_runs, on, one_child, python};

mod hooks_support;

/// A session request whose own hooks are `hooks` (a `hooks` block).
fn hooked(ws: &Path, hooks: serde_json::Value) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        permission_mode: "bypassPermissions".into(),
        hooks_json: json!({ "hooks": hooks }).to_string(),
        ..session_request(ws)
    }
}

/// A daemon, a workspace, a client and a session whose own hooks are `hooks`.
struct Hooked {
    /// Kept while the test runs: the daemon stops when it is dropped.
    _daemon: forkd_test_support::TestDaemon,
    ws: tempfile::TempDir,
    client: Client,
    session: String,
}

async fn start(hooks: serde_json::Value) -> Hooked {
    let daemon = spawn_daemon().await.unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, hooked(ws.path(), hooks))
        .await
        .unwrap()
        .session_id;
    Hooked {
        _daemon: daemon,
        ws,
        client,
        session,
    }
}

/// The session takes its next message and ends its turn: its transcript is whole.
async fn takes_next_message(client: &mut Client, session: &str) {
    let events = run_turn(client, message(session, "Again.\n@sim say again", ""))
        .await
        .unwrap();
    assert!(
        turn_text(&events).unwrap().contains("Result: again"),
        "{events:?}"
    );
}

fn message(session: &str, text: &str, key: &str) -> pb::SendMessageRequest {
    pb::SendMessageRequest {
        session_id: session.into(),
        text: text.into(),
        idempotency_key: key.into(),
    }
}

/// The text of a session's transcript, every message's content.
async fn session_text(client: &mut Client, session: &str) -> String {
    session_transcript(client, session)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.content_json)
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn user_prompt_submit_adds_context_or_blocks_the_message_once_per_key() {
    let hooks = on("UserPromptSubmit", "", &python("prompt_context.py"));
    let Hooked {
        ws,
        mut client,
        session,
        _daemon,
    } = start(hooks).await;
    let id = &session;

    let events = run_turn(&mut client, message(id, "Say hi.\n@sim say hi", "k1"))
        .await
        .unwrap();
    assert!(
        turn_text(&events).unwrap().contains("Result: hi"),
        "{events:?}"
    );
    let text = session_text(&mut client, id).await;
    assert!(
        text.contains(
            "<user-prompt-submit-hook>\\nProject context from a hook: the prompt has 5 words."
        ),
        "the context is in the user message submitted: {text}"
    );
    // A retry under the key stores nothing and runs no hook again.
    let events = run_turn(&mut client, message(id, "Say hi.\n@sim say hi", "k1"))
        .await
        .unwrap();
    assert!(
        turn_text(&events).unwrap().contains("Result: hi"),
        "{events:?}"
    );
    let log = std::fs::read_to_string(ws.path().join("prompt-hook.log")).unwrap();
    assert_eq!(log, "UserPromptSubmit\n", "one run for the key");

    // A blocked message is refused, with the hook's reason, and not stored.
    let before = session_transcript(&mut client, id).await.unwrap().len();
    let refused = run_turn(&mut client, message(id, "My password is hunter2", ""))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("Security policy violation"),
        "{refused:?}"
    );
    let after = session_transcript(&mut client, id).await.unwrap();
    assert_eq!(after.len(), before, "nothing stored");
    // The session takes its next message.
    takes_next_message(&mut client, id).await;
}

#[tokio::test]
async fn a_stop_hook_keeps_a_turn_going_once_with_its_reason() {
    let Hooked {
        ws,
        mut client,
        session,
        _daemon,
    } = start(on("Stop", "", &python("stop_until_checked.py"))).await;
    let id = &session;
    let events = run_turn(&mut client, message(id, "Finish.\n@sim say first", ""))
        .await
        .unwrap();
    assert!(turn_text(&events).is_some(), "{events:?}");
    let log = std::fs::read_to_string(ws.path().join("stop-hook.log")).unwrap();
    assert_eq!(log, "Stop False\nStop True\n");
    // Each Stop read the session's transcript ending on the reply it was about (as Claude
    // Code's Stop hooks read the last assistant message); the second had the note and the next
    // reply too.
    let seen = std::fs::read_to_string(ws.path().join("stop-transcript.log")).unwrap();
    let counts: Vec<(usize, String)> = seen
        .lines()
        .map(|l| {
            let (n, role) = l.split_once(' ').unwrap();
            (n.parse().unwrap(), role.to_owned())
        })
        .collect();
    assert_eq!(counts.len(), 2, "{seen}");
    assert_eq!(
        counts[1].0,
        counts[0].0 + 2,
        "appended: the reply and the note: {seen}"
    );
    assert_eq!(counts[0].1, "assistant", "{seen}");
    assert_eq!(counts[1].1, "assistant", "{seen}");
    let text = session_text(&mut client, id).await;
    assert!(text.contains("Run the checks before you stop."), "{text}");
    assert!(text.contains("first"), "the first reply is kept: {text}");
}

#[tokio::test]
async fn continue_false_stops_a_child_and_a_turn_after_the_calls_result() {
    let stop = format!(
        "cat >/dev/null; echo '{}'",
        json!({"continue": false, "stopReason": "the hook has seen enough"})
    );
    let Hooked {
        ws,
        mut client,
        session,
        _daemon,
    } = start(on("PostToolUse", "Bash", &stop)).await;
    let id = &session;
    let script = "Go.\n@sim tool Bash {\"command\":\"echo one >> ran.txt\"}\n\
                  @sim tool Bash {\"command\":\"echo two >> ran.txt\"}\n@sim say done";
    let agent = one_child(&mut client, id, script).await;
    let child = get_agent(&mut client, &agent).await;
    assert_eq!(child.state, pb::AgentState::Failed as i32, "{child:?}");
    assert!(
        child.error.contains("the hook has seen enough"),
        "{child:?}"
    );
    let ran = std::fs::read_to_string(ws.path().join("ran.txt")).unwrap();
    assert_eq!(ran, "one\n", "the call after the stop did not run");
    let text = transcript_text(&mut client, &agent).await.unwrap();
    assert!(!text.contains("\"done\""), "{text}");
    // What the hook decided is kept with the agent (forkctl logs, the web view).
    let runs = hook_runs(&mut client, &agent).await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    let run = &runs[0];
    assert_eq!(
        (
            run.event.as_str(),
            run.tool_name.as_str(),
            run.program.as_str()
        ),
        ("PostToolUse", "Bash", "cat")
    );
    assert_eq!((run.decision.as_str(), run.exit_code), ("stop", Some(0)));
    assert_eq!(run.output, "the hook has seen enough");
    assert!(run.tool_use_id.starts_with("toolu_"), "{run:?}");

    // A parent turn ends with the reason, its call's result stored.
    let refused = run_turn(&mut client, message(id, script, ""))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Cancelled, "{refused:?}");
    assert!(
        refused.message().contains("the hook has seen enough"),
        "{refused:?}"
    );
    let ran = std::fs::read_to_string(ws.path().join("ran.txt")).unwrap();
    assert_eq!(ran, "one\none\n");
    // The session takes its next message: its transcript is whole.
    takes_next_message(&mut client, id).await;
}

#[tokio::test]
async fn session_start_runs_once_and_its_context_is_in_the_first_message() {
    let started = "echo started >> \"$CLAUDE_PROJECT_DIR/start.log\"; \
                 echo 'Loaded the team conventions.'";
    let Hooked {
        ws,
        mut client,
        session,
        _daemon,
    } = start(on("SessionStart", "", started)).await;
    let id = &session;
    // Never per child or branch.
    let agent = one_child(&mut client, id, "Look.\n@sim say ok").await;
    client
        .branch_session(pb::BranchSessionRequest {
            session_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let child = transcript_text(&mut client, &agent).await.unwrap();
    assert_eq!(
        child.matches("Loaded the team conventions.").count(),
        1,
        "{child}"
    );
    let log = std::fs::read_to_string(ws.path().join("start.log")).unwrap();
    assert_eq!(log, "started\n");
}

#[tokio::test]
async fn a_hooks_ask_reaches_the_subscribed_client_and_notification_hooks_hear_it() {
    let daemon = spawn_daemon().await.unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();
    let ask = format!(
        "cat >/dev/null; echo '{}'",
        json!({"hookSpecificOutput": {"hookEventName": "PreToolUse",
            "permissionDecision": "ask", "permissionDecisionReason": "a person checks commands"}})
    );
    let mut hooks = on("PreToolUse", "Bash", &ask);
    hooks["Notification"] = on(
        "Notification",
        "",
        "cat > \"$CLAUDE_PROJECT_DIR/notified.json\"",
    )["Notification"]
        .clone();
    let session = create_session(
        &mut client,
        pb::CreateSessionRequest {
            interactive: true,
            ..hooked(ws.path(), hooks)
        },
    )
    .await
    .unwrap();
    let mut prompts = client
        .subscribe_permissions(pb::SubscribePermissionsRequest {
            session_id: session.session_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let script = "Run.\n@sim tool Bash {\"command\":\"echo yes > asked.txt\"}\n@sim say done";
    let batch = fork(&mut client, &session.session_id, &[script], None)
        .await
        .unwrap();
    // bypassPermissions would run it without asking: the hook's ask reaches the client.
    let prompt = tokio::time::timeout(Duration::from_secs(30), prompts.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(prompt.tool_name, "Bash");
    assert!(
        prompt.question.contains("a person checks commands"),
        "{prompt:?}"
    );
    forkd_test_support::wait_for_path(&ws.path().join("notified.json")).await;
    client
        .answer_permission(pb::AnswerPermissionRequest {
            prompt_id: prompt.prompt_id,
            decision: pb::PermissionDecision::AllowOnce as i32,
            reason: String::new(),
        })
        .await
        .unwrap();
    wait_for_batch(&mut client, &batch.batch_id, 1, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(ws.path().join("asked.txt").exists());
    let heard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ws.path().join("notified.json")).unwrap())
            .unwrap();
    assert_eq!(heard["hook_event_name"], "Notification");
    assert_eq!(heard["agent_id"], batch.agent_ids[0].as_str());
    assert!(
        heard["message"]
            .as_str()
            .unwrap()
            .contains("permission to use Bash"),
        "{heard}"
    );
}

#[tokio::test]
async fn a_parents_agent_call_is_gated_by_pre_tool_use_hooks() {
    let deny = "echo 'no forks today' >&2; exit 2";
    let Hooked {
        ws: _ws,
        mut client,
        session,
        _daemon,
    } = start(on("PreToolUse", "Agent", deny)).await;
    let id = &session;
    let script = "Fork.\n@sim agent {\"prompt\":\"Look around.\",\"description\":\"look\"}\n\
                  @sim say done";
    let events = run_turn(&mut client, message(id, script, ""))
        .await
        .unwrap();
    let refused = events.iter().any(|e| {
        matches!(e, pb::session_event::Event::ToolResult(r)
            if r.is_error && r.content.contains("no forks today"))
    });
    assert!(refused, "{events:?}");
    let agents = client
        .list_agents(pb::ListAgentsRequest {
            session_id: id.clone(),
            include_ended: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .agents;
    assert!(
        agents.iter().all(|a| a.kind == "parent"),
        "nothing forked: {agents:?}"
    );
}

#[tokio::test]
async fn pre_compact_hooks_hear_a_manual_compaction_by_its_trigger() {
    let hooks = json!({ "PreCompact": [
        { "matcher": "manual", "hooks": [{ "type": "command",
            "command": "cat > \"$CLAUDE_PROJECT_DIR/manual.json\"" }] },
        { "matcher": "auto", "hooks": [{ "type": "command",
            "command": "touch \"$CLAUDE_PROJECT_DIR/auto\"" }] }
    ]});
    let Hooked {
        ws,
        mut client,
        session,
        _daemon,
    } = start(hooks).await;
    let id = &session;
    run_turn(&mut client, message(id, "Hello.\n@sim say hello", ""))
        .await
        .unwrap();
    client
        .compact_session(pb::CompactSessionRequest {
            session_id: id.clone(),
            instructions: "keep the names".into(),
        })
        .await
        .unwrap();
    let heard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ws.path().join("manual.json")).unwrap())
            .unwrap();
    assert_eq!(heard["hook_event_name"], "PreCompact");
    assert_eq!(heard["trigger"], "manual");
    assert_eq!(heard["custom_instructions"], "keep the names");
    assert!(
        !ws.path().join("auto").exists(),
        "the auto matcher did not run"
    );
}

#[tokio::test]
async fn transcript_path_is_claude_codes_jsonl_appended_per_event() {
    let daemon = spawn_daemon().await.unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();
    // Each run copies the transcript it was given into the workspace, numbered.
    let copy = "python3 -c 'import glob, json, os, shutil, sys; e = json.load(sys.stdin); \
                d = os.environ[\"CLAUDE_PROJECT_DIR\"]; \
                shutil.copy(e[\"transcript_path\"], \"%s/copy-%d.jsonl\" % (d, len(glob.glob(d + \"/copy-*\"))))'";
    let session = create_session(
        &mut client,
        hooked(ws.path(), on("PostToolUse", "Bash", copy)),
    )
    .await
    .unwrap();
    // Two turns (a thought between the calls), so the second call's hook sees more stored.
    let script = "Twice.\n@sim tool Bash {\"command\":\"echo first-call\"}\n@sim think then\n\
                  @sim tool Bash {\"command\":\"echo second-call\"}\n@sim say done";
    let agent = one_child(&mut client, &session.session_id, script).await;
    let read = |n: usize| -> Vec<serde_json::Value> {
        std::fs::read_to_string(ws.path().join(format!("copy-{n}.jsonl")))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let (first, second) = (read(0), read(1));
    // The directive, then the model's first call (its result not stored yet).
    assert_eq!(first[0]["type"], "user");
    assert!(
        first[0]["message"]["content"]
            .to_string()
            .contains("Twice.")
    );
    assert_eq!(first.last().unwrap()["type"], "assistant");
    assert_eq!(first[0]["agentId"], agent.as_str());
    assert_eq!(first[0]["isSidechain"], true);
    // Appended to, never rewritten: the second holds the first, then the call's result and the
    // next call.
    assert_eq!(second[..first.len()], first[..]);
    assert!(second.len() > first.len());
    let added = serde_json::Value::Array(second[first.len()..].to_vec()).to_string();
    assert!(
        added.contains("first-call") && added.contains("tool_result"),
        "{added}"
    );
    assert_eq!(second[1]["parentUuid"], second[0]["uuid"]);
}
