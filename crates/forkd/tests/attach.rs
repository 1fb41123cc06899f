//! Attach and the background handoff: a client follows an agent live; a background request (or
//! the auto-background delay) ends the client's stream with async_launched at once, and the
//! agent completes under the same id with one continuous transcript.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use forkd_proto::v1 as pb;
use forkd_proto::v1::agent_event::Event;
use forkd_test_support::{
    create_session, eventually, fork, session_request, spawn_daemon_with, wait_for_batch,
};

const SLOW: &str = "Take your time.\n@sim tool Read {\"file_path\":\"notes.md\"}\n@sim sleep 3s\n@sim say took my time";

async fn slow_child(
    auto_background: Option<Duration>,
) -> (
    forkd_test_support::TestDaemon,
    forkd_proto::v1::forkd_client::ForkdClient<tonic::transport::Channel>,
    pb::ForkBatchResponse,
) {
    let daemon = spawn_daemon_with(|c| c.engine.auto_background = auto_background)
        .await
        .unwrap();
    std::fs::write(daemon.workspace_path().join("notes.md"), "notes\n").unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let batch = fork(&mut client, &session.session_id, &[SLOW], None)
        .await
        .unwrap();
    (daemon, client, batch)
}

async fn attach(
    client: &mut forkd_proto::v1::forkd_client::ForkdClient<tonic::transport::Channel>,
    agent_id: &str,
) -> tonic::Streaming<pb::AgentEvent> {
    client
        .attach(pb::AttachRequest {
            agent_id: agent_id.to_owned(),
            since_seq: 0,
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn bg_from_another_client_hands_the_attached_one_to_the_background() {
    let (daemon, mut client, batch) = slow_child(None).await;
    let agent = batch.agent_ids[0].clone();
    let mut stream = attach(&mut client, &agent).await;
    // The Read call and its result arrive live (the slow reply is still streaming after them).
    let mut seqs = Vec::new();
    while seqs.len() < 2 {
        match stream.message().await.unwrap().unwrap().event.unwrap() {
            Event::Message(m) => seqs.push(m.seq),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seqs, vec![0, 1]);

    let mut other = daemon.client().await.unwrap();
    let asked = Instant::now();
    let reply = other
        .background(pb::BackgroundRequest {
            agent_id: agent.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status, "async_launched");
    match stream.message().await.unwrap().unwrap().event.unwrap() {
        Event::AsyncLaunched(a) => assert_eq!(a.agent_id, agent),
        other => panic!("expected async_launched, got {other:?}"),
    }
    assert!(
        asked.elapsed() < Duration::from_millis(500),
        "{:?}",
        asked.elapsed()
    );
    assert!(stream.message().await.unwrap().is_none(), "the stream ends");

    // The agent completes under the same id; re-attaching replays one continuous transcript.
    let done = wait_for_batch(&mut client, &batch.batch_id, 1, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(done[0].report.clone().unwrap().result, "took my time");
    let mut again = attach(&mut client, &agent).await;
    let mut events = Vec::new();
    while let Some(e) = again.message().await.unwrap() {
        events.push(e.event.unwrap());
    }
    let seqs: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            Event::Message(m) => Some(m.seq),
            _ => None,
        })
        .collect();
    assert_eq!(seqs, vec![0, 1, 2]);
    assert!(matches!(events.last(), Some(Event::Ended(_))));
}

#[tokio::test]
async fn an_attached_client_is_handed_to_the_background_after_the_delay() {
    let (_daemon, mut client, batch) = slow_child(Some(Duration::from_secs(1))).await;
    let started = Instant::now();
    let mut stream = attach(&mut client, &batch.agent_ids[0]).await;
    let launched = loop {
        match stream.message().await.unwrap().unwrap().event.unwrap() {
            Event::AsyncLaunched(a) => break a,
            Event::Message(_) | Event::Interrupted(_) | Event::Resumed(_) => {}
            Event::Ended(n) => panic!("ended before the delay: {n:?}"),
        }
    };
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(900), "{waited:?}");
    assert_eq!(launched.agent_id, batch.agent_ids[0]);
    let done = wait_for_batch(&mut client, &batch.batch_id, 1, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(done[0].status, pb::NotificationStatus::Completed as i32);
}

#[tokio::test]
async fn a_parent_turn_is_handed_to_the_background_and_goes_on() {
    let daemon = spawn_daemon_with(|c| c.engine.auto_background = Some(Duration::from_secs(1)))
        .await
        .unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let started = Instant::now();
    let mut stream = client
        .send_message(pb::SendMessageRequest {
            session_id: session.session_id.clone(),
            text: "Think slowly.\n@sim sleep 3s\n@sim say thought it through".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut last = None;
    while let Some(e) = stream.message().await.unwrap() {
        last = e.event;
    }
    match last {
        Some(pb::session_event::Event::AsyncLaunched(a)) => assert!(!a.agent_id.is_empty()),
        other => panic!("expected async_launched, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(900));
    // The turn goes on: its reply lands in the session's transcript.
    eventually(
        Duration::from_secs(20),
        "the turn's reply to be stored",
        || {
            let mut client = client.clone();
            let session_id = session.session_id.clone();
            async move {
                let count = client
                    .get_session(pb::GetSessionRequest { session_id })
                    .await
                    .unwrap()
                    .into_inner()
                    .session
                    .unwrap()
                    .message_count;
                count == 3
            }
        },
    )
    .await;
}
