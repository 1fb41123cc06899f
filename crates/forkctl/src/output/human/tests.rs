//! Human output, checked as the exact text a user sees.

use forkd_proto::v1::{AgentState, NotificationStatus};

use super::*;

fn usage() -> Usage {
    Usage {
        input_tokens: 210,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: 48_500,
        output_tokens: 1_234,
    }
}

#[test]
fn numbers_read_at_a_glance() {
    let cases = [
        (0, "0"),
        (999, "999"),
        (1_000, "1,000"),
        (48_500, "48,500"),
        (1_234_567, "1,234,567"),
    ];
    for (n, text) in cases {
        assert_eq!(tokens(n), text);
    }
    assert_eq!(usd(0.012_34), "$0.0123");
    assert_eq!(percent(0.995), "99.5%");
}

#[test]
fn first_line_skips_blank_lines_and_cuts_long_ones() {
    assert_eq!(
        first_line("\n  Fix the tests  \nthen more", 40),
        "Fix the tests"
    );
    assert_eq!(first_line("abcdef", 6), "abcdef");
    assert_eq!(first_line("abcdefg", 6), "abcde…");
    assert_eq!(first_line("ab de fg", 4), "ab…");
    assert_eq!(first_line("", 6), "");
}

#[test]
fn a_notification_is_one_line() {
    let n = Notification {
        seq: 12,
        agent_id: "A1".into(),
        status: NotificationStatus::Completed as i32,
        summary: "Fixed the flaky test\nDetails follow".into(),
        usage: Some(usage()),
        cost_usd: 0.0021,
        ..Default::default()
    };
    assert_eq!(
        notification_line(&n),
        "#12 A1 completed Fixed the flaky test  (in 210 · write 0 · read 48,500 · out 1,234; $0.0021)"
    );
}

#[test]
fn a_timed_out_notification_names_its_limit() {
    let n = Notification {
        seq: 13,
        agent_id: "A2".into(),
        status: NotificationStatus::TimedOut as i32,
        summary: "Read 3 of 5 files".into(),
        report: Some(forkd_proto::v1::Report {
            issues: "timed out: no final answer after 30 model requests (its max_turns)".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        notification_line(&n),
        "#13 A2 timed_out Read 3 of 5 files [timed out: no final answer after 30 model requests \
         (its max_turns)]  (in 0 · write 0 · read 0 · out 0; $0.0000)"
    );
}

#[test]
fn a_daemon_s_timed_out_line_names_the_limit_once_and_the_calls_it_cut_off() {
    let n = Notification {
        seq: 9,
        agent_id: "A9".into(),
        status: NotificationStatus::TimedOut as i32,
        summary: "Timed out: its timeout of 5s (wall time since it started) ran out, before any \
                  reply."
            .into(),
        report: Some(forkd_proto::v1::Report {
            issues: "timed out: its timeout of 5s (wall time since it started) ran out; tool \
                     calls cut off (killed): Bash (\"sleep 3600\")"
                .into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let line = notification_line(&n);
    assert_eq!(line.matches("its timeout of 5s").count(), 1, "{line}");
    assert!(line.contains(r#"[killed: Bash ("sleep 3600")]"#), "{line}");
}

#[test]
fn ps_prints_full_ids_and_right_aligned_numbers() {
    let agent = Agent {
        agent_id: "0192aaaa-bbbb-7ccc-8ddd-eeeeeeeeeeee".into(),
        kind: "fork".into(),
        state: AgentState::Running as i32,
        usage: Some(usage()),
        cost_usd: 0.012_34,
        cache_read_share: 0.995,
        description: "Fix the tests".into(),
        daemon: "0192ffff-0000-7111-8222-333344445555".into(),
        ..Default::default()
    };
    let unclaimed = Agent {
        agent_id: "0192aaaa-bbbb-7ccc-8ddd-ffffffffffff".into(),
        kind: "fork".into(),
        state: AgentState::Pending as i32,
        ..Default::default()
    };
    let expected = [
        "AGENT                                 KIND  STATE    DAEMON         IN  WRITE    READ    OUT  READ %     COST  DESCRIPTION",
        "0192aaaa-bbbb-7ccc-8ddd-eeeeeeeeeeee  fork  running  333344445555  210      0  48,500  1,234   99.5%  $0.0123  Fix the tests",
        "0192aaaa-bbbb-7ccc-8ddd-ffffffffffff  fork  pending  -               0      0       0      0    0.0%  $0.0000",
    ];
    assert_eq!(agents_table(&[agent, unclaimed]), expected.join("\n"));
}

#[test]
fn ps_says_when_a_running_agent_is_throttled() {
    let agent = |id: &str, state: AgentState, throttled: bool| Agent {
        agent_id: id.into(),
        kind: "fork".into(),
        state: state as i32,
        throttled_since: throttled.then_some(prost_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 0,
        }),
        ..Default::default()
    };
    let table = agents_table(&[
        agent("A1", AgentState::Running, true),
        agent("A2", AgentState::Running, false),
    ]);
    let states: Vec<&str> = table
        .lines()
        .skip(1)
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .find(|c| c.starts_with("running"))
                .unwrap_or("")
        })
        .collect();
    assert_eq!(states, ["running (throttled)", "running"], "{table}");
}

#[test]
fn calc_shows_both_costs_and_the_seed_figure_with_its_caveat() {
    let e = EstimateForkCostResponse {
        independent_cost_usd: 0.7335,
        fork_cost_usd: 0.2598,
        saving: 0.646,
        break_even_children: 2,
        seed_simplified_saving: 0.72,
        model: "sim".into(),
    };
    let expected = [
        "model                     sim",
        "independent agents        $0.7335",
        "fork batch                $0.2598",
        "saving                    64.6%",
        "forking pays from         2 children",
        "seed's simplified saving  72.0%  for comparison (ignores the 1.25× write premium)",
    ];
    assert_eq!(estimate_table(&e, false), expected.join("\n"));
    let never = EstimateForkCostResponse {
        break_even_children: 0,
        ..e
    };
    let text = estimate_table(&never, true);
    assert!(
        text.contains("forking pays from         never at these sizes"),
        "{text}"
    );
    assert!(text.contains("ignores the 2× write premium"), "{text}");
}

#[test]
fn stats_lists_tokens_and_costs() {
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
    let text = stats_table(&s);
    for line in [
        "children                 5",
        "shared prefix tokens     48,500",
        "cache read tokens        48,500",
        "cache-read share         75.0%",
        "as independent agents    $1.5000",
        "saving                   62.5%",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
}
