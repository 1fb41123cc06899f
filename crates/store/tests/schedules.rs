//! Schedules in the store, on both backends: a firing is claimed once (the claim moves the
//! schedule's next firing on, so a second claim of the same time finds it moved), recorded, and
//! a claim that lapsed is taken over once.

mod support;

use forkd_core::DaemonId;
use forkd_core::schedule::{FiringClaim, FiringOutcome, FiringState};
use support::{TestResult, TestStore, conformance, nightly};

conformance!(
    a_firing_is_claimed_once_and_moves_the_schedule_on,
    a_lapsed_claim_is_taken_over_once,
);

fn claim(at: i64, next: i64, until: i64) -> FiringClaim {
    FiringClaim {
        name: "nightly".into(),
        fire_at_ms: at,
        manual: false,
        claim_until_ms: until,
        advance: Some((Some(at), Some(next))),
        decided: None,
    }
}

async fn a_firing_is_claimed_once_and_moves_the_schedule_on(store: TestStore) -> TestResult {
    store.create_schedule(&nightly(1_000)).await?;
    assert!(
        store.create_schedule(&nightly(1_000)).await.is_err(),
        "the name is taken"
    );
    assert_eq!(store.due_schedules(999).await?.len(), 0);
    assert_eq!(store.due_schedules(1_000).await?.len(), 1);
    let (a, b) = (DaemonId::new(), DaemonId::new());
    assert!(
        store
            .claim_firing("alice", &claim(1_000, 2_000, 9_000), a)
            .await?
    );
    // The second daemon read the same due time: the schedule has moved on, nothing is claimed.
    assert!(
        !store
            .claim_firing("alice", &claim(1_000, 2_000, 9_000), b)
            .await?
    );
    let s = store
        .schedule("alice", "nightly")
        .await?
        .ok_or("not stored")?;
    assert_eq!(s.next_fire_at_ms, Some(2_000));
    assert_eq!(store.due_schedules(1_500).await?.len(), 0);
    let outcome = FiringOutcome {
        state: FiringState::Fired,
        session_id: None,
        batch_id: Some(forkd_core::BatchId::new()),
        reason: None,
    };
    store
        .finish_firing("alice", "nightly", 1_000, &outcome)
        .await?;
    let firings = store.firings("alice", "nightly", 10).await?;
    assert_eq!(firings.len(), 1);
    assert_eq!(firings[0].state, FiringState::Fired);
    assert_eq!(firings[0].batch_id, outcome.batch_id);
    // Another tenant has none of it.
    assert!(store.schedule("bob", "nightly").await?.is_none());
    assert!(store.firings("bob", "nightly", 10).await?.is_empty());
    assert!(!store.delete_schedule("bob", "nightly").await?);
    assert!(store.delete_schedule("alice", "nightly").await?);
    assert!(store.firings("alice", "nightly", 10).await?.is_empty());
    Ok(())
}

async fn a_lapsed_claim_is_taken_over_once(store: TestStore) -> TestResult {
    store.create_schedule(&nightly(1_000)).await?;
    let (a, b, c) = (DaemonId::new(), DaemonId::new(), DaemonId::new());
    // Claimed until 5000 on the daemons' clock, and never finished (its daemon died).
    assert!(
        store
            .claim_firing("alice", &claim(1_000, 2_000, 5_000), a)
            .await?
    );
    assert!(store.stale_firings(4_000).await?.is_empty());
    let stale = store.stale_firings(6_000).await?;
    assert_eq!(stale.len(), 1);
    assert_eq!(stale[0].0, "alice");
    assert_eq!(stale[0].1.state, FiringState::Firing);
    // Claims are compared with the store's clock, past 5000: one of two daemons takes it over.
    let later = i64::MAX / 2;
    let first = store
        .reclaim_firing("alice", "nightly", 1_000, b, later)
        .await?;
    let second = store
        .reclaim_firing("alice", "nightly", 1_000, c, later)
        .await?;
    assert!(first && !second, "{first} {second}");
    Ok(())
}
