//! Fixtures shared by the store's integration tests: a fresh store of either backend, sessions,
//! transcripts, batches, agents.
//!
//! Most tests are conformance tests: written once against `dyn Store`, and run on each backend by
//! [`conformance!`], which makes `sqlite::NAME` and `postgres::NAME` of each. A PostgreSQL test
//! gets a database of its own on the server `FORKD_TEST_DATABASE_URL` names, dropped when the
//! test ends; without that variable it says so and passes, unless `CI` is set: then it fails, as
//! it does whenever the server cannot be reached.

#![allow(dead_code)] // Each test binary uses its own subset.

use std::future::Future;
use std::ops::Deref;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use forkd_core::agent::{Directive, FORK_QUERY_SOURCE};
use forkd_core::fork::{ForkBatch, client_fork_message, fork_directives};
use forkd_core::report::Report;
use forkd_core::session::{
    CacheSafeParams, PermissionMode, RenderedSystem, Session, ThinkingConfig, ToolsJson,
};
use forkd_core::{
    Agent, AgentKind, AgentState, BatchId, Block, Message, NotificationStatus, RawJson, SessionId,
    Usage,
};
use forkd_store::{
    Durability, Holder, NewChild, NewNotification, PgStore, SqliteStore, Store, redacted_url,
};
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use tempfile::TempDir;

pub type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Where the PostgreSQL tests find their server.
pub const DATABASE_URL_VAR: &str = "FORKD_TEST_DATABASE_URL";

/// Connections each PostgreSQL test store keeps at most: tests run in parallel on one server.
const TEST_CONNECTIONS: u32 = 4;

/// One test per backend for each conformance test named: `sqlite::NAME` and `postgres::NAME`,
/// each calling `NAME(store)` on a fresh store of its backend.
#[allow(unused_macros)] // Tests of one backend only do not use it.
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() -> crate::support::TestResult {
                    crate::support::run(crate::support::Backend::Sqlite, super::$name).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() -> crate::support::TestResult {
                    crate::support::run(crate::support::Backend::Postgres, super::$name).await
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use conformance;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A fresh store for one test. Dereferences to the store; cheap to clone.
#[derive(Clone)]
pub struct TestStore {
    store: Arc<dyn Store>,
    database: Arc<Database>,
}

/// Where a test store's data lives.
enum Database {
    Sqlite {
        dir: TempDir,
        store: SqliteStore,
    },
    Postgres {
        /// The server's URL, as the environment gave it.
        server: String,
        /// The test's own database on it, and its URL.
        name: String,
        url: String,
        /// Every store opened on it, closed before it is dropped.
        stores: Mutex<Vec<PgStore>>,
    },
}

impl Deref for TestStore {
    type Target = dyn Store;

    fn deref(&self) -> &dyn Store {
        &*self.store
    }
}

impl TestStore {
    /// A fresh store of `backend`; `None` when the PostgreSQL tests are skipped.
    async fn open(backend: Backend) -> TestResult<Option<Self>> {
        match backend {
            Backend::Sqlite => {
                let (dir, store) = temp_store().await?;
                Ok(Some(Self {
                    store: Arc::new(store.clone()),
                    database: Arc::new(Database::Sqlite { dir, store }),
                }))
            }
            Backend::Postgres => Self::open_postgres().await,
        }
    }

    async fn open_postgres() -> TestResult<Option<Self>> {
        let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
        let server = match std::env::var(DATABASE_URL_VAR) {
            Ok(url) if !url.trim().is_empty() => url,
            _ if ci => {
                return Err(format!(
                    "CI is set but {DATABASE_URL_VAR} is not: the PostgreSQL store tests must run \
                     in CI (set {DATABASE_URL_VAR}=postgres://user:password@host:5432/postgres)"
                )
                .into());
            }
            _ => {
                println!(
                    "skipped: set {DATABASE_URL_VAR}=postgres://… to run the PostgreSQL store tests"
                );
                return Ok(None);
            }
        };
        let name = format!("forkd_test_{}", uuid::Uuid::now_v7().simple());
        let mut admin = PgConnection::connect(&server).await.map_err(|e| {
            format!(
                "cannot reach {DATABASE_URL_VAR} ({}): {e}",
                redacted_url(&server)
            )
        })?;
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await?;
        admin.close().await?;
        let url = with_database(&server, &name)?;
        let store = PgStore::connect_with(&url, TEST_CONNECTIONS).await?;
        Ok(Some(Self {
            store: Arc::new(store.clone()),
            database: Arc::new(Database::Postgres {
                server,
                name,
                url,
                stores: Mutex::new(vec![store]),
            }),
        }))
    }

    pub fn backend(&self) -> Backend {
        match *self.database {
            Database::Sqlite { .. } => Backend::Sqlite,
            Database::Postgres { .. } => Backend::Postgres,
        }
    }

    /// The store, to hand to tasks.
    pub fn shared(&self) -> Arc<dyn Store> {
        Arc::clone(&self.store)
    }

    /// Another store on the same database: a second daemon, or this one restarted.
    pub async fn reopen(&self) -> TestResult<Arc<dyn Store>> {
        self.reopen_as(Holder::new()).await
    }

    /// Another store on the same database, claiming agents for `holder`: a second daemon with
    /// a lease of its own. (Opening a SQLite database ends its earlier holders' leases.)
    pub async fn reopen_as(&self, holder: Holder) -> TestResult<Arc<dyn Store>> {
        match &*self.database {
            Database::Sqlite { dir, .. } => Ok(Arc::new(
                SqliteStore::open(&db_path(dir), Durability::Normal)
                    .await?
                    .with_holder(holder),
            )),
            Database::Postgres { url, stores, .. } => {
                let store = PgStore::connect_with(url, TEST_CONNECTIONS)
                    .await?
                    .with_holder(holder);
                stores.lock().map_err(|_| "poisoned")?.push(store.clone());
                Ok(Arc::new(store))
            }
        }
    }

    /// A second daemon whose claims last `lease`.
    pub async fn daemon_with_lease(
        &self,
        lease: std::time::Duration,
    ) -> TestResult<Arc<dyn Store>> {
        self.reopen_as(Holder {
            daemon: forkd_core::DaemonId::new(),
            lease,
        })
        .await
    }

    /// Checks what the database does not check on its own: SQLite's file and its foreign keys
    /// (PostgreSQL enforces every constraint at every write).
    pub async fn check_integrity(&self) -> TestResult {
        if let Database::Sqlite { store, .. } = &*self.database {
            store.integrity_check().await?;
        }
        Ok(())
    }

    /// Drops a PostgreSQL test's database.
    async fn clean_up(&self) -> TestResult {
        let Database::Postgres {
            server,
            name,
            stores,
            ..
        } = &*self.database
        else {
            return Ok(());
        };
        let stores: Vec<PgStore> = stores.lock().map_err(|_| "poisoned")?.drain(..).collect();
        for store in stores {
            store.close().await;
        }
        drop_database(server, name).await
    }
}

/// Drops a test's database once its stores are closed. A plain `DROP DATABASE` waits for an
/// autovacuum worker to leave (`WITH (FORCE)` would fail on it without the right to signal it);
/// `FORCE` is the fallback for a connection of the test that is still open.
async fn drop_database(server: &str, name: &str) -> TestResult {
    let mut admin = PgConnection::connect(server).await?;
    let plain = sqlx::query(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}")))
        .execute(&mut admin)
        .await;
    if plain.is_err() {
        sqlx::query(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&mut admin)
        .await?;
    }
    admin.close().await?;
    Ok(())
}

/// Runs one conformance test on a fresh store of `backend`, then drops the store's database,
/// whether the test passed, failed or panicked.
pub async fn run<F, Fut>(backend: Backend, test: F) -> TestResult
where
    F: FnOnce(TestStore) -> Fut,
    Fut: Future<Output = TestResult> + Send + 'static,
{
    let Some(store) = TestStore::open(backend).await? else {
        return Ok(());
    };
    let outcome = tokio::spawn(test(store.clone())).await;
    store.clean_up().await?;
    match outcome {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(e.into()),
    }
}

/// `url` with its database replaced by `name`.
fn with_database(url: &str, name: &str) -> TestResult<String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("{DATABASE_URL_VAR} is not a URL"))?;
    let host_at = rest.rfind('@').map_or(0, |i| i + 1);
    let (user, host) = rest.split_at(host_at);
    let (host, tail) = host.split_at(host.find(['/', '?']).unwrap_or(host.len()));
    let query = tail.find('?').map_or("", |i| &tail[i..]);
    Ok(format!("{scheme}://{user}{host}/{name}{query}"))
}

/// A SQLite store on a fresh file; keep the directory alive as long as the store.
pub async fn temp_store() -> TestResult<(TempDir, SqliteStore)> {
    let dir = tempfile::tempdir()?;
    let store = SqliteStore::open(&db_path(&dir), Durability::Normal).await?;
    Ok((dir, store))
}

pub fn db_path(dir: &TempDir) -> PathBuf {
    dir.path().join("forkd.db")
}

/// A session whose stored bytes would be easy to disturb: unicode and odd spacing in the system
/// prompt, and a tools array that is valid JSON but not compact (so any re-encoding shows).
pub fn session() -> TestResult<Session> {
    let tools = ToolsJson::from_stored(
        r#"[ {"name": "Read", "description": "Lies \u00e9 ünïcödé", "input_schema": {"type":"object"}},{"name":"Bash","input_schema":{}} ]"#,
    )?;
    Ok(Session {
        id: SessionId::new(),
        tenant: "local".into(),
        params: CacheSafeParams {
            model: "claude-test-1".into(),
            system: RenderedSystem::from_stored(
                "You help.  \n\n<env>\nWorking directory: /ws/日本語 🦀\nToday's date: 2026-11-29\n</env>\n",
            ),
            tools,
            thinking: Some(ThinkingConfig {
                budget_tokens: 4096,
            }),
            max_tokens: 8192,
        },
        workspace: PathBuf::from("/ws/日本語 🦀"),
        coordinator: false,
        interactive: true,
        permission_mode: PermissionMode::AcceptEdits,
        rules: forkd_core::session::PermissionRules {
            allow: vec!["Bash(cargo test:*)".into()],
            deny: vec!["Write(secrets/**)".into(), "Read(ünï/**)".into()],
        },
        sandbox: forkd_core::session::Sandbox {
            mode: forkd_core::session::SandboxMode::ReadOnly,
            allow_network: true,
            unix_sockets: false,
        },
        mcp: forkd_core::session::SessionMcp {
            servers: vec![forkd_core::session::McpServerRef {
                name: "gït.hub".into(),
                origin: forkd_core::session::McpOrigin::Operator,
            }],
            tools: vec![forkd_core::session::McpToolRef {
                name: "mcp__g_t_hub__search".into(),
                server: "gït.hub".into(),
                tool: "search".into(),
                read_only: true,
            }],
            sealed_config: Some("v1:0011223344556677:00ff".into()),
        },
        hooks: Some(forkd_core::session::SessionHooks {
            events: vec!["PreToolUse".into(), "Stop".into()],
            sealed: "v1:8899aabbccddeeff:00ff".into(),
        }),
        created_at_ms: 1_700_000_000_000,
        branch: None,
        reply_breakpoint: true,
    })
}

/// A transcript with every block kind that matters: text, thinking, tool_use, tool_result.
pub fn history() -> TestResult<Vec<Message>> {
    let input = RawJson::parse(r#"{"file_path": "src/lib.rs", "limit": 10}"#)?;
    Ok(vec![
        Message::user(vec![Block::text("Fix the parser — «quickly» 🚀")]),
        Message::assistant(vec![
            Block::thinking("Let me look\nat the file.", "sig-abc=="),
            Block::text("Reading it."),
            Block::tool_use("toolu_01", "Read", &input)?,
        ]),
        Message::user(vec![
            Block::tool_result("toolu_01", "1\tfn main() {}\n", false),
            Block::tool_result("toolu_02", "permission denied", true),
        ]),
        Message::assistant(vec![Block::parse(
            r#"{"type":"redacted_thinking","data":"opaque"}"#,
        )?]),
    ])
}

/// A client-submitted batch of `n` directives forking `session` at `fork_point`, with its
/// children (pending fork agents) and the parent's results message.
pub struct Fixture {
    pub batch: ForkBatch,
    pub children: Vec<NewChild>,
    pub parent_results: Message,
}

pub fn fork(session: &Session, fork_point: u64, n: usize) -> TestResult<Fixture> {
    let id = BatchId::new();
    let directives: Vec<Directive> = (0..n)
        .map(|i| Directive {
            description: format!("part {i}"),
            prompt: format!("Do part {i} — ünïcödé"),
        })
        .collect();
    let assistant = client_fork_message(id, &directives);
    let created = session.created_at_ms + 1000;
    let batch = ForkBatch::new(id, session.id, fork_point, assistant.clone(), created)?;
    let mut children = Vec::new();
    let mut ids = Vec::new();
    for (index, (tool_use_id, directive)) in fork_directives(&assistant).into_iter().enumerate() {
        let child = fork_child(&batch, index, &directive)?;
        ids.push((tool_use_id, child.agent.id));
        children.push(child);
    }
    let parent_results = batch.parent_results(&ids);
    Ok(Fixture {
        batch,
        children,
        parent_results,
    })
}

/// Child `index` of `batch`, pending, with its directive block.
fn fork_child(batch: &ForkBatch, index: usize, directive: &Directive) -> TestResult<NewChild> {
    Ok(NewChild {
        agent: Agent {
            batch_id: Some(batch.id),
            index: u32::try_from(index)?,
            directive: Some(directive.clone()),
            query_source: Some(FORK_QUERY_SOURCE.into()),
            ..Agent::new(
                forkd_core::AgentId::new(),
                batch.session_id,
                AgentKind::Fork,
                AgentState::Pending,
                batch.created_at_ms,
            )
        },
        directive_block: ForkBatch::directive_block(directive),
    })
}

/// Creates `session` with [`history`] and one batch of `n` children at its end.
pub async fn seeded(store: &dyn Store, n: usize) -> TestResult<(Session, Fixture)> {
    seeded_for(store, "local", n).await
}

/// [`seeded`], the session belonging to `tenant`.
pub async fn seeded_for(
    store: &dyn Store,
    tenant: &str,
    n: usize,
) -> TestResult<(Session, Fixture)> {
    let mut session = session()?;
    session.tenant = tenant.into();
    let history = history()?;
    store.create_session(&session, &history, None).await?;
    let fx = fork(&session, u64::try_from(history.len())?, n)?;
    store
        .create_fork_batch(
            &fx.batch,
            std::slice::from_ref(&fx.parent_results),
            &fx.children,
            &forkd_store::BatchExtras::default(),
        )
        .await?;
    Ok((session, fx))
}

/// The notification a child sends when it ends.
pub fn ended(child: &Agent, status: NotificationStatus, at_ms: i64) -> NewNotification {
    let report = Report {
        scope: format!("part {}", child.index),
        result: "done — ✓".into(),
        key_files: vec!["src/lib.rs".into()],
        files_changed: vec![],
        issues: String::new(),
        // A completed child's object under an output schema: stored with the report, read back
        // as it was.
        structured: (status == NotificationStatus::Completed)
            .then(|| serde_json::json!({"verdict": "pass", "findings": ["ü", 1.5, null]})),
    };
    NewNotification {
        session_id: child.session_id,
        batch_id: child.batch_id,
        agent_id: child.id,
        status,
        summary: report.summary(),
        report,
        usage: Usage {
            input_tokens: 10,
            cache_creation_input_tokens: 20,
            cache_read_input_tokens: 30_000,
            output_tokens: 40,
        },
        cost_usd: 0.0125,
        created_at_ms: at_ms,
    }
}

/// Ends an agent the way a run does: claims it, then finishes under that lease.
pub async fn finish(
    store: &dyn Store,
    n: &NewNotification,
    error: Option<&str>,
) -> Result<forkd_core::Notification, forkd_store::StoreError> {
    let lease = store.claim_agent(n.agent_id).await?;
    store.finish_agent(&lease, n, error).await
}

/// A client's batch of `n` directives at `fork_point`: no fork message; its launch note is what
/// the parent's transcript gains. Its children report to the transcript with one digest.
pub fn client_fork(session: &Session, fork_point: u64, n: usize) -> TestResult<Fixture> {
    let id = BatchId::new();
    let created = session.created_at_ms + 2000;
    let batch = ForkBatch::client(id, session.id, fork_point, created);
    let directives: Vec<Directive> = (0..n)
        .map(|i| Directive {
            description: format!("client part {i}"),
            prompt: format!("Do client part {i}"),
        })
        .collect();
    let children = directives
        .iter()
        .enumerate()
        .map(|(index, directive)| fork_child(&batch, index, directive))
        .collect::<TestResult<Vec<_>>>()?;
    Ok(Fixture {
        batch,
        children,
        parent_results: forkd_core::digest::launch_note(id, &directives),
    })
}

/// A session's main-loop agent, idle between turns, as the engine creates it.
pub fn main_loop(session: &Session) -> Agent {
    Agent::new(
        forkd_core::AgentId::new(),
        session.id,
        AgentKind::Parent,
        AgentState::Idle,
        session.created_at_ms,
    )
}

/// A typed agent of `session` that reports to `report_to`, running.
pub fn typed(session: &Session, report_to: forkd_core::ReportTo) -> Agent {
    Agent {
        directive: Some(Directive {
            description: "explore".into(),
            prompt: "Map the crate.".into(),
        }),
        report_to,
        ..Agent::new(
            forkd_core::AgentId::new(),
            session.id,
            AgentKind::Typed,
            AgentState::Running,
            session.created_at_ms,
        )
    }
}

/// Tenant `alice`'s schedule `nightly`, due next at `next_fire_at_ms`.
pub fn nightly(next_fire_at_ms: i64) -> forkd_core::schedule::Schedule {
    forkd_core::schedule::Schedule {
        tenant: "alice".into(),
        name: "nightly".into(),
        cron: "0 3 * * *".into(),
        timezone: "UTC".into(),
        overlap: Default::default(),
        catch_up: Default::default(),
        paused: false,
        spec: vec![7],
        created_at_ms: 1,
        next_fire_at_ms: Some(next_fire_at_ms),
        upload_id: None,
    }
}
