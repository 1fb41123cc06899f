//! Tenants, idempotency keys and budgets, end to end through the real daemon and gRPC clients.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_server::TokenStore;
use forkd_test_support::{
    Caller, directives, session_request, spawn_daemon, spawn_daemon_with, wait_for_batch,
};
use futures::StreamExt;
use tonic::Code;

const LOOPBACK: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// Asserts that caller `$c`'s call `$method($request)` is refused as `NOT_FOUND`.
macro_rules! not_found {
    ($c:expr, $method:ident, $request:expr) => {
        assert_eq!(
            code($c.client.$method($c.req($request)).await),
            Code::NotFound,
            stringify!($method)
        )
    };
}

fn code<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> Code {
    r.expect_err("the call is refused").code()
}

#[tokio::test]
async fn a_tenant_sees_only_its_own_sessions_agents_and_notifications() {
    let mut secrets = Vec::new();
    let daemon = spawn_daemon_with(|c| {
        c.listen = Some(LOOPBACK);
        let tokens = TokenStore::in_home(&c.home);
        secrets.push(tokens.create("alpha").unwrap());
        secrets.push(tokens.create("beta").unwrap());
    })
    .await
    .unwrap();
    let mut alpha = Caller::new(&daemon, secrets[0].expose()).await.unwrap();
    let mut beta = Caller::new(&daemon, secrets[1].expose()).await.unwrap();

    let session = alpha
        .client
        .create_session(alpha.req(session_request(&daemon.tenant_workspace("alpha"))))
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    let sid = session.session_id.clone();
    let batch = alpha
        .client
        .fork_batch(alpha.req(pb::ForkBatchRequest {
            session_id: sid.clone(),
            directives: directives(&["one", "two"]),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    let mut notes = alpha
        .client
        .subscribe_notifications(alpha.req(pb::SubscribeNotificationsRequest {
            batch_id: batch.batch_id.clone(),
            follow: true,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    for _ in 0..2 {
        notes.next().await.unwrap().unwrap();
    }
    let agent = batch.agent_ids[0].clone();

    // Every call by id from the other tenant is NOT_FOUND, worded as for an id that never was.
    let b = &mut beta;
    let unknown = b
        .client
        .get_session(b.req(pb::GetSessionRequest {
            session_id: uuid_like(),
        }))
        .await
        .unwrap_err();
    let theirs = b
        .client
        .get_session(b.req(pb::GetSessionRequest {
            session_id: sid.clone(),
        }))
        .await
        .unwrap_err();
    assert_eq!(theirs.code(), Code::NotFound);
    assert_eq!(
        theirs.message().replace(&sid, "ID"),
        unknown.message().replace(&uuid_like(), "ID")
    );
    let agent_req = || pb::GetAgentRequest {
        agent_id: agent.clone(),
    };
    not_found!(b, get_agent, agent_req());
    not_found!(
        b,
        get_transcript,
        pb::GetTranscriptRequest {
            agent_id: agent.clone(),
            ..Default::default()
        }
    );
    not_found!(
        b,
        attach,
        pb::AttachRequest {
            agent_id: agent.clone(),
            ..Default::default()
        }
    );
    not_found!(
        b,
        kill,
        pb::KillRequest {
            agent_id: agent.clone()
        }
    );
    not_found!(
        b,
        background,
        pb::BackgroundRequest {
            agent_id: agent.clone()
        }
    );
    not_found!(
        b,
        fork_batch,
        pb::ForkBatchRequest {
            session_id: sid.clone(),
            directives: directives(&["steal"]),
            ..Default::default()
        }
    );
    not_found!(
        b,
        send_message,
        pb::SendMessageRequest {
            session_id: sid.clone(),
            text: "hi".into(),
            ..Default::default()
        }
    );
    not_found!(
        b,
        spawn_agent,
        pb::SpawnAgentRequest {
            session_id: sid.clone(),
            subagent_type: "Explore".into(),
            description: "x".into(),
            prompt: "look".into(),
            ..Default::default()
        }
    );
    not_found!(
        b,
        get_cache_stats,
        pb::GetCacheStatsRequest {
            scope: Some(pb::get_cache_stats_request::Scope::BatchId(
                batch.batch_id.clone()
            )),
        }
    );
    not_found!(
        b,
        subscribe_notifications,
        pb::SubscribeNotificationsRequest {
            session_id: sid.clone(),
            ..Default::default()
        }
    );
    not_found!(
        b,
        subscribe_permissions,
        pb::SubscribePermissionsRequest {
            session_id: sid.clone(),
        }
    );

    // Lists and unfiltered streams hold nothing of alpha's.
    let sessions = b
        .client
        .list_sessions(b.req(pb::ListSessionsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert!(sessions.sessions.is_empty());
    let agents = b
        .client
        .list_agents(b.req(pb::ListAgentsRequest {
            include_ended: true,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(agents.agents.is_empty());
    let replay: Vec<_> = b
        .client
        .subscribe_notifications(b.req(pb::SubscribeNotificationsRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    assert!(replay.is_empty(), "{replay:?}");
    // Nor does the Unix socket's local tenant see them.
    let mut local = daemon.client().await.unwrap();
    let listed = local
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.sessions.is_empty());

    // Alpha sees its own.
    let own = alpha
        .client
        .list_agents(alpha.req(pb::ListAgentsRequest {
            include_ended: true,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(own.agents.len(), 2);
    let replay: Vec<_> = alpha
        .client
        .subscribe_notifications(alpha.req(pb::SubscribeNotificationsRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    assert_eq!(replay.len(), 2);
}

fn uuid_like() -> String {
    "0190f2a4-0000-7000-8000-000000000000".into()
}

#[tokio::test]
async fn idempotency_keys_return_the_first_result_and_refuse_other_parameters() {
    let mut daemon = spawn_daemon().await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let keyed = |key: &str| pb::CreateSessionRequest {
        idempotency_key: key.into(),
        ..session_request(&daemon.workspace_path())
    };
    let first = client
        .create_session(keyed("s-1"))
        .await
        .unwrap()
        .into_inner();
    let again = client
        .create_session(keyed("s-1"))
        .await
        .unwrap()
        .into_inner();
    let sid = first.session.unwrap().session_id;
    assert_eq!(sid, again.session.unwrap().session_id);
    let other = client
        .create_session(pb::CreateSessionRequest {
            system_prompt: "Something else.".into(),
            ..keyed("s-1")
        })
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::FailedPrecondition);
    assert!(other.message().contains("s-1"), "{other:?}");

    // Two submissions racing with one key make one batch.
    let fork = |key: &str| pb::ForkBatchRequest {
        session_id: sid.clone(),
        directives: directives(&["@sim sleep 300ms\none", "two", "three"]),
        idempotency_key: key.into(),
        ..Default::default()
    };
    let mut second_client = daemon.client().await.unwrap();
    let (a, b) = tokio::join!(
        client.fork_batch(fork("b-1")),
        second_client.fork_batch(fork("b-1"))
    );
    let (a, b) = (a.unwrap().into_inner(), b.unwrap().into_inner());
    assert_eq!(a.batch_id, b.batch_id);
    assert_eq!(a.agent_ids, b.agent_ids);
    wait_for_batch(&mut client, &a.batch_id, 3, Duration::from_secs(60))
        .await
        .unwrap();
    let agents = client
        .list_agents(pb::ListAgentsRequest {
            session_id: sid.clone(),
            include_ended: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(agents.agents.len(), 3, "one batch, not two");
    // A key names one call: reusing a session's key for a batch is refused.
    let reused = client.fork_batch(fork("s-1")).await.unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition);

    // After a restart the key still answers with the first batch.
    daemon.restart(|_| {}).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let after = client.fork_batch(fork("b-1")).await.unwrap().into_inner();
    assert_eq!(after.batch_id, a.batch_id);
    let changed = client
        .fork_batch(pb::ForkBatchRequest {
            directives: directives(&["other"]),
            ..fork("b-1")
        })
        .await
        .unwrap_err();
    assert_eq!(changed.code(), Code::FailedPrecondition);
}

#[tokio::test]
async fn a_child_over_its_batch_budget_fails_saying_so() {
    let daemon = spawn_daemon().await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = client
        .create_session(session_request(&daemon.workspace_path()))
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    let batch = client
        .fork_batch(pb::ForkBatchRequest {
            session_id: session.session_id,
            // Two requests: the second would start after the batch spent its one token.
            directives: directives(&["@sim tool Glob {\"pattern\":\"*\"}\n@sim say listed"]),
            budget_tokens: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let notes = wait_for_batch(&mut client, &batch.batch_id, 1, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        notes[0].status(),
        pb::NotificationStatus::Failed,
        "{notes:?}"
    );
    let agent = client
        .get_agent(pb::GetAgentRequest {
            agent_id: batch.agent_ids[0].clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert!(
        agent.error.contains("token budget") && agent.error.contains(&batch.batch_id),
        "{}",
        agent.error
    );
}
