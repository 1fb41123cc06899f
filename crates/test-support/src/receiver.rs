//! A webhook receiver for tests and benchmarks: an HTTP server on loopback that verifies each
//! delivery's signature with the Standard Webhooks specification's own library, records what it
//! got, and answers as the test tells it (take it, fail it, ask for a pause, redirect, hang).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::Value;

/// How the receiver answers a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// 200.
    Take,
    /// This status, with no `retry-after`.
    Fail(u16),
    /// 429 with `retry-after: N` seconds.
    SlowDown(u64),
    /// 302 to this location.
    Redirect(String),
    /// Never answers (until the connection is cut).
    Hang,
}

/// One delivery as received.
#[derive(Debug, Clone)]
pub struct Received {
    /// The `webhook-id` header.
    pub id: String,
    /// The body, parsed.
    pub body: Value,
    /// Whether the signature verified against any of the secrets the test gave.
    pub verified: bool,
    /// When it arrived.
    pub at: Instant,
    /// When it arrived, by the wall clock (to compare with a notification's time).
    pub at_wall: std::time::SystemTime,
    /// What the receiver answered.
    pub answer: Answer,
    /// The request path (the redirect target records its hits too).
    pub path: String,
}

#[derive(Default)]
struct Shared {
    secrets: Vec<String>,
    /// Answers to give in order; `Take` once they run out.
    script: VecDeque<Answer>,
    /// The answer once the script is spent.
    otherwise: Option<Answer>,
    received: Vec<Received>,
}

/// A receiver on `127.0.0.1`; dropped, it stops.
pub struct Receiver {
    addr: SocketAddr,
    shared: Arc<Mutex<Shared>>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    /// Starts one on a free port.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Starts one on `addr` (a port a test chose before, to come up late).
    pub async fn start_on(addr: SocketAddr) -> anyhow::Result<Self> {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let app = axum::Router::new()
            .route("/{*path}", post(receive))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, shared, task })
    }

    /// Its URL, at `path` (`/hook`).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The secrets a delivery's signature may verify against (any one suffices).
    pub fn trust(&self, secrets: &[&str]) {
        self.lock().secrets = secrets.iter().map(|s| (*s).to_owned()).collect();
    }

    /// The next answers, in order; after them, `otherwise` (or 200).
    pub fn answer(&self, script: Vec<Answer>, otherwise: Option<Answer>) {
        let mut shared = self.lock();
        shared.script = script.into();
        shared.otherwise = otherwise;
    }

    /// Every delivery received so far.
    pub fn received(&self) -> Vec<Received> {
        self.lock().received.clone()
    }

    /// The distinct `webhook-id`s of the deliveries it took (answered 200).
    pub fn taken_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .lock()
            .received
            .iter()
            .filter(|r| r.answer == Answer::Take)
            .map(|r| r.id.clone())
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn receive(
    State(shared): State<Arc<Mutex<Shared>>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let at = Instant::now();
    let answer = {
        let mut s = shared.lock().unwrap_or_else(|e| e.into_inner());
        let verified = s.secrets.iter().any(|secret| {
            standardwebhooks::Webhook::new(secret)
                .map(|w| w.verify(&body, &headers).is_ok())
                .unwrap_or(false)
        });
        let answer = s
            .script
            .pop_front()
            .or_else(|| s.otherwise.clone())
            .unwrap_or(Answer::Take);
        s.received.push(Received {
            id: headers
                .get("webhook-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            verified,
            at,
            at_wall: std::time::SystemTime::now(),
            answer: answer.clone(),
            path: uri.path().to_owned(),
        });
        answer
    };
    match answer {
        Answer::Take => StatusCode::OK.into_response(),
        Answer::Fail(status) => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            "receiver says no",
        )
            .into_response(),
        Answer::SlowDown(secs) => (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, secs.to_string())],
        )
            .into_response(),
        Answer::Redirect(to) => (StatusCode::FOUND, [(header::LOCATION, to)]).into_response(),
        Answer::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            StatusCode::OK.into_response()
        }
    }
}
