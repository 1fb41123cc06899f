//! Figure 15, a full disk: a batch whose database fills mid-run, and how soon it goes on once
//! space returns, without a restart.
//!
//! Through the engine (the embedded sim, a real SQLite store, the recovery loop running): a batch
//! of children that each read a big file three times, slow replies between. Once each has stored
//! its first read, the database is capped at its size (`PageLimit`, SQLite's `max_page_count`:
//! the next write that needs a page fails as on a full disk), so the children stop as their next
//! result is refused. Then the cap is lifted, and the clock runs from that moment to the daemon's
//! health being serving again (a write probe succeeded, the stopped children resumed) and to the
//! batch's end.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use forkd_core::{AgentState, Directive};
use forkd_engine::{AgentEvent, BatchOptions, ContextFile, Engine, StoreHealth};
use forkd_store::{SqliteStore, Store};
use futures::StreamExt;
use serde_json::json;

use crate::common::{self, Ctx};
use crate::report::{Check, Section, Table};

/// What recovery may take at most (the median): the recovery loop probes every half second.
const RECOVERY_TARGET: Duration = Duration::from_secs(1);

/// How long anything in one run may take.
const DEADLINE: Duration = Duration::from_secs(60);

fn directive(i: usize) -> Directive {
    let read = "@sim tool Read {\"file_path\":\"big.txt\"}";
    Directive {
        description: format!("Part {:03}", i + 1),
        prompt: format!(
            "Read the file three times.\n{read}\n@sim sleep 200ms\n{read}\n@sim sleep 200ms\n\
             {read}\n@sim say part {} read",
            i + 1
        ),
    }
}

/// Waits until `check` holds, polling every few milliseconds; fails after [`DEADLINE`].
async fn until<F, Fut>(what: &str, mut check: F) -> anyhow::Result<Instant>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let started = Instant::now();
    loop {
        if check().await? {
            return Ok(Instant::now());
        }
        if started.elapsed() > DEADLINE {
            anyhow::bail!("{what} did not happen within {DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One run's times from the space returning, in milliseconds.
struct Recovery {
    to_serving_ms: f64,
    to_done_ms: f64,
    stopped: usize,
}

async fn once(ctx: &Ctx, n: usize) -> anyhow::Result<Recovery> {
    let dir = ctx.tempdir("forkd-bench-faults-")?;
    let base = std::fs::canonicalize(dir.path())?;
    std::fs::write(
        base.join("big.txt"),
        "0123456789abcdef ".repeat(1_500) + "\n",
    )?;
    let sqlite: SqliteStore =
        common::open_store(&base.join("forkd.db"), Default::default()).await?;
    let limit = sqlite.page_limit().clone();
    let store: Arc<dyn Store> = Arc::new(sqlite);
    let engine: Engine = common::engine(&store, common::sim(0.0));
    engine.start_recovery();
    let context = ContextFile {
        path: "notes.md".into(),
        content: "A full disk, then space again.".into(),
    };
    let session = engine
        .create_session(common::new_session(&base, &context))
        .await?;
    let batch = engine
        .fork_batch(
            session.id,
            (0..n).map(directive).collect(),
            BatchOptions::default(),
        )
        .await?;
    for id in &batch.agent_ids {
        until("a child's first read", || async {
            Ok(store.agent_messages(*id).await?.len() >= 3)
        })
        .await?;
    }
    // Each child's attach stream says when it stops.
    let stopped = Arc::new(AtomicUsize::new(0));
    for id in &batch.agent_ids {
        let mut events = engine.attach(*id, 0).await?;
        let stopped = stopped.clone();
        tokio::spawn(async move {
            while let Some(Ok(event)) = events.next().await {
                if matches!(event, AgentEvent::Interrupted { .. }) {
                    stopped.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            }
        });
    }
    limit.set(1);
    let mut health = engine.store_health();
    until("the database to refuse writes", || {
        let failing = matches!(*health.borrow_and_update(), StoreHealth::Failing(_));
        async move { Ok(failing) }
    })
    .await?;
    // Every child's next result needs a page: after its slow reply, each stops.
    until("every child to stop", || {
        let all = stopped.load(Ordering::SeqCst) == n;
        async move { Ok(all) }
    })
    .await?;

    let returned = Instant::now();
    limit.lift();
    let serving = until("the health to be serving again", || {
        let healthy = health.borrow_and_update().is_healthy();
        async move { Ok(healthy) }
    })
    .await?;
    let done = until("the batch to end", || async {
        let agents = store
            .list_agents(&forkd_core::store::AgentFilter {
                batch_id: Some(batch.batch_id),
                include_ended: true,
                ..Default::default()
            })
            .await?;
        Ok(agents.len() == n && agents.iter().all(|a| a.state == AgentState::Completed))
    })
    .await?;
    engine.shutdown(Duration::from_millis(200)).await;
    Ok(Recovery {
        to_serving_ms: common::ms(serving - returned),
        to_done_ms: common::ms(done - returned),
        stopped: stopped.load(Ordering::SeqCst),
    })
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    let (runs, n) = if ctx.quick { (3, 4) } else { (7, 8) };
    let mut to_serving = Vec::new();
    let mut to_done = Vec::new();
    let mut data = Vec::new();
    for run in 1..=runs {
        eprintln!("  faults: run {run} of {runs}, a batch of {n} on a database that fills");
        let r = once(ctx, n).await?;
        to_serving.push(r.to_serving_ms);
        to_done.push(r.to_done_ms);
        data.push(json!({
            "to_serving_ms": r.to_serving_ms,
            "to_done_ms": r.to_done_ms,
            "children_stopped": r.stopped,
        }));
    }
    let median = |v: &[f64]| common::quantile(v, 0.5);
    let mut table = Table::new(
        format!(
            "A batch of {n} children whose database fills mid-run; from the space returning \
             (the cap lifted), over {runs} runs"
        ),
        &["to", "median", "min", "max"],
    );
    for (label, samples) in [
        (
            "health serving again (a probe wrote, the children resumed)",
            &to_serving,
        ),
        ("every child completed", &to_done),
    ] {
        let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
        let max = samples.iter().copied().fold(0.0, f64::max);
        table.row(vec![
            label.to_owned(),
            format!("{:.0} ms", median(samples)),
            format!("{min:.0} ms"),
            format!("{max:.0} ms"),
        ]);
    }
    let recovered = median(&to_serving);
    let checks = vec![Check::judge(
        "faults: recovery after space returns (median)",
        format!("≤ {} ms", RECOVERY_TARGET.as_millis()),
        format!("{recovered:.0} ms"),
        recovered <= common::ms(RECOVERY_TARGET),
        || "the recovery loop probes every 500 ms; a slower recovery means a probe failed".into(),
    )];
    Ok(Section {
        id: "faults",
        title: "15. A full disk: recovery without a restart".into(),
        compared_with: "a restart, which was the only way back before (issue 32).".into(),
        tables: vec![table],
        notes: vec![
            "The database is capped at its size with SQLite's `max_page_count` once each child \
             has stored its first read: each child's next result needs new pages and is \
             refused as on a full disk, so the child stops and stays running. The clock \
             starts once every child's attach stream has said `interrupted`: lifting the cap \
             is the space returning."
                .into(),
            "The daemon probes a failing database every 500 ms (a 64 KiB write, removed in the \
             same transaction), so recovery takes up to half a second plus a tick of its loop \
             (250 ms); the batch's end adds the children's remaining reads and replies."
                .into(),
        ],
        checks,
        data: json!({ "runs": data, "median_to_serving_ms": recovered, "median_to_done_ms": median(&to_done) }),
        seconds: started.elapsed().as_secs_f64(),
    })
}
