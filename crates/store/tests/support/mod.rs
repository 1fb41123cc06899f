//! Fixtures shared by the store's integration tests: sessions, transcripts, batches, agents.

#![allow(dead_code)] // Each test binary uses its own subset.

use std::path::PathBuf;

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
use forkd_store::{Durability, NewChild, NewNotification, SqliteStore, Store};
use tempfile::TempDir;

pub type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A store on a fresh file; keep the directory alive as long as the store.
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
        },
        created_at_ms: 1_700_000_000_000,
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
        let agent = Agent {
            id: forkd_core::AgentId::new(),
            session_id: session.id,
            batch_id: Some(id),
            kind: AgentKind::Fork,
            index: u32::try_from(index)?,
            state: AgentState::Pending,
            directive: Some(directive.clone()),
            query_source: Some(FORK_QUERY_SOURCE.into()),
            report_to: forkd_core::ReportTo::Transcript,
            usage: Usage::default(),
            cost_usd: 0.0,
            error: None,
            created_at_ms: created,
            updated_at_ms: created,
        };
        ids.push((tool_use_id, agent.id));
        children.push(NewChild {
            agent,
            directive_block: ForkBatch::directive_block(&directive),
        });
    }
    let parent_results = batch.parent_results(&ids);
    Ok(Fixture {
        batch,
        children,
        parent_results,
    })
}

/// Creates `session` with [`history`] and one batch of `n` children at its end.
pub async fn seeded(store: &SqliteStore, n: usize) -> TestResult<(Session, Fixture)> {
    let session = session()?;
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
    store: &SqliteStore,
    n: &NewNotification,
    error: Option<&str>,
) -> Result<forkd_core::Notification, forkd_store::StoreError> {
    let lease = store.claim_agent(n.agent_id).await?;
    store.finish_agent(&lease, n, error).await
}
