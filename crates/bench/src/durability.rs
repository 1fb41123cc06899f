//! Figure 4, durability cost and recovery: transcript append throughput with forkd's shipped
//! durability (`Normal`) and with `Full`; rebuilding a 100k-token transcript into its request;
//! resuming 1000 interrupted agents after a restart.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use forkd_core::request;
use forkd_core::{Agent, AgentId, AgentKind, AgentState, Block, Directive, Message, Usage};
use forkd_engine::{BatchOptions, ContextFile};
use forkd_provider::{EventStream, ModelRequest, Provider, SimConfig, SimProvider};
use forkd_store::{AgentFilter, Durability, NotificationFilter, RequestFilter, Store};
use futures::StreamExt;
use serde_json::json;

use crate::common::{self, Corpus, Ctx};
use crate::report::{Check, Section, Table};

/// A provider whose responses never start: agents sent to it stay in their first request, as
/// they are when a daemon dies under them.
struct Hang;

impl Provider for Hang {
    fn name(&self) -> &'static str {
        "hang"
    }

    fn stream(&self, _request: ModelRequest) -> EventStream {
        futures::stream::pending().boxed()
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn small_context() -> ContextFile {
    ContextFile {
        path: "notes.md".into(),
        content: "Durability bench.".into(),
    }
}

/// Messages per second that `writers` agents append concurrently for `window`.
async fn append_rate(
    dir: &Path,
    durability: Durability,
    writers: usize,
    window: Duration,
) -> anyhow::Result<f64> {
    let db = dir.join(format!("append-{durability:?}-{writers}.db"));
    let store = common::open_store(&db, durability).await?;
    let shared: Arc<dyn Store> = Arc::new(store.clone());
    let engine = common::engine(&shared, common::sim(0.0));
    let session = engine
        .create_session(common::new_session(dir, &small_context()))
        .await?;
    engine.shutdown(Duration::from_millis(100)).await;
    // A typical assistant turn: about 200 tokens of text.
    let text = "The change keeps the prefix byte-identical across siblings; the test covers it. "
        .repeat(10);
    let message = Message::assistant(vec![Block::text(&text)]);
    let mut tasks = Vec::new();
    let deadline = Instant::now() + window;
    let start = Instant::now();
    for i in 0..writers {
        let agent = Agent {
            index: i as u32,
            directive: Some(Directive {
                description: format!("writer {i}"),
                prompt: "Append.".into(),
            }),
            ..Agent::new(
                AgentId::new(),
                session.id,
                AgentKind::Typed,
                AgentState::Pending,
                now_ms(),
            )
        };
        store
            .insert_agent(&agent, Some(&Block::text("Append.")), None)
            .await?;
        let lease = store.claim_agent(agent.id).await?;
        let (store, message) = (store.clone(), message.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                store.append_agent_message(&lease, &message).await?;
                n += 1;
            }
            anyhow::Ok(n)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    let rate = total as f64 / start.elapsed().as_secs_f64();
    drop(shared);
    store.close().await;
    Ok(rate)
}

struct Rebuild {
    load_ms: Vec<f64>,
    serialize_ms: Vec<f64>,
    body_bytes: usize,
    prefix_tokens: u64,
    fingerprint_matches: bool,
    /// The sim's time to first token for the rebuilt request with its prefix cached, at the
    /// realistic pace.
    cached_ttft_ms: f64,
}

/// Loads a 100k-token child's transcript from the store and serializes its request, as a run
/// that resumes it does.
async fn rebuild(ctx: &Ctx, dir: &Path, corpus: &Corpus) -> anyhow::Result<Rebuild> {
    let store = common::open_store(&dir.join("rebuild.db"), Durability::Normal).await?;
    let shared: Arc<dyn Store> = Arc::new(store.clone());
    let overhead = common::prefix_overhead(dir, 1).await?;
    let context = corpus.context(100_000 - overhead);
    let engine = common::engine(&shared, common::sim(0.0));
    let session = engine
        .create_session(common::new_session(dir, &context))
        .await?;
    let batch = common::fork_and_wait(&engine, &session, 1, true).await?;
    let stats = common::batch_stats(&engine, batch.batch_id).await?;
    engine.shutdown(Duration::from_millis(100)).await;
    let agent = *batch.agent_ids.first().context("no child")?;
    let original = store
        .list_requests(&RequestFilter {
            agent_id: Some(agent),
            ..RequestFilter::default()
        })
        .await?
        .into_iter()
        .find(|r| r.turn == 0)
        .context("the child's first request is not recorded")?;

    let repeats = if ctx.quick { 10 } else { 40 };
    let (mut load_ms, mut serialize_ms) = (Vec::new(), Vec::new());
    let mut last = None;
    let mut fingerprint_matches = true;
    for _ in 0..repeats {
        let start = Instant::now();
        let session = store.get_session(session.id).await?.context("session")?;
        let fork = store.get_batch(batch.batch_id).await?.context("batch")?;
        let history: Vec<Message> = store
            .session_messages(session.id, Some(fork.fork_point))
            .await?
            .into_iter()
            .map(|m| m.message)
            .collect();
        let directive = store
            .agent_directive_block(agent)
            .await?
            .context("directive")?;
        let own: Vec<Message> = store
            .agent_messages(agent)
            .await?
            .into_iter()
            .map(|m| m.message)
            .collect();
        let loaded = start.elapsed();
        let conv = fork.child_conversation(&history, &directive, &own);
        let req = request::serialize(&session.params, &conv, true);
        let serialized = start.elapsed() - loaded;
        load_ms.push(common::ms(loaded));
        serialize_ms.push(common::ms(serialized));
        let pos = fork.directive_pos(&history);
        fingerprint_matches &=
            req.prefix_fingerprint(pos).as_deref() == Some(original.prefix_fingerprint.as_str());
        last = Some((session.params.model.clone(), req.body));
    }
    let (model, body) = last.context("no rebuild ran")?;
    let body_bytes = body.len();

    // The sim at a tenth of the realistic pace: once to write the cache, once to time the
    // first event; its delays scale linearly with the speed, so ×10 is the realistic figure.
    const SPEED: f64 = 0.1;
    let sim = SimProvider::new(SimConfig {
        speed: SPEED,
        ..SimConfig::default()
    });
    let request = ModelRequest {
        model,
        body: Arc::from(body),
    };
    let mut warm = sim.stream(request.clone());
    while let Some(event) = warm.next().await {
        event?;
    }
    let start = Instant::now();
    let mut timed = sim.stream(request);
    timed.next().await.context("no first event")??;
    let cached_ttft_ms = common::ms(start.elapsed()) / SPEED;
    drop(shared);
    store.close().await;
    Ok(Rebuild {
        load_ms,
        serialize_ms,
        body_bytes,
        prefix_tokens: stats.shared_prefix_tokens,
        fingerprint_matches,
        cached_ttft_ms,
    })
}

struct Resume {
    agents: usize,
    batches: usize,
    running_at_stop: usize,
    pending_at_stop: usize,
    resumed: usize,
    reopen_ms: f64,
    resume_call_ms: f64,
    all_ended_ms: f64,
    distinct_ended: usize,
    read_share: f64,
    fresh_ms: f64,
    fresh_read_share: f64,
}

/// Children per interrupted batch: 1000 agents are 100 batches of 10, as a daemon serving many
/// clients would hold them (one batch of 1000 would make every child's prefix carry 1000
/// directives).
const RESUME_BATCH: usize = 10;

/// The cache-read share of the agents whose notifications these are.
fn read_share(notes: &[forkd_core::Notification]) -> f64 {
    notes
        .iter()
        .fold(Usage::default(), |acc, n| acc + n.usage)
        .cache_read_share()
}

/// `agents` children in batches of [`RESUME_BATCH`], one session each, submitted without gating.
async fn submit_batches(
    engine: &forkd_engine::Engine,
    dir: &Path,
    context: &ContextFile,
    agents: usize,
    gating: bool,
) -> anyhow::Result<usize> {
    let batches = agents.div_ceil(RESUME_BATCH);
    for b in 0..batches {
        let n = RESUME_BATCH.min(agents - b * RESUME_BATCH);
        let session = engine
            .create_session(common::new_session(dir, context))
            .await?;
        engine
            .fork_batch(
                session.id,
                common::directives(n),
                BatchOptions {
                    warmup_gating: Some(gating),
                    ..BatchOptions::default()
                },
            )
            .await?;
    }
    Ok(batches)
}

/// 1000 children interrupted in flight (their model requests never answer; the engine is shut
/// down and dropped), then a new engine on the same database resumes them.
async fn resume(dir: &Path, corpus: &Corpus, prefix: u64, agents: usize) -> anyhow::Result<Resume> {
    let db = dir.join("resume.db");
    let store = common::open_store(&db, Durability::Normal).await?;
    let shared: Arc<dyn Store> = Arc::new(store.clone());
    let overhead = common::prefix_overhead(dir, RESUME_BATCH).await?;
    let context = corpus.context(prefix.saturating_sub(overhead));
    let engine = common::engine(&shared, Arc::new(Hang));
    let since = store.last_notification_seq().await?;
    // All at once, so that as many as the engine allows are in flight when it stops.
    let batches = submit_batches(&engine, dir, &context, agents, false).await?;
    let cap = engine
        .config()
        .max_running_agents
        .unwrap_or(agents)
        .min(agents);
    let live = AgentFilter::default();
    let states = |agents: &[Agent], s: AgentState| agents.iter().filter(|a| a.state == s).count();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = store.list_agents(&live).await?;
        if states(&now, AgentState::Running) >= cap {
            break;
        }
        if Instant::now() > deadline {
            bail!("the interrupted agents did not start");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    engine.shutdown(Duration::from_millis(200)).await;
    drop(engine);
    let before = store.list_agents(&live).await?;
    let (running_at_stop, pending_at_stop) = (
        states(&before, AgentState::Running),
        states(&before, AgentState::Pending),
    );
    drop(shared);
    store.close().await;

    // The restart.
    let start = Instant::now();
    let store = common::open_store(&db, Durability::Normal).await?;
    let shared: Arc<dyn Store> = Arc::new(store.clone());
    let engine = common::engine(&shared, common::sim(0.0));
    let reopen_ms = common::ms(start.elapsed());
    let resumed = engine.resume_interrupted().await?;
    let resume_call_ms = common::ms(start.elapsed());
    let notes =
        common::wait_notifications(&engine, since, NotificationFilter::default(), agents).await?;
    let all_ended_ms = common::ms(start.elapsed());
    let distinct_ended = notes
        .iter()
        .map(|n| n.agent_id)
        .collect::<HashSet<_>>()
        .len();
    let resumed_share = read_share(&notes);
    engine.shutdown(Duration::from_millis(100)).await;

    // The same batches without a restart, on fresh sessions over the same context.
    let fresh_engine = common::engine(&shared, common::sim(0.0));
    let since = store.last_notification_seq().await?;
    let start = Instant::now();
    submit_batches(&fresh_engine, dir, &context, agents, true).await?;
    let fresh_notes =
        common::wait_notifications(&fresh_engine, since, NotificationFilter::default(), agents)
            .await?;
    let fresh_ms = common::ms(start.elapsed());
    fresh_engine.shutdown(Duration::from_millis(100)).await;
    drop(shared);
    store.close().await;
    Ok(Resume {
        agents,
        batches,
        running_at_stop,
        pending_at_stop,
        resumed,
        reopen_ms,
        resume_call_ms,
        all_ended_ms,
        distinct_ended,
        read_share: resumed_share,
        fresh_ms,
        fresh_read_share: read_share(&fresh_notes),
    })
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    let dir = ctx.tempdir("forkd-bench-durability-")?;
    let window = Duration::from_millis(if ctx.quick { 1500 } else { 4000 });
    let mut appends = Table::new(
        format!(
            "Transcript appends (`Store::append_agent_message`, one ~200-token assistant message \
             per transaction, lease checked), for {:.1} s each, database on {}.",
            window.as_secs_f64(),
            ctx.dir.display()
        ),
        &["durability", "writers", "messages/s", "÷ Normal"],
    );
    let mut rates = Vec::new();
    for writers in [1, 8] {
        let mut normal = f64::NAN;
        for durability in [Durability::Normal, Durability::Full] {
            eprintln!("  durability: appends, {durability:?}, {writers} writer(s)");
            let rate = append_rate(dir.path(), durability, writers, window).await?;
            if durability == Durability::Normal {
                normal = rate;
            }
            appends.row(vec![
                match durability {
                    Durability::Normal => "Normal (shipped: WAL, synchronous=NORMAL)".into(),
                    Durability::Full => "Full (`--fsync-every-commit`)".into(),
                },
                writers.to_string(),
                format!("{rate:.0}"),
                format!("{:.2}", rate / normal),
            ]);
            rates.push(json!({"durability": format!("{durability:?}"), "writers": writers, "messages_per_s": rate}));
        }
    }

    eprintln!("  durability: rebuilding a 100k-token transcript");
    let corpus = Corpus::generate(101_000);
    let rb = rebuild(ctx, dir.path(), &corpus).await?;
    let load = common::quantile(&rb.load_ms, 0.5);
    let ser = common::quantile(&rb.serialize_ms, 0.5);
    let mut rebuild_table = Table::new(
        format!(
            "Rebuilding a fork child's request from the store ({} tokens shared, {} body), median \
             of {} runs.",
            rb.prefix_tokens,
            common::bytes(rb.body_bytes as f64),
            rb.load_ms.len()
        ),
        &[
            "load ms",
            "serialize ms",
            "total ms",
            "sim's cached time to first token (speed 1) ms",
            "total ÷ that",
            "prefix byte-identical to the original",
        ],
    );
    rebuild_table.row(vec![
        format!("{load:.2}"),
        format!("{ser:.2}"),
        format!("{:.2}", load + ser),
        format!("{:.0}", rb.cached_ttft_ms),
        common::pct((load + ser) / rb.cached_ttft_ms),
        if rb.fingerprint_matches { "yes" } else { "NO" }.into(),
    ]);

    let (resume_prefix, resume_agents) = if ctx.quick {
        (10_000, 1000)
    } else {
        (100_000, 1000)
    };
    eprintln!(
        "  durability: resuming {resume_agents} interrupted agents ({} prefix)",
        common::ktok(resume_prefix)
    );
    let rs = resume(dir.path(), &corpus, resume_prefix, resume_agents).await?;
    let mut resume_table = Table::new(
        format!(
            "{} children ({} batches of {RESUME_BATCH}, one session each, {} prefix) interrupted: \
             an engine whose model never answers is shut down with {} running and {} pending; a \
             new engine opens the same database and `resume_interrupted()` restarts them (sim at \
             speed 0). No restart: the same batches on fresh sessions, submitted and run.",
            rs.agents,
            rs.batches,
            common::ktok(resume_prefix),
            rs.running_at_stop,
            rs.pending_at_stop
        ),
        &[
            "reopen ms",
            "resume_interrupted() returned (all started) ms",
            "all ended ms",
            "resumed / ended once",
            "read share",
            "no restart: all ended ms",
            "read share",
            "restart ÷ no restart",
        ],
    );
    resume_table.row(vec![
        format!("{:.1}", rs.reopen_ms),
        format!("{:.1}", rs.resume_call_ms),
        format!("{:.0}", rs.all_ended_ms),
        format!("{} / {}", rs.resumed, rs.distinct_ended),
        common::pct(rs.read_share),
        format!("{:.0}", rs.fresh_ms),
        common::pct(rs.fresh_read_share),
        format!("{:.2}", rs.all_ended_ms / rs.fresh_ms),
    ]);

    let checks = vec![
        Check::judge(
            "durability: restart resumes every interrupted agent",
            format!("{} resumed, each ends exactly once", rs.agents),
            format!("{} resumed, {} ended", rs.resumed, rs.distinct_ended),
            rs.resumed == rs.agents && rs.distinct_ended == rs.agents,
            || format!("{} agents", rs.agents - rs.resumed.min(rs.distinct_ended)),
        ),
        Check::judge(
            "cache fidelity: a rebuilt 100k-token request",
            "byte-identical prefix to the original request",
            if rb.fingerprint_matches {
                "identical (prefix fingerprints match)"
            } else {
                "differs"
            },
            rb.fingerprint_matches,
            || "a differing prefix".into(),
        ),
    ];
    let notes = vec![
        "Every append is one transaction that checks the agent's lease. Normal syncs the WAL only \
         at checkpoints (a commit survives `kill -9`, a power loss may take the last few); Full \
         syncs it at every commit. SQLite has one writer, so 8 writers share its rate."
            .into(),
        "`resume_interrupted()` returns once every agent is started (queued behind the cap of 256 \
         running agents); \"all ended\" is until the last notification. A batch's children \
         resume together, behind warm-up gating, since none of these batches had made a request \
         (a batch that had, within the cache's 5 minutes, resumes ungated): the first child \
         writes the prefix and its siblings read it (the read-share column)."
            .into(),
    ];
    Ok(Section {
        id: "durability",
        title: "4. Durability cost and recovery".into(),
        compared_with: "appends: `Full` against the shipped `Normal`; rebuild: the sim's own \
                        time to first token for that request with its prefix cached (at the \
                        realistic pace), which a resumed request waits for anyway; resume: the \
                        same batches run without a restart."
            .into(),
        tables: vec![appends, rebuild_table, resume_table],
        notes,
        checks,
        data: json!({
            "appends": rates,
            "rebuild": {
                "prefix_tokens": rb.prefix_tokens,
                "body_bytes": rb.body_bytes,
                "load_ms": rb.load_ms,
                "serialize_ms": rb.serialize_ms,
                "load_p50_ms": load,
                "serialize_p50_ms": ser,
                "cached_ttft_ms_speed_1": rb.cached_ttft_ms,
                "prefix_identical": rb.fingerprint_matches,
            },
            "resume": {
                "agents": rs.agents,
                "batches": rs.batches,
                "prefix_tokens_target": resume_prefix,
                "running_at_stop": rs.running_at_stop,
                "pending_at_stop": rs.pending_at_stop,
                "resumed": rs.resumed,
                "distinct_ended": rs.distinct_ended,
                "reopen_ms": rs.reopen_ms,
                "resume_call_ms": rs.resume_call_ms,
                "all_ended_ms": rs.all_ended_ms,
                "read_share": rs.read_share,
                "no_restart_all_ended_ms": rs.fresh_ms,
                "no_restart_read_share": rs.fresh_read_share,
            },
        }),
        seconds: started.elapsed().as_secs_f64(),
    })
}
