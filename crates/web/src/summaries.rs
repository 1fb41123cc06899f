//! What the pages summarize: a tenant's sessions, a session's batches, a batch's figures (its
//! cache statistics, the calculator for its shape and its timeline). Shared by the JSON API and
//! the live streams, which send the same shapes.

use std::collections::{BTreeMap, HashMap};

use forkd_core::pricing::CacheTtl;
use forkd_core::query::{AgentFilter, RequestFilter, RequestRecord};
use forkd_core::{Agent, AgentId, AgentKind, BatchId, Tenant};
use forkd_engine::{Engine, SessionView, StatsScope, TenantEngine};
use serde::Serialize;
use serde_json::{Value, json};

use crate::error::WebError;
use crate::views::{self, AgentRow};

/// Sessions shown in the list: the most recent ones.
const MAX_SESSIONS: usize = 500;

fn to_json<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// One line of the sessions list.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct SessionSummary {
    pub id: String,
    pub model: String,
    /// The main loop's state: `idle` between turns, `running` during one.
    pub state: String,
    /// The main loop's model requests.
    pub turns: u64,
    pub batches: usize,
    pub agents: usize,
    pub running: usize,
    pub cost_usd: f64,
    pub last_activity_ms: i64,
    pub created_at_ms: i64,
    pub messages: u64,
    pub interactive: bool,
    pub coordinator: bool,
}

pub(crate) fn main_loop(agents: &[Agent]) -> Option<&Agent> {
    agents.iter().find(|a| a.kind == AgentKind::Parent)
}

pub(crate) async fn summary(
    scoped: &TenantEngine<'_>,
    view: SessionView,
) -> Result<SessionSummary, WebError> {
    let s = &view.session;
    let agents = scoped
        .list_agents(AgentFilter {
            session_id: Some(s.id),
            include_ended: true,
            ..AgentFilter::default()
        })
        .await?;
    let main = main_loop(&agents);
    let turns = match main {
        Some(m) => scoped
            .list_requests(RequestFilter {
                agent_id: Some(m.id),
                ..RequestFilter::default()
            })
            .await?
            .len() as u64,
        None => 0,
    };
    let batches: std::collections::HashSet<_> = agents.iter().filter_map(|a| a.batch_id).collect();
    Ok(SessionSummary {
        id: s.id.to_string(),
        model: s.params.model.clone(),
        state: main.map_or("idle", |m| m.state.as_str()).to_owned(),
        turns,
        batches: batches.len(),
        agents: agents
            .iter()
            .filter(|a| a.kind != AgentKind::Parent)
            .count(),
        running: agents
            .iter()
            .filter(|a| a.kind != AgentKind::Parent && !a.state.is_terminal())
            .count(),
        cost_usd: agents.iter().map(|a| a.cost_usd).sum(),
        last_activity_ms: agents
            .iter()
            .map(|a| a.updated_at_ms)
            .chain([s.created_at_ms])
            .max()
            .unwrap_or(s.created_at_ms),
        created_at_ms: s.created_at_ms,
        messages: view.message_count,
        interactive: s.interactive,
        coordinator: s.coordinator,
    })
}

/// The tenant's sessions, most recent activity first.
pub(crate) async fn summaries(
    engine: &Engine,
    tenant: &Tenant,
) -> Result<Vec<SessionSummary>, WebError> {
    let scoped = engine.for_tenant(tenant.clone());
    let mut views = Vec::new();
    let mut after = None;
    loop {
        let page = scoped.list_sessions(after, 200).await?;
        let full = page.len() == 200;
        after = page.last().map(|v| v.session.id);
        views.extend(page);
        if !full {
            break;
        }
    }
    // The newest sessions (ids are UUID v7: creation order).
    let skip = views.len().saturating_sub(MAX_SESSIONS);
    let mut out = Vec::with_capacity(views.len() - skip);
    for view in views.into_iter().skip(skip) {
        out.push(summary(&scoped, view).await?);
    }
    out.sort_by_key(|s| std::cmp::Reverse(s.last_activity_ms));
    Ok(out)
}

/// A batch's line in its session's page.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct BatchSummary {
    pub id: String,
    pub created_at_ms: i64,
    pub children: usize,
    pub states: BTreeMap<&'static str, usize>,
    pub cost_usd: f64,
}

pub(crate) fn batch_summaries(agents: &[Agent]) -> Vec<BatchSummary> {
    let mut by_batch: BTreeMap<BatchId, BatchSummary> = BTreeMap::new();
    for a in agents.iter().filter(|a| a.kind == AgentKind::Fork) {
        let Some(b) = a.batch_id else { continue };
        let entry = by_batch.entry(b).or_insert_with(|| BatchSummary {
            id: b.to_string(),
            created_at_ms: a.created_at_ms,
            children: 0,
            states: BTreeMap::new(),
            cost_usd: 0.0,
        });
        entry.children += 1;
        *entry.states.entry(a.state.as_str()).or_default() += 1;
        entry.cost_usd += a.cost_usd;
        entry.created_at_ms = entry.created_at_ms.min(a.created_at_ms);
    }
    by_batch.into_values().collect()
}

/// One child on a batch's timeline: times in ms since the epoch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct TimelineRow {
    pub agent_id: String,
    pub index: u32,
    /// When the batch stored the child (it waits from then, pending or behind the gate).
    pub created_at_ms: i64,
    /// When its first model request was sent (`None` for records made before it was kept).
    pub first_sent_ms: Option<i64>,
    /// When its first model response ended (the request's record is made then).
    pub first_reply_ms: Option<i64>,
    /// Its first request's time to first token.
    pub first_token_ms: Option<u64>,
    /// When it ended.
    pub ended_at_ms: Option<i64>,
}

pub(crate) fn timeline(agents: &[Agent], records: &[RequestRecord]) -> Vec<TimelineRow> {
    let mut first: HashMap<AgentId, &RequestRecord> = HashMap::new();
    for r in records {
        let e = first.entry(r.agent_id).or_insert(r);
        if (r.turn, r.created_at_ms) < (e.turn, e.created_at_ms) {
            *e = r;
        }
    }
    let mut rows: Vec<TimelineRow> = agents
        .iter()
        .filter(|a| a.kind == AgentKind::Fork)
        .map(|a| {
            let f = first.get(&a.id);
            TimelineRow {
                agent_id: a.id.to_string(),
                index: a.index,
                created_at_ms: a.created_at_ms,
                first_sent_ms: f.and_then(|r| r.sent_at_ms),
                first_reply_ms: f.map(|r| r.created_at_ms),
                first_token_ms: f.and_then(|r| r.first_token_ms),
                ended_at_ms: a.state.is_terminal().then_some(a.updated_at_ms),
            }
        })
        .collect();
    rows.sort_by_key(|r| r.index);
    rows
}

/// The batch's figures: its cache statistics, the calculator for its shape, the calculator's
/// curve over N, and the timeline.
pub(crate) async fn batch_figures(
    engine: &Engine,
    tenant: &Tenant,
    id: BatchId,
    agents: &[Agent],
) -> Result<Value, WebError> {
    let scoped = engine.for_tenant(tenant.clone());
    let batch = scoped.batch(id).await?;
    let model = scoped.session(batch.session_id).await?.session.params.model;
    let stats = scoped.cache_stats(StatsScope::Batch(id)).await?;
    let records = scoped
        .list_requests(RequestFilter {
            batch_id: Some(id),
            ..RequestFilter::default()
        })
        .await?;
    let rows = timeline(agents, &records);
    let children = rows.len().max(1) as u64;
    // The calculator for this batch's shape: its shared prefix and its children's mean
    // directive (first request's input beyond the prefix).
    let firsts: Vec<u64> = {
        let mut first: HashMap<AgentId, (u32, i64, u64)> = HashMap::new();
        for r in &records {
            let e =
                first
                    .entry(r.agent_id)
                    .or_insert((r.turn, r.created_at_ms, r.usage.total_input()));
            if (r.turn, r.created_at_ms) < (e.0, e.1) {
                *e = (r.turn, r.created_at_ms, r.usage.total_input());
            }
        }
        first.values().map(|e| e.2).collect()
    };
    let prefix = stats.shared_prefix_tokens;
    let directive = if firsts.is_empty() {
        0
    } else {
        firsts.iter().map(|t| t.saturating_sub(prefix)).sum::<u64>() / firsts.len() as u64
    };
    let estimate = engine
        .estimate_fork_cost(
            Some(&model),
            prefix,
            directive,
            children,
            CacheTtl::default(),
        )
        .ok();
    let mut curve = Vec::new();
    let top = children.max(8);
    for n in curve_points(top) {
        if let Ok(e) =
            engine.estimate_fork_cost(Some(&model), prefix, directive, n, CacheTtl::default())
        {
            curve.push(
                json!({ "n": n, "fork": e.fork_cost_usd, "independent": e.independent_cost_usd }),
            );
        }
    }
    Ok(json!({
        "model": model,
        "stats": {
            "children": stats.children,
            "shared_prefix_tokens": stats.shared_prefix_tokens,
            "usage": stats.usage,
            "read_share": views::read_share(&stats.usage),
            "requests": stats.requests,
            "cost_usd": stats.cost_usd,
            "input_cost_usd": stats.input_cost_usd,
            "independent_cost_usd": stats.independent_cost_usd,
            "saving": stats.saving,
        },
        "calc": {
            "prefix_tokens": prefix,
            "directive_tokens": directive,
            "children": children,
            "estimate": estimate,
            "curve": curve,
        },
        "timeline": rows,
    }))
}

/// Up to 25 values of N from 1 to `top`, both included.
fn curve_points(top: u64) -> Vec<u64> {
    let steps = top.clamp(1, 24);
    let mut points = vec![1];
    points.extend((1..=steps).map(|i| (i * top).div_ceil(steps)));
    points.dedup();
    points
}

pub(crate) async fn batch_agents(
    engine: &Engine,
    tenant: &Tenant,
    id: BatchId,
) -> Result<Vec<Agent>, WebError> {
    Ok(engine
        .for_tenant(tenant.clone())
        .list_agents(AgentFilter {
            batch_id: Some(id),
            include_ended: true,
            ..AgentFilter::default()
        })
        .await?)
}

pub(crate) fn agent_rows(agents: &[Agent]) -> Vec<AgentRow> {
    agents.iter().map(AgentRow::from).collect()
}

pub(crate) fn json_of<T: Serialize>(value: &T) -> Value {
    to_json(value)
}

#[cfg(test)]
mod tests {
    use forkd_core::{AgentState, ReportTo, RequestId, SessionId};

    use super::*;

    fn child(session: SessionId, batch: BatchId, index: u32, state: AgentState) -> Agent {
        Agent {
            id: AgentId::new(),
            session_id: session,
            batch_id: Some(batch),
            kind: AgentKind::Fork,
            index,
            state,
            directive: None,
            query_source: None,
            report_to: ReportTo::default(),
            usage: forkd_core::Usage::default(),
            cost_usd: 0.5,
            error: None,
            created_at_ms: 1_000,
            updated_at_ms: 9_000,
            held_by: None,
            throttled_since_ms: None,
            limits: None,
            started_at_ms: None,
            throttled_ms: 0,
        }
    }

    fn record(agent: &Agent, turn: u32, at: i64, first_token_ms: Option<u64>) -> RequestRecord {
        RequestRecord {
            id: RequestId::new(),
            agent_id: agent.id,
            session_id: agent.session_id,
            batch_id: agent.batch_id,
            turn,
            model: "m".into(),
            usage: forkd_core::Usage::default(),
            cost_usd: 0.0,
            prefix_fingerprint: String::new(),
            prefix_parts: Vec::new(),
            message_count: None,
            body_bytes: 0,
            first_token_ms,
            stop_reason: None,
            // Sent a second before its response ended.
            sent_at_ms: Some(at - 1_000),
            created_at_ms: at,
        }
    }

    #[test]
    fn the_timeline_takes_each_childs_first_request_and_ends_only_ended_children() {
        let (session, batch) = (SessionId::new(), BatchId::new());
        let done = child(session, batch, 1, AgentState::Completed);
        let running = child(session, batch, 0, AgentState::Running);
        let records = [
            record(&done, 1, 5_000, Some(10)),
            record(&done, 0, 3_000, Some(400)),
            record(&running, 0, 2_000, Some(900)),
        ];
        let rows = timeline(&[done.clone(), running.clone()], &records);
        assert_eq!(rows.iter().map(|r| r.index).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(rows[0].agent_id, running.id.to_string());
        assert_eq!(
            (
                rows[0].first_sent_ms,
                rows[0].first_reply_ms,
                rows[0].first_token_ms
            ),
            (Some(1_000), Some(2_000), Some(900))
        );
        assert_eq!(rows[0].ended_at_ms, None);
        assert_eq!(
            (rows[1].first_reply_ms, rows[1].first_token_ms),
            (Some(3_000), Some(400))
        );
        assert_eq!(rows[1].ended_at_ms, Some(9_000));
    }

    #[test]
    fn batches_are_summed_by_state() {
        let (session, batch) = (SessionId::new(), BatchId::new());
        let agents = [
            child(session, batch, 0, AgentState::Completed),
            child(session, batch, 1, AgentState::Completed),
            child(session, batch, 2, AgentState::Killed),
        ];
        let summaries = batch_summaries(&agents);
        assert_eq!(summaries.len(), 1);
        assert_eq!(summaries[0].children, 3);
        assert_eq!(summaries[0].states.get("completed"), Some(&2));
        assert_eq!(summaries[0].states.get("killed"), Some(&1));
        assert!((summaries[0].cost_usd - 1.5).abs() < 1e-9);
    }

    #[test]
    fn timed_out_children_are_counted_apart_from_failed_and_killed_ones() {
        let (session, batch) = (SessionId::new(), BatchId::new());
        let agents = [
            child(session, batch, 0, AgentState::Completed),
            child(session, batch, 1, AgentState::TimedOut),
            child(session, batch, 2, AgentState::TimedOut),
            child(session, batch, 3, AgentState::Failed),
            child(session, batch, 4, AgentState::Killed),
        ];
        let summaries = batch_summaries(&agents);
        assert_eq!(summaries[0].children, 5);
        assert_eq!(summaries[0].states.get("timed_out"), Some(&2));
        assert_eq!(summaries[0].states.get("failed"), Some(&1));
        assert_eq!(summaries[0].states.get("killed"), Some(&1));
        assert_eq!(summaries[0].states.get("completed"), Some(&1));
        // A timed-out child has ended: its timeline row ends, and it no longer runs.
        let rows = timeline(&agents, &[]);
        assert_eq!(rows[1].ended_at_ms, Some(9_000));
    }

    #[test]
    fn the_curve_runs_from_one_to_n_in_at_most_25_points() {
        assert_eq!(curve_points(8), (1..=8).collect::<Vec<_>>());
        assert_eq!(curve_points(1), [1]);
        let big = curve_points(1000);
        assert!(big.len() <= 25);
        assert_eq!(big.first(), Some(&1));
        assert_eq!(big.last(), Some(&1000));
        assert!(big.windows(2).all(|w| w[0] < w[1]));
    }
}
