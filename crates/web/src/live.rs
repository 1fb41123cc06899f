//! Live updates over server-sent events.
//!
//! Each page has one stream. Notifications come from the engine's notification subscriptions
//! (the store's replay after a seq, then live) and an agent's messages from its attach stream,
//! exactly as gRPC clients get them; their SSE ids are their seqs, so a browser that reconnects
//! sends `Last-Event-ID` and resumes after the last event it saw, without gaps. What has no
//! stream of its own — agents' states and token counts while they run, a batch's figures — is
//! read once a second and sent when it changed (a reconnect starts with the whole picture).

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::KeepAliveStream;
use axum::response::sse::{Event, KeepAlive, Sse};
use forkd_core::query::{AgentFilter, NotificationFilter, RequestFilter};
use forkd_core::{AgentKind, Tenant};
use forkd_engine::{AgentEvent, Engine};
use futures::StreamExt as _;
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::AppState;
use crate::api::{agent_id, batch_id, session_id};
use crate::auth::{Caller, Lease};
use crate::error::WebError;
use crate::summaries;
use crate::views::{self, AgentRow, NotificationView, RequestView};

/// How often what has no stream of its own is read again.
const TICK: Duration = Duration::from_secs(1);
/// A batch's figures are sent at most once in this many ticks.
const FIGURES_EVERY: u32 = 3;

type Tx = mpsc::Sender<Event>;
type EventStream =
    Sse<KeepAliveStream<futures::stream::BoxStream<'static, Result<Event, Infallible>>>>;

/// Runs `feed` until it returns, the browser goes away, the daemon stops, or the token the
/// sign-in rests on (`lease`) is revoked: then an `unauthorized` event (status 401) ends it,
/// within a second of the revocation.
fn sse<F, Fut>(state: &AppState, lease: Option<Lease>, feed: F) -> EventStream
where
    F: FnOnce(Tx) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(256);
    let shutdown = state.shutdown.clone();
    let closed = tx.clone();
    let fed = feed(tx);
    tokio::spawn(async move {
        let revoked = async {
            match lease {
                Some(lease) => lease.revoked().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = fed => {}
            () = shutdown.cancelled() => {}
            () = closed.closed() => {}
            () = revoked => {
                let body = serde_json::json!({
                    "status": 401,
                    "error": "the token of this sign-in was revoked; sign in again",
                });
                let _ = closed.send(event("unauthorized", &body)).await;
            }
        }
    });
    Sse::new(ReceiverStream::new(rx).map(Ok).boxed()).keep_alive(KeepAlive::default())
}

fn event(name: &str, data: &impl serde::Serialize) -> Event {
    Event::default()
        .event(name)
        .json_data(data)
        .unwrap_or_else(|_| Event::default().event("error").data("unserializable"))
}

fn error_event(e: &WebError) -> Event {
    event("failure", &serde_json::json!({ "error": e.to_string() }))
}

/// The seq after which to resume: the browser's `Last-Event-ID` when it reconnects.
fn last_event_id(headers: &HeaderMap) -> Option<u64> {
    headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// Rows that changed since the last call (all of them the first time).
#[derive(Default)]
struct Changes {
    last: HashMap<String, AgentRow>,
}

impl Changes {
    fn changed(&mut self, rows: Vec<AgentRow>) -> Vec<AgentRow> {
        rows.into_iter()
            .filter(|row| {
                let fresh = self.last.get(&row.id) != Some(row);
                if fresh {
                    self.last.insert(row.id.clone(), row.clone());
                }
                fresh
            })
            .collect()
    }
}

/// `GET /api/live/sessions`: the sessions list, whenever it changes.
pub(crate) async fn sessions(caller: Caller, State(state): State<AppState>) -> EventStream {
    let (engine, tenant) = (state.engine.clone(), caller.tenant);
    sse(&state, caller.lease.clone(), move |tx| async move {
        let mut last = None;
        let mut every = tokio::time::interval(TICK);
        loop {
            every.tick().await;
            let ev = match summaries::summaries(&engine, &tenant).await {
                Ok(list) => {
                    let value = serde_json::json!({ "sessions": list });
                    if last.as_ref() == Some(&value) {
                        continue;
                    }
                    let ev = event("sessions", &value);
                    last = Some(value);
                    ev
                }
                Err(e) => error_event(&e),
            };
            if tx.send(ev).await.is_err() {
                return;
            }
        }
    })
}

#[derive(Deserialize, Default)]
pub(crate) struct Since {
    #[serde(default)]
    since: Option<u64>,
}

/// Sends notifications as `notification` events with their seqs as ids; false when the browser
/// is gone.
async fn forward_notification(
    tx: &Tx,
    n: Result<forkd_core::Notification, forkd_engine::EngineError>,
) -> bool {
    let ev = match n {
        Ok(n) => event("notification", &NotificationView::from(&n)).id(n.tenant_seq.to_string()),
        Err(e) => error_event(&WebError::Engine(e)),
    };
    tx.send(ev).await.is_ok()
}

/// `GET /api/live/sessions/{id}`: the session's notifications, its agents' changes, its
/// summary and its permission prompts.
pub(crate) async fn session(
    caller: Caller,
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<Since>,
    headers: HeaderMap,
) -> Result<EventStream, WebError> {
    let id = session_id(&id)?;
    let tenant = caller.tenant;
    let scoped = state.engine.for_tenant(tenant.clone());
    scoped.session(id).await?;
    let since = last_event_id(&headers).or(q.since).unwrap_or(0);
    let filter = NotificationFilter {
        session_id: Some(id),
        ..NotificationFilter::default()
    };
    let mut notes = scoped.subscribe(since, filter, true).await?;
    let mut prompts = scoped.subscribe_prompts(id).await?;
    let engine = state.engine.clone();
    Ok(sse(&state, caller.lease.clone(), move |tx| async move {
        let mut changes = Changes::default();
        let mut last_summary = None;
        let mut last_batches = None;
        let mut every = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                n = notes.next() => match n {
                    Some(n) => if !forward_notification(&tx, n).await { return },
                    None => return,
                },
                p = prompts.next() => match p {
                    Some(p) => {
                        let ev = event("prompt", &serde_json::json!({
                            "id": p.id, "agent_id": p.agent_id.to_string(), "tool": p.tool,
                            "input": p.input_json, "question": p.question,
                        }));
                        if tx.send(ev).await.is_err() { return }
                    }
                    None => return,
                },
                _ = every.tick() => {
                    let events = session_tick(&engine, &tenant, id, &mut changes, &mut last_summary, &mut last_batches).await;
                    for ev in events {
                        if tx.send(ev).await.is_err() { return }
                    }
                }
            }
        }
    }))
}

async fn session_tick(
    engine: &Engine,
    tenant: &Tenant,
    id: forkd_core::SessionId,
    changes: &mut Changes,
    last_summary: &mut Option<serde_json::Value>,
    last_batches: &mut Option<serde_json::Value>,
) -> Vec<Event> {
    let scoped = engine.for_tenant(tenant.clone());
    let read = async {
        let view = scoped.session(id).await?;
        let summary = summaries::summary(&scoped, view).await?;
        let agents = scoped
            .list_agents(AgentFilter {
                session_id: Some(id),
                include_ended: true,
                ..AgentFilter::default()
            })
            .await?;
        Ok::<_, WebError>((summary, agents))
    };
    let (summary, agents) = match read.await {
        Ok(read) => read,
        Err(e) => return vec![error_event(&e)],
    };
    let mut out = Vec::new();
    let summary = summaries::json_of(&summary);
    if last_summary.as_ref() != Some(&summary) {
        out.push(event("session", &summary));
        *last_summary = Some(summary);
    }
    let batches = summaries::json_of(&summaries::batch_summaries(&agents));
    if last_batches.as_ref() != Some(&batches) {
        out.push(event("batches", &batches));
        *last_batches = Some(batches);
    }
    // The children of batches are on their batches' pages; here the main loop and typed agents.
    let rows = agents
        .iter()
        .filter(|a| a.kind != AgentKind::Fork)
        .map(AgentRow::from)
        .collect();
    let changed = changes.changed(rows);
    if !changed.is_empty() {
        out.push(event("agents", &changed));
    }
    out
}

/// `GET /api/live/batches/{id}`: the batch's notifications, its children's changes and its
/// figures.
pub(crate) async fn batch(
    caller: Caller,
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<Since>,
    headers: HeaderMap,
) -> Result<EventStream, WebError> {
    let id = batch_id(&id)?;
    let tenant = caller.tenant;
    let scoped = state.engine.for_tenant(tenant.clone());
    scoped.batch(id).await?;
    let since = last_event_id(&headers).or(q.since).unwrap_or(0);
    let filter = NotificationFilter {
        batch_id: Some(id),
        ..NotificationFilter::default()
    };
    let mut notes = scoped.subscribe(since, filter, true).await?;
    let engine = state.engine.clone();
    Ok(sse(&state, caller.lease.clone(), move |tx| async move {
        let mut changes = Changes::default();
        let mut every = tokio::time::interval(TICK);
        let mut figures_due = true;
        // A batch's figures read all its request records: at most every few ticks.
        let mut since_figures = FIGURES_EVERY;
        loop {
            tokio::select! {
                n = notes.next() => match n {
                    Some(n) => {
                        figures_due = true;
                        if !forward_notification(&tx, n).await { return }
                    }
                    None => return,
                },
                _ = every.tick() => {
                    let agents = match summaries::batch_agents(&engine, &tenant, id).await {
                        Ok(agents) => agents,
                        Err(e) => { let _ = tx.send(error_event(&e)).await; return }
                    };
                    let changed = changes.changed(summaries::agent_rows(&agents));
                    if !changed.is_empty() {
                        figures_due = true;
                        if tx.send(event("agents", &changed)).await.is_err() { return }
                    }
                    since_figures += 1;
                    if figures_due && since_figures >= FIGURES_EVERY {
                        figures_due = false;
                        since_figures = 0;
                        let ev = match summaries::batch_figures(&engine, &tenant, id, &agents).await {
                            Ok(figures) => event("figures", &figures),
                            Err(e) => error_event(&e),
                        };
                        if tx.send(ev).await.is_err() { return }
                    }
                }
            }
        }
    }))
}

#[derive(Deserialize, Default)]
pub(crate) struct From {
    #[serde(default)]
    from: Option<u64>,
}

/// `GET /api/live/agents/{id}`: the agent's own messages from `from` (or after `Last-Event-ID`),
/// its end, and its row and request records when they change.
pub(crate) async fn agent(
    caller: Caller,
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<From>,
    headers: HeaderMap,
) -> Result<EventStream, WebError> {
    let id = agent_id(&id)?;
    let tenant = caller.tenant;
    let scoped = state.engine.for_tenant(tenant.clone());
    let agent = scoped.agent(id).await?;
    let mut next = last_event_id(&headers)
        .map(|s| s + 1)
        .or(q.from)
        .unwrap_or(0);
    // A session's main loop speaks in its session's transcript, not through attach.
    let attachable = agent.kind != AgentKind::Parent;
    let mut attached = if attachable {
        Some(scoped.attach(id, next).await?)
    } else {
        None
    };
    let engine = state.engine.clone();
    Ok(sse(&state, caller.lease.clone(), move |tx| async move {
        let mut last_row = None;
        let mut last_requests = None;
        let mut every = tokio::time::interval(TICK);
        loop {
            let message = async {
                match attached.as_mut() {
                    Some(s) => s.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ev = message => {
                    let sent = match ev {
                        Some(Ok(AgentEvent::Message { seq, message })) => {
                            next = seq + 1;
                            tx.send(event("message", &views::message(&message, Some(seq))).id(seq.to_string())).await
                        }
                        Some(Ok(AgentEvent::Ended(n))) => {
                            attached = None;
                            tx.send(event("ended", &NotificationView::from(&*n))).await
                        }
                        // Handed to the background (or the auto-background delay passed): the
                        // page keeps following, from where it was.
                        Some(Ok(AgentEvent::AsyncLaunched)) => {
                            attached = engine.for_tenant(tenant.clone()).attach(id, next).await.ok();
                            Ok(())
                        }
                        Some(Ok(AgentEvent::Interrupted { reason })) => {
                            tx.send(event("interrupted", &serde_json::json!({ "reason": reason }))).await
                        }
                        Some(Ok(AgentEvent::Resumed)) => {
                            tx.send(event("resumed", &serde_json::json!({}))).await
                        }
                        // The engine is stopping: nothing more will come.
                        None => {
                            attached = None;
                            Ok(())
                        }
                        Some(Err(e)) => {
                            attached = None;
                            tx.send(error_event(&WebError::Engine(e))).await
                        }
                    };
                    if sent.is_err() { return }
                }
                _ = every.tick() => {
                    for ev in agent_tick(&engine, &tenant, id, &mut last_row, &mut last_requests).await {
                        if tx.send(ev).await.is_err() { return }
                    }
                }
            }
        }
    }))
}

async fn agent_tick(
    engine: &Engine,
    tenant: &Tenant,
    id: forkd_core::AgentId,
    last_row: &mut Option<AgentRow>,
    last_requests: &mut Option<usize>,
) -> Vec<Event> {
    let scoped = engine.for_tenant(tenant.clone());
    let mut out = Vec::new();
    match scoped.agent(id).await {
        Ok(agent) => {
            let row = AgentRow::from(&agent);
            if last_row.as_ref() != Some(&row) {
                out.push(event("agent", &row));
                *last_row = Some(row);
            }
        }
        Err(e) => out.push(error_event(&WebError::Engine(e))),
    }
    let filter = RequestFilter {
        agent_id: Some(id),
        ..RequestFilter::default()
    };
    if let Ok(records) = scoped.list_requests(filter).await
        && *last_requests != Some(records.len())
    {
        *last_requests = Some(records.len());
        let rows: Vec<RequestView> = records.iter().map(RequestView::from).collect();
        out.push(event("requests", &rows));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_event_id_is_read_as_a_seq() {
        let mut h = HeaderMap::new();
        assert_eq!(last_event_id(&h), None);
        h.insert("last-event-id", axum::http::HeaderValue::from_static("42"));
        assert_eq!(last_event_id(&h), Some(42));
        h.insert("last-event-id", axum::http::HeaderValue::from_static("x"));
        assert_eq!(last_event_id(&h), None);
    }

    #[test]
    fn only_changed_rows_are_sent_again() {
        let row = |id: &str, state: &'static str| AgentRow {
            id: id.into(),
            session_id: String::new(),
            batch_id: None,
            kind: "fork",
            index: 0,
            state,
            description: String::new(),
            subagent_type: String::new(),
            usage: forkd_core::Usage::default(),
            read_share: 0.0,
            cost_usd: 0.0,
            error: None,
            created_at_ms: 0,
            updated_at_ms: 0,
            ended: false,
            throttled_since_ms: None,
            limits: None,
            started_at_ms: None,
            throttled_ms: 0,
        };
        let mut c = Changes::default();
        assert_eq!(
            c.changed(vec![row("a", "pending"), row("b", "pending")])
                .len(),
            2
        );
        assert!(
            c.changed(vec![row("a", "pending"), row("b", "pending")])
                .is_empty()
        );
        let again = c.changed(vec![row("a", "running"), row("b", "pending")]);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].state, "running");
    }
}
