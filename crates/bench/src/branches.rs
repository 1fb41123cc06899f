//! Figure 12, branches: sessions of 10 turns at about 10k and 100k tokens of history, each
//! branched many times at points spread over its turns.
//!
//! Through the engine (the embedded sim, a real SQLite store): how long creating a branch takes,
//! what a branch adds to the database before its first turn (the file measured after a WAL
//! checkpoint), and how much of its first request — everything before its own message, the
//! ideal — it reads from the cache the origin's requests wrote.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use forkd_core::Block;
use forkd_core::branch::At;
use forkd_core::session::Session;
use forkd_engine::{Engine, NewBranch, ParentEvent};
use forkd_provider::tokens;
use forkd_store::Store;
use futures::StreamExt;
use serde_json::json;

use crate::common::{self, Ctx};
use crate::report::{Check, Section, Table};

/// Issue 29's targets.
const BYTES_PER_BRANCH_TARGET: f64 = 16.0 * 1024.0;
const READ_SHARE_TARGET: f64 = 0.99;

/// Turns in each origin.
const TURNS: usize = 10;

/// One turn of `text` on `session`; its usage.
async fn turn(
    engine: &Engine,
    session: &Session,
    text: String,
) -> anyhow::Result<forkd_core::Usage> {
    let mut stream = engine.send_message(session.id, text).await?;
    while let Some(event) = stream.next().await {
        if let ParentEvent::TurnEnded { usage, .. } = event? {
            return Ok(usage);
        }
    }
    anyhow::bail!("the turn's stream ended before the turn did")
}

/// Turn `k`'s message: a part of the corpus (`words` words), then a reply of `reply` words.
fn message(corpus: &str, k: usize, words: usize, reply: usize) -> String {
    let text: Vec<&str> = corpus
        .split_whitespace()
        .cycle()
        .skip(k * 97)
        .take(words)
        .collect();
    format!(
        "Part {k} of the notes:\n{}\n@sim say noted part {k}: {}",
        text.join(" "),
        "summary ".repeat(reply)
    )
}

/// The database's file after a WAL checkpoint, in bytes.
async fn checkpointed_bytes(db: &Path) -> anyhow::Result<u64> {
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display())).await?;
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(&pool)
        .await?;
    pool.close().await;
    Ok(common::db_bytes(db))
}

struct Point {
    history_tokens: u64,
    create_ms: Vec<f64>,
    bytes_per_branch: f64,
    read_share: f64,
}

async fn measure(
    engine: &Engine,
    db: &Path,
    ws: &Path,
    corpus: &str,
    words: usize,
    branches: usize,
) -> anyhow::Result<Point> {
    let origin = engine
        .create_session(forkd_engine::NewSession {
            system_prompt: "You keep notes.".into(),
            workspace: Some(ws.to_path_buf()),
            permission_mode: forkd_core::session::PermissionMode::DontAsk,
            ..forkd_engine::NewSession::default()
        })
        .await?;
    let mut last = forkd_core::Usage::default();
    for k in 1..=TURNS {
        last = turn(engine, &origin, message(corpus, k, words, words / 20)).await?;
    }
    let history_tokens = last.total_input();
    let before = checkpointed_bytes(db).await?;
    let mut create_ms = Vec::with_capacity(branches);
    let mut made = Vec::with_capacity(branches);
    for i in 0..branches {
        let started = Instant::now();
        let branch = engine
            .branch_session(
                origin.clone(),
                NewBranch {
                    origin: origin.id,
                    at: At::AfterTurn((i % (TURNS + 1)) as u32),
                    workspace: None,
                    idempotency_key: None,
                },
            )
            .await?;
        create_ms.push(common::ms(started.elapsed()));
        made.push(branch);
    }
    let after = checkpointed_bytes(db).await?;
    // The first request of a branch from the middle: everything before its own message is the
    // ideal read.
    // Branch `i` starts after turn `i % (TURNS + 1)`.
    let middle = &made[(TURNS / 2) % made.len()];
    let text = "Take it another way.\n@sim say another way".to_owned();
    let new_block = tokens::block_tokens(Block::text(&text).raw().as_str());
    let usage = turn(engine, middle, text).await?;
    let ideal = usage.total_input().saturating_sub(new_block).max(1);
    Ok(Point {
        history_tokens,
        create_ms,
        bytes_per_branch: after.saturating_sub(before) as f64 / branches as f64,
        read_share: usage.cache_read_input_tokens as f64 / ideal as f64,
    })
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    let dir = ctx.tempdir("forkd-bench-branches-")?;
    let base = std::fs::canonicalize(dir.path())?;
    let db = base.join("forkd.db");
    let store: Arc<dyn Store> =
        Arc::new(common::open_store(&db, forkd_store::Durability::Normal).await?);
    let engine = common::engine(&store, common::sim(0.0));
    let corpus_file = common::Corpus::generate(12_000).context(12_000);
    let corpus = corpus_file.content;
    let branches = if ctx.quick { 30 } else { 100 };
    // About 1k and 10k tokens a turn: 10k and 100k of history after ten turns.
    let sizes: [(usize, &str); 2] = [(800, "10k"), (8_000, "100k")];

    let mut table = Table::new(
        format!(
            "A session of {TURNS} turns, branched {branches} times at points spread over its \
             turns; then one turn on a branch from turn {}",
            TURNS / 2
        ),
        &[
            "history",
            "create p50 ms",
            "create p99 ms",
            "added per branch",
            "first request's read, of the ideal",
        ],
    );
    let mut data = Vec::new();
    let mut checks = Vec::new();
    for (words, label) in sizes {
        let p = measure(&engine, &db, &base, &corpus, words, branches).await?;
        let (p50, p99) = (
            common::quantile(&p.create_ms, 0.5),
            common::quantile(&p.create_ms, 0.99),
        );
        table.row(vec![
            format!("{} ({label})", common::ktok(p.history_tokens)),
            format!("{p50:.2}"),
            format!("{p99:.2}"),
            common::bytes(p.bytes_per_branch),
            common::pct(p.read_share),
        ]);
        checks.push(Check::judge(
            format!("branches: database bytes per branch ({label} history)"),
            format!("≤ {}", common::bytes(BYTES_PER_BRANCH_TARGET)),
            common::bytes(p.bytes_per_branch),
            p.bytes_per_branch <= BYTES_PER_BRANCH_TARGET,
            || "a branch stores more than its row".to_owned(),
        ));
        checks.push(Check::judge(
            format!("branches: first request's cache read, of the ideal ({label} history)"),
            format!("≥ {}", common::pct(READ_SHARE_TARGET)),
            common::pct(p.read_share),
            p.read_share >= READ_SHARE_TARGET,
            || "the branch writes again what its origin cached".to_owned(),
        ));
        data.push(json!({
            "history": label,
            "history_tokens": p.history_tokens,
            "create_ms": p.create_ms,
            "create_p50_ms": p50,
            "create_p99_ms": p99,
            "bytes_per_branch": p.bytes_per_branch,
            "read_share_of_ideal": p.read_share,
        }));
    }
    engine.shutdown(Duration::from_millis(200)).await;
    Ok(Section {
        id: "branches",
        title: "12. Branches: a session from any earlier turn".into(),
        compared_with: "the ideal: a first request that reads everything before its own message, \
                        and a branch that stores nothing of its origin's."
            .into(),
        tables: vec![table],
        notes: vec![
            "A branch stores one session row (its system prompt and tools are its origin's, by \
             reference) and no message; its transcript is read through its origin's. Creating \
             one reads the origin's turn list and compaction boundaries and writes that row. \
             Sessions created since branches mark the end of the last reply in their main \
             loop's requests too, so the reply that ends the branch's point is in the cache."
                .into(),
            format!(
                "Each turn's message is a part of a seeded corpus and its reply a twentieth of \
                 that; {branches} branches per session."
            ),
        ],
        checks,
        data: json!({ "sessions": data }),
        seconds: started.elapsed().as_secs_f64(),
    })
}
