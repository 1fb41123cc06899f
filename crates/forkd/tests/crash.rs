//! Crash tests: the real `forkd serve` binary is killed with SIGKILL at seeded random moments
//! while a fork batch runs (tool calls in flight), and restarted each time. Afterwards every
//! child has ended exactly once, no notification a subscriber saw is lost, no mutating call ran
//! twice, every request of the batch carried the same prefix bytes, and the database is sound.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use binary::{Daemon, client};
use forkd_proto::v1 as pb;
use forkd_store::{Durability, RequestFilter, SqliteStore, Store};
use forkd_test_support::{create_session, eventually, fork, trusted_session_request};

mod binary;

const CHILDREN: usize = 6;
const CRASHES: usize = 3;

/// Every notification of the batch stored so far.
async fn replay(
    c: &mut pb::forkd_client::ForkdClient<tonic::transport::Channel>,
    batch: &str,
) -> Vec<pb::Notification> {
    let mut stream = c
        .subscribe_notifications(pb::SubscribeNotificationsRequest {
            batch_id: batch.to_owned(),
            follow: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut all = Vec::new();
    while let Some(n) = stream.message().await.unwrap() {
        all.push(n);
    }
    all
}

/// Follows the batch's notifications in the background, recording every one seen.
fn record_seen(
    mut client: pb::forkd_client::ForkdClient<tonic::transport::Channel>,
    batch: String,
) -> tokio::task::JoinHandle<Vec<pb::Notification>> {
    tokio::spawn(async move {
        let mut seen = Vec::new();
        let Ok(reply) = client
            .subscribe_notifications(pb::SubscribeNotificationsRequest {
                batch_id: batch,
                follow: true,
                ..Default::default()
            })
            .await
        else {
            return seen;
        };
        let mut stream = reply.into_inner();
        while let Ok(Some(n)) = stream.message().await {
            seen.push(n);
        }
        seen
    })
}

fn script(i: usize) -> String {
    format!(
        "Part {i}.\n@sim tool Bash {{\"command\":\"echo run >> marker-{i}.txt\"}}\n@sim sleep 150ms\n\
         @sim tool Read {{\"file_path\":\"marker-{i}.txt\"}}\n@sim sleep 150ms\n@sim say part {i} done"
    )
}

/// Runs one seeded crash scenario; returns its one-line summary.
async fn crash_run(seed: u64) -> String {
    let mut rng = fastrand::Rng::with_seed(seed);
    let home = tempfile::Builder::new()
        .prefix("forkd-crash-")
        .tempdir()
        .unwrap();
    // Beside the home, never in it: the home is never a workspace.
    let files = tempfile::tempdir().unwrap();
    let ws = files.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let mut daemon = Daemon::start(home.path(), "0.05");
    let mut c = client(home.path()).await;
    let session = create_session(&mut c, trusted_session_request(&ws))
        .await
        .unwrap();
    let prompts: Vec<String> = (0..CHILDREN).map(script).collect();
    let refs: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let batch = fork(&mut c, &session.session_id, &refs, None)
        .await
        .unwrap();

    let mut seen: Vec<pb::Notification> = Vec::new();
    let mut kills_ms = Vec::new();
    for _ in 0..CRASHES {
        let watcher = record_seen(c.clone(), batch.batch_id.clone());
        let after = rng.u64(20..500);
        kills_ms.push(after);
        tokio::time::sleep(Duration::from_millis(after)).await;
        daemon.kill9();
        seen.extend(watcher.await.unwrap());
        daemon = Daemon::start(home.path(), "0.05");
        c = client(home.path()).await;
    }

    // Every child ends, once.
    let what = format!("seed {seed}: every child to end");
    let done = eventually(Duration::from_secs(60), what, || {
        let mut c = c.clone();
        let batch = batch.batch_id.clone();
        async move {
            let all = replay(&mut c, &batch).await;
            (all.len() >= CHILDREN).then_some(all)
        }
    })
    .await;
    assert_eq!(
        done.len(),
        CHILDREN,
        "seed {seed}: one notification per child"
    );
    let agents: BTreeSet<&str> = done.iter().map(|n| n.agent_id.as_str()).collect();
    assert_eq!(agents.len(), CHILDREN);
    for n in &done {
        assert_eq!(
            n.status,
            pb::NotificationStatus::Completed as i32,
            "seed {seed}: {n:?}"
        );
    }
    // Nothing a subscriber saw before a crash is lost (same seq, same agent).
    let stored: BTreeMap<u64, &str> = done.iter().map(|n| (n.seq, n.agent_id.as_str())).collect();
    for n in &seen {
        assert_eq!(
            stored.get(&n.seq),
            Some(&n.agent_id.as_str()),
            "seed {seed}: lost {n:?}"
        );
    }
    // The parent heard from the batch exactly once: its context, the launch note, and one digest
    // of every child's result (a client's batch does not send one notification per child).
    let parent = c
        .get_session(pb::GetSessionRequest {
            session_id: session.session_id,
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    assert_eq!(parent.message_count, 3, "seed {seed}");
    // No mutating call ran twice.
    for i in 0..CHILDREN {
        let marker =
            std::fs::read_to_string(ws.join(format!("marker-{i}.txt"))).unwrap_or_default();
        assert!(
            marker.lines().count() <= 1,
            "seed {seed}: child {i} ran its Bash twice"
        );
    }

    daemon.kill9();
    let store = SqliteStore::open(&home.path().join("forkd.db"), Durability::Normal)
        .await
        .unwrap();
    store.integrity_check().await.unwrap();
    // Every request of the batch, first or resumed, carried the same prefix bytes.
    let requests = store
        .list_requests(&RequestFilter {
            batch_id: Some(batch.batch_id.parse().unwrap()),
            ..Default::default()
        })
        .await
        .unwrap();
    let prefixes: BTreeSet<&str> = requests
        .iter()
        .map(|r| r.prefix_fingerprint.as_str())
        .collect();
    assert_eq!(prefixes.len(), 1, "seed {seed}: siblings' prefixes differ");
    format!(
        "seed {seed}: SIGKILL after {kills_ms:?} ms; {CHILDREN}/{CHILDREN} children completed \
         once; {} notifications seen before the kills, all kept; {} requests, 1 prefix; \
         integrity ok",
        seen.len(),
        requests.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_seeded_moments_loses_nothing_and_runs_nothing_twice() {
    // Three seeds (nine kill points) by default; `FORKD_CRASH_SEEDS=8` runs eight (24 kills).
    let seeds: u64 = std::env::var("FORKD_CRASH_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    for i in 0..seeds {
        let summary = crash_run(7 + i * 7919).await;
        eprintln!("{summary}");
    }
}

/// An isolated child killed with its daemon (SIGKILL) after it wrote in its copy resumes in the
/// same copy: it reads its own edit, its sibling never sees it, and the workspace stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_child_resumed_after_sigkill_finds_its_own_edits() {
    let home = tempfile::Builder::new()
        .prefix("forkd-crash-")
        .tempdir()
        .unwrap();
    // Beside the home, never in it: the home is never a workspace.
    let files = tempfile::tempdir().unwrap();
    let ws = files.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("a.txt"), "snapshot\n").unwrap();
    let daemon = Daemon::start(home.path(), "1");
    let mut c = client(home.path()).await;
    let session = create_session(&mut c, trusted_session_request(&ws))
        .await
        .unwrap();
    let writer = "Write, wait, read.\n@sim tool Bash {\"command\":\"echo mine > a.txt\"}\n\
        @sim sleep 5s\n@sim tool Bash {\"command\":\"cat a.txt\"}\n@sim say done";
    let looker =
        "Look.\n@sim sleep 5s\n@sim tool Bash {\"command\":\"cat a.txt\"}\n@sim say looked";
    let batch = c
        .fork_batch(pb::ForkBatchRequest {
            session_id: session.session_id.clone(),
            directives: forkd_test_support::directives(&[writer, looker]),
            isolation: "copy".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // Killed once the first command's result is stored.
    eventually(
        Duration::from_secs(30),
        "the first command's result",
        || {
            let mut c = c.clone();
            let agent = batch.agent_ids[0].clone();
            async move {
                forkd_test_support::transcript_text(&mut c, &agent)
                    .await
                    .is_ok_and(|log| log.contains("tool_result"))
            }
        },
    )
    .await;
    daemon.kill9();
    let _daemon = Daemon::start(home.path(), "0");
    let mut c = client(home.path()).await;
    let done = eventually(Duration::from_secs(60), "both children to end", || {
        let mut c = c.clone();
        let batch = batch.batch_id.clone();
        async move {
            let all = replay(&mut c, &batch).await;
            (all.len() >= 2).then_some(all)
        }
    })
    .await;
    assert!(
        done.iter()
            .all(|n| n.status == pb::NotificationStatus::Completed as i32),
        "{done:?}"
    );
    let own = forkd_test_support::transcript_text(&mut c, &batch.agent_ids[0])
        .await
        .unwrap();
    // Its second command ran after the restart and read its own copy, not the snapshot.
    assert!(own.matches("tool_result").count() >= 2, "{own}");
    assert!(
        !own.contains("snapshot"),
        "the resumed child reads its edit: {own}"
    );
    let sibling = forkd_test_support::transcript_text(&mut c, &batch.agent_ids[1])
        .await
        .unwrap();
    assert!(
        sibling.contains("snapshot") && !sibling.contains("mine"),
        "{sibling}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "snapshot\n"
    );
}
