//! Figure 8, long sessions: a session driven by 40 turns of ~3k tokens of tool output each on a
//! model whose window is set to 32k tokens — four windows' worth — keeps answering by compacting.
//! Per request: input tokens, what was read from and written to the cache; per compaction, what
//! its summary request read.

use std::sync::Arc;
use std::time::Instant;

use forkd_core::pricing::{self, ModelSpec, Models};
use forkd_core::store::{RequestFilter, Store};
use forkd_engine::{Engine, EngineConfig, ParentEvent};
use forkd_store::Durability;
use futures::StreamExt;
use serde_json::json;

use crate::common::{self, Ctx};
use crate::report::{Check, Section, Table};

const WINDOW: u64 = 32_000;
const MAX_TOKENS: u32 = 2_048;
const TURNS: usize = 40;

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    let dir = ctx.tempdir("forkd-bench-compaction-")?;
    let ws = dir.path();
    let store: Arc<dyn Store> =
        Arc::new(common::open_store(&ws.join("forkd.db"), Durability::Normal).await?);
    let sonnet = pricing::model(pricing::DEFAULT_MODEL)
        .ok_or_else(|| anyhow::anyhow!("the default model is not in the price table"))?;
    let config = EngineConfig {
        models: Models::default().with(ModelSpec {
            context_window: WINDOW,
            ..sonnet.clone()
        }),
        ..EngineConfig::default()
    };
    let engine = Engine::new(store.clone(), common::sim(0.0), config);
    let line = "forkd keeps long sessions alive by compacting them at the threshold\n";
    std::fs::write(ws.join("big.txt"), line.repeat(300))?;
    let mut new = forkd_engine::NewSession {
        // Long enough (~1.5k tokens with the tools) for the system prompt and tools to be
        // cached on their own: they are what every request after a boundary still shares.
        system_prompt: format!(
            "{}\n\n{}",
            common::SYSTEM_PROMPT,
            "Project rule: keep answers short, cite files, and never invent results. ".repeat(60)
        ),
        workspace: Some(ws.to_path_buf()),
        permission_mode: forkd_core::session::PermissionMode::DontAsk,
        max_tokens: Some(MAX_TOKENS),
        ..forkd_engine::NewSession::default()
    };
    new.context_files = vec![];
    let session = engine.create_session(new).await?;
    let mut failed = 0;
    for i in 0..TURNS {
        let script = format!(
            "Turn {i}: read the file.\n@sim tool Read {{\"file_path\":\"big.txt\"}}\n@sim say read part {i}"
        );
        let events: Vec<_> = engine
            .send_message(session.id, script)
            .await?
            .collect()
            .await;
        if !matches!(events.last(), Some(Ok(ParentEvent::TurnEnded { .. }))) {
            failed += 1;
        }
    }
    let compactions = store.compactions(session.id).await?;
    let mut requests = store
        .list_requests(&RequestFilter {
            session_id: Some(session.id),
            ..RequestFilter::default()
        })
        .await?;
    // Ids are UUID v7: in creation order, also within one millisecond.
    requests.sort_by_key(|r| r.id);
    let max_input = requests
        .iter()
        .map(|r| r.usage.total_input())
        .max()
        .unwrap_or(0);
    let read: u64 = requests
        .iter()
        .map(|r| r.usage.cache_read_input_tokens)
        .sum();
    let written: u64 = requests
        .iter()
        .map(|r| r.usage.cache_creation_input_tokens)
        .sum();
    let total: u64 = requests.iter().map(|r| r.usage.total_input()).sum();
    let cost: f64 = requests.iter().map(|r| r.cost_usd).sum();
    let mut summary = Table::new(
        format!(
            "{TURNS} turns of ~3k tokens of tool output, window {WINDOW} tokens, max_tokens \
             {MAX_TOKENS}, threshold 0.9, sim at speed 0"
        ),
        &[
            "turns answered",
            "requests",
            "compactions",
            "largest request, tokens",
            "fits the window",
            "read share",
            "cache writes, tokens",
            "cost $",
        ],
    );
    summary.row(vec![
        format!("{}/{TURNS}", TURNS - failed),
        requests.len().to_string(),
        compactions.len().to_string(),
        max_input.to_string(),
        yes(max_input + u64::from(MAX_TOKENS) <= WINDOW),
        format!("{:.1}%", 100.0 * read as f64 / total.max(1) as f64),
        written.to_string(),
        format!("{cost:.3}"),
    ]);
    let mut timeline = Table::new(
        "The first 22 requests, in order (two compactions among them): input, and what of it \
         came from the cache",
        &["request", "input tokens", "read", "written", "uncached"],
    );
    for (i, r) in requests.iter().enumerate().take(22) {
        timeline.row(vec![
            i.to_string(),
            r.usage.total_input().to_string(),
            r.usage.cache_read_input_tokens.to_string(),
            r.usage.cache_creation_input_tokens.to_string(),
            r.usage.input_tokens.to_string(),
        ]);
    }
    let checks = vec![Check::judge(
        "compaction: a 40-turn session on a 32k window",
        "every turn answered, no request over the window",
        format!(
            "{}/{TURNS} answered, largest request {max_input} + {MAX_TOKENS} tokens, {} compactions",
            TURNS - failed,
            compactions.len()
        ),
        failed == 0 && max_input + u64::from(MAX_TOKENS) <= WINDOW,
        || format!("{failed} turns failed, largest {max_input}"),
    )];
    engine.shutdown(std::time::Duration::from_millis(100)).await;
    Ok(Section {
        id: "compaction",
        title: "8. Long sessions: compaction".into(),
        compared_with: "the model's window (no request may pass it) and the session's cache \
                        (most input read, not written)."
            .into(),
        tables: vec![summary, timeline],
        notes: vec![
            "A compaction request is the request that produced the last reply plus an \
             instruction: it reads that request's cache. After a boundary the summary and the \
             messages after it are written once, then read by the requests that follow."
                .into(),
        ],
        checks,
        data: json!({
            "requests": requests.iter().map(|r| json!({
                "input": r.usage.total_input(),
                "read": r.usage.cache_read_input_tokens,
                "written": r.usage.cache_creation_input_tokens,
            })).collect::<Vec<_>>(),
            "compactions": compactions.iter().map(|c| json!({"from": c.from_seq, "to": c.to_seq})).collect::<Vec<_>>(),
        }),
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn yes(b: bool) -> String {
    if b { "yes" } else { "no" }.into()
}
