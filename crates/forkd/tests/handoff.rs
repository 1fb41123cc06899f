//! The handoff across a crash: `forkd serve` is killed with SIGKILL while a parent turn waits on
//! a typed agent. The next daemon answers the turn's stored reply (no second typed agent), goes
//! on at once with `async_launched` for that call, and the typed agent's report reaches the
//! parent's transcript later, exactly once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use binary::{Client, Daemon, client};
use forkd_proto::v1 as pb;
use forkd_test_support::{create_session, eventually, session_transcript, trusted_session_request};

mod binary;

async fn typed_agents(c: &mut Client, session: &str) -> Vec<pb::Agent> {
    c.list_agents(pb::ListAgentsRequest {
        session_id: session.to_owned(),
        include_ended: true,
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .agents
    .into_iter()
    .filter(|a| a.kind == "typed")
    .collect()
}

/// The parent's transcript as one text per message.
async fn texts(c: &mut Client, session: &str) -> Vec<String> {
    session_transcript(c, session)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.content_json)
        .collect()
}

fn count(texts: &[String], needle: &str) -> usize {
    texts.iter().filter(|t| t.contains(needle)).count()
}

#[tokio::test]
async fn a_sigkill_while_the_parent_waits_on_a_typed_agent_hands_the_wait_to_the_background() {
    let home = tempfile::Builder::new()
        .prefix("forkd-handoff-")
        .tempdir()
        .unwrap();
    // Beside the home, never in it: the home is never a workspace.
    let files = tempfile::tempdir().unwrap();
    let ws = files.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let daemon = Daemon::start(home.path(), "1");
    let mut c = client(home.path()).await;
    let session = create_session(&mut c, trusted_session_request(&ws))
        .await
        .unwrap()
        .session_id;
    let script = concat!(
        "Plan it.\n",
        r#"@sim agent {"description":"plan","prompt":"Plan slowly.\n@sim sleep 6s\n@sim say the plan: step 1, step 2","subagent_type":"Plan"}"#,
        "\n@sim say delegated",
    );
    let turn = c
        .send_message(pb::SendMessageRequest {
            session_id: session.clone(),
            text: script.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let typed = eventually(Duration::from_secs(30), "the typed agent to run", || {
        let mut c = c.clone();
        let session = session.clone();
        async move {
            typed_agents(&mut c, &session)
                .await
                .into_iter()
                .find(|a| a.state == pb::AgentState::Running as i32)
        }
    })
    .await;
    daemon.kill9();
    drop(turn);

    let _daemon = Daemon::start(home.path(), "1");
    let mut c = client(home.path()).await;
    let launched = format!("async_launched: agent {}", typed.agent_id);
    eventually(
        Duration::from_secs(30),
        "the resumed turn's next reply",
        || {
            let mut c = c.clone();
            let (session, launched) = (session.clone(), launched.clone());
            async move {
                let texts = texts(&mut c, &session).await;
                count(&texts, &launched) == 1 && count(&texts, "delegated") >= 2
            }
        },
    )
    .await;
    let all = typed_agents(&mut c, &session).await;
    assert_eq!(all.len(), 1, "no second typed agent: {all:?}");

    let texts = eventually(Duration::from_secs(30), "the typed agent's report", || {
        let mut c = c.clone();
        let session = session.clone();
        async move {
            let texts = texts(&mut c, &session).await;
            // What only a notification holds (the async_launched result names the tag too).
            (count(&texts, "<agent-id>") == 1).then_some(texts)
        }
    })
    .await;
    assert_eq!(count(&texts, "the plan: step 1, step 2"), 3, "{texts:#?}");
}
