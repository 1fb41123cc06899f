//! Figure 5, notifications: end-to-end latency with 100 subscribers, from an agent's end to each
//! subscriber receiving its notification, through the engine's `subscribe` and through gRPC.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use forkd::daemon::{self, DaemonConfig};
use forkd_core::session::Session;
use forkd_engine::Engine;
use forkd_proto::v1 as pb;
use forkd_store::NotificationFilter;
use futures::StreamExt;
use serde_json::json;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::common::{self, Corpus, Ctx};
use crate::overhead::connect;
use crate::report::{Check, Section, Table};

const SUBSCRIBERS: usize = 100;
/// gRPC subscribers share this many connections (HTTP/2 streams on each).
const CONNECTIONS: usize = 10;

/// One notification received by one subscriber.
struct Delivery {
    subscriber: usize,
    seq: u64,
    created_ms: i64,
    /// Wall clock at receipt, µs since the epoch (comparable with `created_ms`).
    recv_wall_us: i64,
    recv: Instant,
}

#[derive(Default)]
struct Collector {
    deliveries: Mutex<Vec<Delivery>>,
    count: AtomicUsize,
    notify: Notify,
}

impl Collector {
    fn record(&self, subscriber: usize, seq: u64, created_ms: i64) {
        let recv = Instant::now();
        let recv_wall_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        self.deliveries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Delivery {
                subscriber,
                seq,
                created_ms,
                recv_wall_us,
                recv,
            });
        self.count.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    async fn wait_for(&self, n: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + common::WAIT_LIMIT;
        loop {
            let notified = self.notify.notified();
            if self.count.load(Ordering::SeqCst) >= n {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "subscribers received {} of {n} notifications",
                    self.count.load(Ordering::SeqCst)
                );
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
    }

    /// How many subscribers did not receive exactly the notifications in `range`, each once and
    /// in order.
    fn incomplete(&self, range: std::ops::RangeInclusive<u64>) -> usize {
        let all = self.deliveries.lock().unwrap_or_else(|p| p.into_inner());
        let expected: Vec<u64> = range.collect();
        (0..SUBSCRIBERS)
            .filter(|s| {
                let got: Vec<u64> = all
                    .iter()
                    .filter(|d| d.subscriber == *s)
                    .map(|d| d.seq)
                    .collect();
                got != expected
            })
            .count()
    }

    /// Latency figures (ms) of the deliveries with `seq` in `range`: the end→receipt upper bound
    /// and the spread after the first subscriber's receipt.
    fn figures(&self, range: std::ops::RangeInclusive<u64>) -> (Vec<f64>, Vec<f64>) {
        let all = self.deliveries.lock().unwrap_or_else(|p| p.into_inner());
        let mut first: std::collections::HashMap<u64, Instant> = std::collections::HashMap::new();
        for d in all.iter().filter(|d| range.contains(&d.seq)) {
            first
                .entry(d.seq)
                .and_modify(|t| *t = (*t).min(d.recv))
                .or_insert(d.recv);
        }
        let mut end_to_recv = Vec::new();
        let mut spread = Vec::new();
        for d in all.iter().filter(|d| range.contains(&d.seq)) {
            end_to_recv.push((d.recv_wall_us - d.created_ms * 1000) as f64 / 1000.0);
            if let Some(t) = first.get(&d.seq) {
                spread.push(common::ms(d.recv - *t));
            }
        }
        (end_to_recv, spread)
    }
}

/// Subscribers through the engine.
async fn engine_subscribers(
    engine: &Engine,
    since: u64,
    collector: &Arc<Collector>,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let mut tasks = Vec::new();
    for i in 0..SUBSCRIBERS {
        let mut stream = engine
            .subscribe(since, NotificationFilter::default(), true)
            .await?;
        let c = collector.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(Ok(n)) = stream.next().await {
                c.record(i, n.seq, n.created_at_ms);
            }
        }));
    }
    Ok(tasks)
}

/// Subscribers through the daemon's gRPC service, over its Unix socket.
async fn grpc_subscribers(
    addr: &str,
    since: u64,
    collector: &Arc<Collector>,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let mut clients = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        clients.push(connect(addr).await?);
    }
    let mut tasks = Vec::new();
    for i in 0..SUBSCRIBERS {
        let mut client = clients[i % CONNECTIONS].clone();
        let mut stream = client
            .subscribe_notifications(pb::SubscribeNotificationsRequest {
                since_seq: since,
                follow: true,
                ..Default::default()
            })
            .await?
            .into_inner();
        let c = collector.clone();
        tasks.push(tokio::spawn(async move {
            while let Ok(Some(n)) = stream.message().await {
                let created_ms = n
                    .created_at
                    .map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000)
                    .unwrap_or(0);
                c.record(i, n.seq, created_ms);
            }
        }));
    }
    Ok(tasks)
}

struct Phases {
    single: std::ops::RangeInclusive<u64>,
    burst: std::ops::RangeInclusive<u64>,
}

/// Single-child batches one at a time, then one burst batch, each waited for at every
/// subscriber.
async fn drive(
    engine: &Engine,
    session: &Session,
    since: u64,
    collector: &Collector,
    singles: usize,
    burst: usize,
) -> anyhow::Result<Phases> {
    for i in 0..singles {
        common::fork_and_wait(engine, session, 1, true).await?;
        collector.wait_for(SUBSCRIBERS * (i + 1)).await?;
    }
    common::fork_and_wait(engine, session, burst, true).await?;
    collector.wait_for(SUBSCRIBERS * (singles + burst)).await?;
    let s = since + singles as u64;
    Ok(Phases {
        single: since + 1..=s,
        burst: s + 1..=s + burst as u64,
    })
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    let (singles, burst) = if ctx.quick { (30, 50) } else { (100, 100) };
    let corpus = Corpus::generate(11_000);
    let home = ctx.tempdir("forkd-bench-notify-")?;
    let ws = ctx.tempdir("forkd-bench-ws-")?;
    let daemon = daemon::start(DaemonConfig::new(home.path().to_path_buf())).await?;
    let outcome = async {
        let engine = &daemon.engine;
        let context = corpus.context(10_000 - common::prefix_overhead(ws.path(), 1).await?);
        let session = engine
            .create_session(common::new_session(ws.path(), &context))
            .await?;
        let mut results = Vec::new();
        for path in ["engine `subscribe`", "gRPC `SubscribeNotifications`"] {
            eprintln!("  notifications: {SUBSCRIBERS} subscribers through {path}");
            let since = engine.store().last_notification_seq().await?;
            let collector = Arc::new(Collector::default());
            let tasks = if path.starts_with("engine") {
                engine_subscribers(engine, since, &collector).await?
            } else {
                grpc_subscribers(&daemon.addr(), since, &collector).await?
            };
            let phases = drive(engine, &session, since, &collector, singles, burst).await;
            for t in &tasks {
                t.abort();
            }
            let phases = phases?;
            let incomplete = collector.incomplete(*phases.single.start()..=*phases.burst.end());
            results.push((
                path,
                collector.figures(phases.single),
                collector.figures(phases.burst),
                incomplete,
            ));
        }
        anyhow::Ok(results)
    }
    .await;
    daemon.shutdown(Duration::from_secs(5)).await?;
    let results = outcome?;

    let mut t = Table::new(
        format!(
            "{SUBSCRIBERS} subscribers, all notifications; a 10k-token session on the sim at \
             speed 0. One at a time: {singles} single-child batches, each delivered to every \
             subscriber before the next. Burst: one batch of {burst} children."
        ),
        &[
            "path",
            "load",
            "end → receipt p50 ms",
            "p99 ms",
            "max ms",
            "fan-out spread p50 ms",
            "p99 ms",
        ],
    );
    let q = common::quantile;
    let mut data = Vec::new();
    let mut checks = Vec::new();
    for (path, _, _, incomplete) in &results {
        checks.push(Check::judge(
            format!("notifications: {SUBSCRIBERS} subscribers through {path}"),
            "every subscriber receives every notification once, in order",
            format!(
                "{} of {SUBSCRIBERS} subscribers complete",
                SUBSCRIBERS - incomplete
            ),
            *incomplete == 0,
            || format!("{incomplete} subscribers"),
        ));
    }
    for (path, single, burst_figs, _) in &results {
        for (load, (e2e, spread)) in [
            ("one at a time", single),
            (&*format!("burst of {burst}"), burst_figs),
        ] {
            t.row(vec![
                (*path).into(),
                load.into(),
                format!("{:.2}", q(e2e, 0.5)),
                format!("{:.2}", q(e2e, 0.99)),
                format!("{:.2}", q(e2e, 1.0)),
                format!("{:.3}", q(spread, 0.5)),
                format!("{:.3}", q(spread, 0.99)),
            ]);
            data.push(json!({
                "path": path,
                "load": load,
                "deliveries": e2e.len(),
                "end_to_receipt_ms": {"p50": q(e2e, 0.5), "p99": q(e2e, 0.99), "max": q(e2e, 1.0)},
                "fan_out_spread_ms": {"p50": q(spread, 0.5), "p99": q(spread, 0.99)},
            }));
        }
    }
    let notes = vec![
        "End → receipt: from the notification's `created_at` (taken when the agent's end is \
         recorded, just before its commit) to the subscriber's wall clock at receipt. \
         `created_at` is whole milliseconds, so these are upper bounds, up to 1 ms high."
            .into(),
        "Fan-out spread: monotonic time from the first subscriber's receipt of a notification to \
         each other subscriber's (exact)."
            .into(),
        "In a burst, the figures include queueing behind the batch's other notifications and the \
         children still running on the same 2 CPUs."
            .into(),
    ];
    Ok(Section {
        id: "notifications",
        title: "5. Notifications: end-to-end latency with 100 subscribers".into(),
        compared_with: "one subscriber's receipt against another's (the fan-out spread), and \
                        the engine's own stream against the same stream through gRPC. forkd sets \
                        no latency target; a subscriber must miss nothing (each saw every one)."
            .into(),
        tables: vec![t],
        notes,
        checks,
        data: json!(data),
        seconds: started.elapsed().as_secs_f64(),
    })
}
