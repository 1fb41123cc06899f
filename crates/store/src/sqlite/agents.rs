//! Agents: their rows, lifecycle moves and own (sidechain) transcripts.

use forkd_core::agent::Directive;
use forkd_core::{Agent, AgentId, AgentKind, AgentState, Block, Message};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection, SqlitePool};

use super::convert::{
    MessageRow, UsageRow, conflict_if_duplicate, corrupt, from_i64, limit_param, now_ms, opt_id,
    parse_id, stored_messages, to_i64,
};
use crate::{AgentFilter, Result, StoreError, StoredMessage};

macro_rules! agent_columns {
    () => {
        "id, session_id, batch_id, kind, idx, state, description, prompt, query_source, \
         input_tokens, cache_creation_input_tokens, cache_read_input_tokens, output_tokens, \
         cost_usd, error, created_at_ms, updated_at_ms"
    };
}

#[derive(sqlx::FromRow)]
struct AgentRow {
    id: String,
    session_id: String,
    batch_id: Option<String>,
    kind: String,
    idx: i64,
    state: String,
    description: Option<String>,
    prompt: Option<String>,
    query_source: Option<String>,
    #[sqlx(flatten)]
    usage: UsageRow,
    cost_usd: f64,
    error: Option<String>,
    created_at_ms: i64,
    updated_at_ms: i64,
}

fn parse_state(text: &str) -> Result<AgentState> {
    AgentState::parse(text).ok_or_else(|| corrupt("agent state", format!("unknown {text:?}")))
}

impl TryFrom<AgentRow> for Agent {
    type Error = StoreError;

    fn try_from(row: AgentRow) -> Result<Self> {
        let kind = AgentKind::parse(&row.kind)
            .ok_or_else(|| corrupt("agent kind", format!("unknown {:?}", row.kind)))?;
        // The schema keeps description and prompt both set or both NULL.
        let directive = match (row.description, row.prompt) {
            (Some(description), Some(prompt)) => Some(Directive {
                description,
                prompt,
            }),
            _ => None,
        };
        Ok(Agent {
            id: parse_id(&row.id, "agent id")?,
            session_id: parse_id(&row.session_id, "agent session id")?,
            batch_id: row
                .batch_id
                .as_deref()
                .map(|b| parse_id(b, "agent batch id"))
                .transpose()?,
            kind,
            index: from_i64(row.idx, "agent index")?,
            state: parse_state(&row.state)?,
            directive,
            query_source: row.query_source,
            usage: row.usage.into_usage()?,
            cost_usd: row.cost_usd,
            error: row.error,
            created_at_ms: row.created_at_ms,
            updated_at_ms: row.updated_at_ms,
        })
    }
}

/// Inserts an agent row as given (state, totals and all).
pub(super) async fn insert(
    conn: &mut SqliteConnection,
    agent: &Agent,
    directive_block: Option<&Block>,
) -> Result<()> {
    let id = agent.id.to_string();
    let usage = UsageRow::from_usage(&agent.usage)?;
    sqlx::query(concat!(
        "INSERT INTO agents (",
        agent_columns!(),
        ", directive_block_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    ))
    .bind(&id)
    .bind(agent.session_id.to_string())
    .bind(opt_id(agent.batch_id))
    .bind(agent.kind.as_str())
    .bind(to_i64(agent.index, "agent index")?)
    .bind(agent.state.as_str())
    .bind(agent.directive.as_ref().map(|d| d.description.as_str()))
    .bind(agent.directive.as_ref().map(|d| d.prompt.as_str()))
    .bind(agent.query_source.as_deref())
    .bind(usage.input_tokens)
    .bind(usage.cache_creation_input_tokens)
    .bind(usage.cache_read_input_tokens)
    .bind(usage.output_tokens)
    .bind(agent.cost_usd)
    .bind(agent.error.as_deref())
    .bind(agent.created_at_ms)
    .bind(agent.updated_at_ms)
    .bind(directive_block.map(|b| b.raw().as_str()))
    .execute(conn)
    .await
    .map_err(|e| conflict_if_duplicate(e, || format!("agent {id} already exists")))?;
    Ok(())
}

pub(super) async fn get(pool: &SqlitePool, id: AgentId) -> Result<Option<Agent>> {
    let row: Option<AgentRow> = sqlx::query_as(concat!(
        "SELECT ",
        agent_columns!(),
        " FROM agents WHERE id = ?"
    ))
    .bind(id.to_string())
    .fetch_optional(pool)
    .await?;
    row.map(Agent::try_from).transpose()
}

pub(super) async fn list(pool: &SqlitePool, filter: &AgentFilter) -> Result<Vec<Agent>> {
    let mut q = QueryBuilder::<Sqlite>::new(concat!(
        "SELECT ",
        agent_columns!(),
        " FROM agents WHERE TRUE"
    ));
    if let Some(session_id) = filter.session_id {
        q.push(" AND session_id = ")
            .push_bind(session_id.to_string());
    }
    if let Some(batch_id) = filter.batch_id {
        q.push(" AND batch_id = ").push_bind(batch_id.to_string());
    }
    if !filter.include_ended {
        // A literal (not bound) list, so the planner can use the partial index `agents_live`.
        q.push(" AND state IN ('pending', 'running')");
    }
    if let Some(after) = filter.after {
        q.push(" AND id > ").push_bind(after.to_string());
    }
    q.push(" ORDER BY id LIMIT ")
        .push_bind(limit_param(filter.limit));
    let rows: Vec<AgentRow> = q.build_query_as().fetch_all(pool).await?;
    rows.into_iter().map(Agent::try_from).collect()
}

pub(super) async fn directive_block(pool: &SqlitePool, id: AgentId) -> Result<Option<Block>> {
    let text: Option<Option<String>> =
        sqlx::query_scalar("SELECT directive_block_json FROM agents WHERE id = ?")
            .bind(id.to_string())
            .fetch_optional(pool)
            .await?;
    text.flatten()
        .map(|t| Block::from_stored(&t).map_err(|e| corrupt("directive block", e)))
        .transpose()
}

fn not_found(id: impl ToString) -> StoreError {
    StoreError::NotFound {
        kind: "agent",
        id: id.to_string(),
    }
}

/// The agent's current state; `NotFound` when there is no such agent, `Conflict` when it ended.
pub(super) async fn live_state(conn: &mut SqliteConnection, id: &str) -> Result<AgentState> {
    let state: Option<String> = sqlx::query_scalar("SELECT state FROM agents WHERE id = ?")
        .bind(id)
        .fetch_optional(conn)
        .await?;
    let state = parse_state(&state.ok_or_else(|| not_found(id))?)?;
    if state.is_terminal() {
        return Err(StoreError::Conflict(format!(
            "agent {id} already ended ({})",
            state.as_str()
        )));
    }
    Ok(state)
}

/// Sets an agent's state, error and update time (the caller has checked that it is live).
pub(super) async fn update_state(
    conn: &mut SqliteConnection,
    id: &str,
    state: AgentState,
    error: Option<&str>,
    updated_at_ms: i64,
) -> Result<()> {
    sqlx::query("UPDATE agents SET state = ?, error = ?, updated_at_ms = ? WHERE id = ?")
        .bind(state.as_str())
        .bind(error)
        .bind(updated_at_ms)
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

pub(super) async fn set_state(
    conn: &mut SqliteConnection,
    id: AgentId,
    state: AgentState,
    error: Option<&str>,
) -> Result<()> {
    let id = id.to_string();
    live_state(conn, &id).await?;
    update_state(conn, &id, state, error, now_ms()).await
}

pub(super) async fn append_message(
    conn: &mut SqliteConnection,
    id: AgentId,
    message: &Message,
) -> Result<u64> {
    let id = id.to_string();
    // Agents are never deleted, so a NULL here means there is no such agent.
    let next: Option<i64> = sqlx::query_scalar(
        "SELECT (SELECT COALESCE(MAX(seq) + 1, 0) FROM agent_messages WHERE agent_id = a.id) \
         FROM agents AS a WHERE a.id = ?",
    )
    .bind(&id)
    .fetch_optional(&mut *conn)
    .await?;
    let seq = next.ok_or_else(|| not_found(&id))?;
    sqlx::query(
        "INSERT INTO agent_messages (agent_id, seq, role, content_json, created_at_ms) \
         VALUES (?, ?, ?, ?, ?)",
    )
    .bind(&id)
    .bind(seq)
    .bind(message.role.as_str())
    .bind(message.content_json())
    .bind(now_ms())
    .execute(conn)
    .await?;
    from_i64(seq, "agent message seq")
}

pub(super) async fn messages(pool: &SqlitePool, id: AgentId) -> Result<Vec<StoredMessage>> {
    let id = id.to_string();
    let mut conn = pool.acquire().await?;
    let rows: Vec<MessageRow> = sqlx::query_as(
        "SELECT seq, role, content_json, created_at_ms FROM agent_messages \
         WHERE agent_id = ? ORDER BY seq",
    )
    .bind(&id)
    .fetch_all(&mut *conn)
    .await?;
    if rows.is_empty() {
        // Rows are never deleted, so checking existence after the read cannot race.
        let found: Option<i64> = sqlx::query_scalar("SELECT 1 FROM agents WHERE id = ?")
            .bind(&id)
            .fetch_optional(&mut *conn)
            .await?;
        if found.is_none() {
            return Err(not_found(id));
        }
    }
    stored_messages(rows)
}
