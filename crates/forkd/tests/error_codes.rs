//! The status a client gets says whose fault it is and whether a retry can help: every row of
//! the error table that a client can provoke, through the real daemon. (The rows a client cannot
//! provoke — a store failure, a broken invariant — are unit tests of the mapping in
//! `forkd-server`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use forkd_core::tenant::Budget;
use forkd_proto::v1 as pb;
use forkd_proto::v1::forkd_client::ForkdClient;
use forkd_test_support::{
    create_session, run_turn, session_request, session_transcript, spawn_daemon, spawn_daemon_with,
    turn_text,
};
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt as _;

fn send(session_id: &str, text: &str, key: &str) -> pb::SendMessageRequest {
    pb::SendMessageRequest {
        session_id: session_id.to_owned(),
        text: text.to_owned(),
        idempotency_key: key.to_owned(),
    }
}

/// Runs a turn to its end: the final reply's text, or the status the turn ended with (whether
/// the call itself was refused or the stream ended with an error).
async fn turn(
    client: &mut ForkdClient<Channel>,
    request: pb::SendMessageRequest,
) -> Result<String, tonic::Status> {
    let events = run_turn(client, request).await?;
    Ok(turn_text(&events)
        .expect("the turn ended without TurnEnded")
        .to_owned())
}

async fn user_messages(client: &mut ForkdClient<Channel>, session_id: &str) -> usize {
    session_transcript(client, session_id)
        .await
        .unwrap()
        .iter()
        .filter(|m| m.role == "user" && m.content_json.contains("Say hello"))
        .count()
}

/// Each provider failure that outlasts the limiter's patience (or that asking again cannot
/// mend), as a parent turn sees it.
#[tokio::test]
async fn provider_failures_reach_clients_by_what_they_mean() {
    let daemon = spawn_daemon_with(|config| {
        config.engine.admission.patience = Duration::from_millis(500);
    })
    .await
    .unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let sid = session.session_id;
    // (script, code, RetryInfo's delay)
    let cases = [
        ("@sim fail 529 x100", Code::Unavailable, None),
        ("@sim fail 500 x100", Code::Unavailable, None),
        ("@sim fail 503 x100", Code::Unavailable, None),
        (
            "@sim fail 429 x100",
            Code::ResourceExhausted,
            Some(Duration::from_secs(1)),
        ),
        ("@sim fail 401 x100", Code::FailedPrecondition, None),
        ("@sim fail 403 x100", Code::FailedPrecondition, None),
        ("@sim fail 400 x100", Code::Internal, None),
    ];
    for (script, code, retry) in cases {
        let status = turn(&mut client, send(&sid, script, ""))
            .await
            .expect_err(script);
        assert_eq!(status.code(), code, "{script}: {status:?}");
        let delay = status.get_details_retry_info().and_then(|r| r.retry_delay);
        assert_eq!(delay, retry, "{script}");
        assert!(
            status.message().contains("provider"),
            "{script}: {}",
            status.message()
        );
    }
    // The daemon keeps serving.
    turn(&mut client, send(&sid, "@sim say fine", ""))
        .await
        .unwrap();
}

/// The state and the budgets, as a client meets them.
#[tokio::test]
async fn state_and_budget_refusals_say_so() {
    let daemon = spawn_daemon_with(|config| {
        config.engine.tenant_budgets.insert(
            "local".into(),
            Budget {
                usd: None,
                tokens: Some(1),
            },
        );
    })
    .await
    .unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let sid = session.session_id;

    // A turn is running: the second message is refused, not queued. The call returns its stream
    // once the turn holds the session, so the second call finds it held.
    let mut first = client
        .send_message(send(&sid, "@sim sleep 2s\n@sim say slow", ""))
        .await
        .unwrap()
        .into_inner();
    let busy = turn(&mut client, send(&sid, "second", ""))
        .await
        .unwrap_err();
    assert_eq!(busy.code(), Code::FailedPrecondition, "{busy:?}");
    assert!(
        busy.message().contains("already running a turn"),
        "{busy:?}"
    );
    while first.message().await.unwrap().is_some() {}

    // The tenant's token budget is spent by that first turn: the next is refused, saying which
    // budget, and without RetryInfo (waiting does not refill it).
    let spent = turn(&mut client, send(&sid, "@sim say again", ""))
        .await
        .unwrap_err();
    assert_eq!(spent.code(), Code::ResourceExhausted, "{spent:?}");
    assert!(spent.message().contains("tenant local"), "{spent:?}");
    assert!(spent.get_details_retry_info().is_none());
}

/// A client that retries `SendMessage` after `UNAVAILABLE` with the same key never stores its
/// message twice: the retry continues the turn, and a retry after the turn ended answers with
/// its reply.
#[tokio::test]
async fn a_message_sent_again_with_its_key_is_stored_once() {
    let daemon = spawn_daemon().await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let sid = session.session_id;
    // Three 500s: what the limiter tries of a plain server error before giving up.
    let text = "Say hello.\n@sim fail 500 x3\n@sim say hello";

    let failed = turn(&mut client, send(&sid, text, "k-1"))
        .await
        .unwrap_err();
    assert_eq!(failed.code(), Code::Unavailable, "{failed:?}");
    assert_eq!(user_messages(&mut client, &sid).await, 1);

    let reply = turn(&mut client, send(&sid, text, "k-1")).await.unwrap();
    assert!(reply.contains("hello"), "{reply}");
    assert_eq!(user_messages(&mut client, &sid).await, 1);

    // The turn has ended: the same key answers with its reply and runs nothing.
    let again = turn(&mut client, send(&sid, text, "k-1")).await.unwrap();
    assert_eq!(again, reply);
    assert_eq!(user_messages(&mut client, &sid).await, 1);

    // The same key with another message is refused.
    let reused = turn(&mut client, send(&sid, "Say hello twice.", "k-1"))
        .await
        .unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition, "{reused:?}");
    assert_eq!(user_messages(&mut client, &sid).await, 1);
}
