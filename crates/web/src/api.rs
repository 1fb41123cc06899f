//! The JSON API the page reads and the actions it takes, all through the tenant-scoped engine.

use axum::Json;
use axum::extract::{Path, Query, State};
use forkd_core::query::{AgentFilter, RequestFilter};
use forkd_core::{AgentId, AgentKind, BatchId, RequestId, SessionId};
use forkd_engine::{EngineError, PermissionAnswer};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::AppState;
use crate::auth::{Actor, Caller};
use crate::error::WebError;
use crate::summaries::{
    batch_agents, batch_figures, batch_summaries, main_loop, summaries, summary,
};
use crate::views::{self, AgentRow, RequestView};

type Reply = Result<Json<Value>, WebError>;

pub(crate) fn not_found(kind: &'static str, id: &str) -> WebError {
    WebError::Engine(EngineError::NotFound {
        kind,
        id: id.chars().take(64).collect(),
    })
}

pub(crate) fn session_id(s: &str) -> Result<SessionId, WebError> {
    SessionId::parse(s).map_err(|_| not_found("session", s))
}

pub(crate) fn batch_id(s: &str) -> Result<BatchId, WebError> {
    BatchId::parse(s).map_err(|_| not_found("batch", s))
}

pub(crate) fn agent_id(s: &str) -> Result<AgentId, WebError> {
    AgentId::parse(s).map_err(|_| not_found("agent", s))
}

pub(crate) async fn sessions(caller: Caller, State(state): State<AppState>) -> Reply {
    let list = summaries(&state.engine, &caller.tenant).await?;
    Ok(Json(json!({ "sessions": list })))
}

pub(crate) async fn session(
    caller: Caller,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Reply {
    let id = session_id(&id)?;
    let scoped = state.engine.for_tenant(caller.tenant);
    let view = scoped.session(id).await?;
    let sandbox = &view.session.sandbox;
    let (permission_mode, sandbox) = (
        view.session.permission_mode.as_str().to_owned(),
        format!(
            "{}{}{}",
            sandbox.mode.as_str(),
            if sandbox.allow_network {
                ", network allowed"
            } else {
                ""
            },
            if sandbox.unix_sockets {
                ", Unix sockets allowed"
            } else {
                ""
            }
        ),
    );
    // Where a branch starts, and the branches made from this session: links both ways.
    let after_turn = |turns: &forkd_core::branch::TurnIndex, point: u64| {
        turns.starts.iter().filter(|s| **s < point).count()
    };
    // An uploaded session's origin: what the tree was.
    let upload = view.origin.as_ref().map(|o| {
        json!({
            "upload_id": o.upload_id.to_string(),
            "files": o.files,
            "bytes": o.bytes,
            "git_commit": o.git_commit,
        })
    });
    let branch = match view.session.branch {
        Some(b) => Some(json!({
            "origin": b.origin.to_string(),
            "point": b.point,
            "after_turn": after_turn(&view.turns, b.point),
        })),
        None => None,
    };
    let branches: Vec<Value> = scoped
        .branches(id)
        .await?
        .iter()
        .filter_map(|s| s.branch.map(|b| (s, b)))
        .map(|(s, b)| {
            json!({
                "id": s.id.to_string(),
                "point": b.point,
                "after_turn": after_turn(&view.turns, b.point),
                "created_at_ms": s.created_at_ms,
            })
        })
        .collect();
    let summary = summary(&scoped, view).await?;
    let agents = scoped
        .list_agents(AgentFilter {
            session_id: Some(id),
            include_ended: true,
            ..AgentFilter::default()
        })
        .await?;
    let main = main_loop(&agents);
    let transcript = match main {
        Some(m) => scoped
            .transcript(m.id, true)
            .await?
            .iter()
            .map(|e| views::entry(e, None))
            .collect(),
        None => Vec::new(),
    };
    let typed: Vec<AgentRow> = agents
        .iter()
        .filter(|a| a.kind == AgentKind::Typed)
        .map(AgentRow::from)
        .collect();
    Ok(Json(json!({
        "session": summary,
        "main_agent": main.map(AgentRow::from),
        "permission_mode": permission_mode,
        "sandbox": sandbox,
        "transcript": transcript,
        "batches": batch_summaries(&agents),
        "typed": typed,
        "branch": branch,
        "upload": upload,
        "branches": branches,
    })))
}

pub(crate) async fn batch(
    caller: Caller,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Reply {
    let id = batch_id(&id)?;
    let scoped = state.engine.for_tenant(caller.tenant.clone());
    let batch = scoped.batch(id).await?;
    let agents = batch_agents(&state.engine, &caller.tenant, id).await?;
    let figures = batch_figures(&state.engine, &caller.tenant, id, &agents).await?;
    Ok(Json(json!({
        "batch": {
            "id": batch.id.to_string(),
            "session_id": batch.session_id.to_string(),
            "created_at_ms": batch.created_at_ms,
        },
        "trace": trace(state.trace_url_template.as_deref(), batch.trace_parent.as_deref()),
        "figures": figures,
    })))
}

/// The trace a batch's work is in (docs/operations.md, "Tracing"): its id, and a trace UI's
/// link when the daemon has a `trace_url_template`; `null` when traces were off.
fn trace(template: Option<&str>, trace_parent: Option<&str>) -> serde_json::Value {
    let Some(id) = trace_parent
        .and_then(forkd_engine::trace::parse)
        .map(|sc| sc.trace_id().to_string())
    else {
        return serde_json::Value::Null;
    };
    let url = template.map(|template| template.replace("{trace_id}", &id));
    json!({"trace_id": id, "url": url})
}

#[cfg(test)]
mod trace_tests {
    use super::*;

    #[test]
    fn a_trace_is_its_id_and_the_template_filled_in() {
        let parent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert_eq!(
            trace(Some("http://jaeger:16686/trace/{trace_id}"), parent),
            json!({
                "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
                "url": "http://jaeger:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736",
            })
        );
        assert_eq!(trace(None, parent)["url"], serde_json::Value::Null);
        assert_eq!(trace(Some("x"), None), serde_json::Value::Null);
        assert_eq!(trace(Some("x"), Some("garbage")), serde_json::Value::Null);
    }
}

pub(crate) async fn agent(
    caller: Caller,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Reply {
    let id = agent_id(&id)?;
    let scoped = state.engine.for_tenant(caller.tenant);
    let agent = scoped.agent(id).await?;
    // The transcript and how many of its messages are the agent's own, read until they agree
    // (the transcript only grows): the own ones carry their seqs, and the live stream goes on
    // from the next seq.
    let mut own_before = scoped.own_message_count(id).await?;
    let mut entries = scoped.transcript(id, true).await?;
    for _ in 0..5 {
        let own_after = scoped.own_message_count(id).await?;
        if own_after == own_before {
            break;
        }
        own_before = own_after;
        entries = scoped.transcript(id, true).await?;
    }
    let parent = agent.kind == AgentKind::Parent;
    let own = if parent { 0 } else { own_before as usize };
    let head = entries.len().saturating_sub(own);
    let transcript: Vec<_> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| views::entry(e, (i >= head).then(|| (i - head) as u64)))
        .collect();
    let requests: Vec<RequestView> = scoped
        .list_requests(RequestFilter {
            agent_id: Some(id),
            ..RequestFilter::default()
        })
        .await?
        .iter()
        .map(RequestView::from)
        .collect();
    // What its hooks decided (docs/contracts.md, "Hooks").
    let hooks: Vec<_> = scoped
        .hook_runs(id)
        .await?
        .iter()
        .map(|r| {
            json!({
                "event": r.event.as_str(),
                "tool_use_id": r.tool_use_id,
                "tool_name": r.tool_name,
                "program": r.program,
                "exit_code": r.exit_code,
                "decision": r.decision.as_str(),
                "output": r.output,
                "started_at_ms": r.started_at_ms,
                "duration_ms": r.finished_at_ms - r.started_at_ms,
            })
        })
        .collect();
    // The trace its work is in: its batch's.
    let trace_parent = match agent.batch_id {
        Some(batch) => scoped.batch(batch).await?.trace_parent,
        None => None,
    };
    // An isolated child's copy, once it has ended: its files and unified diff.
    let changes = match agent.batch_id.is_some() && agent.state.is_terminal() {
        true => scoped
            .copies_of(std::slice::from_ref(&agent))
            .await?
            .remove(&id),
        false => None,
    };
    Ok(Json(json!({
        "agent": AgentRow::from(&agent),
        "changes": changes.map(|c| json!({
            "state": c.state.as_str(),
            "summary": c.summary(),
            "files": c.files,
            "diff": forkd_core::isolation::without_binary_patches(&c.diff),
            "conflicts": c.conflicts,
            "outside_possible": c.outside_possible,
        })),
        "directive": agent.directive.as_ref().map(|d| json!({"description": d.description, "prompt": d.prompt})),
        "transcript": transcript,
        "next_seq": own,
        "requests": requests,
        "hooks": hooks,
        "trace": trace(state.trace_url_template.as_deref(), trace_parent.as_deref()),
    })))
}

#[derive(Deserialize)]
pub(crate) struct ExplainQuery {
    a: String,
    b: Option<String>,
}

pub(crate) async fn explain(
    caller: Caller,
    State(state): State<AppState>,
    Query(q): Query<ExplainQuery>,
) -> Reply {
    let parse = |s: &str| RequestId::parse(s).map_err(|_| not_found("request", s));
    let a = parse(&q.a)?;
    let b = match q.b.as_deref().filter(|s| !s.is_empty()) {
        Some(s) => Some(parse(s)?),
        None => None,
    };
    let e = state
        .engine
        .for_tenant(caller.tenant)
        .explain_cache(a, b)
        .await?;
    Ok(Json(json!({
        "request_id": e.request_id,
        "other_request_id": e.other_request_id,
        "same_prefix": e.same_prefix,
        "part": e.part,
        "kind": e.kind,
        "byte": e.byte,
        "exact": e.exact,
        "excerpt": e.excerpt,
        "other_excerpt": e.other_excerpt,
        "note": e.note,
    })))
}

pub(crate) async fn kill(
    Actor(tenant): Actor,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Reply {
    let id = agent_id(&id)?;
    state.engine.for_tenant(tenant.clone()).kill(id).await?;
    tracing::info!(agent.id = %id, tenant = %tenant, "Agent killed from the web view");
    Ok(Json(json!({})))
}

pub(crate) async fn background(
    Actor(tenant): Actor,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Reply {
    let id = agent_id(&id)?;
    state.engine.for_tenant(tenant).background(id).await?;
    Ok(Json(json!({})))
}

#[derive(Deserialize)]
pub(crate) struct AnswerBody {
    /// `allow`, `always` or `deny`.
    answer: String,
    #[serde(default)]
    reason: Option<String>,
}

pub(crate) async fn answer_prompt(
    Actor(tenant): Actor,
    State(state): State<AppState>,
    Path(id): Path<String>,
    Json(body): Json<AnswerBody>,
) -> Reply {
    let answer = match body.answer.as_str() {
        "allow" => PermissionAnswer::AllowOnce,
        "always" => PermissionAnswer::AllowAlways,
        "deny" => PermissionAnswer::Deny(body.reason.filter(|r| !r.is_empty())),
        other => {
            return Err(WebError::BadRequest(format!(
                "answer {other:?}: use allow, always or deny"
            )));
        }
    };
    state
        .engine
        .for_tenant(tenant)
        .answer_prompt(&id, answer)
        .await?;
    Ok(Json(json!({})))
}
