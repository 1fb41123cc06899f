//! Figure 14, traces: what OTLP export costs. The daemon (gRPC over its Unix socket, the sim at
//! speed 0) with its spans exported over OTLP/gRPC to a receiver in this process, against the
//! same daemon with export off: `ForkBatch` p50 (N = 8, a ~100k-token session) and a 100-child
//! batch's wall time, each the median of 5 runs, the two modes interleaved.
//!
//! The exporter's layer is installed once for the process, behind a switch that the runs turn
//! on and off; off, the layer is given no span at all.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use forkd::daemon::{self, DaemonConfig};
use forkd::telemetry::{OtlpProtocol, Telemetry, TracingConfig};
use forkd_proto::v1 as pb;
use forkd_test_support::otlp::OtlpReceiver;
use serde_json::json;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;

use crate::common::{self, Corpus, Ctx};
use crate::overhead::{self, CHILDREN, PREFIX, Route};
use crate::report::{Check, Section, Table};

/// Issue 31's target: export on within 1.1× of export off.
const TARGET_RATIO: f64 = 1.1;
const RUNS: usize = 5;
const WIDE: usize = 100;

/// Whether spans go to the exporter now.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// A batch of `WIDE` children, sent with a `traceparent`, until its last child ends.
async fn wide_batch(
    client: &mut pb::forkd_client::ForkdClient<tonic::transport::Channel>,
    session: &str,
) -> anyhow::Result<f64> {
    let directives = common::directives(WIDE)
        .into_iter()
        .map(|d| pb::Directive {
            description: d.description,
            prompt: d.prompt,
            limits: None,
        })
        .collect();
    let mut request = tonic::Request::new(pb::ForkBatchRequest {
        session_id: session.to_owned(),
        directives,
        ..Default::default()
    });
    request.metadata_mut().insert(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse()?,
    );
    let started = Instant::now();
    let batch = client.fork_batch(request).await?.into_inner();
    forkd_test_support::wait_for_batch(client, &batch.batch_id, WIDE, Duration::from_secs(600))
        .await?;
    Ok(common::ms(started.elapsed()))
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    let receiver = OtlpReceiver::start().await?;
    let telemetry = Telemetry::start(&TracingConfig {
        endpoint: receiver.endpoint.clone(),
        protocol: OtlpProtocol::Grpc,
        headers: Vec::new(),
        service_name: "forkd-bench".into(),
        capture_content: false,
    })?;
    // A dynamic filter: asked at every span, not once per callsite (a plain filter's answer
    // would be cached while the switch is off).
    let switch = tracing_subscriber::filter::dynamic_filter_fn(|meta, _| {
        EXPORTING.load(Ordering::Relaxed) && forkd::telemetry::traced(meta)
    });
    let subscriber = tracing_subscriber::registry().with(telemetry.layer().with_filter(switch));
    // Once per process; another figure's subscriber would leave this one unused.
    let installed = tracing::subscriber::set_global_default(subscriber).is_ok();

    let (warmup, batches) = if ctx.quick { (3, 20) } else { (5, 50) };
    let home = ctx.tempdir("forkd-bench-traces-")?;
    let ws = ctx.tempdir("forkd-bench-traces-ws-")?;
    let mut config = DaemonConfig::new(home.path().to_path_buf());
    config.sim_speed = 0.0;
    let daemon = daemon::start(config).await?;
    let outcome = async {
        let mut client = overhead::connect(&daemon.addr()).await?;
        let corpus = Corpus::generate(PREFIX + 1000);
        let overhead_tokens = common::prefix_overhead(ws.path(), CHILDREN).await?;
        let context = corpus.context(PREFIX - overhead_tokens);
        let small = corpus.context(10_000);
        let mut p50 = [Vec::new(), Vec::new()];
        let mut wide = [Vec::new(), Vec::new()];
        for run in 0..RUNS {
            for (mode, on) in [(0, false), (1, true)] {
                EXPORTING.store(on, Ordering::Relaxed);
                eprintln!(
                    "  traces: run {}, export {}",
                    run + 1,
                    if on { "on" } else { "off" }
                );
                let samples = overhead::measure(
                    Route::Grpc,
                    &mut client,
                    &daemon.engine,
                    ws.path(),
                    &context,
                    warmup,
                    batches,
                )
                .await?;
                p50[mode].push(common::quantile(&samples, 0.5));
                let session = overhead::grpc_session(&mut client, ws.path(), &small).await?;
                wide[mode].push(wide_batch(&mut client, &session.to_string()).await?);
            }
        }
        EXPORTING.store(false, Ordering::Relaxed);
        anyhow::Ok((p50, wide))
    }
    .await;
    daemon.shutdown(Duration::from_secs(5)).await?;
    let (p50, wide) = outcome?;
    let flush = tokio::task::spawn_blocking(move || {
        telemetry.flush();
        telemetry
    });
    let telemetry = flush.await?;
    let exported = receiver.count() as u64;

    let rows = [
        (
            format!("`ForkBatch` p50, N = {CHILDREN}, ~100k-token session (ms)"),
            &p50,
        ),
        (format!("{WIDE}-child batch, wall time (ms)"), &wide),
    ];
    let mut table = Table::new(
        format!(
            "The daemon with its spans exported over OTLP/gRPC to a receiver in the same process \
             against export off; median of {RUNS} runs each, interleaved; {batches} ForkBatch \
             calls a run after {warmup} unmeasured; the {WIDE}-child batch on a 10k context."
        ),
        &[
            "measure",
            "export off",
            "export on",
            "on ÷ off",
            "runs (off; on)",
        ],
    );
    let mut checks = vec![Check::judge(
        "traces: spans exported while export is on",
        "> 0, none dropped",
        format!("{exported} exported, {} dropped", telemetry.dropped()),
        exported > 0 && telemetry.dropped() == 0,
        || "the exporter's layer saw no span: the figure measures nothing".to_owned(),
    )];
    let mut data = Vec::new();
    for (name, samples) in rows {
        let (off, on) = (median(samples[0].clone()), median(samples[1].clone()));
        let ratio = on / off;
        table.row(vec![
            name.clone(),
            format!("{off:.2}"),
            format!("{on:.2}"),
            format!("{ratio:.3}×"),
            format!(
                "{}; {}",
                samples[0]
                    .iter()
                    .map(|x| format!("{x:.1}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                samples[1]
                    .iter()
                    .map(|x| format!("{x:.1}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ]);
        checks.push(Check::judge(
            format!("traces: {name}, export on ÷ off"),
            format!("≤ {TARGET_RATIO}×"),
            format!("{ratio:.3}×"),
            ratio <= TARGET_RATIO,
            || "exporting spans slows the daemon".to_owned(),
        ));
        data.push(json!({"measure": name, "off": samples[0], "on": samples[1], "ratio": ratio}));
    }
    Ok(Section {
        id: "traces",
        title: "14. Traces: what OTLP export costs".into(),
        compared_with: "the same daemon with export off.".into(),
        tables: vec![table],
        notes: vec![
            format!(
                "{exported} spans reached the receiver ({} could not be exported){}.",
                telemetry.dropped(),
                if installed {
                    ""
                } else {
                    "; the exporter's layer could not be installed (another subscriber was)"
                }
            ),
            "Spans are batched and exported on a thread of their own; a request's span, its \
             agent's and its batch's are all the work export adds on the agents' path."
                .into(),
        ],
        checks,
        data: json!({ "rows": data, "spans_exported": exported }),
        seconds: started.elapsed().as_secs_f64(),
    })
}
