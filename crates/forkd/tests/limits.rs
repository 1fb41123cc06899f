//! The provider's limits end to end: the daemon's `anthropic` provider against a `forkd
//! sim-server` that limits its rate and scripts refusals, checked by what the server answered
//! and when (`SimProvider::answered`), not by timings of the client.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use forkd::daemon::DaemonConfig;
use forkd_core::tenant::Budget;
use forkd_proto::v1 as pb;
use forkd_proto::v1::forkd_client::ForkdClient;
use forkd_provider::{Answered, SimConfig, SimProvider};
use forkd_server::TokenStore;
use forkd_sim_server::SimServerConfig;
use forkd_test_support::{
    Caller, TestDaemon, create_session, fork, run_turn, session_request, sim_server,
    spawn_daemon_with, use_anthropic, wait_for_batch,
};
use tonic::transport::Channel;

const DEADLINE: Duration = Duration::from_secs(60);
const KEY: &str = "limits-key";

/// A sim-server limited by `rate_limit` (`requests=N,…`), and the sim behind it.
async fn limited_server(rate_limit: Option<&str>) -> (String, SimProvider) {
    let sim = SimProvider::new(SimConfig {
        rate_limit: rate_limit.map(|spec| spec.parse().unwrap()),
        ..SimConfig::default()
    });
    let config = SimServerConfig {
        api_key: Some(KEY.into()),
        ..SimServerConfig::default()
    };
    let url = sim_server(sim.clone(), config).await.unwrap();
    (url, sim)
}

async fn daemon(url: &str, tweak: impl FnOnce(&mut DaemonConfig)) -> TestDaemon {
    spawn_daemon_with(|c| {
        use_anthropic(c, url, KEY);
        tweak(c);
    })
    .await
    .unwrap()
}

/// A client of `daemon` and a new session of it.
async fn client_and_session(daemon: &TestDaemon) -> (ForkdClient<Channel>, pb::Session) {
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    (client, session)
}

/// Forks a child whose first request is refused with `retry-after: 600`, and returns once the
/// sim has refused it.
async fn wait_long(
    client: &mut ForkdClient<Channel>,
    session: &pb::Session,
    sim: &SimProvider,
) -> pb::ForkBatchResponse {
    let batch = fork(
        client,
        &session.session_id,
        &["Wait long.\n@sim fail 429 retry-after 600s\n@sim say never"],
        None,
    )
    .await
    .unwrap();
    answered_when(sim, |a| a.status == 429).await;
    batch
}

/// Waits until the sim has answered a request that `matches`; returns it.
async fn answered_when(sim: &SimProvider, matches: impl Fn(&Answered) -> bool) -> Answered {
    tokio::time::timeout(DEADLINE, async {
        loop {
            if let Some(a) = sim.answered().into_iter().find(|a| matches(a)) {
                return a;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the sim answered the request in time")
}

fn admitted(sim: &SimProvider) -> Vec<Answered> {
    sim.answered()
        .into_iter()
        .filter(|a| a.status == 200)
        .collect()
}

/// Why a child ended: its summary is one short line, its report's result the whole reason.
fn reason(n: &pb::Notification) -> String {
    n.report
        .as_ref()
        .map_or_else(|| n.summary.clone(), |r| r.result.clone())
}

fn statuses(notes: &[pb::Notification]) -> Vec<i32> {
    notes.iter().map(|n| n.status).collect()
}

const COMPLETED: i32 = pb::NotificationStatus::Completed as i32;
const FAILED: i32 = pb::NotificationStatus::Failed as i32;

/// Forks `prompts` without warm-up gating and waits until every child completed.
async fn fork_and_complete(
    client: &mut ForkdClient<Channel>,
    session_id: &str,
    prompts: &[String],
) {
    let prompts: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let batch = fork(client, session_id, &prompts, Some(false))
        .await
        .unwrap();
    let notes = wait_for_batch(client, &batch.batch_id, prompts.len(), DEADLINE)
        .await
        .unwrap();
    assert_eq!(
        statuses(&notes),
        vec![COMPLETED; prompts.len()],
        "{notes:?}"
    );
}
const KILLED: i32 = pb::NotificationStatus::Killed as i32;

#[tokio::test]
async fn a_429_storm_longer_than_any_retry_count_completes_every_child() {
    let (url, sim) = limited_server(Some("requests=5,per=1s")).await;
    let daemon = daemon(&url, |_| {}).await;
    let (mut client, session) = client_and_session(&daemon).await;
    // Each child is refused six times (the retry policy this limiter replaced gave up after
    // five), on top of a limit of five requests a second.
    let prompts: Vec<String> = (0..10)
        .map(|i| format!("Part {i}.\n@sim fail 429 x6 retry-after 100ms\n@sim say done {i}"))
        .collect();
    fork_and_complete(&mut client, &session.session_id, &prompts).await;
    let refused = sim.answered().iter().filter(|a| a.status == 429).count();
    assert!(refused >= 60, "every scripted refusal was met: {refused}");
}

#[tokio::test]
async fn a_retry_after_holds_every_request_of_the_key_and_child_one_still_goes_first() {
    let (url, sim) = limited_server(None).await;
    let daemon = daemon(&url, |_| {}).await;
    let (mut client, session) = client_and_session(&daemon).await;
    let prompts = [
        "The first.\n@sim fail 429 retry-after 3s\n@sim say first",
        "Sibling two.",
        "Sibling three.",
        "Sibling four.",
    ];
    let batch = fork(&mut client, &session.session_id, &prompts, None)
        .await
        .unwrap();
    let refusal = answered_when(&sim, |a| a.status == 429).await;
    // Another session's turn, sent while the key is paused, waits for it too.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let other = create_session(&mut client, session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let turn = run_turn(
        &mut client,
        pb::SendMessageRequest {
            session_id: other.session_id.clone(),
            text: "Another session's turn.".into(),
            ..Default::default()
        },
    )
    .await;
    assert!(turn.is_ok(), "{turn:?}");
    let notes = wait_for_batch(&mut client, &batch.batch_id, prompts.len(), DEADLINE)
        .await
        .unwrap();
    assert_eq!(
        statuses(&notes),
        vec![COMPLETED; prompts.len()],
        "{notes:?}"
    );

    let admitted = admitted(&sim);
    assert_eq!(admitted.len(), prompts.len() + 1);
    for a in &admitted {
        let after = a.at - refusal.at;
        assert!(
            after >= Duration::from_secs(3),
            "admitted {after:?} after the 429"
        );
    }
    // Gating held through the wait: child 1 was admitted before any sibling.
    let first = admitted.iter().position(|a| a.tail.contains("The first."));
    let sibling = admitted.iter().position(|a| a.tail.contains("Sibling"));
    assert!(first < sibling, "{admitted:?}");
}

#[tokio::test]
async fn a_kill_and_a_shutdown_end_a_long_wait_at_once() {
    let (url, sim) = limited_server(None).await;
    let mut daemon = daemon(&url, |_| {}).await;
    let (mut client, session) = client_and_session(&daemon).await;
    let batch = wait_long(&mut client, &session, &sim).await;
    // It waits `running`, and says it is throttled.
    let waiting = tokio::time::timeout(DEADLINE, async {
        loop {
            let agent = client
                .get_agent(pb::GetAgentRequest {
                    agent_id: batch.agent_ids[0].clone(),
                })
                .await
                .unwrap()
                .into_inner()
                .agent
                .unwrap();
            if agent.throttled_since.is_some() {
                return agent;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the agent was marked throttled");
    assert_eq!(waiting.state(), pb::AgentState::Running);
    let started = Instant::now();
    client
        .kill(pb::KillRequest {
            agent_id: batch.agent_ids[0].clone(),
        })
        .await
        .unwrap();
    let notes = wait_for_batch(&mut client, &batch.batch_id, 1, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(statuses(&notes), [KILLED]);

    // The key is still paused: a new child waits for its turn, and shutdown ends that wait.
    fork(&mut client, &session.session_id, &["Queued."], None)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::time::timeout(Duration::from_secs(20), daemon.stop())
        .await
        .expect("the daemon stopped without waiting out the pause")
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(admitted(&sim).len(), 0);
}

#[tokio::test]
async fn a_budget_spent_during_a_wait_ends_it() {
    let (url, sim) = limited_server(None).await;
    let daemon = daemon(&url, |c| {
        c.engine.tenant_budgets.insert(
            "local".into(),
            Budget {
                usd: None,
                tokens: Some(1),
            },
        );
    })
    .await;
    let (mut client, session) = client_and_session(&daemon).await;
    let waiting = wait_long(&mut client, &session, &sim).await;
    // Another model is another limit: a session on it runs, and spends the tenant's budget.
    let other = client
        .create_session(pb::CreateSessionRequest {
            model: "claude-haiku-4-5".into(),
            ..session_request(&daemon.workspace_path())
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    let spender = fork(&mut client, &other.session_id, &["Spend."], None)
        .await
        .unwrap();
    let spent = wait_for_batch(&mut client, &spender.batch_id, 1, DEADLINE)
        .await
        .unwrap();
    assert_eq!(statuses(&spent), [COMPLETED]);
    // The waiting child ends now, not after its 600 s: its budget is spent.
    let notes = wait_for_batch(&mut client, &waiting.batch_id, 1, DEADLINE)
        .await
        .unwrap();
    assert_eq!(statuses(&notes), [FAILED]);
    let why = reason(&notes[0]);
    assert!(
        why.contains("budget") && why.contains("tenant local"),
        "{why}"
    );
}

#[tokio::test]
async fn an_unreachable_base_url_fails_within_its_short_patience() {
    // A port that was just free: nothing listens there.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let daemon = daemon(&url, |c| {
        c.engine.admission.unreachable_patience = Duration::from_secs(1);
    })
    .await;
    let (mut client, session) = client_and_session(&daemon).await;
    let batch = fork(&mut client, &session.session_id, &["Anyone there?"], None)
        .await
        .unwrap();
    // Far less than the 15 minutes' patience for refusals.
    let notes = wait_for_batch(&mut client, &batch.batch_id, 1, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(statuses(&notes), [FAILED]);
    let summary = reason(&notes[0]);
    for part in ["gave up after waiting", "unreachable", "patience 1s"] {
        assert!(summary.contains(part), "{part:?} in {summary}");
    }
}

#[tokio::test]
async fn spent_patience_fails_the_child_naming_the_wait_and_the_refusals() {
    let (url, _sim) = limited_server(None).await;
    let daemon = daemon(&url, |c| {
        c.engine.admission.patience = Duration::from_secs(3);
    })
    .await;
    let (mut client, session) = client_and_session(&daemon).await;
    let batch = fork(
        &mut client,
        &session.session_id,
        &["Refused.\n@sim fail 429 x100\n@sim say never"],
        None,
    )
    .await
    .unwrap();
    let notes = wait_for_batch(&mut client, &batch.batch_id, 1, DEADLINE)
        .await
        .unwrap();
    assert_eq!(statuses(&notes), [FAILED]);
    let summary = reason(&notes[0]);
    for part in [
        "gave up after waiting",
        "refused attempts",
        "patience 3s",
        "scripted failure",
    ] {
        assert!(summary.contains(part), "{part:?} in {summary}");
    }
}

const LOOPBACK: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

#[tokio::test]
async fn a_tenants_turn_is_not_queued_behind_another_tenants_batch() {
    let (url, sim) = limited_server(Some("requests=4,per=1s")).await;
    let mut secrets = Vec::new();
    let daemon = daemon(&url, |c| {
        c.listen = Some(LOOPBACK);
        let tokens = TokenStore::in_home(&c.home);
        secrets.push(tokens.create("alpha").unwrap());
        secrets.push(tokens.create("beta").unwrap());
    })
    .await;
    let mut alpha = Caller::new(&daemon, secrets[0].expose()).await.unwrap();
    let mut beta = Caller::new(&daemon, secrets[1].expose()).await.unwrap();
    let a_session = alpha
        .create_session(session_request(&daemon.tenant_workspace("alpha")))
        .await
        .unwrap();
    let b_session = beta
        .create_session(session_request(&daemon.tenant_workspace("beta")))
        .await
        .unwrap();
    let prompts: Vec<String> = (0..24).map(|i| format!("Alpha part {i}.")).collect();
    let batch = alpha
        .client
        .fork_batch(alpha.req(pb::ForkBatchRequest {
            session_id: a_session.session_id.clone(),
            directives: forkd_test_support::directives(
                &prompts.iter().map(String::as_str).collect::<Vec<_>>(),
            ),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    // Alpha's batch is at the limit, its children queued.
    tokio::time::timeout(DEADLINE, async {
        while admitted(&sim).len() < 8 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    let sent = tokio::time::Instant::now();
    let mut turn = beta
        .client
        .send_message(beta.req(pb::SendMessageRequest {
            session_id: b_session.session_id.clone(),
            text: "Beta's turn.".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    while turn.message().await.unwrap().is_some() {}
    let admitted = admitted(&sim);
    let b = admitted
        .iter()
        .find(|a| a.tail.contains("Beta's turn."))
        .unwrap();
    let ahead = admitted
        .iter()
        .filter(|a| a.at > sent && a.at < b.at)
        .count();
    // At most what was already on its way when beta's turn came.
    assert!(
        ahead <= 2,
        "{ahead} of alpha's requests went ahead of beta's turn"
    );

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
    let mut done = 0;
    tokio::time::timeout(DEADLINE, async {
        while done < prompts.len() {
            let n = notes.message().await.unwrap().unwrap();
            assert_eq!(n.status, COMPLETED, "{n:?}");
            done += 1;
        }
    })
    .await
    .unwrap();
}

/// `GetCapacity` says what paces each key and whence: after a batch at a sliding window that
/// states no limit, a pace learned from refusals, and the refusals of the last minute; a token
/// tenant sees the same without the provider's endpoint.
#[tokio::test]
async fn capacity_says_what_paces_the_key_and_whence() {
    let spec = "requests=10,per=1s,algorithm=sliding-window,headers=retry-after-only";
    let (url, sim) = limited_server(Some(spec)).await;
    let mut secrets = Vec::new();
    let daemon = daemon(&url, |c| {
        c.listen = Some(LOOPBACK);
        secrets.push(TokenStore::in_home(&c.home).create("ci").unwrap());
    })
    .await;
    let (mut client, session) = client_and_session(&daemon).await;
    let capacity = |mut client: ForkdClient<Channel>| async move {
        client
            .get_capacity(pb::GetCapacityRequest {})
            .await
            .unwrap()
            .into_inner()
            .providers
    };
    assert!(
        capacity(client.clone()).await.is_empty(),
        "nothing sent yet"
    );

    let prompts: Vec<String> = (0..30)
        .map(|i| format!("Part {i}.\n@sim say done {i}"))
        .collect();
    fork_and_complete(&mut client, &session.session_id, &prompts).await;
    let refused = sim.answered().iter().filter(|a| a.status == 429).count();
    assert!(refused >= 1, "the burst met the window");

    let keys = capacity(client).await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    let key = &keys[0];
    assert_eq!(
        (key.provider.as_str(), key.endpoint.as_str()),
        ("anthropic", url.as_str())
    );
    let learned = key
        .limits
        .iter()
        .find(|l| l.source == "refusals")
        .unwrap_or_else(|| panic!("a pace learned from refusals: {key:?}"));
    assert_eq!(learned.name, "requests");
    assert!(
        learned.per_second > 0.0 && learned.per_second <= 10.5,
        "{learned:?}"
    );
    assert!(
        !key.limits.iter().any(|l| l.source == "headers"),
        "no header stated a limit: {key:?}"
    );
    assert!(key.refusals_last_minute >= 1, "{key:?}");
    assert_eq!((key.in_flight, key.throttled), (0, 0), "{key:?}");

    let ci = Caller::new(&daemon, secrets[0].expose()).await.unwrap();
    let seen = ci
        .client
        .clone()
        .get_capacity(ci.req(pb::GetCapacityRequest {}))
        .await
        .unwrap()
        .into_inner()
        .providers;
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].endpoint, "",
        "the operator's endpoint is not a tenant's to see"
    );
    assert_eq!(seen[0].limits, key.limits);
}
