//! End-to-end: a real daemon on a temp home, driven through the real gRPC client.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_store::RequestFilter;
use forkd_test_support::{create_session, fork, session_request, spawn_daemon, wait_for_batch};

const DEADLINE: Duration = Duration::from_secs(30);

fn usage(n: &pb::Notification) -> pb::Usage {
    n.usage.unwrap()
}

#[tokio::test]
async fn five_children_complete_share_the_prefix_and_replay() {
    let daemon = spawn_daemon().await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let prompts = ["audit a", "audit b", "audit c", "audit d", "audit e"];
    let batch = fork(&mut client, &session.session_id, &prompts, None)
        .await
        .unwrap();
    assert_eq!(batch.agent_ids.len(), 5);

    let live = wait_for_batch(&mut client, &batch.batch_id, 5, DEADLINE)
        .await
        .unwrap();
    for n in &live {
        assert_eq!(n.status, pb::NotificationStatus::Completed as i32, "{n:?}");
        let report = n.report.as_ref().unwrap();
        assert!(report.result.starts_with("Done: audit"), "{report:?}");
        assert!(!report.scope.is_empty());
    }

    // A replay from seq 0 without following returns exactly those notifications.
    let mut replay = client
        .subscribe_notifications(pb::SubscribeNotificationsRequest {
            session_id: session.session_id.clone(),
            follow: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut replayed = Vec::new();
    while let Some(n) = replay.message().await.unwrap() {
        replayed.push(n);
    }
    let mut live_sorted = live.clone();
    live_sorted.sort_by_key(|n| n.seq);
    assert_eq!(replayed, live_sorted);
    assert!(replayed.windows(2).all(|w| w[0].seq < w[1].seq));

    // Stats agree with the notifications, and the siblings read the whole shared prefix.
    let stats = client
        .get_cache_stats(pb::GetCacheStatsRequest {
            scope: Some(pb::get_cache_stats_request::Scope::BatchId(
                batch.batch_id.clone(),
            )),
        })
        .await
        .unwrap()
        .into_inner();
    let su = stats.usage.unwrap();
    let sum = |f: fn(&pb::Usage) -> u64| live.iter().map(|n| f(&usage(n))).sum::<u64>();
    assert_eq!(su.input_tokens, sum(|u| u.input_tokens));
    assert_eq!(
        su.cache_creation_input_tokens,
        sum(|u| u.cache_creation_input_tokens)
    );
    assert_eq!(
        su.cache_read_input_tokens,
        sum(|u| u.cache_read_input_tokens)
    );
    assert_eq!(su.output_tokens, sum(|u| u.output_tokens));
    let cost: f64 = live.iter().map(|n| n.cost_usd).sum();
    assert!((stats.cost_usd - cost).abs() < 1e-9);
    assert_eq!(stats.children, 5);
    assert!(stats.shared_prefix_tokens > 1024);
    let first = batch.agent_ids[0].clone();
    for n in &live {
        let u = usage(n);
        if n.agent_id == first {
            assert_eq!(
                u.cache_read_input_tokens, 0,
                "the first child writes the prefix"
            );
        } else {
            assert_eq!(
                u.cache_read_input_tokens, stats.shared_prefix_tokens,
                "{n:?}"
            );
        }
    }
    assert!(stats.saving > 0.5, "saving {}", stats.saving);

    // Every sibling's request carried byte-identical bytes up to its directive.
    let engine = &daemon.daemon().unwrap().engine;
    let requests = engine
        .store()
        .list_requests(&RequestFilter {
            batch_id: Some(batch.batch_id.parse().unwrap()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(requests.len(), 5);
    assert!(
        requests
            .iter()
            .all(|r| r.prefix_fingerprint == requests[0].prefix_fingerprint)
    );

    // The parent's transcript: first message, the batch's launch note, and one digest of the
    // five children's results (a client's batch invents no fork message for its children).
    let session = client
        .get_session(pb::GetSessionRequest {
            session_id: session.session_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    assert_eq!(session.message_count, 3);
}

#[tokio::test]
async fn the_socket_is_private_and_health_and_reflection_answer() {
    let daemon = spawn_daemon().await.unwrap();
    let mode = std::fs::metadata(daemon.socket_path())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(
        forkd_test_support::serving_status(&daemon.addr())
            .await
            .unwrap(),
        forkd_test_support::ServingStatus::Serving
    );
}

#[tokio::test]
async fn a_child_that_tries_to_fork_is_refused_and_carries_on() {
    let daemon = spawn_daemon().await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let script = "Split this further.\n@sim agent {\"description\":\"x\",\"prompt\":\"grandchild\"}\n@sim say did it myself";
    let batch = fork(&mut client, &session.session_id, &[script], None)
        .await
        .unwrap();
    let done = wait_for_batch(&mut client, &batch.batch_id, 1, DEADLINE)
        .await
        .unwrap();
    assert_eq!(done[0].status, pb::NotificationStatus::Completed as i32);
    assert_eq!(done[0].report.as_ref().unwrap().result, "did it myself");
    let transcript = client
        .get_transcript(pb::GetTranscriptRequest {
            agent_id: batch.agent_ids[0].clone(),
            include_shared_prefix: false,
        })
        .await
        .unwrap()
        .into_inner();
    let refusal = transcript
        .messages
        .iter()
        .find(|m| m.role == "user" && m.content_json.contains("cannot fork"))
        .expect("the refusal is in the transcript");
    assert!(refusal.content_json.contains(r#""is_error":true"#));
    // No grandchild was created.
    let agents = client
        .list_agents(pb::ListAgentsRequest {
            include_ended: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .agents;
    assert_eq!(agents.len(), 1);
}

#[tokio::test]
async fn provider_failures_retry_or_fail_the_child_clearly() {
    let daemon = spawn_daemon().await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let batch = fork(
        &mut client,
        &session.session_id,
        &["@sim fail 529 x2\n@sim say recovered", "@sim fail 400"],
        Some(false),
    )
    .await
    .unwrap();
    let done = wait_for_batch(&mut client, &batch.batch_id, 2, DEADLINE)
        .await
        .unwrap();
    let by_agent = |id: &str| done.iter().find(|n| n.agent_id == id).unwrap();
    let ok = by_agent(&batch.agent_ids[0]);
    assert_eq!(ok.status, pb::NotificationStatus::Completed as i32);
    assert_eq!(ok.report.as_ref().unwrap().result, "recovered");
    let failed = by_agent(&batch.agent_ids[1]);
    assert_eq!(failed.status, pb::NotificationStatus::Failed as i32);
    assert!(failed.summary.contains("400"), "{failed:?}");
    let agent = client
        .get_agent(pb::GetAgentRequest {
            agent_id: batch.agent_ids[1].clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert_eq!(agent.state, pb::AgentState::Failed as i32);
    assert!(agent.error.contains("400"));
}

/// Forks three children on a sim with realistic latency, with or without warm-up gating, and
/// returns the cache-read tokens of each child in directive order.
async fn cache_reads(gating: bool) -> Vec<u64> {
    let daemon = forkd_test_support::spawn_daemon_with(|c| c.sim_speed = 1.0)
        .await
        .unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let batch = fork(
        &mut client,
        &session.session_id,
        &["one", "two", "three"],
        Some(gating),
    )
    .await
    .unwrap();
    let done = wait_for_batch(&mut client, &batch.batch_id, 3, DEADLINE)
        .await
        .unwrap();
    batch
        .agent_ids
        .iter()
        .map(|id| usage(done.iter().find(|n| &n.agent_id == id).unwrap()).cache_read_input_tokens)
        .collect()
}

#[tokio::test]
async fn warmup_gating_lets_siblings_read_what_the_first_child_wrote() {
    let gated = cache_reads(true).await;
    assert_eq!(gated[0], 0);
    assert!(gated[1] > 1024 && gated[1] == gated[2], "{gated:?}");

    // Sent in the same instant, every child misses: nothing is readable before a response starts.
    let ungated = cache_reads(false).await;
    assert_eq!(ungated, vec![0, 0, 0]);
}

/// After a batch of 20 children, the parent's transcript holds 20 `<task-notification>` blocks:
/// the next batch's history end lies beyond the provider's 20-position lookback from the entry
/// the first batch wrote. Its first child must still read the shared history from cache.
#[tokio::test]
async fn a_later_batch_still_reads_the_history_cached_by_an_earlier_one() {
    let daemon = spawn_daemon().await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let prompts: Vec<String> = (0..20).map(|i| format!("first batch {i}")).collect();
    let refs: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let first = fork(&mut client, &session.session_id, &refs, None)
        .await
        .unwrap();
    wait_for_batch(&mut client, &first.batch_id, 20, DEADLINE)
        .await
        .unwrap();

    let second = fork(&mut client, &session.session_id, &["second batch"], None)
        .await
        .unwrap();
    let done = wait_for_batch(&mut client, &second.batch_id, 1, DEADLINE)
        .await
        .unwrap();
    let read = usage(&done[0]).cache_read_input_tokens;
    // The session's history (tools and system prompt, ~1k tokens, and the context file, ~2k)
    // comes from the first batch's entry. Without it the child could read the tools and system
    // prompt at best.
    assert!(read > 2_500, "read {read}");
}
