//! Figure 18, webhooks: how long a notification takes to reach a receiver — from the
//! notification's time (its `created_at`, set in the transaction that commits it and its
//! outbox rows) to the signed `POST` arriving at a receiver on loopback, which verifies each
//! signature — over batches of children ending at sim speed 0, through a real daemon.

use std::time::{Duration, Instant, UNIX_EPOCH};

use anyhow::Context as _;
use forkd::daemon::{self, DaemonConfig};
use forkd_engine::Engine;
use forkd_proto::v1 as pb;
use forkd_store::NotificationFilter;
use forkd_test_support::receiver::Receiver;
use serde_json::json;

use crate::common::{self, Ctx};
use crate::overhead::connect;
use crate::report::{Section, Table};

/// Children per batch.
const BATCH: usize = 100;

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    let total = if ctx.quick { 200 } else { 1000 };
    let home = ctx.tempdir("forkd-bench-webhooks-")?;
    let ws = ctx.tempdir("forkd-bench-ws-")?;
    let mut config = DaemonConfig::new(home.path().to_path_buf());
    config.sim_speed = 0.0;
    // The receiver is on loopback.
    config.engine.webhooks.allow_private = true;
    let daemon = daemon::start(config).await?;
    let receiver = Receiver::start().await?;
    let outcome = measure(&daemon.engine, &daemon.addr(), ws.path(), &receiver, total).await;
    daemon.shutdown(Duration::from_secs(5)).await?;
    let (latencies, all_verified, per_id_once) = outcome?;
    let (p50, p99) = (
        common::quantile(&latencies, 0.5),
        common::quantile(&latencies, 0.99),
    );
    let max = latencies.iter().copied().fold(0.0, f64::max);
    let mut table = Table::new(
        format!(
            "{total} notifications ({} batches of {BATCH} children, sim speed 0)",
            total / BATCH
        ),
        &["path", "p50", "p99", "max"],
    );
    table.row(vec![
        "notification → signed POST at the receiver".into(),
        format!("{p50:.1} ms"),
        format!("{p99:.1} ms"),
        format!("{max:.1} ms"),
    ]);
    Ok(Section {
        id: "webhooks",
        title: "18. Webhooks: a notification pushed to a receiver".into(),
        compared_with: "a subscriber's stream (figure 5), which needs a client that stays \
                        connected"
            .into(),
        tables: vec![table],
        notes: vec![
            format!(
                "Every delivery's signature verified with the Standard Webhooks library: \
                 {all_verified}; each notification taken once per `webhook-id`: {per_id_once}."
            ),
            "The delivery loop wakes on each committed notification (and once a second), claims \
             what is due in one statement and posts each in a task of its own; a notification's \
             time is taken before its commit, so the figure includes the commit."
                .into(),
        ],
        checks: Vec::new(),
        data: json!({ "latency_ms": latencies, "p50_ms": p50, "p99_ms": p99 }),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Latencies in ms, whether every signature verified, whether each notification came once.
async fn measure(
    engine: &Engine,
    addr: &str,
    workspace: &std::path::Path,
    receiver: &Receiver,
    total: usize,
) -> anyhow::Result<(Vec<f64>, bool, bool)> {
    let mut client = connect(addr).await?;
    let created = client
        .create_webhook(pb::CreateWebhookRequest {
            url: receiver.url("/hook"),
            ..Default::default()
        })
        .await?
        .into_inner();
    receiver.trust(&[&created.secret]);
    let session = client
        .create_session(pb::CreateSessionRequest {
            system_prompt: common::SYSTEM_PROMPT.into(),
            workspace: workspace.display().to_string(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .session
        .context("no session")?;
    for b in 0..total / BATCH {
        eprintln!("  webhooks: batch {} of {}", b + 1, total / BATCH);
        let since = engine.store().last_notification_seq().await?;
        let directives = (0..BATCH)
            .map(|i| pb::Directive {
                description: format!("Part {i}"),
                prompt: format!("Review part {i}."),
                ..Default::default()
            })
            .collect();
        let batch = client
            .fork_batch(pb::ForkBatchRequest {
                session_id: session.session_id.clone(),
                directives,
                ..Default::default()
            })
            .await?
            .into_inner();
        let filter = NotificationFilter {
            batch_id: Some(batch.batch_id.parse()?),
            ..NotificationFilter::default()
        };
        common::wait_notifications(engine, since, filter, BATCH).await?;
    }
    let deadline = Instant::now() + common::WAIT_LIMIT;
    while receiver.taken_ids().len() < total {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the receiver took {} of {total} deliveries",
            receiver.taken_ids().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let received = receiver.received();
    let mut latencies = Vec::with_capacity(received.len());
    for r in &received {
        let stamp = r.body["timestamp"].as_str().context("a timestamp")?;
        let sent = humantime::parse_rfc3339(stamp)?;
        let ms = r.at_wall.duration_since(UNIX_EPOCH)?.as_secs_f64() * 1000.0
            - sent.duration_since(UNIX_EPOCH)?.as_secs_f64() * 1000.0;
        latencies.push(ms);
    }
    let verified = received.iter().all(|r| r.verified);
    Ok((latencies, verified, received.len() == total))
}
