//! What every figure shares: the seeded shared context, engines on the sim, sessions, waiting for
//! a batch, percentiles, and reading the process's memory and a database's size.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use forkd_core::session::{PermissionMode, Session};
use forkd_core::{Directive, Notification, NotificationStatus};
use forkd_engine::{
    BatchOptions, CacheStats, ContextFile, Engine, EngineConfig, NewSession, StatsScope,
    context_block,
};
use forkd_provider::{Provider, SimConfig, SimProvider, tokens};
use forkd_store::{Durability, NotificationFilter, SqliteStore, Store};
use futures::StreamExt;

/// The seed of every generated text: runs compare like with like.
pub const SEED: u64 = 0x00f0_4c0d;

/// How long any one wait for a batch may take before the bench gives up on it.
pub const WAIT_LIMIT: Duration = Duration::from_secs(300);

/// The system prompt of every benchmark session.
pub const SYSTEM_PROMPT: &str = "You are a careful reviewer. The user has loaded a long design \
document below. Answer precisely, cite sections by their heading, and when the work splits into \
independent parts, fork one child per part.";

/// How a run is sized and where it keeps its databases.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub quick: bool,
    /// Databases and workspaces go in temporary folders under here.
    pub dir: PathBuf,
}

impl Ctx {
    /// A fresh temporary folder for one measurement, removed when dropped.
    pub fn tempdir(&self, prefix: &str) -> anyhow::Result<tempfile::TempDir> {
        tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(&self.dir)
            .with_context(|| format!("cannot create a folder under {}", self.dir.display()))
    }
}

const WORDS: &[&str] = &[
    "agent",
    "batch",
    "cache",
    "prefix",
    "child",
    "parent",
    "session",
    "request",
    "response",
    "token",
    "stream",
    "daemon",
    "client",
    "server",
    "socket",
    "message",
    "block",
    "system",
    "tools",
    "directive",
    "report",
    "scope",
    "result",
    "issue",
    "transcript",
    "sidechain",
    "notification",
    "subscriber",
    "sequence",
    "commit",
    "durable",
    "restart",
    "resume",
    "lease",
    "generation",
    "fence",
    "write",
    "read",
    "cost",
    "price",
    "model",
    "provider",
    "latency",
    "breakpoint",
    "lookback",
    "entry",
    "minimum",
    "identical",
    "bytes",
    "serialize",
    "splice",
    "render",
    "store",
    "schema",
    "migration",
    "index",
    "query",
    "writer",
    "reader",
    "pool",
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "that",
    "for",
    "each",
    "every",
    "before",
    "after",
    "once",
    "never",
    "always",
    "only",
    "when",
    "while",
    "until",
    "because",
    "so",
    "then",
    "with",
    "without",
    "from",
    "into",
    "by",
    "on",
    "at",
    "its",
    "their",
    "this",
    "these",
    "which",
    "what",
    "must",
    "may",
    "should",
    "can",
    "does",
    "keeps",
    "holds",
    "sends",
    "reads",
    "writes",
    "returns",
    "fails",
    "waits",
    "starts",
    "ends",
    "grows",
    "shares",
    "copies",
    "checks",
    "counts",
    "measures",
    "compares",
    "records",
    "releases",
    "gates",
    "forks",
    "runs",
    "stops",
    "first",
    "last",
    "next",
    "shared",
    "own",
    "whole",
    "partial",
    "large",
    "small",
    "slow",
    "fast",
    "cheap",
    "expensive",
    "warm",
    "cold",
    "live",
    "stale",
    "pending",
    "running",
    "completed",
    "failed",
    "killed",
    "background",
    "foreground",
    "attached",
    "queued",
];

/// Seeded text of a realistic token density, as lines with their token counts, enough for the
/// largest prefix any figure asks for.
pub struct Corpus {
    lines: Vec<(String, u64)>,
}

impl Corpus {
    /// Lines until `tokens` (o200k_base, as the sim counts them) are reached.
    pub fn generate(tokens_wanted: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(SEED);
        let mut lines = Vec::new();
        let mut total = 0;
        let mut section = 0;
        while total < tokens_wanted {
            let line = if lines.len() % 24 == 0 {
                section += 1;
                format!(
                    "## Section {section}: {}\n",
                    rng.choice(WORDS).unwrap_or(&"notes")
                )
            } else {
                let n = rng.usize(8..20);
                let mut line = String::with_capacity(n * 8);
                for i in 0..n {
                    if i > 0 {
                        line.push(' ');
                    }
                    line.push_str(rng.choice(WORDS).unwrap_or(&"text"));
                    if rng.u8(..) < 8 {
                        line.push_str(&format!(" {}", rng.u32(0..10_000)));
                    }
                }
                line.push_str(".\n");
                line
            };
            let t = tokens::count(&line);
            total += t;
            lines.push((line, t));
        }
        Self { lines }
    }

    /// A context file of at most `budget` tokens as the session sends it (its tag included).
    pub fn context(&self, budget: u64) -> ContextFile {
        let mut used = 0;
        let mut take = 0;
        for (_, t) in &self.lines {
            if used + t > budget {
                break;
            }
            used += t;
            take += 1;
        }
        loop {
            let file = ContextFile {
                path: "design.md".into(),
                content: self.lines[..take].iter().map(|(l, _)| l.as_str()).collect(),
            };
            let tokens = context_tokens(&file);
            if take == 0 || tokens <= budget {
                return file;
            }
            // Counting the whole block is the slow part: drop enough lines for the excess at once.
            let mut excess = tokens - budget;
            while take > 0 && excess > 0 {
                take -= 1;
                excess = excess.saturating_sub(self.lines[take].1);
            }
        }
    }
}

/// Tokens of a context file as the session sends it.
pub fn context_tokens(file: &ContextFile) -> u64 {
    tokens::block_tokens(context_block(file).raw().as_str())
}

/// An engine on the given store and provider, with the daemon's default settings.
pub fn engine(store: &Arc<dyn Store>, provider: Arc<dyn Provider>) -> Engine {
    Engine::new(store.clone(), provider, EngineConfig::default())
}

/// The API key the in-process sim-servers accept.
pub const SIM_API_KEY: &str = "bench-key";

/// A `forkd sim-server` serving `sim` on a loopback port in this process (so that everything
/// that talks to it shares one prompt cache), for as long as the process runs: its base URL.
pub async fn sim_server(sim: SimProvider) -> anyhow::Result<String> {
    let config = forkd_sim_server::SimServerConfig {
        api_key: Some(SIM_API_KEY.into()),
        ..forkd_sim_server::SimServerConfig::default()
    };
    forkd_test_support::sim_server(sim, config).await
}

/// The sim at `speed` (0: instant), with a cache of its own.
pub fn sim(speed: f64) -> Arc<dyn Provider> {
    Arc::new(SimProvider::new(SimConfig {
        speed,
        ..SimConfig::default()
    }))
}

/// Opens a database file as the daemon does.
pub async fn open_store(path: &Path, durability: Durability) -> anyhow::Result<SqliteStore> {
    SqliteStore::open(path, durability)
        .await
        .with_context(|| format!("cannot open {}", path.display()))
}

/// A benchmark session over one context file.
pub fn new_session(workspace: &Path, context: &ContextFile) -> NewSession {
    NewSession {
        system_prompt: SYSTEM_PROMPT.into(),
        context_files: vec![context.clone()],
        workspace: Some(workspace.to_path_buf()),
        permission_mode: PermissionMode::DontAsk,
        ..NewSession::default()
    }
}

/// Directive `i` of a batch: all of about the same length, none with `@sim` lines (so each child
/// answers in one request with its report).
pub fn directive(i: usize) -> Directive {
    Directive {
        description: format!("Part {:03}", i + 1),
        prompt: format!(
            "Review part {:03} of the design document: list what is wrong, what is missing, and \
             what you would test first.",
            i + 1
        ),
    }
}

pub fn directives(n: usize) -> Vec<Directive> {
    (0..n).map(directive).collect()
}

/// Reads notifications after `since_seq` until `n` have arrived or `limit` has passed, and
/// returns those that did; fails if any child did not complete.
pub async fn notifications_within(
    engine: &Engine,
    since_seq: u64,
    filter: NotificationFilter,
    n: usize,
    limit: Duration,
) -> anyhow::Result<Vec<Notification>> {
    let mut stream = engine.subscribe(since_seq, filter, true).await?;
    let mut out = Vec::with_capacity(n);
    // Running out of time is not an error here: the caller gets what arrived.
    tokio::time::timeout(limit, async {
        while out.len() < n {
            match stream.next().await {
                Some(note) => out.push(note?),
                None => bail!("the notification stream ended after {}", out.len()),
            }
        }
        Ok(())
    })
    .await
    .unwrap_or(Ok(()))?;
    if let Some(bad) = out
        .iter()
        .find(|n| n.status != NotificationStatus::Completed)
    {
        bail!(
            "agent {} ended {:?}, not completed: {}",
            bad.agent_id,
            bad.status,
            bad.summary
        );
    }
    Ok(out)
}

/// Reads notifications after `since_seq` until `n` have arrived; fails if any child did not
/// complete, or if they take longer than [`WAIT_LIMIT`].
pub async fn wait_notifications(
    engine: &Engine,
    since_seq: u64,
    filter: NotificationFilter,
    n: usize,
) -> anyhow::Result<Vec<Notification>> {
    let out = notifications_within(engine, since_seq, filter, n, WAIT_LIMIT).await?;
    if out.len() < n {
        bail!(
            "timed out waiting for {n} notifications ({} arrived in {} s)",
            out.len(),
            WAIT_LIMIT.as_secs()
        );
    }
    Ok(out)
}

/// Forks `n` children from a session and waits for them all.
pub async fn fork_and_wait(
    engine: &Engine,
    session: &Session,
    n: usize,
    gating: bool,
) -> anyhow::Result<forkd_engine::SubmittedBatch> {
    let since = engine.store().last_notification_seq().await?;
    let batch = engine
        .fork_batch(
            session.id,
            directives(n),
            BatchOptions {
                warmup_gating: Some(gating),
                ..BatchOptions::default()
            },
        )
        .await?;
    let filter = NotificationFilter {
        batch_id: Some(batch.batch_id),
        ..NotificationFilter::default()
    };
    wait_notifications(engine, since, filter, n).await?;
    Ok(batch)
}

/// Tokens of the shared prefix outside the context file, for a batch of `n` children (the
/// system prompt, tools and boilerplate; measured rather than assumed, so the sizing stays right
/// if the shape changes): measured on a session with a tiny context, in a database of its own in
/// memory.
pub async fn prefix_overhead(workspace: &Path, n: usize) -> anyhow::Result<u64> {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().await?);
    let engine = engine(&store, sim(0.0));
    let tiny = ContextFile {
        path: "design.md".into(),
        content: "Calibration.".into(),
    };
    let session = engine.create_session(new_session(workspace, &tiny)).await?;
    let batch = fork_and_wait(&engine, &session, n, true).await?;
    let stats = batch_stats(&engine, batch.batch_id).await?;
    engine.shutdown(Duration::from_millis(100)).await;
    Ok(stats
        .shared_prefix_tokens
        .saturating_sub(context_tokens(&tiny)))
}

pub async fn batch_stats(
    engine: &Engine,
    batch: forkd_core::BatchId,
) -> anyhow::Result<CacheStats> {
    Ok(engine.cache_stats(StatsScope::Batch(batch)).await?)
}

/// The `q` quantile (0..=1) of some samples, by the nearest-rank method.
pub fn quantile(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A field of `/proc/self/status` in kB (`VmRSS`, `VmHWM`).
fn status_kb(field: &str) -> anyhow::Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no {field} in /proc/self/status"))
}

/// The process's resident set now, in bytes.
pub fn rss_bytes() -> anyhow::Result<u64> {
    Ok(status_kb("VmRSS")? * 1024)
}

/// The process's peak resident set since the last [`reset_peak_rss`], in bytes.
pub fn peak_rss_bytes() -> anyhow::Result<u64> {
    Ok(status_kb("VmHWM")? * 1024)
}

/// Resets the peak resident set to the current one (Linux: `5` into `/proc/self/clear_refs`).
pub fn reset_peak_rss() -> anyhow::Result<()> {
    std::fs::write("/proc/self/clear_refs", "5").context("resetting the peak RSS")
}

/// A database's bytes on disk: the file and its WAL.
pub fn db_bytes(path: &Path) -> u64 {
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    size(path) + size(Path::new(&wal))
}

/// The bytes of a session's shared prefix as stored: system prompt, tools and context.
pub fn session_bytes(session: &Session, context: &ContextFile) -> u64 {
    (session.params.system.as_str().len()
        + session.params.tools.raw().as_str().len()
        + context.content.len()) as u64
}

/// `12.3k` for token counts.
pub fn ktok(t: u64) -> String {
    if t >= 1000 {
        format!("{:.1}k", t as f64 / 1000.0)
    } else {
        t.to_string()
    }
}

/// Bytes in the nearest unit.
pub fn bytes(b: f64) -> String {
    let a = b.abs();
    if a >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / (1024.0 * 1024.0))
    } else if a >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b:.0} B")
    }
}

pub fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}
