//! The PostgreSQL server restarted (immediate mode: every connection cut, as a crash does) under a
//! running batch: every child completes, each notification is heard exactly once, and the daemon
//! takes new work again, without a restart of its own.
//!
//! Restarting the server is the machine's to allow: `FORKD_TEST_PG_RESTART` is the command that
//! does it (`.ci/run` sets it to `pg_ctlcluster … restart -m immediate`). Without it the test says
//! so and passes, unless `CI` is set: then it fails. It is alone in its binary, so that no other
//! test loses its connections to the restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod pg;

use std::time::Duration;

use forkd::daemon::DatabaseUrl;
use forkd_proto::v1 as pb;
use forkd_test_support::{
    create_session, fork, get_agent, hear_each_once, spawn_daemon_with, trusted_session_request,
};

const CHILDREN: usize = 6;
const DEADLINE: Duration = Duration::from_secs(90);
const RESTART_VAR: &str = "FORKD_TEST_PG_RESTART";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_mid_batch_loses_nothing_and_repeats_nothing() {
    let restart = match std::env::var(RESTART_VAR) {
        Ok(command) if !command.trim().is_empty() => command,
        _ => {
            let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
            assert!(
                !ci,
                "CI is set but {RESTART_VAR} is not: the PostgreSQL restart test must run in CI"
            );
            println!(
                "skipped: set {RESTART_VAR} to a command that restarts the test's PostgreSQL server"
            );
            return;
        }
    };
    pg::with_scratch_database(move |url| restarted_mid_batch(url, restart)).await;
}

/// A child's script: slow replies around a Bash command that leaves a mark per run.
fn script(i: usize) -> String {
    format!(
        "Part {i}.\n@sim sleep {}ms\n\
         @sim tool Bash {{\"command\":\"echo part-{i} >> ran.log\"}}\n\
         @sim sleep 1500ms\n@sim say part {i} done",
        200 * i
    )
}

async fn restarted_mid_batch(url: String, restart: String) {
    let daemon = spawn_daemon_with(|c| {
        c.database_url = Some(DatabaseUrl::new(url));
        c.lease = Duration::from_secs(2);
    })
    .await
    .unwrap();
    let mut client = daemon.client().await.unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let session = create_session(&mut client, trusted_session_request(workspace.path()))
        .await
        .unwrap();
    let heard = hear_each_once(
        daemon.client().await.unwrap(),
        session.session_id.clone(),
        CHILDREN,
        DEADLINE,
    );
    let prompts: Vec<String> = (0..CHILDREN).map(script).collect();
    let prompts: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let batch = fork(&mut client, &session.session_id, &prompts, None)
        .await
        .unwrap();

    tokio::time::sleep(Duration::from_millis(700)).await;
    let status = tokio::process::Command::new("sh")
        .args(["-c", &restart])
        .status()
        .await
        .unwrap();
    assert!(
        status.success(),
        "{RESTART_VAR} ({restart}) failed: {status}"
    );

    let heard = heard.await.unwrap();
    let mut ids: Vec<&str> = heard.iter().map(|n| n.agent_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), CHILDREN, "each child ends once: {heard:?}");
    assert!(
        heard.windows(2).all(|w| w[0].seq < w[1].seq),
        "in seq order: {heard:?}"
    );
    assert!(
        heard
            .iter()
            .all(|n| n.status == pb::NotificationStatus::Completed as i32),
        "{heard:?}"
    );
    for id in &batch.agent_ids {
        let agent = get_agent(&mut client, id).await;
        assert_eq!(agent.state, pb::AgentState::Completed as i32, "{agent:?}");
    }
    // Every Bash command ran, none twice.
    let ran = std::fs::read_to_string(workspace.path().join("ran.log")).unwrap();
    let mut lines: Vec<&str> = ran.lines().collect();
    lines.sort_unstable();
    let before = lines.len();
    lines.dedup();
    assert_eq!(lines.len(), CHILDREN, "{ran}");
    assert_eq!(before, CHILDREN, "a command ran twice: {ran}");

    // And new work goes through.
    create_session(&mut client, trusted_session_request(workspace.path()))
        .await
        .unwrap();
    drop(daemon);
}
