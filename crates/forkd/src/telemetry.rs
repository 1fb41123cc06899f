//! OpenTelemetry traces (docs/operations.md, "Tracing"): the `tracing` spans forkd already has —
//! RPCs, parent turns, fork batches, agents, model requests, tool calls — exported over OTLP
//! through `tracing-opentelemetry`, off unless an endpoint is configured.
//!
//! Configured the standard way (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_PROTOCOL`,
//! `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`, read by the
//! OpenTelemetry crates themselves), or by `[tracing]` in `config.toml` and `--otlp-endpoint`.
//! Spans are batched on a thread of their own; a collector that is down never slows an agent:
//! what cannot be exported is dropped and counted (`forkd_trace_spans_dropped_total`).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing_subscriber::registry::LookupSpan;

/// The counter of spans that could not be exported.
pub const SPANS_DROPPED: &str = "forkd_trace_spans_dropped_total";

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OtlpProtocol {
    #[default]
    Grpc,
    HttpProtobuf,
}

impl OtlpProtocol {
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        match text.trim() {
            "grpc" => Ok(Self::Grpc),
            "http/protobuf" => Ok(Self::HttpProtobuf),
            other => {
                anyhow::bail!("unknown OTLP protocol {other:?} (expected grpc or http/protobuf)")
            }
        }
    }

    /// The URL traces are sent to on a collector at `base`: the base itself for gRPC, its
    /// `/v1/traces` for HTTP.
    pub fn traces_url(self, base: &str) -> String {
        let base = base.trim().trim_end_matches('/');
        match self {
            Self::Grpc => base.to_owned(),
            Self::HttpProtobuf => format!("{base}/v1/traces"),
        }
    }
}

/// `OTEL_EXPORTER_OTLP_HEADERS`: `key1=value1,key2=value2`, values percent-decoded.
pub fn parse_headers(list: &str) -> anyhow::Result<Vec<(String, String)>> {
    list.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("OTLP header {pair:?} is not key=value"))?;
            Ok((key.trim().to_owned(), percent_decode(value.trim())?))
        })
        .collect()
}

fn percent_decode(text: &str) -> anyhow::Result<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| anyhow::anyhow!("bad percent escape in OTLP header {text:?}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Ok(String::from_utf8(out)?)
}

/// Where traces go.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingConfig {
    /// Where traces are sent: the collector's gRPC URL, or its HTTP `…/v1/traces`.
    pub endpoint: String,
    pub protocol: OtlpProtocol,
    /// Headers sent with every export (an API key of a hosted backend).
    pub headers: Vec<(String, String)>,
    /// The `service.name` of forkd's spans.
    pub service_name: String,
    /// Put prompt and completion text on model-request spans (off: it may hold secrets).
    pub capture_content: bool,
}

/// Which spans and events become traces, whatever the log filter says: forkd's spans at `info`
/// and above, its `gen_ai.*` events (time to first token), and its warnings and errors as span
/// events. Its other log lines stay in the log: as span events they would cost every span.
pub fn span_filter() -> tracing_subscriber::filter::FilterFn {
    tracing_subscriber::filter::filter_fn(traced)
}

/// [`span_filter`]'s test, for a filter that adds its own.
pub fn traced(meta: &tracing::Metadata<'_>) -> bool {
    if !meta.target().starts_with("forkd") {
        return false;
    }
    if meta.is_span() {
        return *meta.level() <= tracing::Level::INFO;
    }
    *meta.level() <= tracing::Level::WARN || meta.name().starts_with("gen_ai.")
}

/// The running exporter: flushes what is left when dropped.
pub struct Telemetry {
    provider: SdkTracerProvider,
    dropped: Arc<AtomicU64>,
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

impl Telemetry {
    /// The exporter and its provider. Needs a Tokio runtime for gRPC.
    pub fn start(config: &TracingConfig) -> anyhow::Result<Self> {
        metrics::describe_counter!(
            SPANS_DROPPED,
            "Spans that could not be exported to the OTLP collector (it was down, slow or refused them)"
        );
        let dropped = Arc::new(AtomicU64::new(0));
        let exporter = Counting {
            inner: exporter(config)?,
            dropped: Arc::clone(&dropped),
        };
        let resource = Resource::builder()
            .with_service_name(config.service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        Ok(Self { provider, dropped })
    }

    /// Spans this exporter could not deliver (also `forkd_trace_spans_dropped_total`).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The `tracing` layer that turns spans into OpenTelemetry spans.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        // What a span costs on the agents' path is kept small: no busy/idle timing at every
        // poll of an async span, no source locations or thread names on every span.
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("forkd"))
            .with_error_records_to_exceptions(true)
            .with_tracked_inactivity(false)
            .with_location(false)
            .with_threads(false)
    }

    /// Exports what is buffered now.
    pub fn flush(&self) {
        if let Err(e) = self.provider.force_flush() {
            tracing::warn!(error = %e, "Could not export the buffered spans");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}

fn exporter(config: &TracingConfig) -> anyhow::Result<opentelemetry_otlp::SpanExporter> {
    let endpoint = config.endpoint.clone();
    let exporter = match config.protocol {
        OtlpProtocol::Grpc => {
            let builder = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint);
            let mut metadata = tonic::metadata::MetadataMap::new();
            for (key, value) in &config.headers {
                let key =
                    tonic::metadata::MetadataKey::from_bytes(key.to_ascii_lowercase().as_bytes())?;
                metadata.insert(key, value.parse()?);
            }
            builder.with_metadata(metadata).build()?
        }
        OtlpProtocol::HttpProtobuf => {
            let builder = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(endpoint);
            let headers: HashMap<String, String> = config.headers.iter().cloned().collect();
            builder.with_headers(headers).build()?
        }
    };
    Ok(exporter)
}

/// An exporter that counts the spans it could not deliver.
#[derive(Debug)]
struct Counting<E> {
    inner: E,
    dropped: Arc<AtomicU64>,
}

impl<E: SpanExporter> SpanExporter for Counting<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len() as u64;
        let result = self.inner.export(batch).await;
        if let Err(e) = &result {
            // Not a log line per failure: a collector that is down would flood the log.
            if self.dropped.fetch_add(n, Ordering::Relaxed) == 0 {
                tracing::warn!(error = %e, "Cannot export traces; spans are dropped and counted ({SPANS_DROPPED})");
            }
            metrics::counter!(SPANS_DROPPED).increment(n);
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: std::time::Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    #[test]
    fn endpoints_headers_and_protocols() {
        assert_eq!(
            OtlpProtocol::HttpProtobuf.traces_url("http://c:4318/"),
            "http://c:4318/v1/traces"
        );
        assert_eq!(
            OtlpProtocol::Grpc.traces_url("http://c:4317"),
            "http://c:4317"
        );
        assert!(OtlpProtocol::parse("http/json").is_err());
        assert_eq!(
            parse_headers("api-key=a%3Db, x = y ,").unwrap(),
            [
                ("api-key".to_owned(), "a=b".to_owned()),
                ("x".to_owned(), "y".to_owned())
            ]
        );
        assert!(parse_headers("novalue").is_err());
        assert!(parse_headers("k=%zz").is_err());
    }

    /// OTLP over HTTP (`http/protobuf`) reaches a receiver at `…/v1/traces`, with the
    /// configured headers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spans_reach_an_http_receiver_with_the_headers() {
        use opentelemetry_proto::tonic::collector::trace::v1::{
            ExportTraceServiceRequest, ExportTraceServiceResponse,
        };
        use prost::Message as _;
        /// Each export: its `x-api-key` header and its spans' names.
        type Exports = Arc<std::sync::Mutex<Vec<(Option<String>, Vec<String>)>>>;
        let received: Exports = Arc::default();
        let kept = Arc::clone(&received);
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| async move {
                    let request = ExportTraceServiceRequest::decode(body).unwrap();
                    let names = request
                        .resource_spans
                        .iter()
                        .flat_map(|r| &r.scope_spans)
                        .flat_map(|s| &s.spans)
                        .map(|s| s.name.clone())
                        .collect();
                    let key = headers
                        .get("x-api-key")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    kept.lock().unwrap().push((key, names));
                    ExportTraceServiceResponse::default().encode_to_vec()
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let telemetry = Telemetry::start(&TracingConfig {
            endpoint: OtlpProtocol::HttpProtobuf.traces_url(&format!("http://{addr}")),
            protocol: OtlpProtocol::HttpProtobuf,
            headers: vec![("x-api-key".into(), "k".into())],
            service_name: "forkd-test".into(),
            capture_content: false,
        })
        .unwrap();
        let subscriber = tracing_subscriber::registry().with(telemetry.layer());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info_span!("fork_batch").in_scope(|| {});
        });
        let telemetry = tokio::task::spawn_blocking(move || {
            telemetry.flush();
            telemetry
        })
        .await
        .unwrap();
        assert_eq!(telemetry.dropped(), 0);
        assert_eq!(
            *received.lock().unwrap(),
            [(Some("k".to_owned()), vec!["fork_batch".to_owned()])]
        );
    }

    /// A collector that is down slows nothing and loses nothing silently: what cannot be
    /// exported is counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spans_a_down_collector_cannot_take_are_dropped_and_counted() {
        for protocol in [OtlpProtocol::Grpc, OtlpProtocol::HttpProtobuf] {
            // Nothing listens on port 1.
            let telemetry = Telemetry::start(&TracingConfig {
                endpoint: protocol.traces_url("http://127.0.0.1:1"),
                protocol,
                headers: Vec::new(),
                service_name: "forkd-test".into(),
                capture_content: false,
            })
            .unwrap();
            let subscriber = tracing_subscriber::registry().with(telemetry.layer());
            tracing::subscriber::with_default(subscriber, || {
                for i in 0..3 {
                    tracing::info_span!("work", i).in_scope(|| {});
                }
            });
            let started = std::time::Instant::now();
            let flushing = tokio::task::spawn_blocking(move || {
                telemetry.flush();
                telemetry
            });
            let telemetry = flushing.await.unwrap();
            assert_eq!(telemetry.dropped(), 3, "{protocol:?}");
            assert!(started.elapsed() < std::time::Duration::from_secs(15));
        }
    }
}
