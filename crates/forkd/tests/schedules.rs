//! Schedules (docs/operations.md, "Webhooks and schedules"): a run file's batch forked on a
//! clock, each firing in a session of its own under its idempotency key; trigger, pause and
//! resume; overlap `skip`; catch-up after a daemon stopped across firings; a tenant's own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use std::time::Duration;

use forkd_core::schedule::FiringState;
use forkd_proto::v1 as pb;
use forkd_test_support::{
    Caller, TestDaemon, directives, eventually, session_request, spawn_tenants,
};

/// Every two seconds, one child that answers at once (or `prompt`).
fn every_two_seconds(
    name: &str,
    workspace: &std::path::Path,
    prompt: &str,
) -> pb::CreateScheduleRequest {
    pb::CreateScheduleRequest {
        name: name.to_owned(),
        cron: "*/2 * * * * *".into(),
        spec: Some(pb::ScheduleSpec {
            session: Some(session_request(workspace)),
            batch: Some(pb::ForkBatchRequest {
                directives: directives(&[prompt]),
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

async fn get(c: &mut Caller, name: &str) -> pb::Schedule {
    let request = c.req(pb::ScheduleNameRequest {
        name: name.to_owned(),
    });
    c.client
        .get_schedule(request)
        .await
        .unwrap()
        .into_inner()
        .schedule
        .unwrap()
}

async fn create(c: &mut Caller, req: pb::CreateScheduleRequest) -> pb::Schedule {
    let request = c.req(req);
    c.client
        .create_schedule(request)
        .await
        .unwrap()
        .into_inner()
        .schedule
        .unwrap()
}

fn now_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    i64::try_from(since.as_millis()).unwrap()
}

fn ms(t: &prost_types::Timestamp) -> i64 {
    t.seconds * 1000 + i64::from(t.nanos) / 1_000_000
}

async fn tenants() -> (TestDaemon, Caller, Caller) {
    let (daemon, mut callers) = spawn_tenants(&["alpha", "beta"], |_| {}).await.unwrap();
    let (beta, _) = callers.pop().unwrap();
    let (alpha, _) = callers.pop().unwrap();
    (daemon, alpha, beta)
}

#[tokio::test]
async fn a_six_field_schedule_fires_every_two_seconds_each_firing_once() {
    let (daemon, mut alpha, mut beta) = tenants().await;
    let ws = daemon.tenant_workspace("alpha");
    let created = create(&mut alpha, every_two_seconds("every2", &ws, "Hi.")).await;
    assert_eq!(created.next_fires.len(), 5);
    let gaps: Vec<i64> = created
        .next_fires
        .windows(2)
        .map(|w| ms(&w[1]) - ms(&w[0]))
        .collect();
    assert_eq!(gaps, vec![2000; 4]);

    let fired = eventually(Duration::from_secs(30), "three firings", || async {
        let s = get(&mut alpha.clone(), "every2").await;
        let done: Vec<pb::ScheduleFiring> = s
            .firings
            .into_iter()
            .filter(|f| f.state == "fired" && f.completed == 1)
            .collect();
        (done.len() >= 3).then_some(done)
    })
    .await;
    let times: BTreeSet<i64> = fired
        .iter()
        .map(|f| ms(f.fire_time.as_ref().unwrap()))
        .collect();
    let batches: BTreeSet<&str> = fired.iter().map(|f| f.batch_id.as_str()).collect();
    let sessions: BTreeSet<&str> = fired.iter().map(|f| f.session_id.as_str()).collect();
    assert_eq!(times.len(), fired.len());
    assert!(times.iter().all(|t| t % 2000 == 0), "{times:?}");
    assert_eq!(batches.len(), fired.len(), "a batch per firing");
    assert_eq!(sessions.len(), fired.len(), "a session per firing");
    // Its notifications say which schedule forked them.
    let request = alpha.req(pb::SubscribeNotificationsRequest {
        batch_id: fired[0].batch_id.clone(),
        ..Default::default()
    });
    let mut stream = alpha
        .client
        .subscribe_notifications(request)
        .await
        .unwrap()
        .into_inner();
    let n = stream
        .message()
        .await
        .unwrap()
        .expect("the child's notification");
    assert_eq!(n.schedule, "every2");

    // Another tenant sees nothing of it.
    let request = beta.req(pb::ScheduleNameRequest {
        name: "every2".into(),
    });
    let err = beta.client.get_schedule(request).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    let listed = beta
        .client
        .list_schedules(beta.req(pb::ListSchedulesRequest {}))
        .await
        .unwrap();
    assert!(listed.into_inner().schedules.is_empty());
    // The name is taken.
    let request = alpha.req(every_two_seconds("every2", &ws, "Hi."));
    let err = alpha.client.create_schedule(request).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");

    // Paused, it fires no more (but a trigger does); resumed, it fires again.
    let request = alpha.req(pb::ScheduleNameRequest {
        name: "every2".into(),
    });
    let paused = alpha
        .client
        .pause_schedule(request)
        .await
        .unwrap()
        .into_inner();
    assert!(paused.schedule.unwrap().paused);
    let before = get(&mut alpha, "every2").await.firings.len();
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert_eq!(get(&mut alpha, "every2").await.firings.len(), before);
    let request = alpha.req(pb::ScheduleNameRequest {
        name: "every2".into(),
    });
    let triggered = alpha
        .client
        .trigger_schedule(request)
        .await
        .unwrap()
        .into_inner()
        .firing
        .unwrap();
    assert_eq!(triggered.state, "fired", "{triggered:?}");
    assert!(triggered.manual && !triggered.batch_id.is_empty());
    let request = alpha.req(pb::ScheduleNameRequest {
        name: "every2".into(),
    });
    alpha.client.resume_schedule(request).await.unwrap();
    eventually(
        Duration::from_secs(20),
        "a firing after resuming",
        || async {
            let s = get(&mut alpha.clone(), "every2").await;
            (s.firings.iter().filter(|f| !f.manual).count() > before).then_some(())
        },
    )
    .await;
    let request = alpha.req(pb::ScheduleNameRequest {
        name: "every2".into(),
    });
    alpha.client.delete_schedule(request).await.unwrap();
    let request = alpha.req(pb::ScheduleNameRequest {
        name: "every2".into(),
    });
    assert_eq!(
        alpha.client.get_schedule(request).await.unwrap_err().code(),
        tonic::Code::NotFound
    );
}

#[tokio::test]
async fn a_firing_while_the_previous_batch_runs_is_skipped() {
    let (daemon, mut alpha, _) = tenants().await;
    let ws = daemon.tenant_workspace("alpha");
    create(
        &mut alpha,
        every_two_seconds("stalls", &ws, "Talk.\n@sim stall"),
    )
    .await;
    let skipped = eventually(Duration::from_secs(30), "a skipped firing", || async {
        let s = get(&mut alpha.clone(), "stalls").await;
        s.firings.into_iter().find(|f| f.state == "skipped")
    })
    .await;
    assert!(skipped.reason.contains("still runs"), "{}", skipped.reason);
    let s = get(&mut alpha, "stalls").await;
    let fired: Vec<_> = s.firings.iter().filter(|f| f.state == "fired").collect();
    assert_eq!(fired.len(), 1, "{:?}", s.firings);
}

/// A tenant whose token is revoked has its schedule's firings skipped, saying why, and forks
/// nothing more; with a token of its name again, the schedule fires again.
#[tokio::test]
async fn a_revoked_tenant_s_schedule_stops_firing_until_it_has_a_token_again() {
    let (daemon, mut alpha, _) = tenants().await;
    let ws = daemon.tenant_workspace("alpha");
    create(&mut alpha, every_two_seconds("nightly", &ws, "Report.")).await;
    let engine = daemon.daemon().unwrap().engine.clone();
    let firings = || {
        let engine = engine.clone();
        async move {
            engine
                .store()
                .firings("alpha", "nightly", 64)
                .await
                .unwrap()
        }
    };
    eventually(Duration::from_secs(30), "a firing", || async {
        firings()
            .await
            .iter()
            .any(|f| f.state == FiringState::Fired)
            .then_some(())
    })
    .await;
    let tokens = forkd_server::TokenStore::in_home(daemon.home_path());
    tokens.revoke("alpha").unwrap();
    let revoked_at = now_ms();
    let skipped = eventually(Duration::from_secs(30), "a skipped firing", || async {
        firings()
            .await
            .into_iter()
            .find(|f| f.fire_at_ms > revoked_at && f.state == FiringState::Skipped)
    })
    .await;
    let reason = skipped.reason.unwrap_or_default();
    assert!(reason.contains("tenant alpha has no token"), "{reason}");
    // Nothing fired after the revocation (a firing claimed just before it may still end).
    let after: Vec<_> = firings()
        .await
        .into_iter()
        .filter(|f| f.fire_at_ms > revoked_at + 1_000)
        .filter(|f| f.state == FiringState::Fired)
        .collect();
    assert!(after.is_empty(), "{after:?}");
    tokens.create("alpha").unwrap();
    let again = now_ms();
    eventually(
        Duration::from_secs(30),
        "a firing with a token again",
        || async {
            firings()
                .await
                .iter()
                .any(|f| f.fire_at_ms > again && f.state == FiringState::Fired)
                .then_some(())
        },
    )
    .await;
}

/// Stopped across two firings and started again past them: `once` forks the latest of them,
/// `none` neither; both record what was missed.
#[tokio::test]
async fn missed_firings_run_once_after_downtime_or_not_at_all() {
    let (mut daemon, mut callers) = spawn_tenants(&["alpha"], |_| {}).await.unwrap();
    let (mut alpha, secret) = callers.pop().unwrap();
    let ws = daemon.tenant_workspace("alpha");
    // Two firings a minute, 4 s and 6 s from now: the daemon is down for both.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let cron = format!("{},{} * * * * *", (now + 4) % 60, (now + 6) % 60);
    for (name, catch_up) in [("once", "once"), ("none", "none")] {
        let mut req = every_two_seconds(name, &ws, "Hi.");
        req.cron.clone_from(&cron);
        req.catch_up = catch_up.into();
        create(&mut alpha, req).await;
    }
    daemon.stop().await.unwrap();
    tokio::time::sleep(Duration::from_secs(9)).await;
    daemon
        .restart(|c| c.listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0))))
        .await
        .unwrap();
    let alpha = Caller::new(&daemon, &secret).await.unwrap();
    let (once, none) = eventually(Duration::from_secs(20), "the catch-up", || async {
        let once = get(&mut alpha.clone(), "once").await.firings;
        let none = get(&mut alpha.clone(), "none").await.firings;
        let settled = |f: &[pb::ScheduleFiring]| {
            f.iter().any(|f| f.state == "skipped") && f.iter().all(|f| f.state != "firing")
        };
        (settled(&once) && settled(&none)).then_some((once, none))
    })
    .await;
    let first = (now + 4) as i64 * 1000;
    let second = (now + 6) as i64 * 1000;
    let at = |f: &pb::ScheduleFiring| ms(f.fire_time.as_ref().unwrap());
    let states = |firings: &[pb::ScheduleFiring]| {
        firings
            .iter()
            .map(|f| (at(f), f.state.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        states(&once),
        vec![(second, "fired".to_owned()), (first, "skipped".to_owned())],
        "{once:?}"
    );
    assert!(
        once[1].reason.contains("1 firing missed"),
        "{}",
        once[1].reason
    );
    assert_eq!(
        states(&none),
        vec![(first, "skipped".to_owned())],
        "{none:?}"
    );
    assert!(
        none[0].reason.contains("2 firings missed"),
        "{}",
        none[0].reason
    );
    assert!(
        none[0].reason.contains("catch-up: none"),
        "{}",
        none[0].reason
    );
}

/// A tenant has at most 256 schedules: the next is refused saying so; another tenant's count is
/// its own.
#[tokio::test]
async fn a_tenant_s_schedules_are_capped() {
    let (daemon, mut alpha, mut beta) = tenants().await;
    let ws = daemon.tenant_workspace("alpha");
    let yearly = |name: String| pb::CreateScheduleRequest {
        cron: "0 0 1 1 *".into(),
        ..every_two_seconds(&name, &ws, "Report.")
    };
    for i in 0..256 {
        create(&mut alpha, yearly(format!("s{i}"))).await;
    }
    let request = alpha.req(yearly("one-more".into()));
    let err = alpha.client.create_schedule(request).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message()
            .contains("has 256 schedules, the most a tenant may have"),
        "{}",
        err.message()
    );
    let beta_ws = daemon.tenant_workspace("beta");
    create(
        &mut beta,
        pb::CreateScheduleRequest {
            cron: "0 0 1 1 *".into(),
            ..every_two_seconds("beta-s", &beta_ws, "Report.")
        },
    )
    .await;
}
