//! Permission prompts and the tools sessions always allow, shared by the daemons on one
//! database. A prompt is open while it has no answer and the daemon that asked it still holds
//! its agent under a live lease (on the database's clock): a dead daemon's prompts are nobody's
//! to answer, and the daemon that adopts the agent asks again.

use forkd_core::prompt::{PermissionAnswer, PermissionPrompt};
use forkd_core::{DaemonId, PromptId, SessionId};
use sqlx::{AssertSqlSafe, PgConnection, PgPool};

use super::agents::{self, DB_NOW_MS};
use crate::Lease;
use crate::error::Result;
use crate::rows::convert::now_ms;
use crate::rows::prompts::{INSERT_PROMPT, PromptRow, bind_prompt, not_open, prompt_columns};

/// The channel on which prompts and answers wake the daemons that `LISTEN`; the payload is
/// `ask:ID` or `answer:ID`.
pub(super) const CHANNEL: &str = "forkd_prompts";

/// The condition, on a row of `permission_prompts`, that its daemon still holds its agent.
fn held() -> String {
    format!(
        "EXISTS (SELECT 1 FROM agents a WHERE a.id = permission_prompts.agent_id \
         AND a.held_by = permission_prompts.daemon AND a.lease_expires_at_ms > {DB_NOW_MS})"
    )
}

async fn wake(conn: &mut PgConnection, what: &str, id: PromptId) -> Result<()> {
    // Delivered at commit (and only then) to every daemon listening.
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(format!("{what}:{id}"))
        .execute(conn)
        .await?;
    Ok(())
}

pub(super) async fn insert(
    conn: &mut PgConnection,
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

pub(super) async fn open(pool: &PgPool, session: SessionId) -> Result<Vec<PermissionPrompt>> {
    let rows: Vec<PromptRow> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT {} FROM permission_prompts WHERE session_id = $1 AND answer IS NULL AND {} \
         ORDER BY created_at_ms, id",
        prompt_columns!(),
        held()
    )))
    .bind(session.to_string())
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|row| row.into_prompt().map(|(prompt, _)| prompt))
        .collect()
}

pub(super) async fn get(
    pool: &PgPool,
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

pub(super) async fn answer(
    conn: &mut PgConnection,
    id: PromptId,
    answer: &PermissionAnswer,
) -> Result<PermissionPrompt> {
    let at = now_ms();
    let row: Option<PromptRow> = sqlx::query_as(AssertSqlSafe(format!(
        "UPDATE permission_prompts SET answer = $1, deny_reason = $2, answered_at_ms = $3 \
         WHERE id = $4 AND answer IS NULL AND {} RETURNING {}",
        held(),
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

pub(super) async fn close(conn: &mut PgConnection, id: PromptId) -> Result<()> {
    sqlx::query("DELETE FROM permission_prompts WHERE id = $1")
        .bind(id.to_string())
        .execute(conn)
        .await?;
    Ok(())
}

pub(super) async fn always_allowed(pool: &PgPool, session: SessionId, tool: &str) -> Result<bool> {
    let allowed: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM session_allowed_tools WHERE session_id = $1 AND tool = $2)",
    )
    .bind(session.to_string())
    .bind(tool)
    .fetch_one(pool)
    .await?;
    Ok(allowed)
}

/// A wake-up's payload (`ask:ID` or `answer:ID`) as the prompt it names and whether it was
/// answered; `None` for a payload this version does not know.
pub(super) fn parse_wakeup(payload: &str) -> Option<(bool, PromptId)> {
    let (what, id) = payload.split_once(':')?;
    let id = id.parse().ok()?;
    match what {
        "ask" => Some((false, id)),
        "answer" => Some((true, id)),
        _ => None,
    }
}
