//! Bad input gets a precise status, and the daemon keeps serving after each.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use forkd_proto::v1 as pb;
use forkd_test_support::{
    create_session, directives, fork, session_request, spawn_daemon, trusted_session_request,
};
use tonic::Code;

const UNKNOWN: &str = "01a22937-0000-7000-8000-000000000000";

#[tokio::test]
async fn bad_requests_get_precise_codes_and_the_daemon_keeps_serving() {
    let daemon = spawn_daemon().await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let sid = session.session_id.clone();

    let fork = |session_id: &str, ds: Vec<pb::Directive>| pb::ForkBatchRequest {
        session_id: session_id.to_owned(),
        directives: ds,
        warmup_gating: None,
        ..Default::default()
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
                    ..session_request(&daemon.workspace_path())
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
                    ..session_request(&daemon.workspace_path())
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
    let coordinator = create_session(
        &mut client,
        pb::CreateSessionRequest {
            coordinator: true,
            ..session_request(&daemon.workspace_path())
        },
    )
    .await
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

/// `GetSessionRequest` with its string field as raw bytes, to send what a well-behaved client
/// cannot: a session id that is not UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
struct RawGetSession {
    #[prost(bytes = "vec", tag = "1")]
    session_id: Vec<u8>,
}

#[tokio::test]
async fn a_string_that_is_not_utf8_is_invalid_argument() {
    let daemon = spawn_daemon().await.unwrap();
    let channel = tonic::transport::Endpoint::from_shared(daemon.addr())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let status = grpc
        .unary(
            tonic::Request::new(RawGetSession {
                session_id: vec![0xff, 0xfe, b'x'],
            }),
            tonic::codegen::http::uri::PathAndQuery::from_static("/forkd.v1.Forkd/GetSession"),
            tonic_prost::ProstCodec::<RawGetSession, pb::GetSessionResponse>::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    // Still serving.
    let mut client = daemon.client().await.unwrap();
    client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn following_an_unknown_id_is_not_found_instead_of_a_silent_wait() {
    let daemon = spawn_daemon().await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let requests = [
        pb::SubscribeNotificationsRequest {
            session_id: UNKNOWN.into(),
            follow: true,
            ..Default::default()
        },
        pb::SubscribeNotificationsRequest {
            batch_id: UNKNOWN.into(),
            follow: true,
            ..Default::default()
        },
        pb::SubscribeNotificationsRequest {
            agent_id: UNKNOWN.into(),
            follow: true,
            ..Default::default()
        },
    ];
    for req in requests {
        let status = client.subscribe_notifications(req).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
    }
}

#[tokio::test]
async fn a_killed_agent_stops_at_once_with_its_process_group() {
    let daemon = spawn_daemon().await.unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, trusted_session_request(ws.path()))
        .await
        .unwrap();
    // The child runs a long Bash command that leaves its pid behind.
    let script = r#"Wait.
@sim tool Bash {"command":"echo $$ > pid; sleep 60","timeout":120}
@sim say never"#;
    let batch = fork(&mut client, &session.session_id, &[script], None)
        .await
        .unwrap();
    let pid_file = ws.path().join("pid");
    forkd_test_support::wait_for_path(&pid_file).await;
    // The shell's pid in its sandbox's PID namespace, as this one numbers it.
    let inner: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let pid = forkd_test_support::host_pid(inner, ws.path())
        .unwrap_or_else(|| panic!("no process of pid {inner} in its namespace"))
        .to_string();

    let agent_id = batch.agent_ids[0].clone();
    let killed_at = std::time::Instant::now();
    client
        .kill(pb::KillRequest {
            agent_id: agent_id.clone(),
        })
        .await
        .unwrap();
    let done = forkd_test_support::wait_for_batch(
        &mut client,
        &batch.batch_id,
        1,
        std::time::Duration::from_secs(5),
    )
    .await
    .unwrap();
    // Well before the 60-second command would end (loose: machines here are noisy).
    assert!(killed_at.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(done[0].status, pb::NotificationStatus::Killed as i32);
    // The shell is gone (its group was killed), and a second kill is refused.
    let alive = std::path::Path::new("/proc").join(&pid).join("status");
    let gone = std::fs::read_to_string(&alive)
        .map(|s| s.contains("State:\tZ"))
        .unwrap_or(true);
    assert!(gone, "process {pid} survived the kill");
    let status = client.kill(pb::KillRequest { agent_id }).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
}
