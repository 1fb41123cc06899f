//! Webhooks with several daemons on one PostgreSQL database: both deliver the outbox, and each
//! delivery is attempted by one daemon at a time, so a receiver that takes every attempt gets
//! each notification once. The database is a fresh one on the server `FORKD_TEST_DATABASE_URL`
//! names, dropped at the end; without that variable the test says so and passes, unless `CI` is
//! set.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_test_support::receiver::Receiver;
use forkd_test_support::{create_session, eventually, fork, session_request, wait_for_batch};

mod binary;
mod pg;

use pg::with_scratch_database;

const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn two_daemons_deliver_each_notification_once() {
    with_scratch_database(deliver_across_daemons).await;
}

async fn deliver_across_daemons(url: String) {
    let env = [("FORKD_DATABASE_URL", url.as_str()), ("FORKD_LEASE", "1s")];
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let workspace = tempfile::tempdir().unwrap();
    // One secret key for both: either opens the secrets the other sealed.
    let key = home_a.path().join("shared.key");
    std::fs::write(
        &key,
        forkd_engine::sealed::SecretKey::generate_hex().unwrap(),
    )
    .unwrap();
    for home in [&home_a, &home_b] {
        std::fs::write(
            home.path().join("config.toml"),
            format!(
                "secret_key_file = {:?}\n[webhooks]\nallow_private = true\n",
                key.display().to_string()
            ),
        )
        .unwrap();
    }
    let _a = binary::Daemon::start_with(home_a.path(), "0", &env);
    let _b = binary::Daemon::start_with(home_b.path(), "0", &env);
    let mut on_a = binary::client(home_a.path()).await;
    let mut on_b = binary::client(home_b.path()).await;

    let receiver = Receiver::start().await.unwrap();
    let created = on_b
        .create_webhook(pb::CreateWebhookRequest {
            url: receiver.url("/hook"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    receiver.trust(&[&created.secret]);

    // Notifications committed by each daemon: a batch through each.
    let mut expected = 0;
    for client in [&mut on_a, &mut on_b] {
        let session = create_session(client, session_request(workspace.path()))
            .await
            .unwrap();
        let prompts: Vec<String> = (0..6).map(|i| format!("Part {i}.")).collect();
        let prompts: Vec<&str> = prompts.iter().map(String::as_str).collect();
        let batch = fork(client, &session.session_id, &prompts, None)
            .await
            .unwrap();
        wait_for_batch(client, &batch.batch_id, 6, DEADLINE)
            .await
            .unwrap();
        expected += 6;
    }
    eventually(DEADLINE, "every delivery", || async {
        (receiver.taken_ids().len() == expected).then_some(())
    })
    .await;
    // A moment for any second attempt to show itself.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got = receiver.received();
    assert_eq!(got.len(), expected, "each notification once: {got:?}");
    assert!(got.iter().all(|r| r.verified));
}
