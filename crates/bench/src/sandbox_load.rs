//! Figure 17, the sandbox under load: N children of one batch each run two Bash commands and a
//! Read, in a sandboxed (`workspace-write`) session and in a `full-access` one, through the
//! engine (the embedded sim, a real SQLite store, the real sandbox), then both again after 200
//! more sessions, each with a workspace of its own, were created; and one command's cost alone at
//! the tool layer, its view hiding none or 200 other sessions' workspaces (what the target holds:
//! the later batches also pay for a daemon grown by the earlier ones, since a sandboxed start
//! forks it).
//!
//! Measured: the batch's wall time; the database waits sqlx reports as slow (an acquire that
//! waited past its threshold: the writer held up); the p50 and p99 of a tool call end to end (the
//! assistant's message with the call stored to its result stored, from the transcript); the
//! runtime's lag (the longest a 5 ms timer overslept: how long a ready task waited for a worker
//! thread); and the process's CPU time.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use forkd_core::session::{PermissionMode, SandboxMode};
use forkd_core::{Directive, message::Role};
use forkd_engine::{BatchOptions, Engine, EngineConfig};
use forkd_store::{NotificationFilter, Store};
use serde_json::json;

use crate::common::{self, Ctx};
use crate::report::{Check, Section, Table, Verdict};

/// The most a tool call's p50 may grow with 200 more sessions.
const CROWD_TARGET: f64 = 1.25;

/// Sessions created before the last run: the cost of a command must not grow with them.
const OTHER_SESSIONS: usize = 200;

/// Child `i`'s directive: two Bash commands and a Read, then its report.
fn directive(i: usize) -> Directive {
    let file = format!("out/c{i:05}.txt");
    Directive {
        description: format!("Child {i:05}"),
        prompt: format!(
            "Write and read back file {i:05}.\n\
             @sim tool Bash {{\"command\":\"mkdir -p out && echo child {i} > {file}\"}}\n\
             @sim tool Bash {{\"command\":\"wc -c {file}\"}}\n\
             @sim tool Read {{\"file_path\":\"{file}\"}}\n\
             @sim say read {file}"
        ),
    }
}

/// Slow acquires sqlx reported (`sqlx::pool::acquire` at WARN), counted by a global layer.
static SLOW_ACQUIRES: AtomicU64 = AtomicU64::new(0);

struct CountSlowAcquires;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountSlowAcquires {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let meta = event.metadata();
        if meta.target().starts_with("sqlx::pool::acquire") && *meta.level() <= tracing::Level::WARN
        {
            SLOW_ACQUIRES.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Installs the counting layer as the process's subscriber; false where one was set already.
fn count_slow_acquires() -> bool {
    use tracing_subscriber::layer::SubscriberExt;
    let subscriber = tracing_subscriber::registry()
        .with(CountSlowAcquires.with_filter(tracing_subscriber::filter::LevelFilter::WARN));
    tracing::subscriber::set_global_default(subscriber).is_ok()
}

use tracing_subscriber::Layer as _;

/// The longest a 5 ms timer overslept while it ran, in milliseconds.
struct LagProbe {
    worst_us: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl LagProbe {
    fn start() -> LagProbe {
        let worst_us = Arc::new(AtomicU64::new(0));
        let worst = worst_us.clone();
        let task = tokio::spawn(async move {
            let tick = Duration::from_millis(5);
            loop {
                let started = Instant::now();
                tokio::time::sleep(tick).await;
                let late = started.elapsed().saturating_sub(tick);
                worst.fetch_max(late.as_micros() as u64, Ordering::Relaxed);
            }
        });
        LagProbe { worst_us, task }
    }

    fn stop(self) -> f64 {
        self.task.abort();
        self.worst_us.load(Ordering::Relaxed) as f64 / 1e3
    }
}

/// CPU time (user + system) this process has used, in seconds.
fn cpu_seconds() -> f64 {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF);
    usage.map_or(0.0, |u| {
        let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
        t(u.user_time()) + t(u.system_time())
    })
}

/// `calls` sandboxed Bash calls of `true` (interleaved in rounds) in a view that hides no other
/// session's workspace, and in one that hides 200; each in milliseconds.
async fn per_command(base: &Path, calls: usize) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    use forkd_tools::sandbox::{ResourceLimits, Sandbox, SandboxPaths};
    use forkd_tools::{SandboxSpec, ToolContext, Workspace};
    let ws = base.join("ws-per-command");
    std::fs::create_dir_all(&ws)?;
    let context = |hidden: Vec<std::path::PathBuf>, tmp: &str| -> anyhow::Result<ToolContext> {
        Ok(ToolContext::new(
            Workspace::new(&ws)?,
            tokio_util::sync::CancellationToken::new(),
        )
        .with_sandbox(SandboxSpec {
            sandbox: Sandbox {
                mode: SandboxMode::WorkspaceWrite,
                allow_network: false,
                unix_sockets: false,
            },
            paths: SandboxPaths {
                hidden: std::iter::once(base.join("home")).chain(hidden).collect(),
                tmp: base.join("sandbox-tmp").join(tmp),
                home: None,
                limits: ResourceLimits::default(),
                group: None,
            },
        }))
    };
    let others = (0..OTHER_SESSIONS)
        .map(|i| base.join(format!("others/ws{i:03}")))
        .collect();
    let (alone, among) = (context(Vec::new(), "alone")?, context(others, "among")?);
    let input = json!({ "command": "true" });
    let time = |ctx: ToolContext| {
        let input = input.clone();
        async move {
            let started = Instant::now();
            let out = forkd_tools::run_tool("Bash", &input, &ctx).await;
            anyhow::ensure!(!out.is_error, "a Bash call failed: {}", out.content);
            Ok::<f64, anyhow::Error>(common::ms(started.elapsed()))
        }
    };
    // Warm-up, unmeasured: each view made.
    time(alone.clone()).await?;
    time(among.clone()).await?;
    let (mut a, mut b) = (Vec::with_capacity(calls), Vec::with_capacity(calls));
    for _ in 0..calls / 10 {
        for _ in 0..10 {
            a.push(time(alone.clone()).await?);
        }
        for _ in 0..10 {
            b.push(time(among.clone()).await?);
        }
    }
    Ok((a, b))
}

struct Run {
    wall_ms: f64,
    slow_acquires: u64,
    tool_p50_ms: f64,
    tool_p99_ms: f64,
    lag_ms: f64,
    cpu_s: f64,
    failed: usize,
}

async fn run_batch(
    engine: &Engine,
    ws: &Path,
    n: usize,
    sandbox: SandboxMode,
) -> anyhow::Result<Run> {
    let context = common::Corpus::generate(500).context(500);
    let session = engine
        .create_session(forkd_engine::NewSession {
            permission_mode: PermissionMode::BypassPermissions,
            sandbox: Some(sandbox),
            ..common::new_session(ws, &context)
        })
        .await?;
    let since = engine.store().last_notification_seq().await?;
    let slow_before = SLOW_ACQUIRES.load(Ordering::Relaxed);
    let cpu_before = cpu_seconds();
    let probe = LagProbe::start();
    let started = Instant::now();
    let batch = engine
        .fork_batch(
            session.id,
            (0..n).map(directive).collect(),
            BatchOptions::default(),
        )
        .await?;
    let filter = NotificationFilter {
        batch_id: Some(batch.batch_id),
        ..NotificationFilter::default()
    };
    let notes = common::wait_notifications(engine, since, filter, n).await?;
    let wall_ms = common::ms(started.elapsed());
    let lag_ms = probe.stop();
    let cpu_s = cpu_seconds() - cpu_before;
    let slow_acquires = SLOW_ACQUIRES.load(Ordering::Relaxed) - slow_before;
    let failed = notes
        .iter()
        .filter(|n| n.status != forkd_core::agent::NotificationStatus::Completed)
        .count();
    // A tool call end to end: the call's message stored to its result's.
    let mut tool_ms = Vec::with_capacity(n * 3);
    for note in &notes {
        let messages = engine.store().agent_messages(note.agent_id).await?;
        for pair in messages.windows(2) {
            let (call, result) = (&pair[0], &pair[1]);
            if call.message.role == Role::Assistant
                && call.message.tool_uses().next().is_some()
                && result.message.role == Role::User
            {
                tool_ms.push((result.created_at_ms - call.created_at_ms) as f64);
            }
        }
    }
    Ok(Run {
        wall_ms,
        slow_acquires,
        tool_p50_ms: common::quantile(&tool_ms, 0.5),
        tool_p99_ms: common::quantile(&tool_ms, 0.99),
        lag_ms,
        cpu_s,
        failed,
    })
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    let counting = count_slow_acquires();
    let dir = ctx.tempdir("forkd-bench-sandbox-load-")?;
    let base = std::fs::canonicalize(dir.path())?;
    let n = if ctx.quick { 200 } else { 1000 };
    std::fs::create_dir_all(base.join("home"))?;
    let store: Arc<dyn Store> = Arc::new(
        common::open_store(&base.join("home/forkd.db"), forkd_store::Durability::Normal).await?,
    );
    let mut config = EngineConfig::default();
    config.isolation.root = base.join("home/isolation");
    config.sandbox.hidden.push(base.join("home"));
    config.sandbox.tmp_root = base.join("sandbox-tmp");
    let engine = Engine::new(store.clone(), common::sim(0.0), config);
    let ws = |name: &str| -> anyhow::Result<std::path::PathBuf> {
        let ws = base.join(name);
        std::fs::create_dir_all(&ws)?;
        Ok(ws)
    };

    let open = run_batch(&engine, &ws("ws-open")?, n, SandboxMode::FullAccess).await?;
    let confined = run_batch(&engine, &ws("ws-confined")?, n, SandboxMode::WorkspaceWrite).await?;
    let context = common::Corpus::generate(500).context(500);
    for i in 0..OTHER_SESSIONS {
        engine
            .create_session(common::new_session(
                &ws(&format!("others/ws{i:03}"))?,
                &context,
            ))
            .await?;
    }
    let open_crowded =
        run_batch(&engine, &ws("ws-open-crowded")?, n, SandboxMode::FullAccess).await?;
    let crowded = run_batch(&engine, &ws("ws-crowded")?, n, SandboxMode::WorkspaceWrite).await?;
    // The cost of one command alone, at the tool layer: its view hiding no other session's
    // workspace, then 200 (each a directory of its own, as above).
    let calls = if ctx.quick { 50 } else { 100 };
    let (alone, among) = per_command(&base, calls).await?;
    let crowd = common::quantile(&among, 0.5) / common::quantile(&alone, 0.5);

    let mut table = Table::new(
        format!(
            "{n} children of one batch, each running 2 Bash commands and a Read (the embedded sim, \
             SQLite, {} worker threads)",
            std::thread::available_parallelism().map_or(0, |p| p.get())
        ),
        &[
            "session",
            "wall ms",
            "slow db acquires",
            "tool call p50 / p99 ms",
            "runtime lag ms (max)",
            "CPU s",
            "failed",
        ],
    );
    let mut data = Vec::new();
    for (label, run) in [
        ("full-access", &open),
        ("workspace-write", &confined),
        ("full-access, +200 sessions", &open_crowded),
        ("workspace-write, +200 sessions", &crowded),
    ] {
        table.row(vec![
            label.to_owned(),
            format!("{:.0}", run.wall_ms),
            if counting {
                run.slow_acquires.to_string()
            } else {
                "n/a".to_owned()
            },
            format!("{:.0} / {:.0}", run.tool_p50_ms, run.tool_p99_ms),
            format!("{:.0}", run.lag_ms),
            format!("{:.1}", run.cpu_s),
            run.failed.to_string(),
        ]);
        data.push(json!({
            "session": label,
            "children": n,
            "wall_ms": run.wall_ms,
            "slow_acquires": counting.then_some(run.slow_acquires),
            "tool_p50_ms": run.tool_p50_ms,
            "tool_p99_ms": run.tool_p99_ms,
            "runtime_lag_max_ms": run.lag_ms,
            "cpu_s": run.cpu_s,
            "failed": run.failed,
        }));
    }
    let ratio = confined.wall_ms / open.wall_ms;
    let failed = open.failed + confined.failed + open_crowded.failed + crowded.failed;
    let mut checks = vec![
        Check::judge(
            "sandbox load: children that did not complete",
            "0",
            failed.to_string(),
            failed == 0,
            || format!("{failed} failed"),
        ),
        Check::judge(
            "sandbox load: a sandboxed Bash `true`, p50 with 200 other sessions' workspaces hidden ÷ with none",
            format!("≤ {CROWD_TARGET}×"),
            format!(
                "{crowd:.2}× ({:.2} ms against {:.2} ms)",
                common::quantile(&among, 0.5),
                common::quantile(&alone, 0.5)
            ),
            crowd <= CROWD_TARGET,
            || format!("{:.2}× over", crowd - CROWD_TARGET),
        ),
        Check::new(
            "sandbox load: sandboxed batch wall ÷ full-access batch wall",
            "reported (figure 7 holds the per-call target)",
            format!("{ratio:.2}×"),
            Verdict::NotApplicable("no target of its own".into()),
        ),
    ];
    let slow = open.slow_acquires
        + confined.slow_acquires
        + open_crowded.slow_acquires
        + crowded.slow_acquires;
    checks.push(if counting {
        Check::judge(
            "sandbox load: slow database acquires",
            "0",
            slow.to_string(),
            slow == 0,
            || format!("{slow} slow"),
        )
    } else {
        Check::new(
            "sandbox load: slow database acquires",
            "0",
            "n/a",
            Verdict::NotApplicable("another figure set the process's subscriber".into()),
        )
    });
    Ok(Section {
        id: "sandboxload",
        title: "17. The sandbox under load".into(),
        compared_with: "the same batch in a full-access session, and again after 200 more \
                        sessions were created"
            .into(),
        tables: vec![table],
        notes: vec![
            "A tool call is timed from the assistant's message with the call stored to its \
             result stored (the transcript's times, in ms). The runtime's lag is the longest a \
             5 ms timer overslept during the batch: how long a ready task waited for one of the \
             runtime's worker threads. A slow acquire is sqlx's warning that a query waited past \
             its threshold for a connection (the writer)."
                .into(),
        ],
        checks,
        data: json!({
            "runs": data,
            "ratio": ratio,
            "per_command": { "alone_ms": alone, "among_200_ms": among, "ratio": crowd },
        }),
        seconds: started.elapsed().as_secs_f64(),
    })
}
