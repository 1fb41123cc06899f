//! Asking before submitting (docs/contracts.md, "Limits"): `GetCapacity` tells a caller this
//! daemon's running slots (totals), its own children queued for one and its tenant's budget
//! left — consistent with what `ps` lists, and nothing of another tenant's queue.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_store::Budget;
use forkd_test_support::{
    Caller, TestDaemon, directives, eventually, session_request, spawn_tenants,
};

async fn capacity(c: &mut Caller) -> pb::GetCapacityResponse {
    let request = c.req(pb::GetCapacityRequest {});
    c.client.get_capacity(request).await.unwrap().into_inner()
}

/// How many of the batch's agents `ps` lists in each state: (running, pending).
async fn listed(c: &mut Caller, batch_id: &str) -> (usize, usize) {
    let request = c.req(pb::ListAgentsRequest {
        batch_id: batch_id.to_owned(),
        ..Default::default()
    });
    let agents = c
        .client
        .list_agents(request)
        .await
        .unwrap()
        .into_inner()
        .agents;
    let count = |state: pb::AgentState| agents.iter().filter(|a| a.state == state as i32).count();
    (
        count(pb::AgentState::Running),
        count(pb::AgentState::Pending),
    )
}

#[tokio::test]
async fn capacity_shows_the_slots_the_caller_s_queue_and_its_budget() {
    let (daemon, mut alpha, mut beta) = alpha_and_beta(2, 5.0).await;

    // Nothing runs yet: every slot is free.
    let idle = capacity(&mut alpha).await;
    assert_eq!(
        idle.slots,
        Some(pb::RunSlots {
            used: 0,
            free: 2,
            total: 2
        })
    );
    assert_eq!(idle.queued, 0);
    assert_eq!(idle.budget_left.unwrap().usd, Some(5.0));

    // Five children that never end: two take the slots, three wait.
    let session = alpha
        .create_session(session_request(&daemon.tenant_workspace("alpha")))
        .await
        .unwrap();
    let stalls = ["Talk.\n@sim stall"; 5];
    // Another tenant cannot dry-run on alpha's session, nor learn that it exists.
    let probe = beta.req(pb::ForkBatchRequest {
        session_id: session.session_id.clone(),
        directives: directives(&stalls),
        dry_run: true,
        ..Default::default()
    });
    let refused = beta.client.fork_batch(probe).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::NotFound, "{refused:?}");
    // With both slots free the batch would start now; no run has ended to say when it would end.
    let before = alpha
        .client
        .fork_batch(alpha.req(pb::ForkBatchRequest {
            session_id: session.session_id.clone(),
            directives: directives(&stalls),
            dry_run: true,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner()
        .dry_run
        .unwrap();
    assert_eq!(
        (before.start_in_ms, before.finish_in_ms),
        (Some(0), None),
        "{before:?}"
    );
    assert!(
        before.estimate_basis.contains("no run has ended here yet"),
        "{}",
        before.estimate_basis
    );
    let request = alpha.req(pb::ForkBatchRequest {
        session_id: session.session_id.clone(),
        directives: directives(&stalls),
        warmup_gating: Some(false),
        ..Default::default()
    });
    let batch = alpha.client.fork_batch(request).await.unwrap().into_inner();
    let (running, pending) = eventually(Duration::from_secs(20), "two children to run", || {
        let mut alpha = alpha.clone();
        let batch_id = batch.batch_id.clone();
        async move {
            let listed = listed(&mut alpha, &batch_id).await;
            (listed.0 == 2).then_some(listed)
        }
    })
    .await;
    let busy = capacity(&mut alpha).await;
    let slots = busy.slots.unwrap();
    assert_eq!((slots.used, slots.free, slots.total), (2, 0, 2));
    // What `ps` lists: the running children hold the slots, the pending ones are the queue.
    assert_eq!(slots.used as usize, running);
    assert_eq!(busy.queued as usize, pending);
    assert_eq!(busy.queued, 3);
    // Now a child more would wait behind alpha's three for runs that never ended here: when
    // it would start cannot be told, and the answer says what it was made of.
    let full = alpha
        .client
        .fork_batch(alpha.req(pb::ForkBatchRequest {
            session_id: session.session_id.clone(),
            directives: directives(&["One more."]),
            dry_run: true,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner()
        .dry_run
        .unwrap();
    assert_eq!((full.start_in_ms, full.finish_in_ms), (None, None));
    assert!(
        full.estimate_basis
            .contains("2 of 2 slots taken, 3 runs served before its first child"),
        "{}",
        full.estimate_basis
    );

    // Another tenant sees the totals, never alpha's queue or budget.
    let other = capacity(&mut beta).await;
    assert_eq!(other.slots, busy.slots);
    assert_eq!(other.queued, 0);
    assert_eq!(other.budget_left, None);
}

#[tokio::test]
async fn a_dry_run_forks_nothing_and_prices_the_first_requests() {
    let daemon = forkd_test_support::spawn_daemon().await.unwrap();
    let mut c = daemon.client().await.unwrap();
    let session =
        forkd_test_support::create_session(&mut c, session_request(&daemon.workspace_path()))
            .await
            .unwrap();
    let prompts: Vec<String> = (0..6)
        .map(|i| format!("Review part {i} of the design.\n@sim say part {i} reviewed"))
        .collect();
    let prompts: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let request = |dry_run: bool| pb::ForkBatchRequest {
        session_id: session.session_id.clone(),
        directives: directives(&prompts),
        idempotency_key: "review-1".into(),
        dry_run,
        ..Default::default()
    };
    let dry = c.fork_batch(request(true)).await.unwrap().into_inner();
    assert!(
        dry.batch_id.is_empty() && dry.agent_ids.is_empty(),
        "{dry:?}"
    );
    let run = dry.dry_run.unwrap();
    assert_eq!(run.children, 6);
    assert!(run.prefix_tokens > 1_000, "{run:?}");
    assert_eq!(run.slots.unwrap().total, 256);
    // No run has ended here: it would start now, and when it would end is not known.
    assert_eq!(
        (run.start_in_ms, run.finish_in_ms),
        (Some(0), None),
        "{run:?}"
    );

    // Nothing was forked, and the key was not recorded: the same call for real forks now.
    let agents = c
        .list_agents(pb::ListAgentsRequest {
            session_id: session.session_id.clone(),
            include_ended: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .agents;
    assert!(agents.iter().all(|a| a.kind == "parent"), "{agents:?}");
    let real = c.fork_batch(request(false)).await.unwrap().into_inner();
    assert!(!real.existing);
    forkd_test_support::wait_for_batch(&mut c, &real.batch_id, 6, Duration::from_secs(60))
        .await
        .unwrap();
    // Its price is what the sim charged the same batch's first (and only) requests.
    let stats = c
        .get_cache_stats(pb::GetCacheStatsRequest {
            scope: Some(pb::get_cache_stats_request::Scope::BatchId(real.batch_id)),
        })
        .await
        .unwrap()
        .into_inner();
    let off = (run.fork_cost_usd - stats.input_cost_usd).abs() / stats.input_cost_usd;
    eprintln!(
        "dry run ${:.6}, measured ${:.6}; prefix {} tokens, measured {}",
        run.fork_cost_usd, stats.input_cost_usd, run.prefix_tokens, stats.shared_prefix_tokens
    );
    assert!(
        off < 1e-9,
        "dry run ${:.6} against ${:.6} measured ({:.2}% off); prefix {} against {}",
        run.fork_cost_usd,
        stats.input_cost_usd,
        off * 100.0,
        run.prefix_tokens,
        stats.shared_prefix_tokens
    );

    // Now six runs have ended here: the same batch again would take about as long as they did.
    let again = c
        .fork_batch(pb::ForkBatchRequest {
            idempotency_key: String::new(),
            ..request(true)
        })
        .await
        .unwrap()
        .into_inner()
        .dry_run
        .unwrap();
    assert_eq!(again.start_in_ms, Some(0), "{again:?}");
    assert!(again.finish_in_ms.is_some(), "{again:?}");
    assert!(
        again.estimate_basis.contains("(median of the latest 6)"),
        "{}",
        again.estimate_basis
    );

    // Refused as the submission would be, with nothing stored either.
    let bad = c
        .fork_batch(pb::ForkBatchRequest {
            at_turn: Some(99),
            ..request(true)
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument, "{bad:?}");
}

/// The result of the session's first `Capacity` call, parsed (a refusal stays text), and
/// whether it was an error.
async fn capacity_result(c: &mut Caller, session_id: &str) -> (serde_json::Value, bool) {
    let results = c.tool_results(session_id).await.unwrap();
    let (text, is_error) = results.first().cloned().expect("the call has its result");
    (
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
        is_error,
    )
}

/// A daemon on TCP with `max_running_agents` `slots` and a budget of `budget_usd` for token
/// tenant alpha, and callers for alpha and beta.
async fn alpha_and_beta(slots: usize, budget_usd: f64) -> (TestDaemon, Caller, Caller) {
    let (daemon, mut callers) = spawn_tenants(&["alpha", "beta"], |c| {
        c.engine.max_running_agents = Some(slots);
        c.engine.tenant_budgets.insert(
            "alpha".into(),
            Budget {
                usd: Some(budget_usd),
                tokens: None,
            },
        );
    })
    .await
    .unwrap();
    let (beta, _) = callers.pop().unwrap();
    let (alpha, _) = callers.pop().unwrap();
    (daemon, alpha, beta)
}

#[tokio::test]
async fn a_session_s_model_may_ask_for_capacity_only_when_the_session_has_the_tool() {
    let (daemon, mut alpha, _) = alpha_and_beta(3, 2.5).await;
    let workspace = daemon.tenant_workspace("alpha");
    let ask = "How busy is it?\n@sim tool Capacity {\"children\": 4}\n@sim say sized";

    // Off by default: the tool is not the model's, and a call to it is refused as a result.
    let plain = alpha
        .create_session(session_request(&workspace))
        .await
        .unwrap();
    assert!(!plain.tool_names.iter().any(|t| t == "Capacity"));
    alpha.turn(&plain.session_id, ask).await.unwrap();
    let (refused, is_error) = capacity_result(&mut alpha, &plain.session_id).await;
    assert!(is_error, "{refused}");
    assert!(
        refused
            .as_str()
            .unwrap()
            .contains("Tool Capacity is not available"),
        "{refused}"
    );

    // Asked for at creation: the model reads the slots, its budget, its model and an estimate.
    let sized = alpha
        .create_session(pb::CreateSessionRequest {
            capacity_tool: true,
            ..session_request(&workspace)
        })
        .await
        .unwrap();
    assert!(sized.tool_names.iter().any(|t| t == "Capacity"));
    let said = alpha.turn(&sized.session_id, ask).await.unwrap();
    assert!(said.contains("Result: sized"), "{said}");
    let (answer, is_error) = capacity_result(&mut alpha, &sized.session_id).await;
    assert!(!is_error, "{answer}");
    assert_eq!(answer["slots"]["total"], 3, "{answer}");
    assert_eq!(answer["slots"]["free"], 3, "{answer}");
    assert_eq!(answer["queued"], 0, "{answer}");
    let budget = answer["budget_left"]["usd"].as_f64().unwrap();
    assert!(budget > 2.0 && budget <= 2.5, "{answer}");
    assert_eq!(answer["model"]["name"], sized.model, "{answer}");
    assert_eq!(answer["fork"]["children"], 4, "{answer}");
    assert_eq!(answer["fork"]["start_in_ms"], 0, "{answer}");
    assert!(
        answer["fork"]["basis"]
            .as_str()
            .unwrap()
            .contains("3 slots taken"),
        "{answer}"
    );
}
