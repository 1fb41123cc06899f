//! The hooks' format and semantics, checked against Claude Code's documented behaviour.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;

use super::*;

fn run(exit: i32, stdout: &str, stderr: &str) -> HookRun {
    HookRun {
        exit: Some(exit),
        stdout: stdout.into(),
        stderr: stderr.into(),
        stdout_cut: false,
        failure: None,
        started: true,
    }
}

/// The shape of Claude Code's documentation's examples.
const SETTINGS: &str = r#"{
    "permissions": {"allow": ["Bash(ls:*)"]},
    "hooks": {
        "PreToolUse": [
            {"matcher": "Bash", "hooks": [{"type": "command", "command": "validate.py"}]},
            {"matcher": "Edit|Write", "hooks": [{"type": "command", "command": "guard.sh", "timeout": 5}]}
        ],
        "PostToolUse": [
            {"matcher": "Write|Edit|MultiEdit", "hooks": [{"type": "command", "command": "fmt.sh"}]}
        ],
        "UserPromptSubmit": [{"hooks": [{"type": "command", "command": "context.sh"}]}],
        "Stop": [{"hooks": [{"type": "command", "command": "tests-pass.sh"}]}]
    }
}"#;

#[test]
fn settings_parse_and_matchers_choose_by_tool_name() {
    let set = HookSet::parse(SETTINGS, false).unwrap();
    let names = |event, tool| {
        set.commands(event, tool)
            .iter()
            .map(|c| c.command.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(HookEvent::PreToolUse, Some("Bash")), ["validate.py"]);
    assert_eq!(names(HookEvent::PreToolUse, Some("Write")), ["guard.sh"]);
    assert!(
        names(HookEvent::PreToolUse, Some("BashOutput")).is_empty(),
        "anchored"
    );
    assert_eq!(names(HookEvent::PostToolUse, Some("Edit")), ["fmt.sh"]);
    assert_eq!(names(HookEvent::UserPromptSubmit, None), ["context.sh"]);
    assert_eq!(
        set.commands(HookEvent::PreToolUse, Some("Write"))[0].timeout,
        Duration::from_secs(5)
    );
    let mcp = HookSet::parse(
        r#"{"hooks": {"PreToolUse": [{"matcher": "mcp__github__.*", "hooks": [{"type": "command", "command": "x"}]}]}}"#,
        false,
    )
    .unwrap();
    assert_eq!(
        mcp.commands(HookEvent::PreToolUse, Some("mcp__github__search"))
            .len(),
        1
    );
    assert!(
        mcp.commands(HookEvent::PreToolUse, Some("mcp__gitlab__search"))
            .is_empty()
    );
}

#[test]
fn bad_settings_say_what_is_wrong() {
    let err = |text: &str| HookSet::parse(text, false).unwrap_err();
    assert!(err(r#"{"hooks": {"BeforeTool": []}}"#).contains("not a hook event"));
    assert!(
        err(r#"{"hooks": {"Stop": [{"hooks": [{"type": "prompt", "prompt": "x"}]}]}}"#)
            .contains("only \"command\"")
    );
    assert!(
        err(r#"{"hooks": {"PreToolUse": [{"matcher": "(", "hooks": []}]}}"#)
            .contains("regular expression")
    );
    let long = format!(
        r#"{{"hooks": {{"PreToolUse": [{{"matcher": "{}", "hooks": []}}]}}}}"#,
        "a".repeat(300)
    );
    assert!(err(&long).contains("at most 256 characters"));
    let heavy = r#"{"hooks": {"PreToolUse": [{"matcher": "\\w{0,200}\\w{0,200}", "hooks": []}]}}"#;
    assert!(err(heavy).contains("regular expression"), "{}", err(heavy));
    let many = serde_json::json!({"hooks": {"Stop": vec![serde_json::json!({"hooks": []}); 33]}});
    assert!(err(&many.to_string()).contains("at most 32 matchers"));
    let commands = vec![serde_json::json!({"type": "command", "command": "true"}); 33];
    let crowded = serde_json::json!({"hooks": {"Stop": [{"hooks": commands}]}});
    assert!(err(&crowded.to_string()).contains("at most 32 hook commands"));
    let forever = r#"{"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "x", "timeout": 1e20}]}]}}"#;
    assert!(err(forever).contains("at most 600"));
    let outside = r#"{"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "x", "sandbox": false}]}]}}"#;
    assert!(err(outside).contains("only the operator's"));
    assert!(
        !HookSet::parse(outside, true)
            .unwrap()
            .commands(HookEvent::Stop, None)[0]
            .sandboxed
    );
}

#[test]
fn exit_codes_and_json_mean_what_they_mean_in_claude_code() {
    let blocked = HookOutput::of(HookEvent::PreToolUse, &run(2, "", "no rm -rf\n"));
    assert_eq!(blocked.block.as_deref(), Some("no rm -rf"));
    assert_eq!(blocked.permission, Some(Permission::Deny));
    let failed = HookOutput::of(HookEvent::PreToolUse, &run(1, "", "oops"));
    assert_eq!(failed.permission, None);
    assert!(failed.error.unwrap().contains("exit code 1"));
    // An operator's PreToolUse hook that did not answer denies: its policy fails closed.
    let set = HookSet::parse(
        r#"{"hooks": {"PreToolUse": [{"hooks": [{"type": "command", "command": "guard"}]}]}}"#,
        true,
    )
    .unwrap();
    let guard = set.commands(HookEvent::PreToolUse, Some("Bash"))[0];
    let failed = HookOutput::of_command(guard, HookEvent::PreToolUse, &run(1, "", "oom"));
    assert_eq!(failed.permission, Some(Permission::Deny));
    assert!(
        failed
            .block
            .unwrap()
            .contains("the operator's hook #1 did not answer")
    );
    let context = HookOutput::of(HookEvent::UserPromptSubmit, &run(0, "It is Monday.\n", ""));
    assert_eq!(context.additional_context.as_deref(), Some("It is Monday."));
    let json = json!({
        "continue": true,
        "systemMessage": "checked",
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "allow",
            "permissionDecisionReason": "safe",
            "updatedInput": {"command": "ls -la"}
        }
    });
    let allowed = HookOutput::of(HookEvent::PreToolUse, &run(0, &json.to_string(), ""));
    assert_eq!(allowed.permission, Some(Permission::Allow));
    assert_eq!(allowed.updated_input, Some(json!({"command": "ls -la"})));
    assert_eq!(allowed.system_message.as_deref(), Some("checked"));
    let stop = json!({"continue": false, "stopReason": "enough"});
    let stopped = HookOutput::of(HookEvent::PostToolUse, &run(0, &stop.to_string(), ""));
    assert_eq!(stopped.stop.as_deref(), Some("enough"));
    let block = json!({"decision": "block", "reason": "format it"});
    let post = HookOutput::of(HookEvent::PostToolUse, &run(0, &block.to_string(), ""));
    assert_eq!(post.block.as_deref(), Some("format it"));
    assert_eq!(post.permission, None);
}

#[test]
fn deny_beats_ask_beats_allow_and_two_inputs_deny() {
    let (a, b) = (
        HookCommand {
            command: "a".into(),
            timeout: DEFAULT_TIMEOUT,
            sandboxed: true,
            operator: true,
            position: 1,
        },
        HookCommand {
            command: "b".into(),
            timeout: DEFAULT_TIMEOUT,
            sandboxed: true,
            operator: false,
            position: 1,
        },
    );
    let decided = |p, input: Option<Value>| HookOutput {
        permission: Some(p),
        block: (p == Permission::Deny).then(|| "no".to_owned()),
        updated_input: input,
        ..HookOutput::default()
    };
    let v = pre_tool_verdict(&[
        (&a, decided(Permission::Allow, None)),
        (&b, decided(Permission::Ask, None)),
    ]);
    assert_eq!(v.permission, Some(Permission::Ask));
    let v = pre_tool_verdict(&[
        (&a, decided(Permission::Deny, None)),
        (&b, decided(Permission::Allow, None)),
    ]);
    assert_eq!(
        (v.permission, v.reason.as_deref()),
        (Some(Permission::Deny), Some("no"))
    );
    let v = pre_tool_verdict(&[
        (
            &a,
            decided(Permission::Allow, Some(json!({"command": "ls"}))),
        ),
        (
            &b,
            decided(Permission::Allow, Some(json!({"command": "pwd"}))),
        ),
    ]);
    assert_eq!(v.permission, Some(Permission::Deny));
    let why = v.reason.unwrap();
    // Named by where they come from, never by their commands (which may hold secrets).
    assert!(
        why.contains("the operator's hook #1") && why.contains("the session's hook #1"),
        "{why}"
    );
    assert!(!why.contains("\"a\""), "{why}");
    let same = pre_tool_verdict(&[
        (
            &a,
            decided(Permission::Allow, Some(json!({"command": "ls"}))),
        ),
        (
            &b,
            decided(Permission::Allow, Some(json!({"command": "ls"}))),
        ),
    ]);
    assert_eq!(same.updated_input, Some(json!({"command": "ls"})));
    assert_eq!(pre_tool_verdict(&[]).permission, None);
}

#[test]
fn a_json_answer_past_the_cap_denies_a_pre_tool_use_and_is_an_error_elsewhere() {
    let cut = HookRun {
        stdout_cut: true,
        ..run(
            0,
            "{\"hookSpecificOutput\": {\"permissionDecision\": \"deny\", \"additionalContext\": \"xx\n… 90000 bytes omitted …\nxx\"}}",
            "",
        )
    };
    let pre = HookOutput::of(HookEvent::PreToolUse, &cut);
    assert_eq!(pre.permission, Some(Permission::Deny));
    assert!(pre.block.unwrap().contains("passed the output cap"));
    let post = HookOutput::of(HookEvent::PostToolUse, &cut);
    assert_eq!(post.permission, None);
    assert_eq!(post.block, None);
    assert!(post.error.unwrap().contains("passed the output cap"));
    // Plain text past the cap is still plain text: context, cut in the middle.
    let text = HookRun {
        stdout_cut: true,
        ..run(0, "lots of notes\n… 90000 bytes omitted …\nend", "")
    };
    let prompt = HookOutput::of(HookEvent::UserPromptSubmit, &text);
    assert!(
        prompt
            .additional_context
            .unwrap()
            .starts_with("lots of notes")
    );
    assert_eq!(prompt.error, None);
}
