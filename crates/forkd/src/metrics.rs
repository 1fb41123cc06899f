//! `--metrics-listen`: the Prometheus endpoint.
//!
//! The recorder is installed before the engine starts, so nothing it counts is lost; the listener
//! is bound then too (a taken port fails the start, and port 0 resolves to the port reported in
//! the log and in [`crate::daemon::RunningDaemon::metrics_addr`]). Each scrape reads a snapshot
//! of the store — agents by kind and state, recent batches' token totals — so those figures are
//! what is stored, not what this process happened to see since it started.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use forkd_core::{AgentKind, AgentState};
use forkd_engine::Engine;
use forkd_store::{BatchStats, Stats};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long a batch whose children have all ended stays in `forkd_batch_cache_read_share`: long
/// enough for a scrape every few minutes to see its final value.
pub const BATCH_WINDOW: Duration = Duration::from_secs(15 * 60);

/// How often histogram samples are folded into their summaries between scrapes.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

const BATCH_SHARE: &str = "forkd_batch_cache_read_share";

const KINDS: [AgentKind; 3] = [AgentKind::Parent, AgentKind::Fork, AgentKind::Typed];
const STATES: [AgentState; 7] = AgentState::ALL;

/// The recorder, installed, and the bound listener, not yet serving.
pub(crate) struct Endpoint {
    listener: TcpListener,
    handle: PrometheusHandle,
}

impl Endpoint {
    /// Installs the process's Prometheus recorder and binds `addr`. One process has one recorder:
    /// a second daemon in the same process asking for metrics fails here. Every series carries
    /// the label `daemon`, so that several daemons on one database can be told apart.
    pub(crate) async fn bind(
        addr: SocketAddr,
        daemon: forkd_core::DaemonId,
    ) -> anyhow::Result<Self> {
        if !addr.ip().is_loopback() {
            tracing::warn!(%addr, "Serving metrics off loopback: the endpoint has no authentication");
        }
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot serve metrics on {addr}"))?;
        let recorder = PrometheusBuilder::new()
            .add_global_label("daemon", daemon.to_string())
            .build_recorder();
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder).map_err(|_| {
            anyhow::anyhow!(
                "cannot serve metrics on {addr}: this process already has a metrics recorder"
            )
        })?;
        forkd_engine::metrics::describe();
        forkd_store::describe_metrics();
        Ok(Self { listener, handle })
    }

    pub(crate) fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves `GET /metrics` until `shutdown`.
    pub(crate) fn serve(self, engine: Engine, shutdown: CancellationToken) -> JoinHandle<()> {
        let Self { listener, handle } = self;
        let upkeep = handle.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(UPKEEP_EVERY);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = every.tick() => upkeep.run_upkeep(),
                }
            }
        });
        let app = Router::new()
            .route("/metrics", get(scrape))
            .with_state((engine, handle));
        tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "The metrics listener stopped");
            }
        })
    }
}

async fn scrape(State((engine, handle)): State<(Engine, PrometheusHandle)>) -> impl IntoResponse {
    let since = std::time::SystemTime::now()
        .checked_sub(BATCH_WINDOW)
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let stats = match engine.store().stats(since).await {
        Ok(stats) => Some(stats),
        Err(e) => {
            // The process's own counters are still worth a scrape; the stored figures are not
            // reported rather than reported wrong.
            tracing::warn!(error = %e, "Cannot read the store's figures for a metrics scrape");
            None
        }
    };
    if let Some(stats) = &stats {
        set_agent_gauges(stats);
    }
    let mut text = handle.render();
    if let Some(stats) = &stats {
        let daemon = engine.store().holder().daemon;
        render_batches(&mut text, &stats.batches, daemon);
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
}

/// Sets `forkd_agents{kind,state}` for every pair, zero included: a state that empties must
/// read 0, not keep its last value.
fn set_agent_gauges(stats: &Stats) {
    for kind in KINDS {
        for state in STATES {
            let n = stats
                .agents
                .iter()
                .find(|c| c.kind == kind && c.state == state)
                .map_or(0, |c| c.count);
            forkd_engine::metrics::agents(kind, state, n);
        }
    }
}

/// Appends `forkd_batch_cache_read_share`, one series per batch that runs or ended within
/// [`BATCH_WINDOW`]. Written here rather than through the recorder, which would keep a series
/// for every batch the process ever saw; labelled with the daemon like the recorder's series.
fn render_batches(text: &mut String, batches: &[BatchStats], daemon: forkd_core::DaemonId) {
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let _ = writeln!(
        text,
        "# HELP {BATCH_SHARE} Share of a fork batch's input tokens read from the prompt cache, \
         for batches running or ended in the last {} minutes",
        BATCH_WINDOW.as_secs() / 60
    );
    let _ = writeln!(text, "# TYPE {BATCH_SHARE} gauge");
    for b in batches {
        let _ = writeln!(
            text,
            "{BATCH_SHARE}{{daemon=\"{daemon}\",batch_id=\"{}\",session_id=\"{}\",tenant=\"{}\"}} {}",
            b.batch_id,
            b.session_id,
            escape_label(&b.tenant),
            b.usage.cache_read_share()
        );
    }
}

/// A label value as the exposition format wants it: backslash, quote and newline escaped.
fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkd_core::{BatchId, SessionId, Usage};

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape_label("x\ny"), "x\\ny");
    }

    #[test]
    fn batches_render_as_one_gauge_family() {
        let batch = BatchStats {
            batch_id: BatchId::new(),
            session_id: SessionId::new(),
            tenant: "ci".into(),
            children: 2,
            ended: 2,
            usage: Usage {
                input_tokens: 10,
                cache_creation_input_tokens: 10,
                cache_read_input_tokens: 80,
                output_tokens: 5,
            },
            cost_usd: 0.1,
        };
        let mut text = "forkd_requests_total 3".to_owned();
        let daemon = forkd_core::DaemonId::new();
        render_batches(&mut text, std::slice::from_ref(&batch), daemon);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "forkd_requests_total 3");
        assert!(lines[1].starts_with("# HELP forkd_batch_cache_read_share "));
        assert_eq!(lines[2], "# TYPE forkd_batch_cache_read_share gauge");
        assert_eq!(
            lines[3],
            format!(
                "forkd_batch_cache_read_share{{daemon=\"{daemon}\",batch_id=\"{}\",session_id=\"{}\",tenant=\"ci\"}} 0.8",
                batch.batch_id, batch.session_id
            )
        );
    }
}
