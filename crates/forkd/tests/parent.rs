//! Parent turns: a parent model's reply that calls the Agent tool forks a batch, its children's
//! notifications reach the parent's transcript, and the parent's next turn sees them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_proto::v1::session_event::Event;
use forkd_test_support::{
    create_session, session_request, session_transcript, spawn_daemon, trusted_session_request,
    wait_for_batch,
};

async fn send(
    client: &mut forkd_proto::v1::forkd_client::ForkdClient<tonic::transport::Channel>,
    session_id: &str,
    text: &str,
) -> Vec<Event> {
    let mut stream = client
        .send_message(pb::SendMessageRequest {
            session_id: session_id.to_owned(),
            text: text.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(e) = stream.message().await.unwrap() {
            events.push(e.event.unwrap());
        }
    })
    .await
    .unwrap();
    events
}

#[tokio::test]
async fn a_parent_reply_that_calls_agent_forks_and_hears_back() {
    let daemon = spawn_daemon().await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let sid = session.session_id.clone();
    let script = concat!(
        "Split the audit in two.\n",
        r#"@sim agent {"description":"audit a","prompt":"Audit part a.\n@sim say a is fine"}"#,
        "\n",
        r#"@sim agent {"description":"audit b","prompt":"Audit part b.\n@sim agent {\"description\":\"deeper\",\"prompt\":\"grandchild\"}\n@sim say b is fine"}"#,
        "\n@sim say forked both",
    );
    let events = send(&mut client, &sid, script).await;
    let launched = events
        .iter()
        .find_map(|e| match e {
            Event::ForkLaunched(l) => Some(l.clone()),
            _ => None,
        })
        .expect("the reply forked");
    assert_eq!(launched.agent_ids.len(), 2);
    let calls = events
        .iter()
        .filter(|e| matches!(e, Event::ToolCall(_)))
        .count();
    assert_eq!(calls, 2);
    match events.last() {
        Some(Event::TurnEnded(end)) => assert!(end.text.contains("forked both"), "{end:?}"),
        other => panic!("the turn did not end: {other:?}"),
    }

    let done = wait_for_batch(&mut client, &launched.batch_id, 2, Duration::from_secs(30))
        .await
        .unwrap();
    let result_of = |i: usize| {
        done.iter()
            .find(|n| n.agent_id == launched.agent_ids[i])
            .unwrap()
            .report
            .clone()
            .unwrap()
            .result
    };
    assert_eq!(result_of(0), "a is fine");
    // Child b tried to fork; the guard refused it and b carried on.
    assert_eq!(result_of(1), "b is fine");
    let b_log = client
        .get_transcript(pb::GetTranscriptRequest {
            agent_id: launched.agent_ids[1].clone(),
            include_shared_prefix: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        b_log
            .messages
            .iter()
            .any(|m| m.content_json.contains("cannot fork"))
    );

    // The parent's transcript holds the fork message, async_launched results and both
    // notifications.
    let all: String = session_transcript(&mut client, &sid)
        .await
        .unwrap()
        .iter()
        .map(|m| m.content_json.as_str())
        .collect();
    assert_eq!(all.matches("async_launched").count(), 2, "{all}");
    assert_eq!(all.matches("<task-notification>\\n<agent-id>").count(), 2);

    // The next turn runs on a transcript that includes them.
    let events = send(&mut client, &sid, "What did they find?\n@sim say both fine").await;
    match events.last() {
        Some(Event::TurnEnded(end)) => {
            assert_eq!(
                end.text.lines().find(|l| l.starts_with("Result:")),
                Some("Result: both fine")
            );
            assert!(end.usage.unwrap().cache_read_input_tokens > 0, "{end:?}");
        }
        other => panic!("the turn did not end: {other:?}"),
    }
}

#[tokio::test]
async fn a_coordinator_parent_is_refused_a_fork_and_told_to_delegate() {
    let daemon = spawn_daemon().await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(
        &mut client,
        pb::CreateSessionRequest {
            coordinator: true,
            ..session_request(&daemon.workspace_path())
        },
    )
    .await
    .unwrap();
    let script = r#"Plan it.
@sim agent {"description":"x","prompt":"do x"}"#;
    let events = send(&mut client, &session.session_id, script).await;
    assert!(!events.iter().any(|e| matches!(e, Event::ForkLaunched(_))));
    let refusal = events
        .iter()
        .find_map(|e| match e {
            Event::ToolResult(r) => Some(r.clone()),
            _ => None,
        })
        .unwrap();
    assert!(refusal.is_error);
    assert!(
        refusal.content.contains("coordinator never forks"),
        "{refusal:?}"
    );
}

/// A child's notification that lands while the parent's own tool call runs must not come
/// between the parent's tool_use and its tool_result (the API would refuse every later turn).
#[tokio::test]
async fn notifications_never_split_a_parent_tool_call_from_its_result() {
    let daemon = spawn_daemon().await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = forkd_test_support::create_session(
        &mut client,
        trusted_session_request(&daemon.workspace_path()),
    )
    .await
    .unwrap();
    let script = concat!(
        "Fork, then keep working.\n",
        r#"@sim agent {"description":"quick","prompt":"be quick"}"#,
        "\n",
        r#"@sim tool Bash {"command":"sleep 1"}"#,
        "\n@sim say worked on",
    );
    let events = send(&mut client, &session.session_id, script).await;
    assert!(matches!(events.last(), Some(Event::TurnEnded(_))));
    let log = session_transcript(&mut client, &session.session_id)
        .await
        .unwrap();
    assert!(
        log.iter()
            .any(|m| m.content_json.contains("<task-notification>\\n<agent-id>")),
        "the child's notification arrived during the turn"
    );
    for (i, m) in log.iter().enumerate() {
        let blocks: Vec<serde_json::Value> = serde_json::from_str(&m.content_json).unwrap();
        let uses: Vec<&str> = blocks
            .iter()
            .filter(|b| b["type"] == "tool_use")
            .map(|b| b["id"].as_str().unwrap())
            .collect();
        if m.role != "assistant" || uses.is_empty() {
            continue;
        }
        let next: Vec<serde_json::Value> = serde_json::from_str(&log[i + 1].content_json).unwrap();
        let answered: Vec<&str> = next
            .iter()
            .filter(|b| b["type"] == "tool_result")
            .map(|b| b["tool_use_id"].as_str().unwrap())
            .collect();
        assert_eq!(
            answered, uses,
            "message {i}'s calls are answered right after it"
        );
    }
}

#[tokio::test]
async fn a_model_written_batch_obeys_the_child_cap() {
    let daemon = forkd_test_support::spawn_daemon_with(|c| c.engine.max_children_per_batch = 2)
        .await
        .unwrap();
    let mut client = daemon.client().await.unwrap();
    let session =
        forkd_test_support::create_session(&mut client, session_request(&daemon.workspace_path()))
            .await
            .unwrap();
    let script = concat!(
        "Split in three.\n",
        r#"@sim agent {"description":"a","prompt":"do a"}"#,
        "\n",
        r#"@sim agent {"description":"b","prompt":"do b"}"#,
        "\n",
        r#"@sim agent {"description":"c","prompt":"do c"}"#,
    );
    let events = send(&mut client, &session.session_id, script).await;
    let launched = events
        .iter()
        .find_map(|e| match e {
            Event::ForkLaunched(l) => Some(l.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(launched.agent_ids.len(), 2);
    let refused = events
        .iter()
        .filter_map(|e| match e {
            Event::ToolResult(r) if r.is_error => Some(r.content.clone()),
            _ => None,
        })
        .collect::<Vec<_>>();
    assert_eq!(refused.len(), 1, "{events:?}");
    assert!(refused[0].contains("at most 2 children"), "{refused:?}");
}
