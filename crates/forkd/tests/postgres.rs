//! The daemon on PostgreSQL (`database_url`): a parent turn that forks, a client's batch, and a
//! restart, end to end through the real gRPC client, with nothing kept in `FORKD_HOME/forkd.db`.
//! The database is a fresh one on the server `FORKD_TEST_DATABASE_URL` names, dropped at the end;
//! without that variable the test says so and passes, unless `CI` is set.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use forkd::daemon::DatabaseUrl;
use forkd_proto::v1 as pb;
use forkd_test_support::{
    create_session, fork, run_turn, session_request, session_transcript, spawn_daemon_with,
    turn_text, wait_for_batch,
};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

const DEADLINE: Duration = Duration::from_secs(30);

/// A fresh database on the test server, and the server's URL to drop it through; `None` when
/// the PostgreSQL tests are skipped.
async fn scratch_database() -> Option<(String, String)> {
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
    let server = match std::env::var("FORKD_TEST_DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => url,
        _ => {
            assert!(
                !ci,
                "CI is set but FORKD_TEST_DATABASE_URL is not: the PostgreSQL tests must run in CI"
            );
            println!(
                "skipped: set FORKD_TEST_DATABASE_URL=postgres://… to run the PostgreSQL store tests"
            );
            return None;
        }
    };
    let name = format!(
        "forkd_daemon_test_{}_{}",
        std::process::id(),
        fastrand::u32(..)
    );
    let mut admin = PgConnection::connect(&server)
        .await
        .unwrap_or_else(|e| panic!("cannot reach FORKD_TEST_DATABASE_URL: {e}"));
    sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .unwrap();
    admin.close().await.unwrap();
    // The server's URL with the database replaced (the path after the host).
    let (scheme, rest) = server.split_once("://").unwrap();
    let host_at = rest.rfind('@').map_or(0, |i| i + 1);
    let host_end = rest[host_at..]
        .find(['/', '?'])
        .map_or(rest.len(), |i| host_at + i);
    let query = rest[host_end..]
        .find('?')
        .map_or("", |i| &rest[host_end + i..]);
    let url = format!("{scheme}://{}/{name}{query}", &rest[..host_end]);
    Some((url, format!("{server}\n{name}")))
}

/// Drops the test's database. A plain `DROP DATABASE` waits for an autovacuum worker to leave
/// (`WITH (FORCE)` would fail on it without the right to signal it); `FORCE` is the fallback for
/// a connection of the test that is still open.
async fn drop_database(handle: &str) {
    let (server, name) = handle.split_once('\n').unwrap();
    let mut admin = PgConnection::connect(server).await.unwrap();
    let plain = sqlx::query(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}")))
        .execute(&mut admin)
        .await;
    if plain.is_err() {
        sqlx::query(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&mut admin)
        .await
        .unwrap();
    }
    admin.close().await.unwrap();
}

#[tokio::test]
async fn a_daemon_on_postgres_forks_restarts_and_keeps_everything() {
    let Some((url, handle)) = scratch_database().await else {
        return;
    };
    // In a task of its own, so that the database is dropped whether the test passes or panics.
    let outcome = tokio::spawn(forks_restarts_and_keeps_everything(url)).await;
    drop_database(&handle).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

async fn forks_restarts_and_keeps_everything(url: String) {
    let database = DatabaseUrl::new(url.clone());
    let with_database = |c: &mut forkd::daemon::DaemonConfig| {
        c.database_url = Some(DatabaseUrl::new(url.clone()));
    };
    let mut daemon = spawn_daemon_with(|c| c.database_url = Some(database))
        .await
        .unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(daemon.home_path()))
        .await
        .unwrap();
    let sid = session.session_id.clone();

    // A parent turn whose reply forks two children, and a client's batch of three.
    let script = concat!(
        "Split the audit in two.\n",
        r#"@sim agent {"description":"audit a","prompt":"Audit part a.\n@sim say a is fine"}"#,
        "\n",
        r#"@sim agent {"description":"audit b","prompt":"Audit part b.\n@sim say b is fine"}"#,
        "\n@sim say forked both",
    );
    let events = run_turn(
        &mut client,
        pb::SendMessageRequest {
            session_id: sid.clone(),
            text: script.to_owned(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let reply = turn_text(&events).unwrap_or_default();
    assert!(reply.contains("forked both"), "{events:?}");
    let turns_batch = events
        .iter()
        .find_map(|e| match e {
            pb::session_event::Event::ForkLaunched(l) => Some(l.batch_id.clone()),
            _ => None,
        })
        .expect("the turn forked");
    let batch = fork(&mut client, &sid, &["audit c", "audit d", "audit e"], None)
        .await
        .unwrap();
    let mut done = wait_for_batch(&mut client, &batch.batch_id, 3, DEADLINE)
        .await
        .unwrap();
    done.extend(
        wait_for_batch(&mut client, &turns_batch, 2, DEADLINE)
            .await
            .unwrap(),
    );
    assert!(
        done.iter()
            .all(|n| n.status == pb::NotificationStatus::Completed as i32),
        "{done:?}"
    );
    let before = session_transcript(&mut client, &sid).await.unwrap();

    // Nothing went to the home's SQLite file: the state is in PostgreSQL, and a restarted daemon
    // (on the same home, the same database) finds all of it.
    assert!(!daemon.home_path().join("forkd.db").exists());
    drop(client);
    daemon.restart(with_database).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let after = session_transcript(&mut client, &sid).await.unwrap();
    assert_eq!(after.len(), before.len());
    assert!(after == before, "the transcript changed across the restart");
    let mut replay = client
        .subscribe_notifications(pb::SubscribeNotificationsRequest {
            session_id: sid.clone(),
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
    // The turn's two children and the client batch's three, once each, in seq order.
    assert_eq!(replayed.len(), 5, "{replayed:?}");
    assert!(replayed.windows(2).all(|w| w[0].seq < w[1].seq));
    drop(client);
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_database_url_that_is_not_postgres_stops_the_start() {
    let result = spawn_daemon_with(|c| {
        c.database_url = Some(DatabaseUrl::new("mysql://root:hunter2@db.example/forkd"));
    })
    .await;
    let err = format!("{:#}", result.err().expect("the daemon started"));
    assert!(err.contains("is not a PostgreSQL URL"), "{err}");
    assert!(err.contains("mysql://root:***@db.example/forkd"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}
