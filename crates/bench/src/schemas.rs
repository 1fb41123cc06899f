//! Figure 13, output schemas: one batch over a ~48.5k-token context with an output schema,
//! beside the same batch without one.
//!
//! Through the engine (the embedded sim, a real SQLite store), each batch on a fresh session of
//! the same context: what the batch cost, what its children wrote to and read from the cache,
//! and how much of the ideal — everything before its directive, the schema block included —
//! each of children 2..N read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use forkd_core::fork::ForkBatch;
use forkd_core::output::OutputSchema;
use forkd_core::store::NotificationFilter;
use forkd_core::{Directive, Notification};
use forkd_engine::BatchOptions;
use forkd_provider::tokens;
use forkd_store::Store;
use serde_json::json;

use crate::common::{self, Ctx};
use crate::report::{Check, Section, Table};

/// Issue 30's guarantee: children 2..N read the whole shared part, schema included.
const READ_SHARE_TARGET: f64 = 0.99;

/// The context the children share, in tokens.
const CONTEXT_TOKENS: u64 = 48_500;

fn schema() -> OutputSchema {
    let value = json!({
        "type": "object",
        "required": ["verdict", "findings"],
        "properties": {
            "verdict": {"enum": ["pass", "fail"], "description": "fail if anything must change"},
            "findings": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["file", "problem"],
                    "properties": {
                        "file": {"type": "string"},
                        "line": {"type": "integer", "minimum": 1},
                        "problem": {"type": "string"}
                    }
                }
            }
        },
        "additionalProperties": false
    });
    // A fixed, valid schema: it cannot fail to parse.
    OutputSchema::from_value(&value).unwrap_or_else(|e| unreachable!("{e}"))
}

/// Child `i`'s directive: the suite's, and with a schema its object.
fn directive(i: usize, shaped: bool) -> Directive {
    let mut d = common::directive(i);
    if shaped {
        d.prompt.push_str(&format!(
            "\n@sim json {{\"verdict\":\"fail\",\"findings\":[{{\"file\":\"part{i:03}.md\",\
             \"line\":{},\"problem\":\"the claim is not backed by a test\"}}]}}",
            i + 1
        ));
    }
    d
}

struct Outcome {
    stats: forkd_engine::CacheStats,
    /// Children 2..N: cache reads over everything before their directive.
    read_shares: Vec<f64>,
    follow_ups: usize,
}

/// One batch on an engine of its own (its own sim, so its own empty prompt cache: neither
/// batch reads what the other wrote).
async fn batch(
    store: &Arc<dyn Store>,
    ws: &std::path::Path,
    context: &forkd_engine::ContextFile,
    n: usize,
    shaped: bool,
) -> anyhow::Result<Outcome> {
    let engine = &common::engine(store, common::sim(0.0));
    let session = engine
        .create_session(common::new_session(ws, context))
        .await?;
    let since = engine.store().last_notification_seq().await?;
    let directives: Vec<Directive> = (0..n).map(|i| directive(i, shaped)).collect();
    let batch = engine
        .fork_batch(
            session.id,
            directives.clone(),
            BatchOptions {
                output_schema: shaped.then(schema),
                ..BatchOptions::default()
            },
        )
        .await?;
    let filter = NotificationFilter {
        batch_id: Some(batch.batch_id),
        ..NotificationFilter::default()
    };
    let notes: Vec<Notification> = common::wait_notifications(engine, since, filter, n).await?;
    let stats = common::batch_stats(engine, batch.batch_id).await?;
    let mut read_shares = Vec::new();
    let mut follow_ups = 0;
    for (i, (agent, d)) in batch.agent_ids.iter().zip(&directives).enumerate() {
        let note = notes
            .iter()
            .find(|n| n.agent_id == *agent)
            .ok_or_else(|| anyhow::anyhow!("no notification for child {}", i + 1))?;
        if shaped && note.report.structured.is_none() {
            anyhow::bail!("child {} ended without a structured report", i + 1);
        }
        let requests = engine
            .store()
            .list_requests(&forkd_core::query::RequestFilter {
                agent_id: Some(*agent),
                ..Default::default()
            })
            .await?;
        follow_ups += requests.len().saturating_sub(1);
        if i == 0 {
            continue;
        }
        let first = requests
            .iter()
            .min_by_key(|r| r.turn)
            .ok_or_else(|| anyhow::anyhow!("child {} made no request", i + 1))?;
        let own = tokens::block_tokens(ForkBatch::directive_block(d).raw().as_str());
        let ideal = first.usage.total_input().saturating_sub(own).max(1);
        read_shares.push(first.usage.cache_read_input_tokens as f64 / ideal as f64);
    }
    engine.shutdown(Duration::from_millis(200)).await;
    Ok(Outcome {
        stats,
        read_shares,
        follow_ups,
    })
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    let dir = ctx.tempdir("forkd-bench-schemas-")?;
    let base = std::fs::canonicalize(dir.path())?;
    let store: Arc<dyn Store> = Arc::new(
        common::open_store(&base.join("forkd.db"), forkd_store::Durability::Normal).await?,
    );
    let overhead = common::prefix_overhead(&base, 2).await?;
    let corpus = common::Corpus::generate(CONTEXT_TOKENS + 1000);
    let context = corpus.context(CONTEXT_TOKENS.saturating_sub(overhead));
    let n = if ctx.quick { 4 } else { 8 };

    let mut table = Table::new(
        format!(
            "One batch of {n} children over a {} context, with and without an output schema \
             (each on a fresh session of the same context, and a sim with an empty cache)",
            common::ktok(CONTEXT_TOKENS)
        ),
        &[
            "batch",
            "shared prefix",
            "written",
            "read",
            "uncached",
            "children 2..N read, of the ideal (min)",
            "follow-ups",
            "input cost",
            "cost",
        ],
    );
    let mut data = Vec::new();
    let mut checks = Vec::new();
    let mut costs = Vec::new();
    for shaped in [false, true] {
        let o = batch(&store, &base, &context, n, shaped).await?;
        let label = if shaped { "with a schema" } else { "without" };
        let min_read = o.read_shares.iter().copied().fold(f64::INFINITY, f64::min);
        let u = &o.stats.usage;
        table.row(vec![
            label.to_owned(),
            common::ktok(o.stats.shared_prefix_tokens),
            common::ktok(u.cache_creation_input_tokens),
            common::ktok(u.cache_read_input_tokens),
            common::ktok(u.input_tokens),
            common::pct(min_read),
            o.follow_ups.to_string(),
            format!("${:.4}", o.stats.input_cost_usd),
            format!("${:.4}", o.stats.cost_usd),
        ]);
        checks.push(Check::judge(
            format!("output schemas: children 2..N's cache read, of the ideal ({label})"),
            format!("≥ {}", common::pct(READ_SHARE_TARGET)),
            common::pct(min_read),
            min_read >= READ_SHARE_TARGET,
            || "a child wrote part of the shared prefix again".to_owned(),
        ));
        costs.push(o.stats.input_cost_usd);
        data.push(json!({
            "schema": shaped,
            "children": n,
            "shared_prefix_tokens": o.stats.shared_prefix_tokens,
            "usage": {
                "input_tokens": u.input_tokens,
                "cache_creation_input_tokens": u.cache_creation_input_tokens,
                "cache_read_input_tokens": u.cache_read_input_tokens,
                "output_tokens": u.output_tokens,
            },
            "read_shares_children_2_to_n": o.read_shares,
            "follow_ups": o.follow_ups,
            "input_cost_usd": o.stats.input_cost_usd,
            "cost_usd": o.stats.cost_usd,
        }));
    }
    let extra = costs[1] / costs[0] - 1.0;
    Ok(Section {
        id: "schemas",
        title: "13. Output schemas: results as data, the cache kept".into(),
        compared_with: "the same batch without a schema, and the ideal: children 2..N read \
                        everything before their directive, the schema block included."
            .into(),
        tables: vec![table],
        notes: vec![
            format!(
                "The schema (a verdict enum and an array of findings, {} bytes as compact JSON) \
                 is one block after the fork boilerplate, the same for every child: it adds its \
                 tokens to the shared prefix, written once by child 1 and read by the others. \
                 The batch's input cost with it is {:+.2}% of the cost without.",
                schema().as_str().len(),
                extra * 100.0
            ),
            "Each child answers with a valid object (`@sim json`), so no follow-up is sent; \
             the engine's tests cover the follow-up and its cache read."
                .into(),
        ],
        checks,
        data: json!({ "batches": data, "input_cost_ratio": costs[1] / costs[0] }),
        seconds: started.elapsed().as_secs_f64(),
    })
}
