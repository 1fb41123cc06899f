//! Agents: their rows, lifecycle moves and own (sidechain) transcripts.

use forkd_core::store::{Holder, Renewal};
use forkd_core::{Agent, AgentId, AgentState, BatchId, Block, DaemonId, Message, SessionId};
use sqlx::QueryBuilder;

use super::dialect::{self, Conn, Db, FOR_UPDATE, NOW_MS, Pool, SKIP_LOCKED};
use super::sql;
use crate::error::Result;
use crate::rows::agents::{
    AgentRow, AgentValues, INSERT_AGENT, NewAgents, agent_columns, bind_agent, check_generation,
    check_holder, ended, not_found, parse_state,
};
use crate::rows::convert::{
    INSERT_AGENT_MESSAGE, MessageRow, conflict_if_duplicate, corrupt, from_i64, now_ms, parse_id,
    stored_messages,
};
use crate::{AgentFilter, Lease, StoredMessage};

/// Inserts an agent row as given (state, totals and all).
pub(crate) async fn insert(
    conn: &mut Conn,
    agent: &Agent,
    directive_block: Option<&Block>,
) -> Result<()> {
    let values = AgentValues::new(agent, directive_block)?;
    bind_agent!(sqlx::query(INSERT_AGENT), &values)
        .execute(conn)
        .await
        .map_err(|e| conflict_if_duplicate(e, || format!("agent {} already exists", values.id)))?;
    Ok(())
}

pub(crate) async fn get(pool: &Pool, id: AgentId) -> Result<Option<Agent>> {
    let row: Option<AgentRow> = sqlx::query_as(concat!(
        "SELECT ",
        agent_columns!(),
        " FROM agents WHERE id = $1"
    ))
    .bind(id.to_string())
    .fetch_optional(pool)
    .await?;
    row.map(Agent::try_from).transpose()
}

/// A session's main-loop agent: its one agent of kind `parent` (`agents_main_loop`).
pub(crate) async fn main_loop(pool: &Pool, session: SessionId) -> Result<Option<Agent>> {
    let row: Option<AgentRow> = sqlx::query_as(concat!(
        "SELECT ",
        agent_columns!(),
        " FROM agents WHERE session_id = $1 AND kind = 'parent' ORDER BY id LIMIT 1"
    ))
    .bind(session.to_string())
    .fetch_optional(pool)
    .await?;
    row.map(Agent::try_from).transpose()
}

pub(crate) async fn list(pool: &Pool, filter: &AgentFilter) -> Result<Vec<Agent>> {
    let mut q = QueryBuilder::<Db>::new(concat!(
        "SELECT ",
        agent_columns!(),
        " FROM agents WHERE TRUE"
    ));
    super::push_scope(
        &mut q,
        filter.session_id,
        filter.tenant.as_ref(),
        filter.batch_id,
    );
    if !filter.include_ended {
        // A literal (not bound) list, so the planner can use the partial index `agents_live`.
        q.push(" AND state IN ('pending', 'running', 'idle')");
    }
    if let Some(after) = filter.after {
        q.push(" AND id > ").push_bind(after.to_string());
    }
    q.push(" ORDER BY id LIMIT ")
        .push_bind(super::limit_param(filter.limit));
    let rows: Vec<AgentRow> = q.build_query_as().fetch_all(pool).await?;
    rows.into_iter().map(Agent::try_from).collect()
}

pub(crate) async fn directive_block(pool: &Pool, id: AgentId) -> Result<Option<Block>> {
    let text: Option<Option<String>> =
        sqlx::query_scalar("SELECT directive_block_json FROM agents WHERE id = $1")
            .bind(id.to_string())
            .fetch_optional(pool)
            .await?;
    text.flatten()
        .map(|t| Block::from_stored(&t).map_err(|e| corrupt("directive block", e)))
        .transpose()
}

/// Locks an agent's row until the transaction ends (see the module docs of `postgres.rs`) and
/// reads its state and generation; `None` when there is no such agent.
async fn lock(conn: &mut Conn, id: &str) -> Result<Option<(String, i64)>> {
    Ok(sqlx::query_as(sql(format!(
        "SELECT state, generation FROM agents WHERE id = $1{FOR_UPDATE}"
    )))
    .bind(id)
    .fetch_optional(conn)
    .await?)
}

/// Locks the agent and reads its current state; `NotFound` when there is no such agent,
/// `Conflict` when it ended.
pub(crate) async fn live_state(conn: &mut Conn, id: &str) -> Result<AgentState> {
    let (state, _) = lock(conn, id).await?.ok_or_else(|| not_found(id))?;
    let state = parse_state(&state)?;
    if state.is_terminal() {
        return Err(ended(id, state));
    }
    Ok(state)
}

/// Sets an agent's state, error and update time (the caller holds its lock and has checked that
/// it is live).
pub(crate) async fn update_state(
    conn: &mut Conn,
    id: &str,
    state: AgentState,
    error: Option<&str>,
    updated_at_ms: i64,
) -> Result<()> {
    sqlx::query("UPDATE agents SET state = $1, error = $2, updated_at_ms = $3 WHERE id = $4")
        .bind(state.as_str())
        .bind(error)
        .bind(updated_at_ms)
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Sets a live agent's state; bumps its generation, fencing whatever run held it.
pub(crate) async fn set_state(
    conn: &mut Conn,
    id: AgentId,
    state: AgentState,
    error: Option<&str>,
) -> Result<()> {
    let id = id.to_string();
    live_state(conn, &id).await?;
    sqlx::query("UPDATE agents SET generation = generation + 1 WHERE id = $1")
        .bind(&id)
        .execute(&mut *conn)
        .await?;
    update_state(conn, &id, state, error, now_ms()).await
}

/// Claims a live agent for a new run: a new generation, the state `running`, and `holder` as
/// its holder for one lease; its first claim is its start (what its wall-time limit counts from).
/// `Held` while another daemon's lease on the running agent lasts. A
/// write of the older run in flight holds the agent's lock, so the claim waits for it; every
/// later one fails.
pub(crate) async fn claim(conn: &mut Conn, id: AgentId, holder: &Holder) -> Result<Lease> {
    let key = id.to_string();
    // Locked like `lock` does, with what the holder check needs, in one read.
    let row: Option<(String, Option<String>, Option<i64>, i64)> = sqlx::query_as(sql(format!(
        "SELECT state, held_by, lease_expires_at_ms, {NOW_MS} FROM agents \
         WHERE id = $1{FOR_UPDATE}"
    )))
    .bind(&key)
    .fetch_optional(&mut *conn)
    .await?;
    let (state, held_by, expires, now) = row.ok_or_else(|| not_found(&key))?;
    let state = parse_state(&state)?;
    if state.is_terminal() {
        return Err(ended(&key, state));
    }
    check_holder(id, state, held_by.as_deref(), expires, now, holder)?;
    // One write: a new generation, `running`, and this daemon's hold for one lease.
    let generation: i64 = sqlx::query_scalar(sql(format!(
        "UPDATE agents SET generation = generation + 1, state = 'running', error = NULL, \
         updated_at_ms = $1, started_at_ms = COALESCE(started_at_ms, $1), held_by = $2, \
         lease_expires_at_ms = {NOW_MS} + $3 \
         WHERE id = $4 RETURNING generation"
    )))
    .bind(now_ms())
    .bind(holder.daemon.to_string())
    .bind(holder.lease_ms())
    .bind(&key)
    .fetch_one(conn)
    .await?;
    Ok(Lease {
        agent_id: id,
        generation: from_i64(generation, "agent generation")?,
    })
}

/// Makes `holder` the holder, for one lease, of the new live agents that `column` (`id` or
/// `batch_id`) equals `key` for: whoever created them answers for them until it runs them, and
/// if it dies they are adopted.
pub(crate) async fn hold_new(
    conn: &mut Conn,
    column: NewAgents,
    key: &str,
    holder: &Holder,
) -> Result<()> {
    let column = match column {
        NewAgents::Agent => "id",
        NewAgents::Batch => "batch_id",
    };
    sqlx::query(sql(format!(
        "UPDATE agents SET held_by = $1, lease_expires_at_ms = {NOW_MS} + $2 \
         WHERE {column} = $3 AND state IN ('pending', 'running')"
    )))
    .bind(holder.daemon.to_string())
    .bind(holder.lease_ms())
    .bind(key)
    .execute(conn)
    .await?;
    Ok(())
}

/// The heartbeat: pushes back the leases `holder` holds on live agents, and reads the kills
/// asked of them. Rows another transaction has locked (a run writing) are renewed at once
/// after it commits; the rows are locked in id order, as every multi-row lock does.
pub(crate) async fn renew(conn: &mut Conn, holder: &Holder) -> Result<Renewal> {
    let daemon = holder.daemon.to_string();
    let ids: Vec<String> = sqlx::query_scalar(sql(format!(
        "SELECT id FROM agents WHERE held_by = $1 AND state IN ('pending', 'running') \
         ORDER BY id{FOR_UPDATE}"
    )))
    .bind(&daemon)
    .fetch_all(&mut *conn)
    .await?;
    let mut q = QueryBuilder::<Db>::new(format!(
        "UPDATE agents SET lease_expires_at_ms = {NOW_MS} + "
    ));
    q.push_bind(holder.lease_ms())
        .push(" WHERE held_by = ")
        .push_bind(&daemon)
        .push(" AND id");
    dialect::push_ids(&mut q, &ids);
    let renewed = q.build().execute(&mut *conn).await?.rows_affected();
    let mut q = QueryBuilder::<Db>::new("SELECT id FROM agents WHERE kill_requested AND id");
    dialect::push_ids(&mut q, &ids);
    q.push(" ORDER BY id");
    let kills: Vec<String> = q.build_query_scalar().fetch_all(conn).await?;
    Ok(Renewal {
        renewed,
        kills: kills
            .iter()
            .map(|id| parse_id(id, "agent id"))
            .collect::<Result<_>>()?,
    })
}

/// Live agents that nobody holds: no holder, or a lease that has expired.
pub(crate) async fn adoptable(pool: &Pool) -> Result<Vec<Agent>> {
    let rows: Vec<AgentRow> = sqlx::query_as(sql(format!(
        "SELECT {} FROM agents WHERE state IN ('pending', 'running') \
         AND (held_by IS NULL OR lease_expires_at_ms IS NULL \
              OR lease_expires_at_ms <= {NOW_MS}) \
         ORDER BY id",
        agent_columns!()
    )))
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(Agent::try_from).collect()
}

/// Records that a batch's warm-up gate opened (the first time only).
pub(crate) async fn open_gate(conn: &mut Conn, batch: BatchId) -> Result<()> {
    sqlx::query(sql(format!(
        "UPDATE batches SET gate_opened_at_ms = {NOW_MS} \
         WHERE id = $1 AND gate_opened_at_ms IS NULL"
    )))
    .bind(batch.to_string())
    .execute(conn)
    .await?;
    Ok(())
}

pub(crate) async fn set_throttled(
    conn: &mut Conn,
    id: AgentId,
    since_ms: Option<i64>,
) -> Result<()> {
    // A wait that ends adds its length to the agent's throttled time (a `timeout` may leave it
    // out); one that starts while another is recorded keeps the earlier start.
    sqlx::query(
        "UPDATE agents SET \
         throttled_ms = throttled_ms + CASE WHEN $1 IS NULL AND throttled_since_ms IS NOT NULL \
             AND throttled_since_ms < $2 THEN $2 - throttled_since_ms ELSE 0 END, \
         throttled_since_ms = CASE WHEN $1 IS NULL THEN NULL \
             ELSE COALESCE(throttled_since_ms, $1) END \
         WHERE id = $3 AND state IN ('pending', 'running')",
    )
    .bind(since_ms)
    .bind(now_ms())
    .bind(id.to_string())
    .execute(conn)
    .await?;
    Ok(())
}

/// Takes up to `limit` pending children held by other daemons (never an isolated batch's, nor an
/// uploaded session's: their files are on their own daemon's machine), of batches whose gate opened
/// `queued_ms` ago or more (or timed out while their first child is not throttled under a live
/// lease): they are `running`, held by `holder`, from now on (no other daemon takes or claims
/// them), and its runs claim them again. Rows another transaction holds locked (a
/// daemon taking or claiming them) are skipped rather than waited for.
pub(crate) async fn take_pending(
    conn: &mut Conn,
    holder: &Holder,
    limit: u32,
    gate_timeout_ms: i64,
    queued_ms: i64,
) -> Result<Vec<AgentId>> {
    let ids: Vec<String> = sqlx::query_scalar(sql(format!(
        "WITH picked AS ( \
           SELECT a.id AS picked_id FROM agents AS a JOIN batches AS b ON b.id = a.batch_id \
           WHERE a.state = 'pending' AND a.kind = 'fork' \
             AND (a.held_by IS NULL OR a.held_by <> $1) \
             AND NOT EXISTS (SELECT 1 FROM batch_snapshots AS s WHERE s.batch_id = b.id) \
             AND NOT EXISTS (SELECT 1 FROM session_uploads AS u \
               WHERE u.session_id = a.session_id) \
             AND (b.gate_opened_at_ms <= {NOW_MS} - $6 OR (b.gate_opened_at_ms IS NULL \
               AND b.created_at_ms <= {NOW_MS} - $2 \
               AND NOT EXISTS (SELECT 1 FROM agents AS f WHERE f.batch_id = b.id AND f.idx = 0 \
                 AND f.state = 'running' AND f.throttled_since_ms IS NOT NULL \
                 AND f.lease_expires_at_ms > {NOW_MS}))) \
           ORDER BY a.batch_id, a.idx LIMIT $3{SKIP_LOCKED}) \
         UPDATE agents SET held_by = $1, lease_expires_at_ms = {NOW_MS} + $4, \
           state = 'running', generation = generation + 1, updated_at_ms = $5 \
         FROM picked WHERE agents.id = picked.picked_id RETURNING id"
    )))
    .bind(holder.daemon.to_string())
    .bind(gate_timeout_ms)
    .bind(i64::from(limit))
    .bind(holder.lease_ms())
    .bind(now_ms())
    .bind(queued_ms)
    .fetch_all(conn)
    .await?;
    let mut ids: Vec<AgentId> = ids
        .iter()
        .map(|id| parse_id(id, "agent id"))
        .collect::<Result<_>>()?;
    // Ids are time-ordered: a batch's children in creation (and index) order.
    ids.sort_unstable();
    Ok(ids)
}

/// Stores a kill request with a live agent; returns its holder while its lease lasts.
pub(crate) async fn request_kill(conn: &mut Conn, id: AgentId) -> Result<Option<DaemonId>> {
    let key = id.to_string();
    live_state(conn, &key).await?;
    let held: Option<String> = sqlx::query_scalar(sql(format!(
        "UPDATE agents SET kill_requested = TRUE WHERE id = $1 \
         RETURNING CASE WHEN lease_expires_at_ms > {NOW_MS} THEN held_by END"
    )))
    .bind(&key)
    .fetch_one(conn)
    .await?;
    held.as_deref()
        .map(|d| parse_id(d, "agent holder"))
        .transpose()
}

pub(crate) async fn kill_requested(pool: &Pool, id: AgentId) -> Result<bool> {
    let asked: Option<bool> = sqlx::query_scalar("SELECT kill_requested FROM agents WHERE id = $1")
        .bind(id.to_string())
        .fetch_optional(pool)
        .await?;
    asked.ok_or_else(|| not_found(id))
}

/// Locks the agent and checks that `lease` is still its newest claim; `Superseded` when a newer
/// run claimed it, `NotFound` when there is no such agent. The lock holds until commit, so no
/// claim can come between the check and the write it guards.
pub(crate) async fn check_lease(conn: &mut Conn, lease: &Lease) -> Result<()> {
    let (_, current) = lock(conn, &lease.agent_id.to_string())
        .await?
        .ok_or_else(|| not_found(lease.agent_id))?;
    check_generation(lease, current)
}

/// Moves the leased (live) agent to another live state.
pub(crate) async fn release(conn: &mut Conn, lease: &Lease, state: AgentState) -> Result<()> {
    check_lease(conn, lease).await?;
    let id = lease.agent_id.to_string();
    live_state(conn, &id).await?;
    update_state(conn, &id, state, None, now_ms()).await
}

/// Marks agents whose reports their caller has delivered: they report to the transcript again
/// (and, having ended, never will). The caller holds their locks (`dialect::lock_agents`).
pub(crate) async fn mark_delivered(conn: &mut Conn, agents: &[AgentId]) -> Result<()> {
    if agents.is_empty() {
        return Ok(());
    }
    let ids: Vec<String> = agents.iter().map(ToString::to_string).collect();
    let mut q = QueryBuilder::<Db>::new("UPDATE agents SET report_to = 'transcript' WHERE id");
    dialect::push_ids(&mut q, &ids);
    q.build().execute(conn).await?;
    Ok(())
}

/// Appends a message to the leased agent's own transcript; the lease check's lock makes the
/// next seq this transaction's.
pub(crate) async fn append_message(
    conn: &mut Conn,
    lease: &Lease,
    message: &Message,
) -> Result<u64> {
    check_lease(conn, lease).await?;
    let id = lease.agent_id.to_string();
    let seq: i64 = sqlx::query_scalar(
        "SELECT COALESCE(MAX(seq) + 1, 0) FROM agent_messages WHERE agent_id = $1",
    )
    .bind(&id)
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query(INSERT_AGENT_MESSAGE)
        .bind(&id)
        .bind(seq)
        .bind(message.role.as_str())
        .bind(message.content_json())
        .bind(now_ms())
        .execute(conn)
        .await?;
    from_i64(seq, "agent message seq")
}

pub(crate) async fn messages(pool: &Pool, id: AgentId) -> Result<Vec<StoredMessage>> {
    let id = id.to_string();
    let mut conn = pool.acquire().await?;
    let rows: Vec<MessageRow> = sqlx::query_as(
        "SELECT seq, role, content_json, created_at_ms FROM agent_messages \
         WHERE agent_id = $1 ORDER BY seq",
    )
    .bind(&id)
    .fetch_all(&mut *conn)
    .await?;
    if rows.is_empty() {
        // Rows are never deleted, so checking existence after the read cannot race.
        let found: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM agents WHERE id = $1)")
            .bind(&id)
            .fetch_one(&mut *conn)
            .await?;
        if !found {
            return Err(not_found(id));
        }
    }
    stored_messages(rows)
}
