//! `eventually` returns as soon as its condition holds, with the condition's value, and fails
//! with a message naming what it waited for.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use forkd_test_support::{POLL_INTERVAL, eventually, wait_for_path};

#[tokio::test]
async fn an_option_check_returns_its_value_once_it_holds() {
    let calls = AtomicU32::new(0);
    let value = eventually(Duration::from_secs(10), "the third call", || async {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        (n == 3).then_some(n * 10)
    })
    .await;
    assert_eq!(value, 30);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_condition_that_already_holds_returns_at_once() {
    let started = Instant::now();
    eventually(Duration::from_secs(10), "true", || async { true }).await;
    assert!(started.elapsed() < POLL_INTERVAL, "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_path_that_appears_later_is_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("later");
    let writer = {
        let path = path.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            std::fs::write(path, "").unwrap();
        })
    };
    wait_for_path(&path).await;
    writer.await.unwrap();
}

#[tokio::test]
#[should_panic(expected = "waiting for the moon to turn blue")]
async fn a_condition_that_never_holds_fails_naming_what_was_awaited() {
    eventually(
        Duration::from_millis(100),
        "the moon to turn blue",
        || async { false },
    )
    .await;
}
