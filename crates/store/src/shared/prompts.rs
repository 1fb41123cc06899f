//! Permission prompts and the tools sessions always allow. A prompt is open while it has no
//! answer and its daemon still holds its agent (`dialect::PROMPT_HELD`).

use forkd_core::prompt::{PermissionAnswer, PermissionPrompt};
use forkd_core::{DaemonId, PromptId, SessionId};

use super::agents;
use super::dialect::{self, Conn, PROMPT_HELD, Pool};
use crate::Lease;
use crate::error::Result;
use crate::rows::convert::now_ms;
use crate::rows::prompts::{INSERT_PROMPT, PromptRow, bind_prompt, not_open, prompt_columns};

/// The channel on which prompts and answers wake the daemons that `LISTEN`; the payload is
/// `ask:ID` or `answer:ID`.
pub(crate) const CHANNEL: &str = "forkd_prompts";

async fn wake(conn: &mut Conn, what: &str, id: PromptId) -> Result<()> {
    dialect::notify(conn, CHANNEL, &format!("{what}:{id}")).await
}

pub(crate) async fn insert(
    conn: &mut Conn,
    lease: &Lease,
    prompt: &PermissionPrompt,
    daemon: DaemonId,
) -> Result<()> {
    agents::check_lease(conn, lease).await?;
    sqlx::query("DELETE FROM permission_prompts WHERE agent_id = $1 AND daemon <> $2")
        .bind(prompt.agent_id.to_string())
        .bind(daemon.to_string())
        .execute(&mut *conn)
        .await?;
    bind_prompt!(sqlx::query(INSERT_PROMPT), prompt)
        .bind(daemon.to_string())
        .bind(now_ms())
        .execute(&mut *conn)
        .await?;
    wake(conn, "ask", prompt.id).await
}

pub(crate) async fn open(pool: &Pool, session: SessionId) -> Result<Vec<PermissionPrompt>> {
    let rows: Vec<PromptRow> = sqlx::query_as(super::sql(format!(
        "SELECT {} FROM permission_prompts WHERE session_id = $1 AND answer IS NULL \
         AND {PROMPT_HELD} ORDER BY created_at_ms, id",
        prompt_columns!(),
    )))
    .bind(session.to_string())
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|row| row.into_prompt().map(|(prompt, _)| prompt))
        .collect()
}

pub(crate) async fn get(
    pool: &Pool,
    id: PromptId,
) -> Result<Option<(PermissionPrompt, Option<PermissionAnswer>)>> {
    let row: Option<PromptRow> = sqlx::query_as(concat!(
        "SELECT ",
        prompt_columns!(),
        " FROM permission_prompts WHERE id = $1"
    ))
    .bind(id.to_string())
    .fetch_optional(pool)
    .await?;
    row.map(PromptRow::into_prompt).transpose()
}

pub(crate) async fn answer(
    conn: &mut Conn,
    id: PromptId,
    answer: &PermissionAnswer,
) -> Result<PermissionPrompt> {
    let at = now_ms();
    let row: Option<PromptRow> = sqlx::query_as(super::sql(format!(
        "UPDATE permission_prompts SET answer = $1, deny_reason = $2, answered_at_ms = $3 \
         WHERE id = $4 AND answer IS NULL AND {PROMPT_HELD} RETURNING {}",
        prompt_columns!()
    )))
    .bind(answer.as_str())
    .bind(answer.reason())
    .bind(at)
    .bind(id.to_string())
    .fetch_optional(&mut *conn)
    .await?;
    let (prompt, _) = row.ok_or_else(|| not_open(id))?.into_prompt()?;
    if *answer == PermissionAnswer::AllowAlways {
        sqlx::query(
            "INSERT INTO session_allowed_tools (session_id, tool, allowed_at_ms) \
             VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        )
        .bind(prompt.session_id.to_string())
        .bind(&prompt.tool)
        .bind(at)
        .execute(&mut *conn)
        .await?;
    }
    wake(conn, "answer", id).await?;
    Ok(prompt)
}

pub(crate) async fn close(conn: &mut Conn, id: PromptId) -> Result<()> {
    sqlx::query("DELETE FROM permission_prompts WHERE id = $1")
        .bind(id.to_string())
        .execute(conn)
        .await?;
    Ok(())
}

pub(crate) async fn always_allowed(pool: &Pool, session: SessionId, tool: &str) -> Result<bool> {
    let allowed: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM session_allowed_tools WHERE session_id = $1 AND tool = $2)",
    )
    .bind(session.to_string())
    .bind(tool)
    .fetch_one(pool)
    .await?;
    Ok(allowed)
}
