//! The cache-safe params of typed agents, stored once when the agent is created.

use forkd_core::AgentId;
use forkd_core::session::{
    CacheSafeParams, PermissionMode, RenderedSystem, ThinkingConfig, ToolsJson,
};
use sqlx::{SqliteConnection, SqlitePool};

use super::convert::{corrupt, from_i64, to_i64};
use crate::AgentParams;
use crate::error::Result;

#[derive(sqlx::FromRow)]
struct ParamsRow {
    model: String,
    system_prompt: String,
    tools_json: String,
    thinking_budget: Option<i64>,
    max_tokens: i64,
    permission_mode: String,
}

pub(super) async fn insert(
    conn: &mut SqliteConnection,
    agent: AgentId,
    params: &AgentParams,
) -> Result<()> {
    let p = &params.params;
    let thinking = p
        .thinking
        .map(|t| to_i64(t.budget_tokens, "thinking budget"))
        .transpose()?;
    sqlx::query(
        "INSERT INTO agent_params (agent_id, model, system_prompt, tools_json, thinking_budget, \
         max_tokens, permission_mode) VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(agent.to_string())
    .bind(&p.model)
    .bind(p.system.as_str())
    .bind(p.tools.raw().as_str())
    .bind(thinking)
    .bind(to_i64(p.max_tokens, "max_tokens")?)
    .bind(params.permission_mode.as_str())
    .execute(conn)
    .await?;
    Ok(())
}

pub(super) async fn get(pool: &SqlitePool, agent: AgentId) -> Result<Option<AgentParams>> {
    let row = sqlx::query_as::<_, ParamsRow>(
        "SELECT model, system_prompt, tools_json, thinking_budget, max_tokens, permission_mode \
         FROM agent_params WHERE agent_id = ?",
    )
    .bind(agent.to_string())
    .fetch_optional(pool)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let thinking = row
        .thinking_budget
        .map(|b| {
            from_i64(b, "thinking budget").map(|budget_tokens| ThinkingConfig { budget_tokens })
        })
        .transpose()?;
    Ok(Some(AgentParams {
        params: CacheSafeParams {
            model: row.model,
            system: RenderedSystem::from_stored(&row.system_prompt),
            tools: ToolsJson::from_stored(&row.tools_json)
                .map_err(|e| corrupt("agent tools", e))?,
            thinking,
            max_tokens: from_i64(row.max_tokens, "max_tokens")?,
        },
        permission_mode: PermissionMode::parse(&row.permission_mode)
            .ok_or_else(|| corrupt("agent permission mode", &row.permission_mode))?,
    }))
}
