//! Bad input gets a precise status, and the daemon keeps serving after each.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use forkd_proto::v1 as pb;
use forkd_test_support::{directives, session_request, spawn_daemon};
use tonic::Code;

const UNKNOWN: &str = "01a22937-0000-7000-8000-000000000000";

#[tokio::test]
async fn bad_requests_get_precise_codes_and_the_daemon_keeps_serving() {
    let daemon = spawn_daemon().await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = client
        .create_session(session_request(daemon.home_path()))
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    let sid = session.session_id.clone();

    let fork = |session_id: &str, ds: Vec<pb::Directive>| pb::ForkBatchRequest {
        session_id: session_id.to_owned(),
        directives: ds,
        warmup_gating: None,
    };
    let cases: Vec<(&str, Code, Result<(), tonic::Status>)> = vec![
        (
            "unknown session",
            Code::NotFound,
            client
                .get_session(pb::GetSessionRequest {
                    session_id: UNKNOWN.into(),
                })
                .await
                .map(drop),
        ),
        (
            "malformed id",
            Code::InvalidArgument,
            client
                .get_session(pb::GetSessionRequest {
                    session_id: "nope".into(),
                })
                .await
                .map(drop),
        ),
        (
            "fork on unknown session",
            Code::NotFound,
            client
                .fork_batch(fork(UNKNOWN, directives(&["x"])))
                .await
                .map(drop),
        ),
        (
            "empty directive list",
            Code::InvalidArgument,
            client.fork_batch(fork(&sid, vec![])).await.map(drop),
        ),
        (
            "empty directive",
            Code::InvalidArgument,
            client
                .fork_batch(fork(&sid, directives(&["ok", "  "])))
                .await
                .map(drop),
        ),
        (
            "oversized directive",
            Code::InvalidArgument,
            client
                .fork_batch(fork(&sid, directives(&[&"x".repeat(70 * 1024)])))
                .await
                .map(drop),
        ),
        (
            "unknown agent",
            Code::NotFound,
            client
                .get_agent(pb::GetAgentRequest {
                    agent_id: UNKNOWN.into(),
                })
                .await
                .map(drop),
        ),
        (
            "transcript of unknown agent",
            Code::NotFound,
            client
                .get_transcript(pb::GetTranscriptRequest {
                    agent_id: UNKNOWN.into(),
                    include_shared_prefix: true,
                })
                .await
                .map(drop),
        ),
        (
            "stats of unknown batch",
            Code::NotFound,
            client
                .get_cache_stats(pb::GetCacheStatsRequest {
                    scope: Some(pb::get_cache_stats_request::Scope::BatchId(UNKNOWN.into())),
                })
                .await
                .map(drop),
        ),
        (
            "unknown model",
            Code::InvalidArgument,
            client
                .create_session(pb::CreateSessionRequest {
                    model: "gpt-2".into(),
                    ..session_request(daemon.home_path())
                })
                .await
                .map(drop),
        ),
        (
            "missing workspace",
            Code::InvalidArgument,
            client
                .create_session(pb::CreateSessionRequest {
                    workspace: "/no/such/dir".into(),
                    ..session_request(daemon.home_path())
                })
                .await
                .map(drop),
        ),
        (
            "calculator with zero children",
            Code::InvalidArgument,
            client
                .estimate_fork_cost(pb::EstimateForkCostRequest {
                    prefix_tokens: 1000,
                    directive_tokens: 10,
                    children: 0,
                    ..Default::default()
                })
                .await
                .map(drop),
        ),
    ];
    for (what, code, result) in cases {
        let status = result.expect_err(what);
        assert_eq!(status.code(), code, "{what}: {status:?}");
        assert!(!status.message().is_empty(), "{what} has no message");
    }

    // The oversized directive's message names the limit.
    let status = client
        .fork_batch(fork(&sid, directives(&[&"x".repeat(70 * 1024)])))
        .await
        .unwrap_err();
    assert!(
        status.message().contains("limit is 65536"),
        "{}",
        status.message()
    );

    // A coordinator never forks.
    let coordinator = client
        .create_session(pb::CreateSessionRequest {
            coordinator: true,
            ..session_request(daemon.home_path())
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    let status = client
        .fork_batch(fork(&coordinator.session_id, directives(&["x"])))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);

    // Still serving.
    let listed = client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.sessions.len(), 2);
}
