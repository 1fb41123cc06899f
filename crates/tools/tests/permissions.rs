//! Permission decisions as tables: mode × tool × input → expected decision, then rules.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::symlink;

use common::Env;
use forkd_core::session::PermissionMode;
use forkd_tools::{Decision, Policy, Rule};
use serde_json::{Value, json};

/// How an expected decision is written in the tables: `A` allow, `D:text` deny whose reason
/// contains `text`, `Q:text` ask whose question contains `text`.
fn check(decision: &Decision, expected: &str, what: &str) {
    let ok = match (decision, expected.split_once(':')) {
        (Decision::Allow, None) => expected == "A",
        (Decision::Deny(reason), Some(("D", text))) => reason.contains(text),
        (Decision::Ask(question), Some(("Q", text))) => question.contains(text),
        _ => false,
    };
    assert!(ok, "{what}: expected {expected}, got {decision:?}");
}

const MODES: [PermissionMode; 6] = PermissionMode::ALL;

const PLAN: &str = "D:plan mode is read-only";
const NEVER: &str = "D:Write would need permission; this session never asks";
const OUT: &str = "D:outside the workspace";

/// One row per call; one column per mode, in the order of `MODES`.
fn mode_table() -> Vec<(&'static str, Value, [&'static str; 6])> {
    vec![
        ("Read", json!({"file_path": "a.txt"}), ["A"; 6]),
        ("Read", json!({"file_path": "../x"}), ["A"; 6]),
        ("Glob", json!({"pattern": "*"}), ["A"; 6]),
        ("Grep", json!({"pattern": "x", "path": "src"}), ["A"; 6]),
        (
            "Agent",
            json!({"description": "d", "prompt": "p"}),
            ["A"; 6],
        ),
        (
            "Write",
            json!({"file_path": "src/new.rs", "content": ""}),
            [
                "Q:Allow Write to src/new.rs?",
                "A",
                PLAN,
                "A",
                NEVER,
                "Q:Allow Write to src/new.rs?",
            ],
        ),
        (
            "Edit",
            json!({"file_path": "a.txt", "old_string": "a", "new_string": "b"}),
            [
                "Q:Allow Edit of a.txt?",
                "A",
                PLAN,
                "A",
                "D:Edit would need permission",
                "Q:Edit",
            ],
        ),
        (
            "Bash",
            json!({"command": "cargo  build"}),
            [
                "Q:Allow Bash to run `cargo build`?",
                "Q:cargo build",
                PLAN,
                "A",
                "D:Bash would need permission; this session never asks",
                "Q:cargo build",
            ],
        ),
        (
            "Write",
            json!({"file_path": "../escape.txt", "content": ""}),
            [OUT, OUT, PLAN, "A", OUT, OUT],
        ),
        (
            "mcp__db__query",
            json!({}),
            [
                "Q:Allow mcp__db__query?",
                "Q:mcp",
                PLAN,
                "A",
                "D:mcp",
                "Q:mcp",
            ],
        ),
    ]
}

#[test]
fn modes_decide_when_no_rule_matches() {
    let env = Env::new();
    for (tool, input, expected) in mode_table() {
        for (mode, expected) in MODES.iter().zip(expected) {
            let decision = Policy::new(*mode).decide(tool, &input, &env.ctx.workspace);
            check(
                &decision,
                expected,
                &format!("{} {tool} {input}", mode.as_str()),
            );
        }
    }
}

fn policy(mode: PermissionMode, allow: &[&str], deny: &[&str]) -> Policy {
    let rules = |texts: &[&str]| texts.iter().map(|t| Rule::parse(t).unwrap()).collect();
    Policy {
        mode,
        allow: rules(allow),
        deny: rules(deny),
        read_only: vec!["mcp__docs__search".into()],
    }
}

#[test]
fn mcp_tools_ask_unless_the_operator_marked_them_read_only_and_rules_name_servers() {
    let dir = tempfile::tempdir().unwrap();
    let ws = forkd_tools::Workspace::new(dir.path()).unwrap();
    let input = serde_json::json!({});
    let p = policy(PermissionMode::Default, &[], &[]);
    assert!(matches!(
        p.decide("mcp__github__create_issue", &input, &ws),
        Decision::Ask(_)
    ));
    assert_eq!(p.decide("mcp__docs__search", &input, &ws), Decision::Allow);
    let plan = policy(PermissionMode::Plan, &[], &[]);
    assert_eq!(
        plan.decide("mcp__docs__search", &input, &ws),
        Decision::Allow
    );
    assert!(matches!(
        plan.decide("mcp__github__create_issue", &input, &ws),
        Decision::Deny(_)
    ));
    let p = policy(PermissionMode::Default, &["mcp__github__*"], &["mcp__docs"]);
    assert_eq!(
        p.decide("mcp__github__create_issue", &input, &ws),
        Decision::Allow
    );
    assert!(matches!(
        p.decide("mcp__docs__search", &input, &ws),
        Decision::Deny(_)
    ));
}

#[test]
fn rules_come_before_the_mode_and_deny_wins() {
    use PermissionMode::{BypassPermissions, Default, DontAsk, Plan};
    let env = Env::new();
    let cases: Vec<(Policy, &str, Value, &str)> = vec![
        // Deny beats allow, and beats bypassPermissions.
        (
            policy(Default, &["Bash"], &["Bash(rm:*)"]),
            "Bash",
            json!({"command": "rm -rf x"}),
            "D:denied by the permission rule `Bash(rm:*)`",
        ),
        (
            policy(Default, &["Bash"], &["Bash(rm:*)"]),
            "Bash",
            json!({"command": "ls; rm -rf x"}),
            "D:Bash(rm:*)",
        ),
        (
            policy(Default, &["Bash"], &["Bash(rm:*)"]),
            "Bash",
            json!({"command": "ls"}),
            "A",
        ),
        (
            policy(BypassPermissions, &[], &["Read(secrets/**)"]),
            "Read",
            json!({"file_path": "secrets/key"}),
            "D:Read(secrets/**)",
        ),
        (
            policy(BypassPermissions, &[], &["Read(secrets/**)"]),
            "Read",
            json!({"file_path": "src/key"}),
            "A",
        ),
        // Allow rules: prefix, exact, and compound commands that a prefix must not approve.
        (
            policy(Default, &["Bash(cargo test:*)"], &[]),
            "Bash",
            json!({"command": "cargo test -p x"}),
            "A",
        ),
        (
            policy(Default, &["Bash(cargo test:*)"], &[]),
            "Bash",
            json!({"command": "cargo test && rm x"}),
            "Q:cargo test && rm x",
        ),
        (
            policy(Default, &["Bash(cargo test:*)"], &[]),
            "Bash",
            json!({"command": "cargo build"}),
            "Q:cargo build",
        ),
        (
            policy(Default, &["Write(src/**)"], &[]),
            "Write",
            json!({"file_path": "src/a/b.rs", "content": ""}),
            "A",
        ),
        (
            policy(Default, &["Write(src/**)"], &[]),
            "Write",
            json!({"file_path": "docs/a.md", "content": ""}),
            "Q:Allow Write to docs/a.md?",
        ),
        (
            policy(Default, &["Edit(*.md)"], &[]),
            "Edit",
            json!({"file_path": "docs/a.md"}),
            "A",
        ),
        (
            policy(Default, &["Edit(*.md)"], &[]),
            "Write",
            json!({"file_path": "docs/a.md"}),
            "Q:Write",
        ),
        (
            policy(DontAsk, &["Bash(ls)"], &[]),
            "Bash",
            json!({"command": "ls"}),
            "A",
        ),
        (
            policy(DontAsk, &["Bash(ls)"], &[]),
            "Bash",
            json!({"command": "ls -la"}),
            "D:never asks",
        ),
        // Plan mode stays read-only whatever the allow rules say; deny rules still apply.
        (
            policy(Plan, &["Write(src/**)", "Bash"], &[]),
            "Write",
            json!({"file_path": "src/a.rs"}),
            "D:plan mode is read-only",
        ),
        (
            policy(Plan, &["Bash"], &[]),
            "Bash",
            json!({"command": "ls"}),
            "D:plan mode",
        ),
        (
            policy(Plan, &[], &["Grep"]),
            "Grep",
            json!({"pattern": "x"}),
            "D:Grep",
        ),
        // A missing field gives the rules nothing to match; the tool will report the field.
        (
            policy(Default, &["Bash(ls)"], &[]),
            "Bash",
            json!({}),
            "Q:Allow Bash?",
        ),
    ];
    for (policy, tool, input, expected) in cases {
        let decision = policy.decide(tool, &input, &env.ctx.workspace);
        check(&decision, expected, &format!("{policy:?} {tool} {input}"));
    }
}

#[test]
fn path_rules_match_where_a_symlink_really_leads() {
    let env = Env::new();
    std::fs::create_dir(env.root().join("secrets")).unwrap();
    symlink(env.root().join("secrets"), env.root().join("innocent")).unwrap();
    let policy = policy(
        PermissionMode::BypassPermissions,
        &[],
        &["Write(secrets/**)"],
    );
    let input = json!({"file_path": "innocent/key", "content": "x"});
    let decision = policy.decide("Write", &input, &env.ctx.workspace);
    check(&decision, "D:Write(secrets/**)", "write through an alias");
}
