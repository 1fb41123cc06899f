//! The tree and its figures, built from known pages and notifications.

use forkd_proto::v1::{Agent, AgentState, Notification, NotificationStatus, Session, Usage};
use prost_types::Timestamp;
use serde_json::json;

use super::*;

fn at(seconds: i64) -> Option<Timestamp> {
    Some(Timestamp { seconds, nanos: 0 })
}

fn usage(input: u64, write: u64, read: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input,
        cache_creation_input_tokens: write,
        cache_read_input_tokens: read,
        output_tokens: output,
    }
}

pub(crate) fn agent(id: &str, session: &str, batch: &str, kind: &str, state: AgentState) -> Agent {
    let mut agent = Agent {
        agent_id: id.into(),
        session_id: session.into(),
        batch_id: batch.into(),
        kind: kind.into(),
        description: format!("{id} work"),
        ..Agent::default()
    };
    agent.set_state(state);
    agent
}

pub(crate) fn session(id: &str, created: i64) -> Session {
    Session {
        session_id: id.into(),
        model: "claude-sonnet-4-5".into(),
        created_at: at(created),
        ..Session::default()
    }
}

/// Session S1 (a main loop, a typed agent, batch B1 of three children), session S2 with nothing.
pub(crate) fn sample() -> Model {
    let mut model = Model::default();
    model.add_session(session("S2", 20));
    model.add_session(session("S1", 10));
    let mut parent = agent("P1", "S1", "", "parent", AgentState::Pending);
    parent.created_at = at(11);
    parent.usage = Some(usage(100, 2000, 0, 50));
    parent.cost_usd = 0.01;
    let mut typed = agent("T1", "S1", "", "typed", AgentState::Completed);
    typed.created_at = at(30);
    typed.usage = Some(usage(500, 0, 0, 20));
    typed.cost_usd = 0.002;
    model.upsert_agent(typed);
    model.upsert_agent(parent);
    for (i, (id, state)) in [
        ("C3", AgentState::Pending),
        ("C1", AgentState::Completed),
        ("C2", AgentState::Running),
    ]
    .into_iter()
    .enumerate()
    {
        let mut child = agent(id, "S1", "B1", "fork", state);
        child.index = id[1..].parse().unwrap_or_default();
        child.created_at = at(12 + i as i64);
        child.usage = Some(usage(10, 0, 90, 5));
        child.cost_usd = 0.001;
        model.upsert_agent(child);
    }
    model
}

fn outline(rows: &[Row]) -> Vec<String> {
    rows.iter()
        .map(|r| {
            let id = r
                .agent_id
                .as_deref()
                .or(r.batch_id.as_deref())
                .unwrap_or(&r.session_id);
            format!("{}{} {} {}", "  ".repeat(r.depth), r.kind, id, r.state)
        })
        .collect()
}

#[test]
fn the_tree_groups_sessions_batches_and_children_in_order() {
    let rows = sample().rows();
    assert_eq!(
        outline(&rows),
        [
            "session S1 running",
            "  parent P1 pending",
            "  batch B1 running",
            "    fork C1 completed",
            "    fork C2 running",
            "    fork C3 pending",
            "  typed T1 completed",
            "session S2 idle",
        ]
    );
}

#[test]
fn groups_sum_their_agents() {
    let rows = sample().rows();
    let batch = &rows[2];
    assert_eq!(
        batch.totals.counts,
        Counts {
            running: 1,
            pending: 1,
            idle: 0,
            ended: 1
        }
    );
    assert_eq!(batch.totals.usage, usage(30, 0, 270, 15));
    assert!((batch.totals.cost_usd - 0.003).abs() < 1e-12);
    assert!((batch.cache_read_share() - 0.9).abs() < 1e-12);
    let session = &rows[0];
    assert_eq!(session.totals.counts.total(), 5);
    assert_eq!(session.totals.usage, usage(630, 2000, 270, 85));
    assert!((session.totals.cost_usd - 0.015).abs() < 1e-12);
    assert_eq!(session.label, "claude-sonnet-4-5");
    let totals = sample().totals();
    assert_eq!(totals.usage, session.totals.usage);
    assert_eq!(totals.counts.ended, 2);
}

#[test]
fn the_read_share_is_the_daemons() {
    assert_eq!(cache_read_share(&Usage::default()), 0.0);
    assert!((cache_read_share(&usage(10, 30, 60, 999)) - 0.6).abs() < 1e-12);
}

fn ended(seq: u64, agent: &str, batch: &str, status: NotificationStatus) -> Notification {
    Notification {
        seq,
        session_id: "S1".into(),
        batch_id: batch.into(),
        agent_id: agent.into(),
        status: status as i32,
        usage: Some(usage(10, 0, 190, 7)),
        cost_usd: 0.005,
        ..Notification::default()
    }
}

#[test]
fn a_notification_ends_its_agent_with_its_final_figures() {
    let mut model = sample();
    assert!(model.apply_notification(&ended(1, "C2", "B1", NotificationStatus::Failed)));
    let rows = model.rows();
    let c2 = rows
        .iter()
        .find(|r| r.agent_id.as_deref() == Some("C2"))
        .map(|r| (r.state.as_str(), r.totals.usage, r.totals.cost_usd));
    assert_eq!(c2, Some(("failed", usage(10, 0, 190, 7), 0.005)));
    assert_eq!(rows[2].state, "pending", "C3 still waits");
}

#[test]
fn a_notification_of_an_unknown_agent_adds_it_and_asks_for_more() {
    let mut model = sample();
    assert!(!model.apply_notification(&ended(2, "C9", "B2", NotificationStatus::Completed)));
    assert!(!model.apply_notification(&ended(3, "T9", "", NotificationStatus::Killed)));
    let rows = model.rows();
    let kinds: Vec<(&str, &str)> = rows
        .iter()
        .filter_map(|r| Some((r.agent_id.as_deref()?, r.kind.as_str())))
        .collect();
    assert!(kinds.contains(&("C9", "fork")), "{kinds:?}");
    assert!(kinds.contains(&("T9", "typed")), "{kinds:?}");
    assert!(rows.iter().any(|r| r.batch_id.as_deref() == Some("B2")));
}

#[test]
fn a_poll_updates_live_counts_and_names_the_agents_that_ended() {
    let mut model = sample();
    let mut c2 = agent("C2", "S1", "B1", "fork", AgentState::Running);
    c2.usage = Some(usage(10, 0, 900, 50));
    let parent = agent("P1", "S1", "", "parent", AgentState::Running);
    // C3 is no longer listed: it ended between two polls.
    let vanished = model.apply_poll(vec![c2, parent]);
    assert_eq!(vanished, ["C3"]);
    let rows = model.rows();
    let c2 = rows.iter().find(|r| r.agent_id.as_deref() == Some("C2"));
    assert_eq!(
        c2.map(|r| r.totals.usage.cache_read_input_tokens),
        Some(900)
    );
    assert_eq!(rows[1].state, "running");
}

#[test]
fn an_ended_agent_is_never_brought_back_by_a_late_page() {
    let mut model = sample();
    model.apply_notification(&ended(1, "C2", "B1", NotificationStatus::Completed));
    let stale = agent("C2", "S1", "B1", "fork", AgentState::Running);
    assert_eq!(model.apply_poll(vec![stale]), ["C3", "P1"]);
    let rows = model.rows();
    let c2 = rows.iter().find(|r| r.agent_id.as_deref() == Some("C2"));
    assert_eq!(c2.map(|r| r.state.as_str()), Some("completed"));
    // A whole agent that has ended replaces it (GetAgent after the notification).
    let mut whole = agent("C2", "S1", "B1", "fork", AgentState::Completed);
    whole.description = "the real description".into();
    model.upsert_agent(whole);
    let rows = model.rows();
    let c2 = rows.iter().find(|r| r.agent_id.as_deref() == Some("C2"));
    assert_eq!(c2.map(|r| r.label.as_str()), Some("the real description"));
}

#[test]
fn sessions_known_only_from_their_agents_are_named_for_a_lookup() {
    let mut model = sample();
    model.upsert_agent(agent("X1", "S3", "", "typed", AgentState::Running));
    assert_eq!(model.unknown_sessions(), ["S3"]);
    let rows = model.rows();
    // Without a creation time it sorts first, and has no model yet.
    assert_eq!(rows[0].session_id, "S3");
    assert_eq!(rows[0].label, "");
    model.add_session(session("S3", 30));
    assert!(model.unknown_sessions().is_empty());
}

#[test]
fn rows_print_as_the_json_lines_of_the_snapshot() {
    let rows = sample().rows();
    assert_eq!(
        rows[0].to_json(),
        json!({
            "session_id": "S1",
            "batch_id": null,
            "agent_id": null,
            "kind": "session",
            "state": "running",
            "depth": 0,
            "description": null,
            "model": "claude-sonnet-4-5",
            "agents": {"running": 1, "pending": 2, "ended": 2},
            "usage": {
                "input_tokens": 630,
                "cache_creation_input_tokens": 2000,
                "cache_read_input_tokens": 270,
                "output_tokens": 85,
            },
            "cache_read_share": 270.0 / 2900.0,
            "cost_usd": rows[0].totals.cost_usd,
        })
    );
    let child = rows[3].to_json();
    assert_eq!(child["agent_id"], "C1");
    assert_eq!(child["batch_id"], "B1");
    assert_eq!(child["kind"], "fork");
    assert_eq!(child["state"], "completed");
    assert_eq!(child["description"], "C1 work");
    assert_eq!(child["agents"], serde_json::Value::Null);
    assert_eq!(child["cache_read_share"], 0.9);
    assert_eq!(rows[2].to_json()["kind"], "batch");
}
