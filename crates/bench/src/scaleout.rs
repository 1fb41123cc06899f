//! Figure 9: one daemon on SQLite against one and three daemons on one PostgreSQL, every daemon
//! a real `forkd serve` process on the `anthropic` provider against one sim-server (in this
//! process, so that they share one prompt cache): `ForkBatch` latency, children completed per
//! second for a 1000-child batch, notification latency from the daemon that stores a
//! notification to a subscriber on another, and adoption after a SIGKILL.
//!
//! Needs the `forkd` binary beside this one (`scripts/bench.sh` builds both) and a PostgreSQL
//! server: `FORKD_BENCH_DATABASE_URL=postgres://user:password@host:5432/postgres` (a role that may
//! create databases); without it the PostgreSQL rows are left out, saying so.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use forkd_proto::v1 as pb;
use forkd_proto::v1::forkd_client::ForkdClient;
use forkd_provider::{SimConfig, SimProvider};
use serde_json::json;
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use tonic::transport::Channel;

use crate::common::{self, Corpus, Ctx, quantile};
use crate::overhead::connect;
use crate::report::{Section, Table};

pub(crate) const DATABASE_VAR: &str = "FORKD_BENCH_DATABASE_URL";
const API_KEY: &str = common::SIM_API_KEY;
const PREFIX: u64 = 100_000;
const N: usize = 8;
const LEASE: &str = "1s";

/// One configuration's daemons and what it measured.
pub(crate) struct Setup {
    pub(crate) daemons: Vec<Daemon>,
    pub(crate) homes: Vec<tempfile::TempDir>,
    /// The scratch database to drop, on PostgreSQL.
    pub(crate) database: Option<(String, String)>,
}

/// A `forkd serve` process, killed when dropped.
pub(crate) struct Daemon {
    child: Option<tokio::process::Child>,
    pub(crate) client: ForkdClient<Channel>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
    }
}

#[derive(Default)]
struct Measured {
    fork_ms: Vec<f64>,
    children_per_s: f64,
    /// Store to subscriber, for the 1000-child batch's notifications (queueing included).
    burst_ms: Vec<f64>,
    /// Store to subscriber, one notification at a time.
    notify_ms: Vec<f64>,
    adoption_s: Option<f64>,
}

/// Milliseconds from a notification's creation (on the daemon that stored it; one machine, one
/// clock) to now.
fn age_ms(n: &pb::Notification) -> anyhow::Result<Option<f64>> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs_f64()
        * 1000.0;
    Ok(n.created_at
        .map(|at| (now - (at.seconds as f64 * 1000.0 + f64::from(at.nanos) / 1e6)).max(0.0)))
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    let forkd = forkd_binary()?;
    let sim = sim_server().await?;
    let server = std::env::var(DATABASE_VAR)
        .ok()
        .filter(|u| !u.trim().is_empty());
    let corpus = Corpus::generate(PREFIX + 5_000);
    let context = corpus.context(PREFIX);
    let reps = if ctx.quick { 10 } else { 30 };
    let children = if ctx.quick { 300 } else { 1000 };

    let mut plans: Vec<(&'static str, usize, bool)> = vec![("SQLite, 1 daemon", 1, false)];
    if server.is_some() {
        plans.push(("PostgreSQL, 1 daemon", 1, true));
        plans.push(("PostgreSQL, 3 daemons", 3, true));
    }
    let mut results = Vec::new();
    for (name, count, postgres) in plans {
        eprintln!("  scale-out: {name}…");
        let database = match (&server, postgres) {
            (Some(server), true) => Some(scratch_database(server).await?),
            _ => None,
        };
        let mut setup = start(ctx, &forkd, &sim, count, database).await?;
        let outcome = measure(ctx, &mut setup, &context, reps, children).await;
        let database = setup.database.take();
        drop(setup);
        if let Some((server, name)) = database {
            // The daemons are gone: nothing holds the database open.
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop_database(&server, &name).await?;
        }
        results.push((name, count, outcome?));
    }

    let mut t = Table::new(
        format!(
            "ForkBatch of N = {N} on a {}-token session through each daemon in turn (p50 / p99 of \
             {reps}); a {children}-child batch at sim speed 0 submitted to the first daemon, its \
             notifications heard by a subscriber on the last (\"in the burst\": queueing \
             included), then {reps} one-child batches one at a time (\"notification\"); adoption: a 60-child batch of slow \
             replies, the daemon running it killed with SIGKILL (lease {LEASE}).",
            common::ktok(PREFIX)
        ),
        &[
            "daemons",
            "ForkBatch p50 ms",
            "p99 ms",
            "children / s",
            "notification p50 ms",
            "p99 ms",
            "in the burst p50 ms",
            "adoption s",
        ],
    );
    let mut data = Vec::new();
    for (name, count, m) in &results {
        t.row(vec![
            (*name).into(),
            format!("{:.2}", quantile(&m.fork_ms, 0.5)),
            format!("{:.2}", quantile(&m.fork_ms, 0.99)),
            format!("{:.0}", m.children_per_s),
            format!("{:.1}", quantile(&m.notify_ms, 0.5)),
            format!("{:.1}", quantile(&m.notify_ms, 0.99)),
            format!("{:.0}", quantile(&m.burst_ms, 0.5)),
            m.adoption_s.map_or("—".into(), |s| format!("{s:.2}")),
        ]);
        data.push(json!({
            "setup": name,
            "daemons": count,
            "fork_ms": m.fork_ms,
            "children_per_s": m.children_per_s,
            "notification_p50_ms": quantile(&m.notify_ms, 0.5),
            "notification_p99_ms": quantile(&m.notify_ms, 0.99),
            "burst_notification_p50_ms": quantile(&m.burst_ms, 0.5),
            "adoption_s": m.adoption_s,
        }));
    }
    let mut notes = vec![
        "Every daemon is its own process on this 2-core machine, with the sim-server and (for \
         PostgreSQL) the database server on the same cores: three daemons share the CPU one \
         daemon had, so they add no throughput here; on several machines each daemon brings its \
         own cores, and the database's writes become the shared cost."
            .to_owned(),
        "On PostgreSQL every notification is read back from the table by each daemon's feed after \
         a LISTEN/NOTIFY wake-up (so that seqs reach subscribers in order across daemons). In a \
         burst, notifications wait for each other: each commits under the one seq counter."
            .to_owned(),
        "Adoption takes the lease (1 s here, 5 s by default) plus up to one heartbeat (a third \
         of the lease) plus the time to read the agents back."
            .to_owned(),
    ];
    if server.is_none() {
        notes.push(format!(
            "PostgreSQL rows skipped: set {DATABASE_VAR}=postgres://user:password@host:5432/postgres \
             (a role that may create databases)."
        ));
    }
    Ok(Section {
        id: "scaleout",
        title: "9. Several daemons on one PostgreSQL".into(),
        compared_with: "one daemon on SQLite, the embedded default.".into(),
        tables: vec![t],
        notes,
        checks: Vec::new(),
        data: json!(data),
        seconds: started.elapsed().as_secs_f64(),
    })
}

async fn measure(
    ctx: &Ctx,
    setup: &mut Setup,
    context: &forkd_engine::ContextFile,
    reps: usize,
    children: usize,
) -> anyhow::Result<Measured> {
    let ws = ctx.tempdir("scaleout-ws")?;
    let mut m = Measured::default();
    let count = setup.daemons.len();

    // ForkBatch through each daemon in turn, each batch settled before the next (not timed).
    let mut session = None;
    for rep in 0..reps {
        if rep % 5 == 0 {
            let mut c = setup.daemons[0].client.clone();
            session = Some(create_session(&mut c, ws.path(), Some(context)).await?);
        }
        let sid = session.clone().context("a session")?;
        let mut c = setup.daemons[rep % count].client.clone();
        let began = Instant::now();
        let batch = fork(&mut c, &sid, N, "").await?;
        m.fork_ms.push(common::ms(began.elapsed()));
        wait_batch(&mut c, &batch.batch_id, N).await?;
    }

    // Throughput and cross-daemon notification latency.
    let mut first = setup.daemons[0].client.clone();
    let mut last = setup.daemons[count - 1].client.clone();
    let sid = create_session(&mut first, ws.path(), None).await?;
    let mut stream = last
        .subscribe_notifications(pb::SubscribeNotificationsRequest {
            session_id: sid.clone(),
            follow: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    let began = Instant::now();
    fork(&mut first, &sid, children, "").await?;
    let mut heard = 0;
    while heard < children {
        let n = tokio::time::timeout(Duration::from_secs(300), stream.message())
            .await
            .context("the 1000-child batch stalled")??
            .context("the subscription ended")?;
        m.burst_ms.extend(age_ms(&n)?);
        heard += 1;
    }
    m.children_per_s = children as f64 / began.elapsed().as_secs_f64();

    // One notification at a time: a one-child batch through the first daemon, heard on the last.
    for _ in 0..reps {
        fork(&mut first, &sid, 1, "").await?;
        let n = tokio::time::timeout(Duration::from_secs(60), stream.message())
            .await
            .context("a one-child batch stalled")??
            .context("the subscription ended")?;
        m.notify_ms.extend(age_ms(&n)?);
    }

    // Adoption after SIGKILL, where there is another daemon to adopt.
    if count > 1 {
        let sid = create_session(&mut first, ws.path(), None).await?;
        let batch = fork(&mut first, &sid, 60, "\n@sim sleep 4s").await?;
        let mut watcher = last.clone();
        let dead = loop {
            let agents = list_batch(&mut watcher, &batch.batch_id).await?;
            if let Some(a) = agents.iter().find(|a| !a.daemon.is_empty()) {
                break a.daemon.clone();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        tokio::time::sleep(Duration::from_millis(1000)).await;
        if let Some(mut child) = setup.daemons[0].child.take() {
            child.kill().await?;
        }
        let killed = Instant::now();
        loop {
            let agents = list_batch(&mut watcher, &batch.batch_id).await?;
            let held = agents
                .iter()
                .any(|a| !terminal(a.state) && (a.daemon.is_empty() || a.daemon == dead));
            if !held {
                m.adoption_s = Some(killed.elapsed().as_secs_f64());
                break;
            }
            anyhow::ensure!(
                killed.elapsed() < Duration::from_secs(60),
                "no adoption within a minute"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        wait_batch(&mut watcher, &batch.batch_id, 60).await?;
    }
    Ok(m)
}

fn terminal(state: i32) -> bool {
    [
        pb::AgentState::Completed,
        pb::AgentState::Failed,
        pb::AgentState::Killed,
        pb::AgentState::TimedOut,
    ]
    .iter()
    .any(|s| *s as i32 == state)
}

/// `forkd`, beside this binary.
pub(crate) fn forkd_binary() -> anyhow::Result<PathBuf> {
    let path = std::env::current_exe()?.with_file_name("forkd");
    anyhow::ensure!(
        path.exists(),
        "{} is missing: build it with `cargo build --release -p forkd` (scripts/bench.sh does)",
        path.display()
    );
    Ok(path)
}

pub(crate) async fn sim_server() -> anyhow::Result<String> {
    common::sim_server(SimProvider::new(SimConfig {
        speed: 0.0,
        ..SimConfig::default()
    }))
    .await
}

pub(crate) async fn start(
    ctx: &Ctx,
    forkd: &Path,
    sim: &str,
    count: usize,
    database: Option<(String, String)>,
) -> anyhow::Result<Setup> {
    let mut homes = Vec::new();
    let mut daemons = Vec::new();
    for _ in 0..count {
        let home = ctx.tempdir("scaleout-home")?;
        let mut cmd = tokio::process::Command::new(forkd);
        cmd.args(["serve", "--grace", "1s"])
            .env("FORKD_HOME", home.path())
            .env("FORKD_PROVIDER", "anthropic")
            .env("ANTHROPIC_BASE_URL", sim)
            .env("ANTHROPIC_API_KEY", API_KEY)
            .env("FORKD_LEASE", LEASE)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        if let Some((server, db)) = &database {
            cmd.env("FORKD_DATABASE_URL", with_database(server, db)?);
        }
        let child = cmd.spawn().context("cannot start forkd serve")?;
        let addr = format!("unix://{}", home.path().join("forkd.sock").display());
        let client = wait_for(&addr).await?;
        daemons.push(Daemon {
            child: Some(child),
            client,
        });
        homes.push(home);
    }
    Ok(Setup {
        daemons,
        homes,
        database,
    })
}

async fn wait_for(addr: &str) -> anyhow::Result<ForkdClient<Channel>> {
    let began = Instant::now();
    loop {
        if let Ok(mut c) = connect(addr).await
            && c.list_sessions(pb::ListSessionsRequest::default())
                .await
                .is_ok()
        {
            return Ok(c);
        }
        anyhow::ensure!(
            began.elapsed() < Duration::from_secs(30),
            "forkd did not come up at {addr}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn create_session(
    client: &mut ForkdClient<Channel>,
    ws: &Path,
    context: Option<&forkd_engine::ContextFile>,
) -> anyhow::Result<String> {
    let session = client
        .create_session(pb::CreateSessionRequest {
            system_prompt: common::SYSTEM_PROMPT.into(),
            context_files: context
                .map(|c| pb::ContextFile {
                    path: c.path.clone(),
                    content: c.content.clone(),
                })
                .into_iter()
                .collect(),
            workspace: ws.display().to_string(),
            permission_mode: "dontAsk".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .session
        .context("the daemon returned no session")?;
    Ok(session.session_id)
}

async fn fork(
    client: &mut ForkdClient<Channel>,
    session: &str,
    n: usize,
    script: &str,
) -> anyhow::Result<pb::ForkBatchResponse> {
    Ok(client
        .fork_batch(pb::ForkBatchRequest {
            session_id: session.to_owned(),
            directives: (0..n)
                .map(|i| {
                    let d = common::directive(i);
                    pb::Directive {
                        description: d.description,
                        prompt: format!("{}{script}", d.prompt),
                        limits: None,
                    }
                })
                .collect(),
            ..Default::default()
        })
        .await?
        .into_inner())
}

async fn wait_batch(
    client: &mut ForkdClient<Channel>,
    batch: &str,
    n: usize,
) -> anyhow::Result<()> {
    let mut stream = client
        .subscribe_notifications(pb::SubscribeNotificationsRequest {
            batch_id: batch.to_owned(),
            follow: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    for _ in 0..n {
        tokio::time::timeout(Duration::from_secs(120), stream.message())
            .await
            .context("a batch stalled")??
            .context("the subscription ended")?;
    }
    Ok(())
}

async fn list_batch(
    client: &mut ForkdClient<Channel>,
    batch: &str,
) -> anyhow::Result<Vec<pb::Agent>> {
    Ok(client
        .list_agents(pb::ListAgentsRequest {
            batch_id: batch.to_owned(),
            include_ended: true,
            ..Default::default()
        })
        .await?
        .into_inner()
        .agents)
}

/// A fresh database on `server`: (server URL, database name).
pub(crate) async fn scratch_database(server: &str) -> anyhow::Result<(String, String)> {
    let name = format!("forkd_bench_{}", std::process::id());
    let mut admin = PgConnection::connect(server)
        .await
        .with_context(|| format!("cannot reach {DATABASE_VAR}"))?;
    sqlx::query(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}")))
        .execute(&mut admin)
        .await?;
    sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await?;
    admin.close().await?;
    Ok((server.to_owned(), name))
}

pub(crate) async fn drop_database(server: &str, name: &str) -> anyhow::Result<()> {
    let mut admin = PgConnection::connect(server).await?;
    sqlx::query(AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await?;
    admin.close().await?;
    Ok(())
}

/// `server` with its database replaced by `name`.
fn with_database(server: &str, name: &str) -> anyhow::Result<String> {
    let (scheme, rest) = server
        .split_once("://")
        .with_context(|| format!("{DATABASE_VAR} is not a URL"))?;
    let host_at = rest.rfind('@').map_or(0, |i| i + 1);
    let host_end = rest[host_at..]
        .find(['/', '?'])
        .map_or(rest.len(), |i| host_at + i);
    let query = rest[host_end..]
        .find('?')
        .map_or("", |i| &rest[host_end + i..]);
    Ok(format!("{scheme}://{}/{name}{query}", &rest[..host_end]))
}
