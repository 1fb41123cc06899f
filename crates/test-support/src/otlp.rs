//! An OTLP/gRPC trace receiver for tests and the bench: opentelemetry-proto's `TraceService` on a
//! local port, keeping every span it is sent, until it is stopped.

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
pub use opentelemetry_proto::tonic::common::v1::any_value::Value;
pub use opentelemetry_proto::tonic::trace::v1::Span;

/// A running receiver.
pub struct OtlpReceiver {
    /// Its address, as an OTLP endpoint (`http://127.0.0.1:PORT`).
    pub endpoint: String,
    spans: Arc<Mutex<Vec<Span>>>,
    down: Arc<std::sync::atomic::AtomicBool>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

#[derive(Clone)]
struct Keep(Arc<Mutex<Vec<Span>>>, Arc<std::sync::atomic::AtomicBool>);

#[tonic::async_trait]
impl TraceService for Keep {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        // Stopped: a connection the exporter already holds (which a graceful shutdown keeps
        // serving) fails too, as a collector that is down would.
        if self.1.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(tonic::Status::unavailable("the collector is down"));
        }
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                kept.extend(scope.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl OtlpReceiver {
    /// Starts one on a free local port.
    pub async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let spans = Arc::new(Mutex::new(Vec::new()));
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(Keep(
                    Arc::clone(&spans),
                    Arc::clone(&down),
                )))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    async {
                        let _ = stopped.await;
                    },
                ),
        );
        Ok(Self {
            endpoint: format!("http://{addr}"),
            spans,
            down,
            stop: Some(stop),
        })
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How many spans it has received.
    pub fn count(&self) -> usize {
        self.spans.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Stops serving: the collector is down from now on.
    pub fn stop(&mut self) {
        self.down.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
