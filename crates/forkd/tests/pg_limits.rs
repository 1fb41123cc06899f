//! Several daemons on one PostgreSQL database and one provider key, at a provider that counts
//! requests in a sliding window and says only `retry-after`: each daemon learns a pace from its
//! own refusals, and every child of both batches completes. The database is a fresh one on the
//! server `FORKD_TEST_DATABASE_URL` names, dropped at the end; without that variable the test
//! says so and passes, unless `CI` is set.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_provider::{SimConfig, SimProvider};
use forkd_sim_server::SimServerConfig;
use forkd_test_support::{create_session, fork, session_request, wait_for_batch};

mod binary;
mod pg;

use pg::with_scratch_database;

const API_KEY: &str = "pg-limits-key";
const CHILDREN: usize = 40;
const DEADLINE: Duration = Duration::from_secs(120);

#[tokio::test]
async fn daemons_sharing_a_key_at_a_sliding_window_complete_every_child() {
    with_scratch_database(sliding_window_across_daemons).await;
}

async fn sliding_window_across_daemons(url: String) {
    let sim = SimProvider::new(SimConfig {
        speed: 0.0,
        rate_limit: Some(
            "requests=10,per=1s,algorithm=sliding-window,headers=retry-after-only"
                .parse()
                .unwrap(),
        ),
    });
    let base = forkd_test_support::sim_server(
        sim.clone(),
        SimServerConfig {
            api_key: Some(API_KEY.into()),
            ..SimServerConfig::default()
        },
    )
    .await
    .unwrap();
    let env = [
        ("FORKD_DATABASE_URL", url.as_str()),
        ("FORKD_PROVIDER", "anthropic"),
        ("ANTHROPIC_BASE_URL", base.as_str()),
        ("ANTHROPIC_API_KEY", API_KEY),
    ];
    let (home_a, home_b, workspace) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let _a = binary::Daemon::start_with(home_a.path(), "0", &env);
    let _b = binary::Daemon::start_with(home_b.path(), "0", &env);
    let mut on_a = binary::client(home_a.path()).await;
    let mut on_b = binary::client(home_b.path()).await;
    let session = create_session(&mut on_a, session_request(workspace.path()))
        .await
        .unwrap();
    let directives: Vec<String> = (0..CHILDREN)
        .map(|i| format!("Part {i}.\n@sim say part {i} done"))
        .collect();
    let directives: Vec<&str> = directives.iter().map(String::as_str).collect();
    let first = fork(&mut on_a, &session.session_id, &directives, None)
        .await
        .unwrap();
    let second = fork(&mut on_b, &session.session_id, &directives, None)
        .await
        .unwrap();
    for (client, batch) in [(&mut on_a, &first), (&mut on_b, &second)] {
        let done = wait_for_batch(client, &batch.batch_id, CHILDREN, DEADLINE)
            .await
            .unwrap();
        let completed = done
            .iter()
            .filter(|n| n.status == pb::NotificationStatus::Completed as i32)
            .count();
        assert_eq!(completed, CHILDREN, "{done:?}");
    }
    let answered = sim.answered();
    let refused = answered.iter().filter(|a| a.status == 429).count();
    eprintln!(
        "{} requests admitted, {refused} refused",
        answered.len() - refused
    );
}
