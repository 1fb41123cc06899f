//! Figure 3, memory and disk: RSS and database bytes added per extra child, against the shared
//! prefix's size. Each (prefix, N) point runs in a process of its own (`--memory-probe`), so one
//! point's allocations cannot hide or inflate another's.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use forkd_store::{Durability, Store};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::common::{self, Corpus, Ctx};
use crate::report::{Check, Section, Table};

/// What one probe measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Probe {
    pub prefix_target: u64,
    pub children: usize,
    /// The batch's shared prefix, as the engine counted it.
    pub prefix_tokens: u64,
    /// System prompt, tools and context as stored.
    pub prefix_bytes: u64,
    /// An empty database (the schema alone).
    pub db_empty: u64,
    /// After the session and one warm-up batch of one child, checkpointed.
    pub db_session: u64,
    /// After the measured batch too, checkpointed.
    pub db_after: u64,
    pub rss_before: u64,
    pub rss_peak: u64,
    pub rss_after: u64,
    pub batch_seconds: f64,
    /// Children that ended within the probe's time limit.
    pub ended: usize,
    /// Bytes of the batch's request records' `prefix_parts` (JSON), the cache diagnostics'
    /// digest of every block of each request's prefix.
    pub prefix_parts_bytes: u64,
}

impl Probe {
    fn complete(&self) -> bool {
        self.ended == self.children
    }
}

impl Probe {
    fn db_added(&self) -> f64 {
        self.db_after as f64 - self.db_session as f64
    }
    fn peak_added(&self) -> f64 {
        self.rss_peak as f64 - self.rss_before as f64
    }
    fn retained_added(&self) -> f64 {
        self.rss_after as f64 - self.rss_before as f64
    }
}

/// The probe itself: runs in its own process and prints one JSON line. The batch may take at
/// most `limit`; the probe then reports how many children ended.
pub async fn probe(
    dir: &Path,
    prefix: u64,
    children: usize,
    limit: Duration,
) -> anyhow::Result<Probe> {
    let tmp = tempfile::Builder::new()
        .prefix("forkd-bench-mem-")
        .tempdir_in(dir)?;
    let ws = tmp.path();
    let empty_path = ws.join("empty.db");
    let empty = common::open_store(&empty_path, Durability::Normal).await?;
    empty.close().await;
    let db_empty = common::db_bytes(&empty_path);

    let db = ws.join("forkd.db");
    let store = common::open_store(&db, Durability::Normal).await?;
    let shared: Arc<dyn Store> = Arc::new(store.clone());
    // The parent's context is the same for every N: the prefix is `prefix` tokens for one child,
    // and grows with N only by the fork message's tool_use and placeholder per child.
    let overhead = common::prefix_overhead(ws, 1).await?;
    let corpus = Corpus::generate(prefix + 1000);
    let context = corpus.context(prefix.saturating_sub(overhead));
    let engine = common::engine(&shared, common::sim(0.0));
    let session = engine
        .create_session(common::new_session(ws, &context))
        .await?;
    common::fork_and_wait(&engine, &session, 1, true).await?;
    engine.shutdown(Duration::from_millis(100)).await;
    drop(shared);
    store.close().await;
    let db_session = common::db_bytes(&db);

    // A new engine and store on the same file, warmed up by one batch of one child (its rows
    // count in every probe alike, so they drop out of the per-child slopes).
    let store = common::open_store(&db, Durability::Normal).await?;
    let shared: Arc<dyn Store> = Arc::new(store.clone());
    let engine = common::engine(&shared, common::sim(0.0));
    common::fork_and_wait(&engine, &session, 1, true).await?;
    let rss_before = common::rss_bytes()?;
    common::reset_peak_rss()?;
    let start = Instant::now();
    let since = store.last_notification_seq().await?;
    let batch = engine
        .fork_batch(
            session.id,
            common::directives(children),
            forkd_engine::BatchOptions::default(),
        )
        .await?;
    let filter = forkd_store::NotificationFilter {
        batch_id: Some(batch.batch_id),
        ..Default::default()
    };
    let ended = common::notifications_within(&engine, since, filter, children, limit)
        .await?
        .len();
    let batch_seconds = start.elapsed().as_secs_f64();
    let rss_peak = common::peak_rss_bytes()?;
    let rss_after = common::rss_bytes()?;
    let stats = common::batch_stats(&engine, batch.batch_id).await?;
    let prefix_parts_bytes = store
        .list_requests(&forkd_store::RequestFilter {
            batch_id: Some(batch.batch_id),
            ..Default::default()
        })
        .await?
        .iter()
        .map(|r| serde_json::to_string(&r.prefix_parts).map_or(0, |j| j.len() as u64))
        .sum();
    engine.shutdown(Duration::from_millis(100)).await;
    drop(engine);
    drop(shared);
    store.close().await;
    Ok(Probe {
        prefix_target: prefix,
        children,
        prefix_tokens: stats.shared_prefix_tokens,
        prefix_bytes: common::session_bytes(&session, &context),
        db_empty,
        db_session,
        db_after: common::db_bytes(&db),
        rss_before,
        rss_peak,
        rss_after,
        batch_seconds,
        ended,
        prefix_parts_bytes,
    })
}

/// Runs one probe in a child process of this binary.
async fn spawn_probe(
    dir: &Path,
    prefix: u64,
    children: usize,
    limit: Duration,
) -> anyhow::Result<Probe> {
    let exe = std::env::current_exe().context("cannot find the bench binary")?;
    let child = tokio::process::Command::new(exe)
        .arg("--memory-probe")
        .arg(format!("{prefix}:{children}:{}", limit.as_secs()))
        .arg("--dir")
        .arg(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("cannot run the memory probe")?;
    let out = tokio::time::timeout(limit + Duration::from_secs(60), child.wait_with_output())
        .await
        .with_context(|| format!("the memory probe {prefix}:{children} did not stop"))??;
    if !out.status.success() {
        bail!(
            "the memory probe {prefix}:{children} failed ({})",
            out.status
        );
    }
    let line = String::from_utf8(out.stdout)?;
    serde_json::from_str(line.trim()).context("the memory probe's output")
}

/// Per extra child between two probes at one prefix.
fn slope(a: &Probe, b: &Probe, f: impl Fn(&Probe) -> f64) -> f64 {
    (f(b) - f(a)) / (b.children as f64 - a.children as f64)
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    // The per-child checks compare the second point with the last; both are above the engine's
    // 64 requests in flight, each holding its whole body (prefix included): below that cap, an
    // extra child adds one more body in flight, which is the prefix's size and no leak.
    let (plan, limit): (&[(u64, &[usize])], Duration) = if ctx.quick {
        (
            &[(10_000, &[1, 100, 400]), (100_000, &[1, 100, 400])],
            Duration::from_secs(60),
        )
    } else {
        (
            &[
                (10_000, &[1, 100, 400, 1000]),
                (100_000, &[1, 100, 400, 1000]),
            ],
            Duration::from_secs(120),
        )
    };
    let mut probes: Vec<Probe> = Vec::new();
    for (prefix, ns) in plan {
        for n in *ns {
            eprintln!("  memory: prefix {}, N {n}", common::ktok(*prefix));
            probes.push(spawn_probe(&ctx.dir, *prefix, *n, limit).await?);
        }
    }

    let mut points = Table::new(
        format!(
            "Each row is a fresh process: a session, then one batch of N children (gating on, sim \
             at speed 0), waited until all ended (at most {} s). DB: bytes the batch added, after \
             a checkpoint; \"prefix parts\" is the part of them that the request records' \
             `prefix_parts` (cache diagnostics) take. RSS: the peak during the batch and what \
             stayed after it, above the level before it.",
            limit.as_secs()
        ),
        &[
            "prefix",
            "N",
            "shared prefix P (tokens / bytes)",
            "DB added",
            "DB per child",
            "of which prefix parts",
            "peak RSS added",
            "RSS after",
            "batch wall s",
        ],
    );
    for p in &probes {
        let n = p.children as f64;
        let (db, parts, peak, after) = if p.complete() {
            (
                common::bytes(p.db_added()),
                common::bytes(p.prefix_parts_bytes as f64 / n),
                common::bytes(p.peak_added()),
                common::bytes(p.retained_added()),
            )
        } else {
            let dash = || "—".to_owned();
            (dash(), dash(), dash(), dash())
        };
        points.row(vec![
            common::ktok(p.prefix_target),
            p.children.to_string(),
            format!(
                "{} / {}",
                p.prefix_tokens,
                common::bytes(p.prefix_bytes as f64)
            ),
            db,
            if p.complete() {
                common::bytes(p.db_added() / n)
            } else {
                format!(
                    "**did not finish**: {} of {} ended in {} s",
                    p.ended,
                    p.children,
                    limit.as_secs()
                )
            },
            parts,
            peak,
            after,
            format!("{:.2}", p.batch_seconds),
        ]);
    }

    // Per extra child, between consecutive N that finished.
    let mut per_child = Table::new(
        "Per extra child: the slope between consecutive rows, against the prefix's size.",
        &[
            "prefix",
            "N range",
            "DB per extra child",
            "÷ prefix bytes",
            "peak RSS per extra child",
            "÷ prefix bytes",
            "prefix stored once: DB(session) − DB(empty)",
        ],
    );
    let complete_at = |prefix: u64| -> Vec<&Probe> {
        probes
            .iter()
            .filter(|p| p.prefix_target == prefix && p.complete())
            .collect()
    };
    for (prefix, _) in plan {
        let at = complete_at(*prefix);
        for pair in at.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let bytes = b.prefix_bytes as f64;
            let (db, rss) = (slope(a, b, Probe::db_added), slope(a, b, Probe::peak_added));
            per_child.row(vec![
                common::ktok(*prefix),
                format!("{}→{}", a.children, b.children),
                common::bytes(db),
                common::pct(db / bytes),
                common::bytes(rss),
                common::pct(rss / bytes),
                format!(
                    "{} for a {} prefix",
                    common::bytes(b.db_session as f64 - b.db_empty as f64),
                    common::bytes(bytes)
                ),
            ]);
        }
    }

    let mut checks = Vec::new();
    // Had each child copied the prefix, its per-child cost would grow by the prefix's growth:
    // compare the smallest and the largest prefix over the widest N range both finished (from
    // the middle N up, past the caps on agents and requests in flight).
    let (small, large) = (plan.first().map(|p| p.0), plan.last().map(|p| p.0));
    if let (Some(small), Some(large)) = (small, large)
        && large > small
    {
        let (s, l) = (complete_at(small), complete_at(large));
        let common_n: Vec<usize> = s
            .iter()
            .map(|p| p.children)
            .filter(|n| l.iter().any(|q| q.children == *n))
            .collect();
        fn find<'a>(at: &[&'a Probe], n: usize) -> Option<&'a Probe> {
            at.iter().copied().find(|p| p.children == n)
        }
        if let (Some(&lo), Some(&hi)) = (common_n.get(1).or(common_n.first()), common_n.last())
            && lo < hi
            && let (Some(s_lo), Some(s_hi), Some(l_lo), Some(l_hi)) =
                (find(&s, lo), find(&s, hi), find(&l, lo), find(&l, hi))
        {
            let growth = l_hi.prefix_bytes as f64 - s_hi.prefix_bytes as f64;
            for (what, f) in [
                ("DB", Probe::db_added as fn(&Probe) -> f64),
                ("peak RSS", Probe::peak_added),
            ] {
                let (d_large, d_small) = (slope(l_lo, l_hi, f), slope(s_lo, s_hi, f));
                let copied = (d_large - d_small) / growth;
                checks.push(Check::judge(
                    format!("memory: {what} per extra child vs prefix size"),
                    "independent of the prefix (share of the prefix copied per child < 1%)",
                    format!(
                        "{} at {} vs {} at {} (N {lo}→{hi}): {} of the prefix's growth per child",
                        common::bytes(d_large),
                        common::ktok(large),
                        common::bytes(d_small),
                        common::ktok(small),
                        common::pct(copied)
                    ),
                    copied < 0.01,
                    || format!("{:.2} points", (copied - 0.01) * 100.0),
                ));
            }
        }
    }
    if let Some(large) = large {
        let at = complete_at(large);
        if at.len() >= 3
            && let (Some(first), Some(last)) = (at.windows(2).next(), at.windows(2).last())
        {
            let below = slope(first[0], first[1], Probe::db_added);
            let above = slope(last[0], last[1], Probe::db_added);
            let growth = above / below;
            checks.push(Check::judge(
                format!(
                    "memory: DB per extra child vs N ({} prefix)",
                    common::ktok(large)
                ),
                "does not grow with N (the last slope ≤ 1.25× the first)",
                format!(
                    "{} per child for N {}→{} vs {} for N {}→{}",
                    common::bytes(above),
                    last[0].children,
                    last[1].children,
                    common::bytes(below),
                    first[0].children,
                    first[1].children
                ),
                growth <= 1.25,
                || format!("{growth:.2}× (what a child stores grows with the batch)"),
            ));
        }
    }
    for p in probes.iter().filter(|p| !p.complete()) {
        checks.push(Check::judge(
            format!(
                "memory: one batch of {} children, {} prefix",
                p.children,
                common::ktok(p.prefix_target)
            ),
            format!(
                "completes (within {} s on the sim at speed 0)",
                limit.as_secs()
            ),
            format!("{} of {} ended", p.ended, p.children),
            false,
            || format!("{} children", p.children - p.ended),
        ));
    }
    let notes = vec![
        "A child stores its directive block, its own messages (here one: its report), its request \
         record and its notification, and the parent's transcript gets its `<task-notification>`; \
         the shared prefix is the parent's transcript and the batch row, stored once."
            .into(),
        "What grows with N: nothing per child. A client's batch gives each child the \
         parent's history, the shared boilerplate and its own directive, so a child's request is \
         the same whatever the batch's size and a batch's CPU work is linear in N. What a child \
         stores does not grow either: its record's `prefix_parts` hold one digest per message, \
         not per block."
            .into(),
        "Peak RSS during a batch: up to 64 requests are in flight at once (the engine's cap), \
         each holding its own serialized body (the sim's parse of each distinct block is shared \
         by all requests). The peak is what those requests hold, by the same amount at a 10k and \
         a 100k prefix: the prefix itself is held once per batch (its context is shared by the \
         children). \"RSS after\" equals the peak because the allocator keeps freed pages."
            .into(),
    ];
    Ok(Section {
        id: "memory",
        title: "3. Memory and disk per child".into(),
        compared_with: "the shared prefix's size: a child must not store or hold the prefix again \
                        (the target: memory and disk for the shared prefix do not grow with N)."
            .into(),
        tables: vec![points, per_child],
        notes,
        checks,
        data: json!(probes),
        seconds: started.elapsed().as_secs_f64(),
    })
}
