//! Typed agents: built-in and custom types with their own prompt and tools, spawned by a client
//! or delegated to by a coordinator's turn.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_proto::v1::session_event::Event;
use forkd_store::RequestFilter;
use forkd_test_support::{create_session, session_request, spawn_daemon, transcript_text};
use futures::StreamExt;
use tonic::Code;

async fn ended(
    client: &mut forkd_proto::v1::forkd_client::ForkdClient<tonic::transport::Channel>,
    agent_id: &str,
) -> pb::Notification {
    let mut stream = client
        .subscribe_notifications(pb::SubscribeNotificationsRequest {
            agent_id: agent_id.to_owned(),
            follow: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn typed_agents_have_their_own_prompt_tools_and_model() {
    let daemon = spawn_daemon().await.unwrap();
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("lib.rs"), "fn main() {}\n").unwrap();
    std::fs::create_dir_all(ws.path().join(".forkd/agents")).unwrap();
    std::fs::write(
        ws.path().join(".forkd/agents/reviewer.md"),
        "---\nname: reviewer\ndescription: Reviews code\ntools: Read, Grep\nmodel: claude-haiku-4-5\n---\nYou review code with care.\n",
    )
    .unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(
        &mut client,
        pb::CreateSessionRequest {
            permission_mode: "acceptEdits".into(),
            ..session_request(ws.path())
        },
    )
    .await
    .unwrap();
    let spawn = |ty: &str, prompt: &str| pb::SpawnAgentRequest {
        session_id: session.session_id.clone(),
        subagent_type: ty.to_owned(),
        description: "look".into(),
        prompt: prompt.to_owned(),
        ..Default::default()
    };

    // Explore reads, and is refused a Write it was never offered.
    let explore = client
        .spawn_agent(spawn(
            "Explore",
            "Map it.\n@sim tool Read {\"file_path\":\"lib.rs\"}\n@sim tool Write {\"file_path\":\"x.txt\",\"content\":\"no\"}\n@sim say mapped",
        ))
        .await
        .unwrap()
        .into_inner();
    let note = ended(&mut client, &explore.agent_id).await;
    assert_eq!(note.status, pb::NotificationStatus::Completed as i32);
    assert!(!ws.path().join("x.txt").exists());
    let log = transcript_text(&mut client, &explore.agent_id)
        .await
        .unwrap();
    assert!(log.contains("fn main()"), "{log}");
    assert!(log.contains("not available to this agent"), "{log}");

    // A custom type from the workspace runs on its own model.
    let reviewer = client
        .spawn_agent(spawn("reviewer", "Review lib.rs.\n@sim say looks fine"))
        .await
        .unwrap()
        .into_inner();
    let note = ended(&mut client, &reviewer.agent_id).await;
    assert_eq!(note.report.unwrap().result, "looks fine");
    let requests = daemon
        .daemon()
        .unwrap()
        .engine
        .store()
        .list_requests(&RequestFilter {
            agent_id: Some(reviewer.agent_id.parse().unwrap()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(requests[0].model, "claude-haiku-4-5");

    // An unknown type names the ones there are.
    let status = client.spawn_agent(spawn("Wizard", "x")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("reviewer"),
        "{}",
        status.message()
    );
}

#[tokio::test]
async fn a_coordinator_delegates_to_typed_agents_instead_of_forking() {
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
    let script = concat!(
        "Plan the work.\n",
        r#"@sim agent {"description":"plan","prompt":"Plan it.\n@sim say step 1, step 2","subagent_type":"Plan"}"#,
        "\n@sim say delegated",
    );
    let mut stream = client
        .send_message(pb::SendMessageRequest {
            session_id: session.session_id,
            text: script.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while let Some(e) = stream.message().await.unwrap() {
        events.push(e.event.unwrap());
    }
    assert!(!events.iter().any(|e| matches!(e, Event::ForkLaunched(_))));
    let result = events
        .iter()
        .find_map(|e| match e {
            Event::ToolResult(r) => Some(r.clone()),
            _ => None,
        })
        .unwrap();
    assert!(!result.is_error, "{result:?}");
    assert!(
        result.content.contains("Result: step 1, step 2"),
        "{result:?}"
    );
    assert!(matches!(events.last(), Some(Event::TurnEnded(_))));
}
