//! Agents: their rows, lifecycle moves and own (sidechain) transcripts.

use forkd_core::agent::Directive;
use forkd_core::{Agent, AgentId, AgentKind, AgentState, Block, Message, ReportTo};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection, SqlitePool};

use super::convert::{
    MessageRow, UsageRow, conflict_if_duplicate, corrupt, from_i64, limit_param, now_ms, opt_id,
    parse_id, stored_messages, to_i64,
};
use crate::StoreError;
use crate::error::Result;
use crate::{AgentFilter, DbError, Lease, StoredMessage};

macro_rules! agent_columns {
    () => {
        "id, session_id, batch_id, kind, idx, state, description, prompt, query_source, report_to, \
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
    report_to: String,
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
    type Error = DbError;

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
            report_to: ReportTo::parse(&row.report_to).ok_or_else(|| {
                corrupt("agent report_to", format!("unknown {:?}", row.report_to))
            })?,
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
        ", directive_block_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
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
    .bind(agent.report_to.as_str())
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
    if let Some(tenant) = &filter.tenant {
        q.push(" AND session_id IN (SELECT id FROM sessions WHERE tenant = ")
            .push_bind(tenant.name().to_owned())
            .push(")");
    }
    if let Some(batch_id) = filter.batch_id {
        q.push(" AND batch_id = ").push_bind(batch_id.to_string());
    }
    if !filter.include_ended {
        // A literal (not bound) list, so the planner can use the partial index `agents_live`.
        q.push(" AND state IN ('pending', 'running', 'idle')");
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

fn not_found(id: impl ToString) -> DbError {
    DbError::Store(StoreError::NotFound {
        kind: "agent",
        id: id.to_string(),
    })
}

/// The agent's current state; `NotFound` when there is no such agent, `Conflict` when it ended.
pub(super) async fn live_state(conn: &mut SqliteConnection, id: &str) -> Result<AgentState> {
    let state: Option<String> = sqlx::query_scalar("SELECT state FROM agents WHERE id = ?")
        .bind(id)
        .fetch_optional(conn)
        .await?;
    let state = parse_state(&state.ok_or_else(|| not_found(id))?)?;
    if state.is_terminal() {
        return Err(DbError::Store(StoreError::Conflict(format!(
            "agent {id} already ended ({})",
            state.as_str()
        ))));
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

/// Sets a live agent's state; bumps its generation, fencing whatever run held it.
pub(super) async fn set_state(
    conn: &mut SqliteConnection,
    id: AgentId,
    state: AgentState,
    error: Option<&str>,
) -> Result<()> {
    let id = id.to_string();
    live_state(conn, &id).await?;
    bump_generation(conn, &id).await?;
    update_state(conn, &id, state, error, now_ms()).await
}

async fn bump_generation(conn: &mut SqliteConnection, id: &str) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "UPDATE agents SET generation = generation + 1 WHERE id = ? RETURNING generation",
    )
    .bind(id)
    .fetch_one(conn)
    .await?)
}

/// Claims a live agent for a new run: a new generation, and the state `running`.
pub(super) async fn claim(conn: &mut SqliteConnection, id: AgentId) -> Result<Lease> {
    let key = id.to_string();
    live_state(conn, &key).await?;
    let generation = bump_generation(conn, &key).await?;
    update_state(conn, &key, AgentState::Running, None, now_ms()).await?;
    Ok(Lease {
        agent_id: id,
        generation: from_i64(generation, "agent generation")?,
    })
}

/// Checks that `lease` is still the agent's newest claim; `Superseded` when a newer run claimed
/// it, `NotFound` when there is no such agent.
pub(super) async fn check_lease(conn: &mut SqliteConnection, lease: &Lease) -> Result<()> {
    let current: Option<i64> = sqlx::query_scalar("SELECT generation FROM agents WHERE id = ?")
        .bind(lease.agent_id.to_string())
        .fetch_optional(conn)
        .await?;
    let current: u64 = from_i64(
        current.ok_or_else(|| not_found(lease.agent_id))?,
        "agent generation",
    )?;
    if current != lease.generation {
        return Err(DbError::Store(StoreError::Superseded {
            agent: lease.agent_id,
            held: lease.generation,
            current,
        }));
    }
    Ok(())
}

/// Moves the leased (live) agent to another live state.
pub(super) async fn release(
    conn: &mut SqliteConnection,
    lease: &Lease,
    state: AgentState,
) -> Result<()> {
    check_lease(conn, lease).await?;
    let id = lease.agent_id.to_string();
    live_state(conn, &id).await?;
    update_state(conn, &id, state, None, now_ms()).await
}

/// Marks agents whose reports their caller has delivered: they report to the transcript again
/// (and, having ended, never will).
pub(super) async fn mark_delivered(conn: &mut SqliteConnection, agents: &[AgentId]) -> Result<()> {
    for id in agents {
        sqlx::query("UPDATE agents SET report_to = 'transcript' WHERE id = ?")
            .bind(id.to_string())
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Appends a message to the leased agent's own transcript.
pub(super) async fn append_message(
    conn: &mut SqliteConnection,
    lease: &Lease,
    message: &Message,
) -> Result<u64> {
    check_lease(conn, lease).await?;
    let id = lease.agent_id.to_string();
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
