//! Leases between daemons on one database: a claim makes its daemon the running agent's holder
//! until its lease expires; the holder renews it by heartbeat; another daemon may claim the
//! agent only once it has expired (adoption); kills asked through another daemon reach the
//! holder at its next heartbeat.
//!
//! Each test plays several daemons with several stores on one database. Waits for a lease to
//! expire sleep for three times a short lease; the checks that a lease still holds use a long
//! one, so that no check depends on how fast the machine is.

mod support;

use std::time::Duration;

use forkd_core::{AgentState, Block, Message};
use forkd_store::StoreError;
use support::{Backend, TestResult, TestStore, conformance, main_loop, seeded};

conformance!(
    a_running_agent_is_held_by_its_daemon_until_its_lease_expires,
    new_agents_are_held_by_the_daemon_that_created_them,
    the_heartbeat_renews_leases_and_brings_kills_asked_elsewhere,
    a_kill_of_an_agent_no_daemon_holds_is_left_to_whoever_records_it,
    an_idle_main_loop_is_claimed_by_any_daemon_and_a_cancel_ends_with_its_turn,
    pending_children_are_taken_by_other_daemons_once_their_gate_opens,
    a_throttled_first_child_keeps_its_gate_shut_past_the_timeout,
    a_sqlite_database_opened_again_ends_its_earlier_holders_leases,
    an_isolated_batchs_pending_children_stay_with_their_daemon,
    an_uploaded_sessions_pending_children_stay_with_their_daemon,
);

/// Long enough that no machine, however loaded, lets it expire within a test.
const LONG: Duration = Duration::from_secs(600);
/// Short enough to wait out.
const SHORT: Duration = Duration::from_millis(100);

async fn expire(lease: Duration) {
    tokio::time::sleep(3 * lease).await;
}

async fn a_running_agent_is_held_by_its_daemon_until_its_lease_expires(
    store: TestStore,
) -> TestResult {
    // Every daemon opens the database first: on SQLite, opening it ends the leases before.
    let a = store.daemon_with_lease(LONG).await?;
    let b = store.daemon_with_lease(LONG).await?;
    let c = store.daemon_with_lease(SHORT).await?;
    let (_, fx) = seeded(&*a, 1).await?;
    let (_, theirs) = seeded(&*c, 1).await?;
    let (one, two) = (fx.children[0].agent.id, theirs.children[0].agent.id);

    // A runs `one`: B can neither claim nor adopt it.
    let lease = a.claim_agent(one).await?;
    let held = b.claim_agent(one).await;
    assert!(
        matches!(held, Err(StoreError::Held { agent, daemon }) if agent == one && daemon == a.holder().daemon),
        "{held:?}"
    );
    assert!(!b.adoptable_agents().await?.iter().any(|x| x.id == one));
    let agent = b.get_agent(one).await?.ok_or("agent missing")?;
    assert_eq!(agent.held_by, Some(a.holder().daemon));
    assert_eq!(agent.state, AgentState::Running);
    // Its own daemon claims it again (a handoff's new run): a new generation.
    let again = a.claim_agent(one).await?;
    assert!(again.generation > lease.generation);

    // C runs `two` under a short lease and stops renewing (it died): B adopts it, and C's run is
    // fenced.
    let dead = c.claim_agent(two).await?;
    expire(SHORT).await;
    let adoptable = b.adoptable_agents().await?;
    assert!(adoptable.iter().any(|x| x.id == two), "{adoptable:?}");
    assert!(!adoptable.iter().any(|x| x.id == one));
    let adopted = b.claim_agent(two).await?;
    assert!(adopted.generation > dead.generation);
    let write = c
        .append_agent_message(&dead, &Message::assistant(vec![Block::text("late")]))
        .await;
    assert!(
        matches!(write, Err(StoreError::Superseded { .. })),
        "{write:?}"
    );
    let agent = a.get_agent(two).await?.ok_or("agent missing")?;
    assert_eq!(agent.held_by, Some(b.holder().daemon));
    Ok(())
}

async fn new_agents_are_held_by_the_daemon_that_created_them(store: TestStore) -> TestResult {
    let a = store.daemon_with_lease(LONG).await?;
    let b = store.daemon_with_lease(LONG).await?;
    let c = store.daemon_with_lease(SHORT).await?;
    let (session, fx) = seeded(&*a, 2).await?;
    for child in &fx.children {
        let agent = b.get_agent(child.agent.id).await?.ok_or("agent missing")?;
        assert_eq!(agent.held_by, Some(a.holder().daemon));
        assert_eq!(agent.state, AgentState::Pending);
    }
    // Pending, held: nobody adopts or claims them while their creator renews.
    assert!(b.adoptable_agents().await?.is_empty());
    let first = fx.children[0].agent.id;
    let refused = b.claim_agent(first).await;
    assert!(
        matches!(refused, Err(StoreError::Held { .. })),
        "{refused:?}"
    );

    // A daemon that dies with agents it created but never ran: they are adopted.
    let typed = support::typed(&session, forkd_core::ReportTo::Transcript);
    c.insert_agent(&typed, None, None).await?;
    assert_eq!(
        b.get_agent(typed.id).await?.and_then(|x| x.held_by),
        Some(c.holder().daemon)
    );
    expire(SHORT).await;
    let adoptable = b.adoptable_agents().await?;
    assert_eq!(
        adoptable.iter().map(|x| x.id).collect::<Vec<_>>(),
        vec![typed.id]
    );
    // The main loop, idle, is never adoptable: no turn of it is running.
    let parent = main_loop(&session);
    c.insert_agent(&parent, None, None).await?;
    expire(SHORT).await;
    assert!(
        !b.adoptable_agents()
            .await?
            .iter()
            .any(|x| x.id == parent.id)
    );
    Ok(())
}

async fn the_heartbeat_renews_leases_and_brings_kills_asked_elsewhere(
    store: TestStore,
) -> TestResult {
    // A's lease is short, but it renews: past its first lease, B still cannot adopt its agents.
    let lease = Duration::from_secs(1);
    let a = store.daemon_with_lease(lease).await?;
    let b = store.daemon_with_lease(LONG).await?;
    let (_, fx) = seeded(&*a, 2).await?;
    let [one, two] = [0, 1].map(|i| fx.children[i].agent.id);
    a.claim_agent(one).await?;
    let started = std::time::Instant::now();
    while started.elapsed() < lease + lease / 2 {
        let renewal = a.renew_leases().await?;
        // `one` running, `two` pending: both held by A.
        assert_eq!(renewal.renewed, 2);
        assert!(renewal.kills.is_empty());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.renew_leases().await?;
    assert!(b.adoptable_agents().await?.is_empty());
    assert!(matches!(
        b.claim_agent(one).await,
        Err(StoreError::Held { .. })
    ));
    // A kill asked through B: B learns who holds the agent, A learns it at its next heartbeat,
    // and any later claim can see it.
    assert!(!b.kill_requested(one).await?);
    let holder = b.request_kill(one).await?;
    assert_eq!(holder, Some(a.holder().daemon));
    assert!(b.kill_requested(one).await?);
    assert!(!b.kill_requested(two).await?);
    let renewal = a.renew_leases().await?;
    assert_eq!(renewal.kills, vec![one]);
    // B renews nothing: it holds nothing.
    assert_eq!(b.renew_leases().await?, Default::default());
    Ok(())
}

async fn a_kill_of_an_agent_no_daemon_holds_is_left_to_whoever_records_it(
    store: TestStore,
) -> TestResult {
    let b = store.daemon_with_lease(LONG).await?;
    let c = store.daemon_with_lease(SHORT).await?;
    let (_, fx) = seeded(&*c, 1).await?;
    let child = &fx.children[0].agent;
    c.claim_agent(child.id).await?;
    expire(SHORT).await;
    // C is gone: nobody holds the agent, so the daemon asked records the kill itself.
    assert_eq!(b.request_kill(child.id).await?, None);
    assert!(b.kill_requested(child.id).await?);
    // An agent that ended cannot be killed.
    let lease = b.claim_agent(child.id).await?;
    store
        .finish_agent(
            &lease,
            &support::ended(child, forkd_core::NotificationStatus::Killed, 7),
            Some("killed"),
        )
        .await?;
    let late = b.request_kill(child.id).await;
    assert!(matches!(late, Err(StoreError::Conflict(_))), "{late:?}");
    Ok(())
}

async fn an_idle_main_loop_is_claimed_by_any_daemon_and_a_cancel_ends_with_its_turn(
    store: TestStore,
) -> TestResult {
    let a = store.daemon_with_lease(LONG).await?;
    let b = store.daemon_with_lease(LONG).await?;
    let (session, _) = seeded(&*a, 1).await?;
    let parent = main_loop(&session);
    a.insert_agent(&parent, None, None).await?;

    // A turn on A: B cannot start one (one turn per session, across daemons).
    let turn = a.claim_agent(parent.id).await?;
    let busy = b.claim_agent(parent.id).await;
    assert!(matches!(busy, Err(StoreError::Held { .. })), "{busy:?}");
    // A cancel asked through B reaches A; it ends with the turn.
    assert_eq!(b.request_kill(parent.id).await?, Some(a.holder().daemon));
    assert_eq!(a.renew_leases().await?.kills, vec![parent.id]);
    a.end_turn(&turn, None).await?;
    assert!(!b.kill_requested(parent.id).await?);
    assert!(a.renew_leases().await?.kills.is_empty());

    // Idle: the next turn may run on B, though A's lease has not expired.
    let next = b.claim_agent(parent.id).await?;
    assert!(next.generation > turn.generation);
    let agent = a.get_agent(parent.id).await?.ok_or("agent missing")?;
    assert_eq!(agent.held_by, Some(b.holder().daemon));
    Ok(())
}

async fn a_sqlite_database_opened_again_ends_its_earlier_holders_leases(
    store: TestStore,
) -> TestResult {
    if store.backend() != Backend::Sqlite {
        // On PostgreSQL opening proves nothing: other daemons may be alive on the database.
        let a = store.daemon_with_lease(LONG).await?;
        let (_, fx) = seeded(&*a, 1).await?;
        a.claim_agent(fx.children[0].agent.id).await?;
        let b = store.daemon_with_lease(LONG).await?;
        assert!(b.adoptable_agents().await?.is_empty());
        return Ok(());
    }
    // SQLite is one daemon's database (its home's socket admits one): a daemon that opens it
    // takes over whatever its predecessor was running.
    let a = store.daemon_with_lease(LONG).await?;
    let (_, fx) = seeded(&*a, 1).await?;
    let child = fx.children[0].agent.id;
    a.claim_agent(child).await?;
    let b = store.daemon_with_lease(LONG).await?;
    let adoptable = b.adoptable_agents().await?;
    assert_eq!(
        adoptable.iter().map(|x| x.id).collect::<Vec<_>>(),
        vec![child]
    );
    b.claim_agent(child).await?;
    Ok(())
}

async fn pending_children_are_taken_by_other_daemons_once_their_gate_opens(
    store: TestStore,
) -> TestResult {
    let a = store.daemon_with_lease(LONG).await?;
    let b = store.daemon_with_lease(LONG).await?;
    let c = store.daemon_with_lease(LONG).await?;
    let fx = batch_now(&*a, 4).await?;
    let ids: Vec<_> = fx.children.iter().map(|x| x.agent.id).collect();

    // Gated: child 1 has not started; nobody else takes its siblings.
    assert!(b.take_pending(10, LONG, SHORT).await?.is_empty());
    a.claim_agent(ids[0]).await?;
    b.open_gate(fx.batch.id).await?;
    b.open_gate(fx.batch.id).await?;

    // Just opened: A's own runs are about to claim them; nobody takes them yet.
    assert!(b.take_pending(10, LONG, LONG).await?.is_empty());
    // Still pending a while after: queued behind A's cap. B takes two, C the rest, in index
    // order; none twice, never the running one.
    expire(SHORT).await;
    assert_eq!(b.take_pending(2, LONG, SHORT).await?, ids[1..3]);
    assert_eq!(c.take_pending(10, LONG, SHORT).await?, ids[3..]);
    assert!(b.take_pending(10, LONG, SHORT).await?.is_empty());
    // The creator finds them held by the daemons that took them; they run there.
    let held = a.claim_agent(ids[1]).await;
    assert!(matches!(held, Err(StoreError::Held { daemon, .. }) if daemon == b.holder().daemon));
    b.claim_agent(ids[1]).await?;
    let taken = c.get_agent(ids[3]).await?.ok_or("agent missing")?;
    assert_eq!(taken.held_by, Some(c.holder().daemon));
    assert_eq!(taken.state, AgentState::Running);

    // A gate that never opened stops holding the children back after the timeout.
    let late = batch_now(&*a, 2).await?;
    assert!(b.take_pending(10, LONG, SHORT).await?.is_empty());
    expire(SHORT).await;
    let taken = b.take_pending(10, SHORT, SHORT).await?;
    assert_eq!(taken.len(), 2, "{taken:?}");
    assert!(taken.contains(&late.children[0].agent.id));
    Ok(())
}

async fn a_throttled_first_child_keeps_its_gate_shut_past_the_timeout(
    store: TestStore,
) -> TestResult {
    let a = store.daemon_with_lease(LONG).await?;
    let b = store.daemon_with_lease(LONG).await?;
    let fx = batch_now(&*a, 3).await?;
    let ids: Vec<_> = fx.children.iter().map(|x| x.agent.id).collect();
    a.claim_agent(ids[0]).await?;
    // Child 1 is refused by the provider's limits and waits; every daemon sees it.
    let since = fx.batch.created_at_ms + 1;
    a.set_throttled(ids[0], Some(since)).await?;
    let first = b.get_agent(ids[0]).await?.ok_or("agent missing")?;
    assert_eq!(
        (first.state, first.throttled_since_ms),
        (AgentState::Running, Some(since))
    );
    // Past the gate's timeout, while child 1 is only throttled, its siblings stay put.
    expire(SHORT).await;
    assert!(b.take_pending(10, SHORT, SHORT).await?.is_empty());
    // Its request went through (or failed): the timeout releases them again.
    a.set_throttled(ids[0], None).await?;
    let first = b.get_agent(ids[0]).await?.ok_or("agent missing")?;
    assert_eq!(first.throttled_since_ms, None);
    assert_eq!(b.take_pending(10, SHORT, SHORT).await?, ids[1..]);
    Ok(())
}

/// A session with one batch of `n` children created now (the gate's timeout counts from the
/// batch's creation).
async fn batch_now(store: &dyn forkd_store::Store, n: usize) -> TestResult<support::Fixture> {
    batch_now_with(store, n, false).await
}

/// [`batch_now`], isolated (`isolation: copy`) when `isolated`.
async fn batch_now_with(
    store: &dyn forkd_store::Store,
    n: usize,
    isolated: bool,
) -> TestResult<support::Fixture> {
    let mut session = support::session()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    // The fixture's batch is created 2 s after its session: a few seconds ago, all told.
    session.created_at_ms = i64::try_from(now)? - 10_000;
    let history = support::history()?;
    store.create_session(&session, &history, None).await?;
    let fx = support::fork(&session, u64::try_from(history.len())?, n)?;
    let snapshot = forkd_core::isolation::BatchSnapshot {
        batch_id: fx.batch.id,
        dir: "/var/lib/forkd/isolation/snapshot".into(),
        agents: None,
        git_ref: None,
        git_commit: None,
        files: 1,
        bytes: 1,
        took_ms: 1,
        created_at_ms: fx.batch.created_at_ms,
    };
    store
        .create_fork_batch(
            &fx.batch,
            std::slice::from_ref(&fx.parent_results),
            &fx.children,
            &forkd_store::BatchExtras {
                snapshot: isolated.then_some(&snapshot),
                ..forkd_store::BatchExtras::default()
            },
        )
        .await?;
    Ok(fx)
}

/// An isolated batch's children run where its snapshot is: another daemon never takes them.
async fn an_isolated_batchs_pending_children_stay_with_their_daemon(
    store: TestStore,
) -> TestResult {
    let a = store.daemon_with_lease(LONG).await?;
    let b = store.daemon_with_lease(LONG).await?;
    let fx = batch_now_with(&*a, 3, true).await?;
    let ids: Vec<_> = fx.children.iter().map(|x| x.agent.id).collect();
    a.claim_agent(ids[0]).await?;
    b.open_gate(fx.batch.id).await?;
    expire(SHORT).await;
    assert!(b.take_pending(10, LONG, SHORT).await?.is_empty());
    a.claim_agent(ids[1]).await?;
    Ok(())
}

/// An uploaded session's files are in its daemon's `workspaces_dir`: its pending children wait
/// for a slot there, as an isolated batch's do.
async fn an_uploaded_sessions_pending_children_stay_with_their_daemon(
    store: TestStore,
) -> TestResult {
    let a = store.daemon_with_lease(LONG).await?;
    let b = store.daemon_with_lease(LONG).await?;
    let fx = batch_now(&*a, 3).await?;
    let origin = forkd_core::upload::Origin {
        upload_id: forkd_core::UploadId::new(),
        files: 1,
        bytes: 1,
        git_commit: None,
    };
    a.record_session_origin(fx.batch.session_id, &origin)
        .await?;
    let ids: Vec<_> = fx.children.iter().map(|x| x.agent.id).collect();
    a.claim_agent(ids[0]).await?;
    b.open_gate(fx.batch.id).await?;
    expire(SHORT).await;
    assert!(b.take_pending(10, LONG, SHORT).await?.is_empty());
    a.claim_agent(ids[1]).await?;
    Ok(())
}
