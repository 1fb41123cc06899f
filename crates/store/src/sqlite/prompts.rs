//! Permission prompts and the tools sessions always allow. One daemon uses a SQLite database,
//! so every unanswered prompt in it is open (the store removes them all when it opens).

use forkd_core::prompt::{PermissionAnswer, PermissionPrompt};
use forkd_core::{DaemonId, PromptId, SessionId};
use sqlx::{SqliteConnection, SqlitePool};

use super::agents;
use crate::Lease;
use crate::error::Result;
use crate::rows::convert::now_ms;
use crate::rows::prompts::{INSERT_PROMPT, PromptRow, bind_prompt, not_open, prompt_columns};

pub(super) async fn insert(
    conn: &mut SqliteConnection,
    lease: &Lease,
    prompt: &PermissionPrompt,
    daemon: DaemonId,
) -> Result<()> {
    agents::check_lease(conn, lease).await?;
    sqlx::query("DELETE FROM permission_prompts WHERE agent_id = ? AND daemon <> ?")
        .bind(prompt.agent_id.to_string())
        .bind(daemon.to_string())
        .execute(&mut *conn)
        .await?;
    bind_prompt!(sqlx::query(INSERT_PROMPT), prompt)
        .bind(daemon.to_string())
        .bind(now_ms())
        .execute(conn)
        .await?;
    Ok(())
}

/// Removes every prompt: the waits they belonged to ended with the daemon that opened the
/// database before.
pub(super) async fn remove_all(conn: &mut SqliteConnection) -> Result<()> {
    sqlx::query("DELETE FROM permission_prompts")
        .execute(conn)
        .await?;
    Ok(())
}

pub(super) async fn open(pool: &SqlitePool, session: SessionId) -> Result<Vec<PermissionPrompt>> {
    let rows: Vec<PromptRow> = sqlx::query_as(concat!(
        "SELECT ",
        prompt_columns!(),
        " FROM permission_prompts WHERE session_id = ? AND answer IS NULL \
         ORDER BY created_at_ms, id"
    ))
    .bind(session.to_string())
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|row| row.into_prompt().map(|(prompt, _)| prompt))
        .collect()
}

pub(super) async fn get(
    pool: &SqlitePool,
    id: PromptId,
) -> Result<Option<(PermissionPrompt, Option<PermissionAnswer>)>> {
    let row: Option<PromptRow> = sqlx::query_as(concat!(
        "SELECT ",
        prompt_columns!(),
        " FROM permission_prompts WHERE id = ?"
    ))
    .bind(id.to_string())
    .fetch_optional(pool)
    .await?;
    row.map(PromptRow::into_prompt).transpose()
}

pub(super) async fn answer(
    conn: &mut SqliteConnection,
    id: PromptId,
    answer: &PermissionAnswer,
) -> Result<PermissionPrompt> {
    let at = now_ms();
    let row: Option<PromptRow> = sqlx::query_as(concat!(
        "UPDATE permission_prompts SET answer = ?, deny_reason = ?, answered_at_ms = ? \
         WHERE id = ? AND answer IS NULL RETURNING ",
        prompt_columns!()
    ))
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
             VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
        )
        .bind(prompt.session_id.to_string())
        .bind(&prompt.tool)
        .bind(at)
        .execute(conn)
        .await?;
    }
    Ok(prompt)
}

pub(super) async fn close(conn: &mut SqliteConnection, id: PromptId) -> Result<()> {
    sqlx::query("DELETE FROM permission_prompts WHERE id = ?")
        .bind(id.to_string())
        .execute(conn)
        .await?;
    Ok(())
}

pub(super) async fn always_allowed(
    pool: &SqlitePool,
    session: SessionId,
    tool: &str,
) -> Result<bool> {
    let allowed: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM session_allowed_tools WHERE session_id = ? AND tool = ?)",
    )
    .bind(session.to_string())
    .bind(tool)
    .fetch_one(pool)
    .await?;
    Ok(allowed)
}
