//! Sessions and their transcripts.

use forkd_core::session::{
    CacheSafeParams, PermissionMode, PermissionRules, RenderedSystem, Sandbox, SandboxMode,
    Session, ThinkingConfig, ToolsJson,
};
use forkd_core::{Message, SessionId};
use sqlx::{SqliteConnection, SqlitePool};

use super::convert::{
    MessageRow, conflict_if_duplicate, corrupt, from_i64, insert_session_message, limit_param,
    parse_id, session_len, stored_messages, to_i64,
};
use crate::StoreError;
use crate::error::Result;
use crate::{DbError, StoredMessage};

macro_rules! session_columns {
    () => {
        "id, model, system_prompt, tools_json, thinking_budget, max_tokens, workspace, \
         coordinator, interactive, permission_mode, created_at_ms, allow_rules, deny_rules, tenant, \
         sandbox, allow_network"
    };
}

#[derive(sqlx::FromRow)]
struct SessionRow {
    id: String,
    model: String,
    system_prompt: String,
    tools_json: String,
    thinking_budget: Option<i64>,
    max_tokens: i64,
    workspace: String,
    coordinator: bool,
    interactive: bool,
    permission_mode: String,
    created_at_ms: i64,
    allow_rules: String,
    deny_rules: String,
    tenant: String,
    sandbox: String,
    allow_network: bool,
}

impl TryFrom<SessionRow> for Session {
    type Error = DbError;

    fn try_from(row: SessionRow) -> Result<Self> {
        let tools =
            ToolsJson::from_stored(&row.tools_json).map_err(|e| corrupt("tools_json", e))?;
        let thinking = row
            .thinking_budget
            .map(|b| {
                from_i64(b, "thinking_budget").map(|budget_tokens| ThinkingConfig { budget_tokens })
            })
            .transpose()?;
        let permission_mode = PermissionMode::parse(&row.permission_mode).ok_or_else(|| {
            corrupt(
                "permission_mode",
                format!("unknown mode {:?}", row.permission_mode),
            )
        })?;
        Ok(Session {
            id: parse_id(&row.id, "session id")?,
            tenant: row.tenant,
            params: CacheSafeParams {
                model: row.model,
                system: RenderedSystem::from_stored(&row.system_prompt),
                tools,
                thinking,
                max_tokens: from_i64(row.max_tokens, "max_tokens")?,
            },
            workspace: row.workspace.into(),
            coordinator: row.coordinator,
            interactive: row.interactive,
            permission_mode,
            rules: PermissionRules {
                allow: serde_json::from_str(&row.allow_rules)
                    .map_err(|e| corrupt("allow rules", e))?,
                deny: serde_json::from_str(&row.deny_rules)
                    .map_err(|e| corrupt("deny rules", e))?,
            },
            sandbox: Sandbox {
                mode: SandboxMode::parse(&row.sandbox)
                    .ok_or_else(|| corrupt("sandbox", format!("unknown mode {:?}", row.sandbox)))?,
                allow_network: row.allow_network,
            },
            created_at_ms: row.created_at_ms,
        })
    }
}

pub(super) async fn create(
    conn: &mut SqliteConnection,
    session: &Session,
    first_messages: &[Message],
) -> Result<()> {
    let id = session.id.to_string();
    // The workspace is matched against tool paths as text; a path that is not UTF-8 could not
    // be stored and read back unchanged, so it is refused rather than mangled.
    let workspace = session.workspace.to_str().ok_or_else(|| {
        DbError::Database(sqlx::Error::Encode(
            format!("workspace {:?} is not UTF-8", session.workspace).into(),
        ))
    })?;
    let p = &session.params;
    let thinking = p
        .thinking
        .map(|t| to_i64(t.budget_tokens, "thinking budget"))
        .transpose()?;
    sqlx::query(concat!(
        "INSERT INTO sessions (",
        session_columns!(),
        ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    ))
    .bind(&id)
    .bind(&p.model)
    .bind(p.system.as_str())
    .bind(p.tools.raw().as_str())
    .bind(thinking)
    .bind(to_i64(p.max_tokens, "max_tokens")?)
    .bind(workspace)
    .bind(session.coordinator)
    .bind(session.interactive)
    .bind(session.permission_mode.as_str())
    .bind(session.created_at_ms)
    .bind(serde_json::to_string(&session.rules.allow).unwrap_or_else(|_| "[]".into()))
    .bind(serde_json::to_string(&session.rules.deny).unwrap_or_else(|_| "[]".into()))
    .bind(&session.tenant)
    .bind(session.sandbox.mode.as_str())
    .bind(session.sandbox.allow_network)
    .execute(&mut *conn)
    .await
    .map_err(|e| conflict_if_duplicate(e, || format!("session {id} already exists")))?;
    for (seq, message) in (0_i64..).zip(first_messages) {
        insert_session_message(conn, &id, seq, message, session.created_at_ms).await?;
    }
    Ok(())
}

pub(super) async fn get(pool: &SqlitePool, id: SessionId) -> Result<Option<Session>> {
    let row: Option<SessionRow> = sqlx::query_as(concat!(
        "SELECT ",
        session_columns!(),
        " FROM sessions WHERE id = ?"
    ))
    .bind(id.to_string())
    .fetch_optional(pool)
    .await?;
    row.map(Session::try_from).transpose()
}

pub(super) async fn list(
    pool: &SqlitePool,
    tenant: Option<&str>,
    after: Option<SessionId>,
    limit: u32,
) -> Result<Vec<Session>> {
    // Every id sorts after "", so one statement serves both the first page and the next ones;
    // SQLite reads LIMIT -1 as "no limit".
    let rows: Vec<SessionRow> = sqlx::query_as(concat!(
        "SELECT ",
        session_columns!(),
        " FROM sessions WHERE (?1 IS NULL OR tenant = ?1) AND id > ?2 ORDER BY id LIMIT ?3"
    ))
    .bind(tenant)
    .bind(after.map(|a| a.to_string()).unwrap_or_default())
    .bind(limit_param(limit))
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(Session::try_from).collect()
}

pub(super) async fn exists(conn: &mut SqliteConnection, id: &str) -> Result<bool> {
    let found: Option<i64> = sqlx::query_scalar("SELECT 1 FROM sessions WHERE id = ?")
        .bind(id)
        .fetch_optional(conn)
        .await?;
    Ok(found.is_some())
}

fn not_found(id: impl ToString) -> DbError {
    DbError::Store(StoreError::NotFound {
        kind: "session",
        id: id.to_string(),
    })
}

pub(super) async fn message_count(pool: &SqlitePool, id: SessionId) -> Result<u64> {
    let id = id.to_string();
    let mut conn = pool.acquire().await?;
    let len = session_len(&mut conn, &id).await?;
    if len == 0 && !exists(&mut conn, &id).await? {
        return Err(not_found(id));
    }
    from_i64(len, "transcript length")
}

pub(super) async fn messages(
    pool: &SqlitePool,
    id: SessionId,
    from: u64,
    before: Option<u64>,
) -> Result<Vec<StoredMessage>> {
    let id = id.to_string();
    // Any bound past i64::MAX is past every stored seq.
    let before = before.map_or(i64::MAX, |b| i64::try_from(b).unwrap_or(i64::MAX));
    let from = i64::try_from(from).unwrap_or(i64::MAX);
    let mut conn = pool.acquire().await?;
    let rows: Vec<MessageRow> = sqlx::query_as(
        "SELECT seq, role, content_json, created_at_ms FROM session_messages \
         WHERE session_id = ? AND seq >= ? AND seq < ? ORDER BY seq",
    )
    .bind(&id)
    .bind(from)
    .bind(before)
    .fetch_all(&mut *conn)
    .await?;
    // Rows are never deleted, so checking existence after the read cannot race.
    if rows.is_empty() && !exists(&mut conn, &id).await? {
        return Err(not_found(id));
    }
    stored_messages(rows)
}
