//! Agents survive a daemon restart: each resumes under its own id from its transcript, a
//! mutating tool call that was cut off is reported as interrupted (never run twice), and the
//! parent hears from each child exactly once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_test_support::{
    create_session, fork, spawn_daemon, transcript_text, trusted_session_request, wait_for_batch,
    wait_for_path,
};

#[tokio::test]
async fn a_restart_resumes_a_child_cut_off_in_a_tool_call() {
    let mut daemon = spawn_daemon().await.unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, trusted_session_request(ws.path()))
        .await
        .unwrap();
    let script = r#"Count the runs.
@sim tool Bash {"command":"echo run >> runs.txt; sleep 30"}
@sim tool Read {"file_path":"runs.txt"}
@sim say resumed"#;
    let batch = fork(
        &mut client,
        &session.session_id,
        &[script, "a quick sibling"],
        None,
    )
    .await
    .unwrap();
    // Stop the daemon while the Bash call is in flight.
    let runs = ws.path().join("runs.txt");
    wait_for_path(&runs).await;
    drop(client);
    daemon.restart(|_| {}).await.unwrap();

    let mut client = daemon.client().await.unwrap();
    let done = wait_for_batch(&mut client, &batch.batch_id, 2, Duration::from_secs(30))
        .await
        .unwrap();
    let child = done
        .iter()
        .find(|n| n.agent_id == batch.agent_ids[0])
        .unwrap();
    assert_eq!(child.status, pb::NotificationStatus::Completed as i32);
    assert_eq!(child.report.clone().unwrap().result, "resumed");
    // The mutating call was not run again; the model was told it was interrupted.
    assert_eq!(std::fs::read_to_string(&runs).unwrap(), "run\n");
    let log = transcript_text(&mut client, &batch.agent_ids[0])
        .await
        .unwrap();
    assert!(log.contains("Interrupted: this call was started"), "{log}");
    // The children's results reached the parent exactly once: its first message, the launch
    // note, and the batch's one digest.
    let session = client
        .get_session(pb::GetSessionRequest {
            session_id: session.session_id,
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    assert_eq!(session.message_count, 3);
}

#[tokio::test]
async fn a_graceful_stop_lets_the_tool_call_in_flight_finish_and_the_agent_resumes() {
    let mut daemon = spawn_daemon().await.unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, trusted_session_request(ws.path()))
        .await
        .unwrap();
    let script = r#"Finish what you start.
@sim tool Bash {"command":"touch started; sleep 1; echo run >> finished.txt"}
@sim tool Read {"file_path":"finished.txt"}
@sim say finished"#;
    let batch = fork(&mut client, &session.session_id, &[script], None)
        .await
        .unwrap();
    let started = ws.path().join("started");
    wait_for_path(&started).await;
    drop(client);
    // A graceful stop (5 s of grace): the Bash call in flight finishes and is stored.
    daemon.stop().await.unwrap();
    let finished = ws.path().join("finished.txt");
    assert_eq!(std::fs::read_to_string(&finished).unwrap(), "run\n");

    daemon.restart(|_| {}).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let done = wait_for_batch(&mut client, &batch.batch_id, 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(done[0].status, pb::NotificationStatus::Completed as i32);
    assert_eq!(done[0].report.clone().unwrap().result, "finished");
    // Run exactly once, and its stored result was what the model saw (no interruption).
    assert_eq!(std::fs::read_to_string(&finished).unwrap(), "run\n");
    let log = transcript_text(&mut client, &batch.agent_ids[0])
        .await
        .unwrap();
    assert!(!log.contains("Interrupted"), "{log}");
}

/// Upgrades keep working: a batch stored before batches had a shape (the column removed and its
/// migration forgotten, as in a database written by an older forkd) reads as the model shape it
/// was built in, and a child cut off by the restart resumes with its stored fork message, its
/// request's prefix byte-identical to its sibling's.
#[tokio::test]
async fn a_batch_stored_before_the_shape_column_resumes_byte_identically() {
    use sqlx::Connection as _;

    let mut daemon = spawn_daemon().await.unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, trusted_session_request(ws.path()))
        .await
        .unwrap();
    // A model's fork: the shape every batch had before client batches got their own.
    let script = concat!(
        "Split it.\n",
        r#"@sim agent {"description":"slow","prompt":"Slowly.\n@sim tool Bash {\"command\":\"touch started; sleep 30\"}\n@sim say slow done"}"#,
        "\n",
        r#"@sim agent {"description":"quick","prompt":"Quickly.\n@sim say quick done"}"#,
        "\n@sim say forked",
    );
    let events = forkd_test_support::run_turn(
        &mut client,
        pb::SendMessageRequest {
            session_id: session.session_id.clone(),
            text: script.into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let batch_id = events
        .iter()
        .find_map(|e| match e {
            pb::session_event::Event::ForkLaunched(f) => Some(f.batch_id.clone()),
            _ => None,
        })
        .unwrap();
    wait_for_path(&ws.path().join("started")).await;
    drop(client);
    daemon.stop().await.unwrap();

    // The database as an older forkd left it.
    let url = format!("sqlite://{}", daemon.home_path().join("forkd.db").display());
    let mut db = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("ALTER TABLE batches DROP COLUMN shape")
        .execute(&mut db)
        .await
        .unwrap();
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = 12")
        .execute(&mut db)
        .await
        .unwrap();
    db.close().await.unwrap();

    daemon.restart(|_| {}).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let done = wait_for_batch(&mut client, &batch_id, 2, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        done.iter()
            .all(|n| n.status == pb::NotificationStatus::Completed as i32),
        "{done:?}"
    );
    let requests = client
        .list_requests(pb::ListRequestsRequest {
            scope: Some(pb::list_requests_request::Scope::BatchId(batch_id)),
        })
        .await
        .unwrap()
        .into_inner()
        .requests;
    // Every request of both children — the slow one's after the restart included — carried the
    // same bytes up to its directive.
    let prefixes: Vec<&str> = requests
        .iter()
        .map(|r| r.prefix_fingerprint.as_str())
        .collect();
    assert!(
        requests.iter().any(|r| r.turn > 0),
        "the slow child made a request after the restart: {requests:?}"
    );
    assert!(prefixes.iter().all(|f| *f == prefixes[0]), "{prefixes:?}");
}
