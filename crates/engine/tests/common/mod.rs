//! What the engine's integration tests share: an engine on a fresh SQLite database and the
//! simulated model, a session ready for forks, and [`eventually`].
//!
//! `forkd-test-support` cannot be a dev-dependency of `forkd-engine`: it depends on the daemon,
//! which depends on the engine. Its `eventually` depends on nothing but tokio, so it is included
//! here by path, and both kinds of tests wait the same way.

#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use forkd_core::session::PermissionMode;
use forkd_core::{AgentId, Notification};
use forkd_engine::{ContextFile, Engine, EngineConfig, NewSession};
use std::sync::Mutex;

use forkd_core::Usage;
use forkd_provider::{
    EventStream, ModelRequest, Provider, SimConfig, SimProvider, StreamEvent, TokenCount,
};
use forkd_store::{Durability, NotificationFilter, SqliteStore};
use futures::StreamExt;
use futures::future::BoxFuture;
use serde_json::Value;

#[path = "../../../test-support/src/eventually.rs"]
mod eventually;
pub use eventually::eventually;

/// The store every test engine opens: `forkd.db` in `dir`.
pub async fn store(dir: &Path) -> Arc<SqliteStore> {
    Arc::new(
        SqliteStore::open(&dir.join("forkd.db"), Durability::Normal)
            .await
            .unwrap(),
    )
}

/// An engine on `store` and the sim at `sim`'s pace, with `config`.
pub fn engine_on(store: Arc<SqliteStore>, sim: SimConfig, config: EngineConfig) -> Engine {
    Engine::new(store, Arc::new(SimProvider::new(sim)), config)
}

/// An engine on `dir`'s database and the instant sim, with `config`.
pub async fn engine_with(dir: &Path, config: EngineConfig) -> Engine {
    engine_on(
        store(dir).await,
        SimConfig {
            speed: 0.0,
            ..SimConfig::default()
        },
        config,
    )
}

/// An engine on `dir`'s database and the instant sim, with the default settings.
pub async fn engine(dir: &Path) -> Engine {
    engine_with(dir, EngineConfig::default()).await
}

/// A session with this system prompt, working in `dir` without asking for permission, whose
/// context (about 600 tokens) is long enough for the shared prefix to be cached.
pub fn new_session(dir: &Path, system: &str) -> NewSession {
    NewSession {
        system_prompt: system.into(),
        context_files: vec![ContextFile {
            path: "a.md".into(),
            content: "context ".repeat(600),
        }],
        workspace: Some(dir.to_path_buf()),
        permission_mode: PermissionMode::DontAsk,
        ..NewSession::default()
    }
}

/// Waits (at most 60 s) for the agent's notification, replayed from the store or live.
pub async fn ended(engine: &Engine, agent: AgentId) -> Notification {
    let filter = NotificationFilter {
        agent_id: Some(agent),
        ..NotificationFilter::default()
    };
    let mut stream = engine.subscribe(0, filter, true).await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), stream.next())
        .await
        .expect("the agent ends")
        .unwrap()
        .unwrap()
}

/// One request the provider was sent: its exact body, and the usage the sim answered with.
#[derive(Clone)]
pub struct Sent {
    pub body: Arc<str>,
    pub usage: Arc<Mutex<Option<Usage>>>,
}

impl Sent {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }

    pub fn usage(&self) -> Usage {
        self.usage
            .lock()
            .unwrap()
            .expect("the request was answered")
    }
}

/// The instant sim, keeping every request's body and usage.
#[derive(Default)]
pub struct Recorder {
    pub sim: SimProvider,
    sent: Mutex<Vec<Sent>>,
}

impl Recorder {
    /// A recorder on `sim` (a clone shares its prompt cache, as a provider's outlives a daemon).
    pub fn on(sim: SimProvider) -> Self {
        Self {
            sim,
            sent: Mutex::default(),
        }
    }

    /// The sim at `speed` (0: instant), recorded.
    pub fn with_speed(speed: f64) -> Self {
        Self::on(SimProvider::new(SimConfig {
            speed,
            ..SimConfig::default()
        }))
    }

    /// Everything sent so far, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.sent.lock().unwrap().clone()
    }

    /// The bodies sent so far, in order.
    pub fn bodies(&self) -> Vec<String> {
        self.sent().iter().map(|s| s.body.to_string()).collect()
    }

    /// What was sent whose body holds `marker` (a directive's own text), in order.
    pub fn sent_with(&self, marker: &str) -> Vec<Sent> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.body.contains(marker))
            .cloned()
            .collect()
    }
}

impl Provider for Recorder {
    fn name(&self) -> &'static str {
        "recorder"
    }

    fn stream(&self, request: ModelRequest) -> EventStream {
        let usage = Arc::new(Mutex::new(None));
        self.sent.lock().unwrap().push(Sent {
            body: request.body.clone(),
            usage: usage.clone(),
        });
        Box::pin(self.sim.stream(request).inspect(move |event| {
            if let Ok(StreamEvent::MessageStart { usage: u, .. }) = event {
                *usage.lock().unwrap() = Some(*u);
            }
        }))
    }

    fn count_tokens(
        &self,
        request: ModelRequest,
    ) -> BoxFuture<'static, Result<TokenCount, forkd_provider::ProviderError>> {
        self.sim.count_tokens(request)
    }
}
