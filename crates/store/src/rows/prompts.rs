//! Permission prompt rows.

use forkd_core::prompt::{PermissionAnswer, PermissionPrompt};

use super::convert::{corrupt, parse_id};
use crate::error::Result;

#[derive(sqlx::FromRow)]
pub(crate) struct PromptRow {
    id: String,
    session_id: String,
    agent_id: String,
    tool: String,
    input_json: String,
    question: String,
    answer: Option<String>,
    deny_reason: Option<String>,
}

/// The columns [`PromptRow`] reads.
macro_rules! prompt_columns {
    () => {
        "id, session_id, agent_id, tool, input_json, question, answer, deny_reason"
    };
}
pub(crate) use prompt_columns;

/// Stores an open prompt: bind it with [`bind_prompt!`], then the asking daemon's id and the
/// time.
pub(crate) const INSERT_PROMPT: &str = "INSERT INTO permission_prompts (id, session_id, \
     agent_id, tool, input_json, question, daemon, created_at_ms) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

/// Binds a [`PermissionPrompt`] to [`INSERT_PROMPT`]'s first six values, on either driver.
macro_rules! bind_prompt {
    ($query:expr, $prompt:expr) => {{
        let p: &forkd_core::prompt::PermissionPrompt = $prompt;
        $query
            .bind(p.id.to_string())
            .bind(p.session_id.to_string())
            .bind(p.agent_id.to_string())
            .bind(&p.tool)
            .bind(&p.input_json)
            .bind(&p.question)
    }};
}
pub(crate) use bind_prompt;

impl PromptRow {
    /// The prompt, and its answer if it has one.
    pub(crate) fn into_prompt(self) -> Result<(PermissionPrompt, Option<PermissionAnswer>)> {
        let answer = match self.answer {
            Some(name) => Some(
                PermissionAnswer::from_stored(&name, self.deny_reason)
                    .ok_or_else(|| corrupt("permission answer", format!("unknown {name:?}")))?,
            ),
            None => None,
        };
        let prompt = PermissionPrompt {
            id: parse_id(&self.id, "permission prompt id")?,
            session_id: parse_id(&self.session_id, "permission prompt's session id")?,
            agent_id: parse_id(&self.agent_id, "permission prompt's agent id")?,
            tool: self.tool,
            input_json: self.input_json,
            question: self.question,
        };
        Ok((prompt, answer))
    }
}

/// The `NotFound` of a prompt that is not open (answered already, or its wait is over).
pub(crate) fn not_open(id: forkd_core::PromptId) -> crate::DbError {
    crate::DbError::Store(crate::StoreError::NotFound {
        kind: "permission prompt",
        id: id.to_string(),
    })
}
