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
use forkd_provider::{SimConfig, SimProvider};
use forkd_store::{Durability, NotificationFilter, SqliteStore};
use futures::StreamExt;

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
