//! The cache-safe params of typed agents, stored once when the agent is created.

use forkd_core::AgentId;
use sqlx::{SqliteConnection, SqlitePool};

use crate::AgentParams;
use crate::error::Result;
use crate::rows::agent_params::{
    INSERT_PARAMS, ParamsRow, ParamsValues, bind_params, params_columns,
};

pub(super) async fn insert(
    conn: &mut SqliteConnection,
    agent: AgentId,
    params: &AgentParams,
) -> Result<()> {
    let values = ParamsValues::new(params)?;
    bind_params!(sqlx::query(INSERT_PARAMS).bind(agent.to_string()), &values)
        .execute(conn)
        .await?;
    Ok(())
}

pub(super) async fn get(pool: &SqlitePool, agent: AgentId) -> Result<Option<AgentParams>> {
    let row: Option<ParamsRow> = sqlx::query_as(concat!(
        "SELECT ",
        params_columns!(),
        " FROM agent_params WHERE agent_id = ?"
    ))
    .bind(agent.to_string())
    .fetch_optional(pool)
    .await?;
    row.map(AgentParams::try_from).transpose()
}
