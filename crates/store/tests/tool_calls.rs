//! Tool calls: the intent is stored before the call runs, the result after, and a result is final.

mod support;

use forkd_core::Block;
use forkd_store::{ProcessGroup, StoreError, ToolCall};
use support::{TestResult, TestStore, conformance, seeded};

conformance!(
    intents_then_results_in_order_and_results_are_final,
    a_running_call_records_its_process_group,
    output_with_nul_bytes_is_kept_as_it_was,
    hooks_runs_are_kept_in_order_per_agent,
);

fn intent(agent: forkd_core::AgentId, id: &str, read_only: bool, at: i64) -> ToolCall {
    ToolCall {
        agent_id: agent,
        tool_use_id: id.into(),
        name: if read_only { "Read" } else { "Write" }.into(),
        input_json: r#"{"file_path":"a.txt"}"#.into(),
        read_only,
        result: None,
        full_output: None,
        started_at_ms: at,
        finished_at_ms: None,
        process: None,
    }
}

async fn intents_then_results_in_order_and_results_are_final(store: TestStore) -> TestResult {
    let (_session, fx) = seeded(&*store, 1).await?;
    let agent = fx.children[0].agent.id;
    let lease = store.claim_agent(agent).await?;

    store
        .begin_tool_call(&lease, &intent(agent, "t1", true, 10))
        .await?;
    store
        .begin_tool_call(&lease, &intent(agent, "t2", false, 11))
        .await?;
    // Re-recording an intent (a read-only call re-run after an interruption) keeps the first.
    store
        .begin_tool_call(&lease, &intent(agent, "t1", true, 99))
        .await?;

    let result = Block::tool_result("t1", "1\tline", false);
    store
        .finish_tool_call(&lease, "t1", &result, Some("full"), 20)
        .await?;
    let again = store
        .finish_tool_call(&lease, "t1", &result, None, 21)
        .await;
    assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
    let unknown = store
        .finish_tool_call(&lease, "nope", &result, None, 21)
        .await;
    assert!(matches!(unknown, Err(StoreError::Conflict(_))));

    let calls = store.tool_calls(agent).await?;
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].tool_use_id, "t1");
    assert_eq!(calls[0].started_at_ms, 10);
    assert_eq!(calls[0].result.as_ref(), Some(&result));
    assert_eq!(calls[0].full_output.as_deref(), Some("full"));
    assert_eq!(calls[0].finished_at_ms, Some(20));
    // The mutating call's intent stands without a result: it was interrupted.
    assert_eq!(calls[1].result, None);
    assert!(!calls[1].read_only);
    Ok(())
}

async fn a_running_call_records_its_process_group(store: TestStore) -> TestResult {
    let (_session, fx) = seeded(&*store, 1).await?;
    let agent = fx.children[0].agent.id;
    let lease = store.claim_agent(agent).await?;
    let group = ProcessGroup {
        pgid: 4242,
        start_ticks: u64::from(u32::MAX) + 5,
        boot_id: "8f2c6a4e-0d1b-4c55-9a7e-3b0f1e2d4c6b".into(),
    };

    // No intent yet: nothing to record it on.
    let early = store.record_tool_process(&lease, "t1", &group).await;
    assert!(matches!(early, Err(StoreError::Conflict(_))), "{early:?}");
    store
        .begin_tool_call(&lease, &intent(agent, "t1", false, 10))
        .await?;
    store.record_tool_process(&lease, "t1", &group).await?;
    let calls = store.tool_calls(agent).await?;
    assert_eq!(calls[0].process.as_ref(), Some(&group));
    assert_eq!(calls[0].result, None);

    // The group stays recorded with the result; a finished call takes no new group.
    let result = Block::tool_result("t1", "done", false);
    store
        .finish_tool_call(&lease, "t1", &result, None, 20)
        .await?;
    let late = store.record_tool_process(&lease, "t1", &group).await;
    assert!(matches!(late, Err(StoreError::Conflict(_))), "{late:?}");
    let calls = store.tool_calls(agent).await?;
    assert_eq!(calls[0].process.as_ref(), Some(&group));
    assert_eq!(calls[0].result.as_ref(), Some(&result));

    // An intent stored with its group keeps it.
    let mut with_group = intent(agent, "t2", false, 30);
    with_group.process = Some(group.clone());
    store.begin_tool_call(&lease, &with_group).await?;
    assert_eq!(store.tool_calls(agent).await?[1].process, Some(group));
    Ok(())
}

/// A command's output may hold NUL bytes (`find -print0`, a binary file): its result and its
/// whole output read back as they were written.
async fn output_with_nul_bytes_is_kept_as_it_was(store: TestStore) -> TestResult {
    let (_session, fx) = seeded(&*store, 1).await?;
    let agent = fx.children[0].agent.id;
    let lease = store.claim_agent(agent).await?;
    store
        .begin_tool_call(&lease, &intent(agent, "t1", false, 10))
        .await?;
    let output = "./a\0./b ünï\0";
    let result = Block::tool_result("t1", output, false);
    store
        .finish_tool_call(&lease, "t1", &result, Some(output), 20)
        .await?;
    let calls = store.tool_calls(agent).await?;
    assert_eq!(calls[0].result.as_ref(), Some(&result));
    assert_eq!(calls[0].full_output.as_deref(), Some(output));
    Ok(())
}

async fn hooks_runs_are_kept_in_order_per_agent(store: TestStore) -> TestResult {
    use forkd_core::hooks::HookEvent;
    use forkd_core::hooks::runs::{HookDecision, HookRunRecord};
    let (_session, fx) = seeded(&*store, 2).await?;
    let (a, b) = (fx.children[0].agent.id, fx.children[1].agent.id);
    let run = |agent, event, decision, output: &str| HookRunRecord {
        agent_id: agent,
        event,
        tool_use_id: (event == HookEvent::PreToolUse).then(|| "toolu_1".to_owned()),
        tool_name: (event == HookEvent::PreToolUse).then(|| "Bash".to_owned()),
        program: "python3".into(),
        exit_code: Some(2),
        decision,
        output: output.into(),
        started_at_ms: 10,
        finished_at_ms: 12,
    };
    let first = [
        run(a, HookEvent::PreToolUse, HookDecision::Deny, "no grep — ✓"),
        run(b, HookEvent::SubagentStop, HookDecision::Block, "tests"),
    ];
    store.record_hook_runs(&first).await?;
    let later = run(a, HookEvent::SubagentStop, HookDecision::None, "");
    store.record_hook_runs(std::slice::from_ref(&later)).await?;
    assert_eq!(store.hook_runs(a).await?, [first[0].clone(), later]);
    assert_eq!(store.hook_runs(b).await?, [first[1].clone()]);
    assert!(
        store
            .hook_runs(forkd_core::AgentId::new())
            .await?
            .is_empty()
    );
    Ok(())
}
