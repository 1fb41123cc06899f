//! Chaos on one PostgreSQL database: three real `forkd serve` processes, all using one sim-server
//! through the `anthropic` provider (so that they share one prompt cache), a 60-child batch whose
//! children run Bash and stream slow replies, and a SIGKILL of the daemon running it at a seeded
//! moment. Every child ends completed exactly once, no Bash command runs twice, a subscriber on
//! a surviving daemon hears every notification exactly once in seq order, and the survivors
//! adopt the dead daemon's agents within its lease plus 5 s.
//!
//! `FORKD_CHAOS_SEEDS` sets how many seeds run (default 5); `FORKD_CHAOS_SEED` runs one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod binary;
mod pg;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use forkd_proto::v1 as pb;
use forkd_provider::{SimConfig, SimProvider};
use forkd_sim_server::{SimServerConfig, StreamCuts};
use forkd_test_support::{
    create_session, eventually, fork, hear_each_once, trusted_session_request,
};

const CHILDREN: usize = 60;
const LEASE: Duration = Duration::from_secs(1);
const DEADLINE: Duration = Duration::from_secs(90);
const API_KEY: &str = "chaos-key";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_mid_batch_loses_nothing_and_repeats_nothing() {
    let seeds: Vec<u64> = match std::env::var("FORKD_CHAOS_SEED") {
        Ok(one) => vec![one.parse().expect("FORKD_CHAOS_SEED is a number")],
        Err(_) => {
            let n = std::env::var("FORKD_CHAOS_SEEDS")
                .ok()
                .map_or(5, |n| n.parse().expect("FORKD_CHAOS_SEEDS is a number"));
            (1..=n).collect()
        }
    };
    let sim = sim_server().await;
    for seed in seeds {
        let sim = sim.clone();
        pg::with_scratch_database(move |url| chaos(seed, url, sim)).await;
    }
}

/// The one sim-server the three daemons talk to, in this process.
async fn sim_server() -> String {
    let config = SimServerConfig {
        api_key: Some(API_KEY.into()),
        cuts: StreamCuts::default(),
    };
    forkd_test_support::sim_server(SimProvider::new(SimConfig::default()), config)
        .await
        .unwrap()
}

async fn chaos(seed: u64, url: String, sim: String) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let env = [
        ("FORKD_DATABASE_URL", url.as_str()),
        ("FORKD_LEASE", "1s"),
        ("FORKD_PROVIDER", "anthropic"),
        ("ANTHROPIC_BASE_URL", sim.as_str()),
        ("ANTHROPIC_API_KEY", API_KEY),
    ];
    let homes: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let workspace = tempfile::tempdir().unwrap();
    let mut daemons: Vec<Option<binary::Daemon>> = homes
        .iter()
        .map(|h| Some(binary::Daemon::start_with(h.path(), "0", &env)))
        .collect();
    let mut clients = Vec::new();
    for home in &homes {
        clients.push(binary::client(home.path()).await);
    }
    let target = rng.usize(0..3);
    let watcher = (target + 1 + rng.usize(0..2)) % 3;
    let kill_after = Duration::from_millis(rng.u64(300..2500));

    let mut on_target = clients[target].clone();
    let session = create_session(&mut on_target, trusted_session_request(workspace.path()))
        .await
        .unwrap();
    // Subscribed on a survivor before anything ends: it must hear all 60, live.
    let heard = hear_each_once(
        clients[watcher].clone(),
        session.session_id.clone(),
        CHILDREN,
        DEADLINE,
    );
    let prompts: Vec<String> = (0..CHILDREN).map(|i| script(i, &mut rng)).collect();
    let prompts: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let batch = fork(&mut on_target, &session.session_id, &prompts, None)
        .await
        .unwrap();

    tokio::time::sleep(kill_after).await;
    let dead = get_daemon_id(&mut clients[watcher], &batch.agent_ids).await;
    daemons[target].take().unwrap().kill9();
    let killed_at = Instant::now();

    // The survivors adopt what the dead daemon held.
    let mut watching = clients[watcher].clone();
    let batch_id = batch.batch_id.clone();
    let adopted_after = eventually(DEADLINE, "the survivors to adopt the batch", || {
        let (mut c, batch_id, dead) = (watching.clone(), batch_id.clone(), dead.clone());
        async move {
            let agents = binary::list_batch(&mut c, &batch_id).await;
            let held = agents.iter().any(|a| {
                !binary::is_terminal(a.state)
                    && (a.daemon.is_empty() || dead.as_deref() == Some(&a.daemon))
            });
            (!held).then(|| killed_at.elapsed())
        }
    })
    .await;

    let heard = heard.await.unwrap();
    let agents = binary::list_batch(&mut watching, &batch.batch_id).await;
    let ran = std::fs::read_to_string(workspace.path().join("ran.log")).unwrap_or_default();
    let mut runs: BTreeMap<&str, usize> = BTreeMap::new();
    for line in ran.lines() {
        *runs.entry(line).or_default() += 1;
    }
    let adopters: std::collections::BTreeSet<&str> = agents
        .iter()
        .map(|a| a.daemon.as_str())
        .filter(|d| dead.as_deref() != Some(*d))
        .collect();
    println!(
        "seed {seed}: batch on daemon {target}, killed after {} ms; survivors held every live \
         child {:.2} s after the SIGKILL; children finished by {} other daemon(s); {} Bash \
         commands ran",
        kill_after.as_millis(),
        adopted_after.as_secs_f64(),
        adopters.len(),
        ran.lines().count(),
    );

    // Every child ended once, completed, and the subscriber heard each end once, in order.
    assert_eq!(heard.len(), CHILDREN, "seed {seed}: {heard:?}");
    assert!(
        heard.windows(2).all(|w| w[0].seq < w[1].seq),
        "seed {seed}: out of order: {heard:?}"
    );
    let mut ids: Vec<&str> = heard.iter().map(|n| n.agent_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), CHILDREN, "seed {seed}: a child ended twice");
    assert!(
        heard
            .iter()
            .all(|n| n.status == pb::NotificationStatus::Completed as i32),
        "seed {seed}: {heard:?}"
    );
    assert!(
        agents
            .iter()
            .all(|a| a.state == pb::AgentState::Completed as i32),
        "seed {seed}: {agents:?}"
    );
    // No Bash command ran twice (one cut off by the kill ran at most once: the adopter reports
    // it interrupted instead of running it again).
    assert!(
        runs.values().all(|&n| n == 1),
        "seed {seed}: Bash ran twice: {runs:?}"
    );
    assert!(
        adopted_after <= LEASE + Duration::from_secs(5),
        "seed {seed}: adoption took {adopted_after:?}"
    );
    drop(clients);
    drop(daemons);
}

/// A child's script: a Bash command that leaves a mark per run, slow replies around it.
fn script(i: usize, rng: &mut fastrand::Rng) -> String {
    let before = rng.u64(0..1500);
    let after = rng.u64(500..2500);
    format!(
        "Part {i}.\n@sim sleep {before}ms\n\
         @sim tool Bash {{\"command\":\"echo part-{i} >> ran.log\"}}\n\
         @sim sleep {after}ms\n@sim say part {i} done"
    )
}

/// The daemon the batch's children run on, once one has claimed them (none if all ended).
async fn get_daemon_id(client: &mut binary::Client, ids: &[String]) -> Option<String> {
    for id in ids {
        let agent = client
            .get_agent(pb::GetAgentRequest {
                agent_id: id.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .agent
            .unwrap();
        if !agent.daemon.is_empty() {
            return Some(agent.daemon);
        }
    }
    None
}
