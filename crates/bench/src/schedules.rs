//! Figure 19, schedules: how late a firing's batch is — from the time a schedule was due to the
//! firing recorded with its batch committed (its session created from the spec, the batch
//! forked under the firing's key) — for a 6-field every-second schedule on a real daemon.

use std::time::{Duration, Instant};

use forkd::daemon::{self, DaemonConfig};
use forkd_core::schedule::FiringState;
use forkd_proto::v1 as pb;
use serde_json::json;

use crate::common::{self, Ctx};
use crate::overhead::connect;
use crate::report::{Section, Table};

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    let firings = if ctx.quick { 10 } else { 60 };
    let home = ctx.tempdir("forkd-bench-schedules-")?;
    let ws = ctx.tempdir("forkd-bench-ws-")?;
    let mut config = DaemonConfig::new(home.path().to_path_buf());
    config.sim_speed = 0.0;
    let daemon = daemon::start(config).await?;
    let outcome = async {
        let mut client = connect(&daemon.addr()).await?;
        client
            .create_schedule(pb::CreateScheduleRequest {
                name: "every-second".into(),
                cron: "* * * * * *".into(),
                spec: Some(pb::ScheduleSpec {
                    session: Some(pb::CreateSessionRequest {
                        system_prompt: common::SYSTEM_PROMPT.into(),
                        workspace: ws.path().display().to_string(),
                        ..Default::default()
                    }),
                    batch: Some(pb::ForkBatchRequest {
                        directives: (0..4)
                            .map(|i| pb::Directive {
                                description: format!("Part {i}"),
                                prompt: format!("Review part {i}."),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            })
            .await?;
        eprintln!("  schedules: {firings} firings, one a second");
        let store = daemon.engine.store().clone();
        let deadline = Instant::now() + Duration::from_secs(firings as u64 * 2 + 30);
        loop {
            let done = store.firings("local", "every-second", 1000).await?;
            let fired: Vec<_> = done
                .into_iter()
                .filter(|f| f.state == FiringState::Fired)
                .collect();
            if fired.len() >= firings {
                break anyhow::Ok(fired);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} of {firings} firings",
                fired.len()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    .await;
    daemon.shutdown(Duration::from_secs(5)).await?;
    let fired = outcome?;
    let late: Vec<f64> = fired
        .iter()
        .map(|f| (f.at_ms - f.fire_at_ms) as f64)
        .collect();
    let (p50, p99) = (common::quantile(&late, 0.5), common::quantile(&late, 0.99));
    let max = late.iter().copied().fold(0.0, f64::max);
    let mut table = Table::new(
        format!(
            "{} firings of `* * * * * *`, 4 children each, sim speed 0",
            fired.len()
        ),
        &["from", "p50", "p99", "max"],
    );
    table.row(vec![
        "due time → session and batch committed".into(),
        format!("{p50:.0} ms"),
        format!("{p99:.0} ms"),
        format!("{max:.0} ms"),
    ]);
    Ok(Section {
        id: "schedules",
        title: "19. Schedules: how late a firing's batch is".into(),
        compared_with: "the due time".into(),
        tables: vec![table],
        notes: vec![
            "The clock looks for due schedules every 100 ms; a firing claims its time, creates \
             its session from the stored spec and forks under the key \
             `schedule/NAME/<fire time>`, then records the batch. The figure is the due time to \
             that record."
                .into(),
        ],
        checks: Vec::new(),
        data: json!({ "late_ms": late, "p50_ms": p50, "p99_ms": p99 }),
        seconds: started.elapsed().as_secs_f64(),
    })
}
