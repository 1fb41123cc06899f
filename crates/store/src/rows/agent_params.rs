//! The rows of typed agents' own cache-safe params.

use forkd_core::session::{
    CacheSafeParams, PermissionMode, RenderedSystem, ThinkingConfig, ToolsJson,
};

use forkd_core::output::OutputSchema;

use super::convert::{corrupt, from_i64, to_i64};
use crate::error::Result;
use crate::{AgentParams, DbError};

#[derive(sqlx::FromRow)]
pub(crate) struct ParamsRow {
    model: String,
    system_prompt: String,
    tools_json: String,
    thinking_budget: Option<i64>,
    max_tokens: i64,
    permission_mode: String,
    output_schema: Option<String>,
}

/// The columns [`ParamsRow`] reads.
macro_rules! params_columns {
    () => {
        "model, system_prompt, tools_json, thinking_budget, max_tokens, permission_mode, \
         output_schema"
    };
}
pub(crate) use params_columns;

/// Stores an agent's params: bind the agent id, then [`ParamsValues`] with [`bind_params!`].
pub(crate) const INSERT_PARAMS: &str = "INSERT INTO agent_params (agent_id, model, \
     system_prompt, tools_json, thinking_budget, max_tokens, permission_mode, output_schema) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

impl TryFrom<ParamsRow> for AgentParams {
    type Error = DbError;

    fn try_from(row: ParamsRow) -> Result<Self> {
        let thinking = row
            .thinking_budget
            .map(|b| {
                from_i64(b, "thinking budget").map(|budget_tokens| ThinkingConfig { budget_tokens })
            })
            .transpose()?;
        Ok(AgentParams {
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
            output_schema: row.output_schema.map(OutputSchema::from_stored),
        })
    }
}

/// An agent's params as their row stores them.
pub(crate) struct ParamsValues<'a> {
    pub model: &'a str,
    pub system_prompt: &'a str,
    pub tools_json: &'a str,
    pub thinking_budget: Option<i64>,
    pub max_tokens: i64,
    pub permission_mode: &'a str,
    pub output_schema: Option<&'a str>,
}

impl<'a> ParamsValues<'a> {
    pub fn new(params: &'a AgentParams) -> Result<Self> {
        let p = &params.params;
        Ok(Self {
            model: &p.model,
            system_prompt: p.system.as_str(),
            tools_json: p.tools.raw().as_str(),
            thinking_budget: p
                .thinking
                .map(|t| to_i64(t.budget_tokens, "thinking budget"))
                .transpose()?,
            max_tokens: to_i64(p.max_tokens, "max_tokens")?,
            permission_mode: params.permission_mode.as_str(),
            output_schema: params.output_schema.as_ref().map(OutputSchema::as_str),
        })
    }
}

/// Binds [`ParamsValues`] after the agent id of [`INSERT_PARAMS`], on either driver.
macro_rules! bind_params {
    ($query:expr, $values:expr) => {{
        let v: &$crate::rows::agent_params::ParamsValues<'_> = $values;
        $query
            .bind(v.model)
            .bind(v.system_prompt)
            .bind(v.tools_json)
            .bind(v.thinking_budget)
            .bind(v.max_tokens)
            .bind(v.permission_mode)
            .bind(v.output_schema)
    }};
}
pub(crate) use bind_params;
