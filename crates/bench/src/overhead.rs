//! Figure 2, daemon overhead: `ForkBatch` latency for N = 8 on a 100k-token session, through the
//! real daemon (gRPC over its Unix socket) and as the engine call alone, with the sim at speed 0.

use std::time::{Duration, Instant};

use anyhow::Context;
use forkd::daemon::{self, DaemonConfig};
use forkd_core::SessionId;
use forkd_engine::{BatchOptions, Engine};
use forkd_proto::v1 as pb;
use forkd_proto::v1::forkd_client::ForkdClient;
use forkd_store::NotificationFilter;
use serde_json::json;
use tonic::transport::{Channel, Endpoint};

use crate::common::{self, Corpus, Ctx};
use crate::report::{Check, Section, Table};

pub(crate) const CHILDREN: usize = 8;
pub(crate) const PREFIX: u64 = 100_000;
/// Batches per session: each batch adds its fork message and 8 notifications to the parent's
/// transcript, so sessions are replaced before they grow far past 100k tokens.
const BATCHES_PER_SESSION: usize = 5;
/// The overhead target for forking 8 children from a 100k-token session (docs/contracts.md).
const TARGET_MS: f64 = 5.0;

pub async fn connect(addr: &str) -> anyhow::Result<ForkdClient<Channel>> {
    let channel = Endpoint::from_shared(addr.to_owned())?
        .connect()
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    Ok(ForkdClient::new(channel))
}

/// A session over the benchmark context, created through the daemon.
pub(crate) async fn grpc_session(
    client: &mut ForkdClient<Channel>,
    ws: &std::path::Path,
    context: &forkd_engine::ContextFile,
) -> anyhow::Result<SessionId> {
    let session = client
        .create_session(pb::CreateSessionRequest {
            system_prompt: common::SYSTEM_PROMPT.into(),
            context_files: vec![pb::ContextFile {
                path: context.path.clone(),
                content: context.content.clone(),
            }],
            workspace: ws.display().to_string(),
            permission_mode: "dontAsk".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .session
        .context("the daemon returned no session")?;
    Ok(session.session_id.parse()?)
}

/// Waits for a batch's children (not measured).
async fn settle(engine: &Engine, batch: forkd_core::BatchId) -> anyhow::Result<()> {
    let filter = NotificationFilter {
        batch_id: Some(batch),
        ..NotificationFilter::default()
    };
    common::wait_notifications(engine, 0, filter, CHILDREN).await?;
    Ok(())
}

/// Which way a `ForkBatch` call goes.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Route {
    Grpc,
    Engine,
}

/// Times `batches` ForkBatch calls on one path; the first `warmup` are not kept.
pub(crate) async fn measure(
    route: Route,
    client: &mut ForkdClient<Channel>,
    engine: &Engine,
    ws: &std::path::Path,
    context: &forkd_engine::ContextFile,
    warmup: usize,
    batches: usize,
) -> anyhow::Result<Vec<f64>> {
    let mut samples = Vec::with_capacity(batches);
    let mut session = None;
    let directives = common::directives(CHILDREN);
    for i in 0..warmup + batches {
        let sid = match session {
            Some(sid) if i % BATCHES_PER_SESSION != 0 => sid,
            _ => grpc_session(client, ws, context).await?,
        };
        session = Some(sid);
        let (batch, took) = match route {
            Route::Grpc => {
                let request = pb::ForkBatchRequest {
                    session_id: sid.to_string(),
                    directives: directives
                        .iter()
                        .map(|d| pb::Directive {
                            description: d.description.clone(),
                            prompt: d.prompt.clone(),
                            limits: None,
                        })
                        .collect(),
                    ..Default::default()
                };
                let start = Instant::now();
                let reply = client.fork_batch(request).await?.into_inner();
                let took = start.elapsed();
                (reply.batch_id.parse()?, took)
            }
            Route::Engine => {
                let start = Instant::now();
                let reply = engine
                    .fork_batch(sid, directives.clone(), BatchOptions::default())
                    .await?;
                (reply.batch_id, start.elapsed())
            }
        };
        if i >= warmup {
            samples.push(common::ms(took));
        }
        settle(engine, batch).await?;
    }
    Ok(samples)
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    let (warmup, batches) = if ctx.quick { (5, 50) } else { (10, 200) };
    let home = ctx.tempdir("forkd-bench-daemon-")?;
    let ws = ctx.tempdir("forkd-bench-ws-")?;
    let mut config = DaemonConfig::new(home.path().to_path_buf());
    config.sim_speed = 0.0;
    let daemon = daemon::start(config).await?;
    let outcome = async {
        let mut client = connect(&daemon.addr()).await?;
        let corpus = Corpus::generate(PREFIX + 1000);
        let overhead = common::prefix_overhead(ws.path(), CHILDREN).await?;
        let context = corpus.context(PREFIX - overhead);
        eprintln!("  overhead: gRPC ForkBatch, {batches} batches");
        let grpc = measure(
            Route::Grpc,
            &mut client,
            &daemon.engine,
            ws.path(),
            &context,
            warmup,
            batches,
        )
        .await?;
        eprintln!("  overhead: engine fork_batch, {batches} batches");
        let engine = measure(
            Route::Engine,
            &mut client,
            &daemon.engine,
            ws.path(),
            &context,
            warmup,
            batches,
        )
        .await?;
        anyhow::Ok((grpc, engine))
    }
    .await;
    daemon.shutdown(Duration::from_secs(5)).await?;
    let (grpc, engine) = outcome?;

    let mut t = Table::new(
        format!(
            "`ForkBatch`, N = {CHILDREN}, ~100k-token session, sim at speed 0, {batches} batches \
             after {warmup} unmeasured; each batch's children end before the next is sent."
        ),
        &[
            "path",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "max ms",
            "p50 ÷ 5 ms target",
        ],
    );
    let q = |s: &[f64], q: f64| common::quantile(s, q);
    for (name, s) in [
        ("gRPC over the Unix socket (the daemon)", &grpc),
        ("`Engine::fork_batch` (no gRPC)", &engine),
    ] {
        t.row(vec![
            name.into(),
            format!("{:.2}", q(s, 0.5)),
            format!("{:.2}", q(s, 0.9)),
            format!("{:.2}", q(s, 0.99)),
            format!("{:.2}", q(s, 1.0)),
            format!("{:.2}", q(s, 0.5) / TARGET_MS),
        ]);
    }
    let p50 = q(&grpc, 0.5);
    let checks = vec![Check::judge(
        "overhead: ForkBatch p50, N = 8, 100k tokens (gRPC)",
        "p50 < 5 ms",
        format!("{p50:.2} ms (p99 {:.2} ms)", q(&grpc, 0.99)),
        p50 < TARGET_MS,
        || format!("{:.2} ms", p50 - TARGET_MS),
    )];
    let notes = vec![
        "The call returns once the batch and its children are committed (one SQLite transaction) \
         and the children are started; it does not wait for them. The gRPC figure includes the \
         client's encoding and the Unix-socket round trip."
            .into(),
        format!(
            "Sessions are replaced every {BATCHES_PER_SESSION} batches, so the parent's transcript \
             stays near 100k tokens."
        ),
    ];
    let data = json!({
        "children": CHILDREN,
        "prefix_tokens_target": PREFIX,
        "batches": batches,
        "grpc_ms": grpc,
        "engine_ms": engine,
        "grpc_p50_ms": q(&grpc, 0.5),
        "grpc_p99_ms": q(&grpc, 0.99),
        "engine_p50_ms": q(&engine, 0.5),
        "engine_p99_ms": q(&engine, 0.99),
    });
    Ok(Section {
        id: "overhead",
        title: "2. Daemon overhead: ForkBatch latency".into(),
        compared_with: "the target: forking 8 children from a 100k-token session adds well \
                        under 5 ms in the daemon (p50 < 5 ms)."
            .into(),
        tables: vec![t],
        notes,
        checks,
        data,
        seconds: started.elapsed().as_secs_f64(),
    })
}
