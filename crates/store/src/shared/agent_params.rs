//! The cache-safe params of typed agents, stored once when the agent is created.

use forkd_core::AgentId;

use super::dialect::{Conn, Pool};
use crate::AgentParams;
use crate::error::Result;
use crate::rows::agent_params::{
    INSERT_PARAMS, ParamsRow, ParamsValues, bind_params, params_columns,
};

pub(crate) async fn insert(conn: &mut Conn, agent: AgentId, params: &AgentParams) -> Result<()> {
    let values = ParamsValues::new(params)?;
    bind_params!(sqlx::query(INSERT_PARAMS).bind(agent.to_string()), &values)
        .execute(conn)
        .await?;
    Ok(())
}

pub(crate) async fn get(pool: &Pool, agent: AgentId) -> Result<Option<AgentParams>> {
    let row: Option<ParamsRow> = sqlx::query_as(concat!(
        "SELECT ",
        params_columns!(),
        " FROM agent_params WHERE agent_id = $1"
    ))
    .bind(agent.to_string())
    .fetch_optional(pool)
    .await?;
    row.map(AgentParams::try_from).transpose()
}
