//! Agent rows.

use forkd_core::agent::Directive;
use forkd_core::store::Holder;
use forkd_core::{Agent, AgentId, AgentKind, AgentState, Block, ReportTo};

use super::convert::{UsageRow, corrupt, from_i64, opt_id, parse_id, to_i64};
use crate::error::Result;
use crate::{DbError, Lease, StoreError};

/// The columns of an agent row that [`AgentRow`] reads.
macro_rules! agent_columns {
    () => {
        "id, session_id, batch_id, kind, idx, state, description, prompt, query_source, report_to, \
         input_tokens, cache_creation_input_tokens, cache_read_input_tokens, output_tokens, \
         cost_usd, error, created_at_ms, updated_at_ms, held_by, throttled_since_ms, limits_json, \
         started_at_ms, throttled_ms"
    };
}
pub(crate) use agent_columns;

/// Inserts an agent as given (state, totals and all) with its directive block: bind
/// [`AgentValues`] with [`bind_agent!`].
pub(crate) const INSERT_AGENT: &str = concat!(
    "INSERT INTO agents (",
    agent_columns!(),
    ", directive_block_json) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, \
     $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24)"
);

#[derive(sqlx::FromRow)]
pub(crate) struct AgentRow {
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
    held_by: Option<String>,
    throttled_since_ms: Option<i64>,
    limits_json: Option<String>,
    started_at_ms: Option<i64>,
    throttled_ms: i64,
}

pub(crate) fn parse_state(text: &str) -> Result<AgentState> {
    AgentState::parse(text).ok_or_else(|| corrupt("agent state", format!("unknown {text:?}")))
}

pub(crate) fn parse_kind(text: &str) -> Result<AgentKind> {
    AgentKind::parse(text).ok_or_else(|| corrupt("agent kind", format!("unknown {text:?}")))
}

impl TryFrom<AgentRow> for Agent {
    type Error = DbError;

    fn try_from(row: AgentRow) -> Result<Self> {
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
            kind: parse_kind(&row.kind)?,
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
            held_by: row
                .held_by
                .as_deref()
                .map(|d| parse_id(d, "agent holder"))
                .transpose()?,
            throttled_since_ms: row.throttled_since_ms,
            limits: row
                .limits_json
                .as_deref()
                .map(|json| {
                    serde_json::from_str(json).map_err(|e| corrupt("agent limits", e.to_string()))
                })
                .transpose()?,
            started_at_ms: row.started_at_ms,
            throttled_ms: from_i64(row.throttled_ms, "agent throttled time")?,
        })
    }
}

/// An agent as its row stores it.
pub(crate) struct AgentValues<'a> {
    pub id: String,
    pub session_id: String,
    pub batch_id: Option<String>,
    pub kind: &'static str,
    pub idx: i64,
    pub state: &'static str,
    pub description: Option<&'a str>,
    pub prompt: Option<&'a str>,
    pub query_source: Option<&'a str>,
    pub report_to: &'static str,
    pub usage: UsageRow,
    pub cost_usd: f64,
    pub error: Option<&'a str>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub held_by: Option<String>,
    pub throttled_since_ms: Option<i64>,
    pub limits_json: Option<String>,
    pub started_at_ms: Option<i64>,
    pub throttled_ms: i64,
    pub directive_block_json: Option<&'a str>,
}

impl<'a> AgentValues<'a> {
    pub fn new(agent: &'a Agent, directive_block: Option<&'a Block>) -> Result<Self> {
        Ok(Self {
            id: agent.id.to_string(),
            session_id: agent.session_id.to_string(),
            batch_id: opt_id(agent.batch_id),
            kind: agent.kind.as_str(),
            idx: to_i64(agent.index, "agent index")?,
            state: agent.state.as_str(),
            description: agent.directive.as_ref().map(|d| d.description.as_str()),
            prompt: agent.directive.as_ref().map(|d| d.prompt.as_str()),
            query_source: agent.query_source.as_deref(),
            report_to: agent.report_to.as_str(),
            usage: UsageRow::from_usage(&agent.usage)?,
            cost_usd: agent.cost_usd,
            error: agent.error.as_deref(),
            created_at_ms: agent.created_at_ms,
            updated_at_ms: agent.updated_at_ms,
            held_by: opt_id(agent.held_by),
            throttled_since_ms: agent.throttled_since_ms,
            limits_json: agent
                .limits
                .map(|l| serde_json::to_string(&l))
                .transpose()
                .map_err(|e| corrupt("agent limits", e.to_string()))?,
            started_at_ms: agent.started_at_ms,
            throttled_ms: to_i64(agent.throttled_ms, "agent throttled time")?,
            directive_block_json: directive_block.map(|b| b.raw().as_str()),
        })
    }
}

/// Binds [`AgentValues`] to [`INSERT_AGENT`], on either driver.
macro_rules! bind_agent {
    ($query:expr, $values:expr) => {{
        let v: &$crate::rows::agents::AgentValues<'_> = $values;
        $query
            .bind(&v.id)
            .bind(&v.session_id)
            .bind(&v.batch_id)
            .bind(v.kind)
            .bind(v.idx)
            .bind(v.state)
            .bind(v.description)
            .bind(v.prompt)
            .bind(v.query_source)
            .bind(v.report_to)
            .bind(v.usage.input_tokens)
            .bind(v.usage.cache_creation_input_tokens)
            .bind(v.usage.cache_read_input_tokens)
            .bind(v.usage.output_tokens)
            .bind(v.cost_usd)
            .bind(v.error)
            .bind(v.created_at_ms)
            .bind(v.updated_at_ms)
            .bind(&v.held_by)
            .bind(v.throttled_since_ms)
            .bind(&v.limits_json)
            .bind(v.started_at_ms)
            .bind(v.throttled_ms)
            .bind(v.directive_block_json)
    }};
}
pub(crate) use bind_agent;

/// `NotFound` for an agent.
pub(crate) fn not_found(id: impl ToString) -> DbError {
    DbError::Store(StoreError::NotFound {
        kind: "agent",
        id: id.to_string(),
    })
}

/// `Conflict` for an agent that already ended.
pub(crate) fn ended(id: &str, state: AgentState) -> DbError {
    DbError::Store(StoreError::Conflict(format!(
        "agent {id} already ended ({})",
        state.as_str()
    )))
}

/// Which new agents a driver's `hold_new` makes its daemon hold: one agent, or a batch's
/// children.
#[derive(Debug, Clone, Copy)]
pub(crate) enum NewAgents {
    Agent,
    Batch,
}

/// `Held` when a daemon other than `me` holds the pending or running agent under a lease that
/// has not expired at `now_ms` (on the clock the lease was written with). A main loop between
/// turns (`idle`) is held by nobody.
pub(crate) fn check_holder(
    id: AgentId,
    state: AgentState,
    holder: Option<&str>,
    expires_at_ms: Option<i64>,
    now_ms: i64,
    me: &Holder,
) -> Result<()> {
    let (Some(holder), Some(expires)) = (holder, expires_at_ms) else {
        return Ok(());
    };
    let live = matches!(state, AgentState::Pending | AgentState::Running);
    if !live || expires <= now_ms || holder == me.daemon.to_string() {
        return Ok(());
    }
    Err(DbError::Store(StoreError::Held {
        agent: id,
        daemon: parse_id(holder, "agent holder")?,
    }))
}

/// `Superseded` unless `current` (the agent's stored generation) is the lease's.
pub(crate) fn check_generation(lease: &Lease, current: i64) -> Result<()> {
    let current: u64 = from_i64(current, "agent generation")?;
    if current != lease.generation {
        return Err(DbError::Store(StoreError::Superseded {
            agent: lease.agent_id,
            held: lease.generation,
            current,
        }));
    }
    Ok(())
}
