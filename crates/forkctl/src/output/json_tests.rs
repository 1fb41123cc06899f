//! The `--json` shapes of docs/contracts.md, “JSON shapes”, checked whole: CI parses them.

use forkd_proto::v1::{
    Agent, AgentState, EstimateForkCostResponse, ForkBatchResponse, GetCacheStatsResponse,
    Notification, NotificationStatus, Report, Session, TranscriptMessage, Usage,
};
use serde_json::json;

use super::*;

fn usage() -> Usage {
    Usage {
        input_tokens: 210,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: 48_500,
        output_tokens: 320,
    }
}

fn usage_value() -> Value {
    json!({
        "input_tokens": 210,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 48_500,
        "output_tokens": 320,
    })
}

#[test]
fn notification() {
    let n = Notification {
        seq: 7,
        session_id: "S".into(),
        batch_id: "B".into(),
        agent_id: "A".into(),
        kind: "fork".into(),
        status: NotificationStatus::Failed as i32,
        summary: "could not build".into(),
        report: Some(Report {
            scope: "crate x".into(),
            result: "broken".into(),
            key_files: vec!["src/lib.rs".into()],
            files_changed: vec![],
            issues: "linker".into(),
            structured_json: String::new(),
        }),
        usage: Some(usage()),
        cost_usd: 0.25,
        created_at: None,
        schedule: String::new(),
    };
    assert_eq!(
        notification_json(&n),
        json!({
            "seq": 7,
            "session_id": "S",
            "batch_id": "B",
            "agent_id": "A",
            "kind": "fork",
            "status": "failed",
            "summary": "could not build",
            "report": {
                "scope": "crate x",
                "result": "broken",
                "key_files": ["src/lib.rs"],
                "files_changed": [],
                "issues": "linker",
            },
            "usage": usage_value(),
            "cost_usd": 0.25,
            "schedule": null,
        })
    );
    let scheduled = Notification {
        schedule: "nightly".into(),
        ..n.clone()
    };
    assert_eq!(notification_json(&scheduled)["schedule"], "nightly");

    // Under an output schema the report carries its object, as JSON, not text.
    let shaped = Notification {
        report: Some(Report {
            result: r#"{"verdict":"fail"}"#.into(),
            structured_json: r#"{"verdict":"fail"}"#.into(),
            ..Default::default()
        }),
        ..n
    };
    assert_eq!(
        notification_json(&shaped)["report"]["structured"],
        json!({"verdict": "fail"})
    );
}

#[test]
fn a_notification_without_report_or_usage_keeps_its_shape() {
    let n = Notification {
        status: NotificationStatus::Completed as i32,
        ..Default::default()
    };
    let v = notification_json(&n);
    assert_eq!(v["status"], "completed");
    assert_eq!(v["batch_id"], Value::Null);
    assert_eq!(
        v["report"],
        json!({"scope": "", "result": "", "key_files": [], "files_changed": [], "issues": ""})
    );
    assert_eq!(v["usage"]["cache_read_input_tokens"], 0);
}

#[test]
fn agent() {
    let a = Agent {
        agent_id: "A".into(),
        session_id: "S".into(),
        batch_id: "B".into(),
        kind: "fork".into(),
        state: AgentState::Running as i32,
        description: "fix the tests".into(),
        prompt: "fix the tests in crate x".into(),
        usage: Some(usage()),
        cost_usd: 0.5,
        cache_read_share: 0.75,
        daemon: "D".into(),
        ..Default::default()
    };
    assert_eq!(
        agent_json(&a),
        json!({
            "agent_id": "A",
            "session_id": "S",
            "batch_id": "B",
            "kind": "fork",
            "state": "running",
            "usage": usage_value(),
            "cost_usd": 0.5,
            "cache_read_share": 0.75,
            "description": "fix the tests",
            "error": null,
            "daemon": "D",
            "changes": null,
            "limits": null,
            "started_at": null,
        })
    );
    let isolated = Agent {
        changes: "1 file (+1 -1), kept".into(),
        ..a.clone()
    };
    assert_eq!(agent_json(&isolated)["changes"], "1 file (+1 -1), kept");
    let parent = Agent {
        kind: "parent".into(),
        error: "boom".into(),
        ..a
    };
    assert_eq!(agent_json(&parent)["error"], "boom");
}

#[test]
fn a_timed_out_agent_and_its_notification_spell_timed_out() {
    let limit = "timed out: its timeout of 2s (wall time since it started) ran out";
    let agent = Agent {
        agent_id: "A".into(),
        state: AgentState::TimedOut as i32,
        error: limit.into(),
        limits: Some(forkd_proto::v1::Limits {
            timeout_ms: 2_000,
            max_turns: 30,
            timeout_excludes_throttle: Some(true),
            ..Default::default()
        }),
        started_at: Some(prost_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 0,
        }),
        ..Default::default()
    };
    let v = agent_json(&agent);
    assert_eq!(v["state"], "timed_out");
    assert_eq!(v["error"], limit);
    assert_eq!(
        v["limits"],
        json!({
            "timeout_ms": 2000,
            "idle_timeout_ms": null,
            "max_turns": 30,
            "max_output_tokens": null,
            "timeout_excludes_throttle": true,
        })
    );
    assert_eq!(v["started_at"], "2023-11-14T22:13:20Z");
    assert_eq!(state_name(AgentState::TimedOut), "timed_out");

    let n = Notification {
        agent_id: "A".into(),
        status: NotificationStatus::TimedOut as i32,
        summary: "partial: read 3 of 5 files".into(),
        report: Some(Report {
            issues: limit.into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let v = notification_json(&n);
    assert_eq!(v["status"], "timed_out");
    assert_eq!(v["report"]["issues"], limit);
    assert!(
        human::notification_line(&n).contains(" timed_out "),
        "{}",
        human::notification_line(&n)
    );
}

#[test]
fn fork_reply() {
    let r = ForkBatchResponse {
        batch_id: "B".into(),
        agent_ids: vec!["A1".into(), "A2".into()],
        ..Default::default()
    };
    assert_eq!(
        fork_json(&r),
        json!({"batch_id": "B", "agent_ids": ["A1", "A2"]})
    );
}

#[test]
fn stats() {
    let s = GetCacheStatsResponse {
        children: 5,
        shared_prefix_tokens: 48_500,
        usage: Some(usage()),
        cost_usd: 0.5,
        independent_cost_usd: 1.5,
        saving: 0.625,
        requests: 6,
        cache_read_share: 0.75,
        input_cost_usd: 0.25,
    };
    assert_eq!(
        stats_json(&s),
        json!({
            "children": 5,
            "shared_prefix_tokens": 48_500,
            "input_tokens": 210,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 48_500,
            "output_tokens": 320,
            "cost_usd": 0.5,
            "independent_cost_usd": 1.5,
            "saving": 0.625,
            "cache_read_share": 0.75,
            "requests": 6,
        })
    );
}

#[test]
fn estimate() {
    let e = EstimateForkCostResponse {
        independent_cost_usd: 0.75,
        fork_cost_usd: 0.25,
        saving: 0.5,
        break_even_children: 2,
        seed_simplified_saving: 0.625,
        model: "sim".into(),
    };
    assert_eq!(
        estimate_json(&e),
        json!({
            "independent_cost_usd": 0.75,
            "fork_cost_usd": 0.25,
            "saving": 0.5,
            "break_even_children": 2,
            "seed_simplified_saving": 0.625,
            "model": "sim",
        })
    );
    let never = EstimateForkCostResponse {
        break_even_children: 0,
        ..e
    };
    assert_eq!(estimate_json(&never)["break_even_children"], Value::Null);
}

#[test]
fn session() {
    let s = Session {
        session_id: "S".into(),
        model: "sim".into(),
        workspace: "/w".into(),
        permission_mode: "default".into(),
        sandbox: "workspace-write".into(),
        unix_sockets: true,
        sandbox_layers: "landlock (ABI 7)".into(),
        mcp_servers: vec!["calc".into()],
        hook_events: vec!["PreToolUse".into()],
        tool_names: vec!["Agent".into(), "Read".into()],
        system_prompt_bytes: 1234,
        message_count: 2,
        created_at: Some(prost_types::Timestamp {
            seconds: 0,
            nanos: 0,
        }),
        ..Default::default()
    };
    assert_eq!(
        session_json(&s),
        json!({
            "session_id": "S",
            "model": "sim",
            "workspace": "/w",
            "coordinator": false,
            "interactive": false,
            "permission_mode": "default",
            "sandbox": "workspace-write",
            "allow_network": false,
            "unix_sockets": true,
            "sandbox_layers": "landlock (ABI 7)",
            "mcp_servers": ["calc"],
            "hook_events": ["PreToolUse"],
            "thinking_budget_tokens": 0,
            "tool_names": ["Agent", "Read"],
            "system_prompt_bytes": 1234,
            "message_count": 2,
            "created_at": "1970-01-01T00:00:00Z",
            "turn_seqs": [],
            "finished_turns": 0,
            "branch": null,
            "branches": [],
            "upload": null,
        })
    );
}

#[test]
fn transcript_message_content_is_parsed_in_order() {
    let m = TranscriptMessage {
        role: "assistant".into(),
        content_json: r#"[{"type":"text","text":"hi"}]"#.into(),
        shared: true,
        compaction: false,
        note: false,
        seq: Some(4),
        turn: 2,
    };
    let v = message_json(&m);
    assert_eq!(
        v,
        json!({"role": "assistant", "content": [{"type": "text", "text": "hi"}], "shared": true, "compaction": false, "note": false, "seq": 4, "turn": 2})
    );
    // Key order is kept (serde_json's `preserve_order`), so output mirrors what the model saw.
    assert_eq!(
        v.to_string(),
        r#"{"role":"assistant","content":[{"type":"text","text":"hi"}],"shared":true,"compaction":false,"note":false,"seq":4,"turn":2}"#
    );
    let bad = TranscriptMessage {
        content_json: "{oops".into(),
        ..m
    };
    assert_eq!(message_json(&bad)["content"], "{oops");
}

/// The wire's states and statuses are core's, one for one: every core value has a wire value
/// that names it back, and only `unspecified` names none.
#[test]
fn wire_states_and_statuses_name_cores() {
    for state in forkd_core::AgentState::ALL {
        assert_eq!(core_state(wire_state(state)), Some(state), "{state:?}");
        assert_eq!(state_name(wire_state(state)), state.as_str());
    }
    assert_eq!(core_state(AgentState::Unspecified), None);
    assert_eq!(state_name(AgentState::Unspecified), "unspecified");
    let wire_states = (0..).map_while(|n| AgentState::try_from(n).ok()).count();
    assert_eq!(wire_states, forkd_core::AgentState::ALL.len() + 1);
    for status in forkd_core::NotificationStatus::ALL {
        let name = format!(
            "NOTIFICATION_STATUS_{}",
            status.as_str().to_ascii_uppercase()
        );
        let wire = NotificationStatus::from_str_name(&name);
        assert_eq!(wire.and_then(core_status), Some(status), "{name}");
        assert_eq!(wire.map(status_name), Some(status.as_str()));
    }
    assert_eq!(status_name(NotificationStatus::Unspecified), "unspecified");
}
