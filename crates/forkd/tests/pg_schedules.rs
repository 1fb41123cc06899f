//! Schedules with several daemons on one PostgreSQL database: both run the clock, and each
//! firing is claimed by one of them, so each fire time has one firing, one session and one
//! batch. The database is a fresh one on the server `FORKD_TEST_DATABASE_URL` names, dropped at
//! the end; without that variable the test says so and passes, unless `CI` is set.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_test_support::{directives, eventually, session_request};

mod binary;
mod pg;

use pg::with_scratch_database;

#[tokio::test]
async fn two_daemons_fire_each_time_once() {
    with_scratch_database(fire_across_daemons).await;
}

async fn fire_across_daemons(url: String) {
    let env = [("FORKD_DATABASE_URL", url.as_str()), ("FORKD_LEASE", "1s")];
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let workspace = tempfile::tempdir().unwrap();
    let _a = binary::Daemon::start_with(home_a.path(), "0", &env);
    let _b = binary::Daemon::start_with(home_b.path(), "0", &env);
    let mut on_a = binary::client(home_a.path()).await;
    let on_b = binary::client(home_b.path()).await;
    on_a.create_schedule(pb::CreateScheduleRequest {
        name: "every2".into(),
        cron: "*/2 * * * * *".into(),
        spec: Some(pb::ScheduleSpec {
            session: Some(session_request(workspace.path())),
            batch: Some(pb::ForkBatchRequest {
                directives: directives(&["Hi."]),
                ..Default::default()
            }),
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    let fired = eventually(Duration::from_secs(30), "four firings", || async {
        let s = on_b
            .clone()
            .get_schedule(pb::ScheduleNameRequest {
                name: "every2".into(),
            })
            .await
            .ok()?
            .into_inner()
            .schedule?;
        let fired: Vec<pb::ScheduleFiring> = s
            .firings
            .into_iter()
            .filter(|f| f.state == "fired")
            .collect();
        (fired.len() >= 4).then_some(fired)
    })
    .await;
    let times: BTreeSet<i64> = fired
        .iter()
        .map(|f| f.fire_time.as_ref().unwrap().seconds)
        .collect();
    let batches: BTreeSet<&str> = fired.iter().map(|f| f.batch_id.as_str()).collect();
    assert_eq!(times.len(), fired.len(), "one firing per time: {fired:?}");
    assert_eq!(
        batches.len(),
        fired.len(),
        "one batch per firing: {fired:?}"
    );
    // Each firing made one session, and nothing else made any: no daemon made a second one for
    // a time another fired.
    let sessions = on_a
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sessions;
    let later = on_a
        .get_schedule(pb::ScheduleNameRequest {
            name: "every2".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .schedule
        .unwrap();
    let made: BTreeSet<&str> = later
        .firings
        .iter()
        .map(|f| f.session_id.as_str())
        .collect();
    assert!(
        sessions
            .iter()
            .all(|s| made.contains(s.session_id.as_str())),
        "{} sessions for {} firings",
        sessions.len(),
        later.firings.len()
    );
}
