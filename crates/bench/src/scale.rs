//! Figure 6, client batches at CI scale: N = 100 and 1000 children over 10k- and 100k-token
//! histories. Each child's request size, the batch's input cost against the calculator and wall
//! time per child — and beside them what the old shape (a fork message with one
//! `Agent` call and one placeholder result per sibling in every child's request) would have sent
//! for the same batch, computed from the same session.

use std::sync::Arc;
use std::time::Instant;

use forkd_core::calc;
use forkd_core::fork::{self, ForkBatch};
use forkd_core::pricing::{self, CacheTtl};
use forkd_core::request;
use forkd_core::store::{RequestFilter, Store};
use forkd_core::{BatchId, Message, SessionId};
use forkd_provider::tokens::request_input_tokens;
use forkd_store::Durability;
use serde::Serialize;
use serde_json::json;

use crate::common::{self, Corpus, Ctx};
use crate::report::{Check, Section, Table};

/// One batch measured.
#[derive(Debug, Clone, Serialize)]
struct Point {
    history_target: u64,
    n: usize,
    /// The largest first request of any child, in input tokens (what the window must hold).
    max_child_tokens: u64,
    /// The same child's request in the old shape, computed.
    old_child_tokens: u64,
    cost_usd: f64,
    calc_usd: f64,
    old_calc_usd: f64,
    wall_s: f64,
    completed: usize,
    /// The bench process's resident set before the batch and at its peak during it.
    rss_before: u64,
    rss_peak: u64,
}

impl Point {
    fn per_child_ms(&self) -> f64 {
        self.wall_s * 1000.0 / self.n as f64
    }
}

/// What one more sibling adds to every child's request in the old shape: one `Agent` tool_use in
/// the fork message and one placeholder result, counted on a tiny session.
fn old_shape_tokens(
    params: &forkd_core::session::CacheSafeParams,
    history: &[Message],
    n: usize,
) -> anyhow::Result<u64> {
    let id = BatchId::new();
    let directives = common::directives(n);
    let message = fork::client_fork_message(id, &directives);
    let batch = ForkBatch::new(id, SessionId::new(), history.len() as u64, message, 0)?;
    let block = ForkBatch::directive_block(&directives[n - 1]);
    let conv = batch.child_conversation(history, &block, &[]);
    Ok(request_input_tokens(
        &request::serialize(params, &conv, true).body,
    )?)
}

async fn point(ctx: &Ctx, corpus: &Corpus, history: u64, n: usize) -> anyhow::Result<Point> {
    let dir = ctx.tempdir("forkd-bench-scale-")?;
    let ws = dir.path();
    let store: Arc<dyn Store> =
        Arc::new(common::open_store(&ws.join("forkd.db"), Durability::Normal).await?);
    let engine = common::engine(&store, common::sim(0.0));
    let context = corpus.context(history);
    let session = engine
        .create_session(common::new_session(ws, &context))
        .await?;
    common::reset_peak_rss()?;
    let rss_before = common::rss_bytes()?;
    let started = Instant::now();
    let batch = common::fork_and_wait(&engine, &session, n, true).await?;
    let wall_s = started.elapsed().as_secs_f64();
    let rss_peak = common::peak_rss_bytes()?;
    let stats = common::batch_stats(&engine, batch.batch_id).await?;
    let records = store
        .list_requests(&RequestFilter {
            batch_id: Some(batch.batch_id),
            ..RequestFilter::default()
        })
        .await?;
    let first: Vec<_> = records.iter().filter(|r| r.turn == 0).collect();
    let max_child_tokens = first
        .iter()
        .map(|r| {
            r.usage.input_tokens
                + r.usage.cache_creation_input_tokens
                + r.usage.cache_read_input_tokens
        })
        .max()
        .unwrap_or(0);
    let completed = engine
        .list_agents(&forkd_core::store::AgentFilter {
            batch_id: Some(batch.batch_id),
            include_ended: true,
            ..Default::default()
        })
        .await?
        .iter()
        .filter(|a| a.state == forkd_core::AgentState::Completed)
        .count();
    let model = pricing::model(&session.params.model)
        .ok_or_else(|| anyhow::anyhow!("{} is not in the price table", session.params.model))?;
    let p = stats.shared_prefix_tokens;
    let d = (max_child_tokens.saturating_sub(p)).max(1);
    let calc_usd = calc::estimate(model, p, d, n as u64, CacheTtl::FiveMinutes).fork_cost_usd;
    // The old shape over the same history: every child carries the N-wide fork message.
    let fork_point = engine.get_batch(batch.batch_id).await?.fork_point;
    let history_messages: Vec<Message> = store
        .session_messages(session.id, Some(fork_point))
        .await?
        .into_iter()
        .map(|m| m.message)
        .collect();
    let old_child_tokens = old_shape_tokens(&session.params, &history_messages, n)?;
    let old_p = old_child_tokens.saturating_sub(d);
    let old_calc_usd =
        calc::estimate(model, old_p, d, n as u64, CacheTtl::FiveMinutes).fork_cost_usd;
    engine.shutdown(std::time::Duration::from_millis(100)).await;
    Ok(Point {
        history_target: history,
        n,
        max_child_tokens,
        old_child_tokens,
        cost_usd: stats.input_cost_usd,
        calc_usd,
        old_calc_usd,
        wall_s,
        completed,
        rss_before,
        rss_peak,
    })
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    let histories = [10_000u64, 100_000];
    let ns = [100usize, 1000];
    let corpus = Corpus::generate(histories[1] + 1000);
    // Each batch runs a few times on a fresh database; the run with the median wall time is
    // reported (a 100-child batch over a 10k history takes a tenth of a second, so one run is
    // mostly noise).
    let reps = if ctx.quick { 3 } else { 5 };
    let mut points = Vec::new();
    for &h in &histories {
        for &n in &ns {
            eprintln!("  scale: history {}, N {n}, {reps} runs", common::ktok(h));
            let mut runs = Vec::with_capacity(reps);
            for _ in 0..reps {
                runs.push(point(ctx, &corpus, h, n).await?);
            }
            runs.sort_by(|a, b| a.wall_s.total_cmp(&b.wall_s));
            points.push(runs.swap_remove(reps / 2));
        }
    }
    Ok(section(&points, started.elapsed().as_secs_f64()))
}

fn section(points: &[Point], seconds: f64) -> Section {
    let mut table = Table::new(
        "Client batches, gated, sim at speed 0, the median of several runs by wall time; the old \
         shape's figures computed for the same batch.",
        &[
            "history",
            "N",
            "completed",
            "child request, tokens (max)",
            "old shape, tokens",
            "fits 200k",
            "old fits",
            "input $",
            "÷ calculator",
            "old shape, calculator $",
            "wall s",
            "ms per child",
            "peak RSS, MiB (+ during the batch)",
        ],
    );
    for p in points {
        table.row(vec![
            common::ktok(p.history_target),
            p.n.to_string(),
            format!("{}/{}", p.completed, p.n),
            p.max_child_tokens.to_string(),
            p.old_child_tokens.to_string(),
            yes(p.max_child_tokens < 200_000),
            yes(p.old_child_tokens < 200_000),
            format!("{:.2}", p.cost_usd),
            format!("{:.4}", p.cost_usd / p.calc_usd),
            format!("{:.2}", p.old_calc_usd),
            format!("{:.2}", p.wall_s),
            format!("{:.2}", p.per_child_ms()),
            format!(
                "{:.0} (+{:.0})",
                mib(p.rss_peak),
                mib(p.rss_peak.saturating_sub(p.rss_before))
            ),
        ]);
    }
    let mut checks = Vec::new();
    for p in points
        .iter()
        .filter(|p| p.history_target == 100_000 && p.n == 1000)
    {
        checks.push(Check::judge(
            "scale: child request, 1000 children over a 100k history",
            "every child's request under 105k tokens, all complete",
            format!(
                "max {} tokens, {}/{} completed",
                p.max_child_tokens, p.completed, p.n
            ),
            p.max_child_tokens < 105_000 && p.completed == p.n,
            || format!("{} tokens", p.max_child_tokens),
        ));
    }
    let worst = points
        .iter()
        .map(|p| (p.cost_usd / p.calc_usd - 1.0).abs())
        .fold(0.0f64, f64::max);
    checks.push(Check::judge(
        "scale: batch input cost vs the calculator",
        "within 1%, every row",
        format!("worst {:+.2}%", worst * 100.0),
        worst <= 0.01,
        || format!("{:.2}%", worst * 100.0),
    ));
    for h in [10_000u64, 100_000] {
        let at = |n| points.iter().find(|p| p.history_target == h && p.n == n);
        if let (Some(small), Some(big)) = (at(100), at(1000)) {
            let ratio = big.per_child_ms() / small.per_child_ms();
            checks.push(Check::judge(
                format!("scale: wall time per child, {} history", common::ktok(h)),
                "N = 1000 within 1.5× of N = 100",
                format!("{ratio:.2}×"),
                ratio <= 1.5,
                || format!("{ratio:.2}×"),
            ));
        }
    }
    Section {
        id: "scale",
        title: "6. Client batches at CI scale".into(),
        compared_with: "the calculator's cost for the batch, N = 100 against N = 1000 per child, \
                        and the old shape (an N-wide fork message in every child's request) for \
                        the same batch."
            .into(),
        tables: vec![table],
        notes: vec![
            "Child request: the largest first request of the batch's children (input, cache \
             writes and cache reads), from the stored request records. The old shape's size is \
             the same child's request built the old way (one `Agent` tool_use and one \
             placeholder result per sibling), counted with the same tokenizer."
                .into(),
            "Cost: the children's input cost against `forkd_core::calc`'s fork cost for the \
             measured shared prefix P and directive D. The old shape's calculator cost uses its \
             larger P (history plus the N-wide fork message)."
                .into(),
            "Peak RSS: the bench process's resident set at its peak during the batch (the peak \
             is reset before each batch through /proc/self/clear_refs), and how much it grew \
             over the resident set before the batch. Figure 3 measures the same batches each in \
             a process of its own, with retained memory and database bytes per child."
                .into(),
        ],
        checks,
        data: json!(points),
        seconds,
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn yes(b: bool) -> String {
    if b { "yes" } else { "no" }.into()
}
