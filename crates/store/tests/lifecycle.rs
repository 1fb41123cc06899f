//! Agents after their batch is created: lifecycle moves, ending and the notification log, their
//! own transcripts, request records and listing.

mod support;

use forkd_core::{
    AgentId, AgentState, Block, Message, NotificationStatus, RequestId, SessionId, Usage,
};
use forkd_store::{AgentFilter, NotificationFilter, RequestFilter, RequestRecord, StoreError};
use support::{
    TestResult, TestStore, conformance, ended, finish, fork, history, seeded, seeded_for,
};

conformance!(
    an_agent_ends_once_and_tells_its_parent,
    notifications_are_sequenced_and_filtered,
    each_tenant_counts_its_own_notifications,
    agents_list_by_filter_and_page_by_id,
    agent_transcripts_append_in_order,
    requests_are_recorded_and_add_up_on_their_agent,
    caller_reports_reach_the_transcript_only_when_handed_back,
    stats_count_agents_by_state_and_sum_recent_batches,
);

/// Two tenants' children ending in turn: each tenant's numbers go 1, 2, 3 whatever the other's
/// do, and its cursor reads its own alone; the daemon's order stays one sequence.
async fn each_tenant_counts_its_own_notifications(store: TestStore) -> TestResult {
    let (_, a) = seeded_for(&*store, "alpha", 3).await?;
    let (_, b) = seeded_for(&*store, "beta", 3).await?;
    let mut ends = Vec::new();
    for i in 0..3 {
        for fx in [&a, &b] {
            let child = &fx.children[i].agent;
            ends.push(
                finish(
                    &*store,
                    &ended(child, NotificationStatus::Completed, 1),
                    None,
                )
                .await?,
            );
        }
    }
    let seqs: Vec<u64> = ends.iter().map(|n| n.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5, 6]);
    let own: Vec<u64> = ends.iter().map(|n| n.tenant_seq).collect();
    assert_eq!(own, [1, 1, 2, 2, 3, 3]);
    for (tenant, fx) in [("alpha", &a), ("beta", &b)] {
        let filter = NotificationFilter {
            tenant: Some(forkd_core::Tenant::new(tenant)?),
            ..NotificationFilter::default()
        };
        let all = store.notifications(0, &filter, 0).await?;
        assert_eq!(
            all.iter().map(|n| n.tenant_seq).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert!(all.iter().all(|n| n.batch_id == Some(fx.batch.id)));
        let after = store.notifications(2, &filter, 0).await?;
        assert_eq!(after.len(), 1, "{tenant}: after its own 2");
        assert_eq!(after[0].tenant_seq, 3);
    }
    Ok(())
}

async fn an_agent_ends_once_and_tells_its_parent(store: TestStore) -> TestResult {
    let (session, fx) = seeded(&*store, 2).await?;
    let child = &fx.children[0].agent;

    store
        .set_agent_state(child.id, AgentState::Running, None)
        .await?;
    let n = finish(
        &*store,
        &ended(child, NotificationStatus::Failed, 5_000),
        Some("boom"),
    )
    .await?;
    assert_eq!(n.seq, 1);

    let agent = store.get_agent(child.id).await?.ok_or("agent missing")?;
    assert_eq!(agent.state, AgentState::Failed);
    assert_eq!(agent.error.as_deref(), Some("boom"));
    assert_eq!(agent.updated_at_ms, 5_000);

    // The parent's transcript got the <task-notification> as a user text message.
    let transcript = store.session_messages(session.id, None).await?;
    let last = transcript.last().ok_or("empty transcript")?;
    assert_eq!(last.seq, 6);
    assert_eq!(
        last.message,
        Message::user(vec![Block::text(&n.to_parent_text())])
    );

    let again = finish(
        &*store,
        &ended(child, NotificationStatus::Completed, 6_000),
        None,
    )
    .await;
    assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
    let moved = store
        .set_agent_state(child.id, AgentState::Running, None)
        .await;
    assert!(matches!(moved, Err(StoreError::Conflict(_))), "{moved:?}");
    assert_eq!(store.session_message_count(session.id).await?, 7);

    let mut ghost = ended(child, NotificationStatus::Killed, 0);
    ghost.agent_id = AgentId::new();
    assert!(matches!(
        finish(&*store, &ghost, None).await,
        Err(StoreError::NotFound { kind: "agent", .. })
    ));
    assert!(matches!(
        store
            .set_agent_state(AgentId::new(), AgentState::Running, None)
            .await,
        Err(StoreError::NotFound { kind: "agent", .. })
    ));
    Ok(())
}

async fn notifications_are_sequenced_and_filtered(store: TestStore) -> TestResult {
    let (session, first) = seeded(&*store, 3).await?;
    let len = store.session_message_count(session.id).await?;
    let second = fork(&session, len, 2)?;
    store
        .create_fork_batch(
            &second.batch,
            std::slice::from_ref(&second.parent_results),
            &second.children,
            &forkd_store::BatchExtras::default(),
        )
        .await?;
    assert_eq!(store.last_notification_seq().await?, 0);

    let order = [
        &first.children[1],
        &second.children[0],
        &first.children[0],
        &second.children[1],
    ];
    for (i, child) in order.iter().enumerate() {
        let at = 10_000 + i64::try_from(i)?;
        finish(
            &*store,
            &ended(&child.agent, NotificationStatus::Completed, at),
            None,
        )
        .await?;
    }

    let all = store
        .notifications(0, &NotificationFilter::default(), 0)
        .await?;
    assert_eq!(all.len(), 4);
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
    let agents: Vec<_> = all.iter().map(|n| n.agent_id).collect();
    assert_eq!(agents, order.iter().map(|c| c.agent.id).collect::<Vec<_>>());
    let expect = ended(&order[0].agent, NotificationStatus::Completed, 10_000);
    let n = &all[0];
    assert_eq!(
        (
            n.session_id,
            n.batch_id,
            n.status,
            &n.summary,
            &n.report,
            n.usage,
            n.cost_usd
        ),
        (
            expect.session_id,
            expect.batch_id,
            expect.status,
            &expect.summary,
            &expect.report,
            expect.usage,
            expect.cost_usd
        )
    );
    assert_eq!(n.created_at_ms, 10_000);
    assert_eq!(store.last_notification_seq().await?, all[3].seq);

    let since = store
        .notifications(all[1].seq, &NotificationFilter::default(), 0)
        .await?;
    assert_eq!(since, all[2..]);
    let limited = store
        .notifications(0, &NotificationFilter::default(), 3)
        .await?;
    assert_eq!(limited, all[..3]);

    let by_batch = NotificationFilter {
        batch_id: Some(second.batch.id),
        ..NotificationFilter::default()
    };
    let second_only = store.notifications(0, &by_batch, 0).await?;
    assert_eq!(second_only, vec![all[1].clone(), all[3].clone()]);
    assert!(
        all.iter()
            .all(|n| by_batch.matches(n) == second_only.contains(n))
    );

    let by_agent = NotificationFilter {
        agent_id: Some(first.children[0].agent.id),
        session_id: Some(session.id),
        ..NotificationFilter::default()
    };
    assert_eq!(
        store.notifications(0, &by_agent, 0).await?,
        vec![all[2].clone()]
    );
    let elsewhere = NotificationFilter {
        session_id: Some(SessionId::new()),
        ..NotificationFilter::default()
    };
    assert!(store.notifications(0, &elsewhere, 0).await?.is_empty());
    Ok(())
}

async fn agents_list_by_filter_and_page_by_id(store: TestStore) -> TestResult {
    let (session, fx) = seeded(&*store, 5).await?;
    let ids: Vec<AgentId> = fx.children.iter().map(|c| c.agent.id).collect();
    let listed = |filter: AgentFilter| {
        let store = store.clone();
        async move {
            let agents = store.list_agents(&filter).await?;
            Ok::<_, StoreError>(agents.into_iter().map(|a| a.id).collect::<Vec<_>>())
        }
    };
    let everything = AgentFilter {
        session_id: Some(session.id),
        include_ended: true,
        ..AgentFilter::default()
    };
    assert_eq!(listed(everything.clone()).await?, ids);

    let mut pages = Vec::new();
    let mut after = None;
    loop {
        let page = listed(AgentFilter {
            after,
            limit: 2,
            ..everything.clone()
        })
        .await?;
        let Some(last) = page.last().copied() else {
            break;
        };
        after = Some(last);
        pages.push(page);
    }
    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);
    assert_eq!(pages.concat(), ids);

    finish(
        &*store,
        &ended(&fx.children[1].agent, NotificationStatus::Killed, 1),
        None,
    )
    .await?;
    let live = AgentFilter {
        batch_id: Some(fx.batch.id),
        ..AgentFilter::default()
    };
    assert_eq!(listed(live).await?, [ids[0], ids[2], ids[3], ids[4]]);
    let other = AgentFilter {
        batch_id: Some(forkd_core::BatchId::new()),
        include_ended: true,
        ..AgentFilter::default()
    };
    assert!(listed(other).await?.is_empty());
    Ok(())
}

async fn agent_transcripts_append_in_order(store: TestStore) -> TestResult {
    let (_, fx) = seeded(&*store, 1).await?;
    let id = fx.children[0].agent.id;
    assert!(store.agent_messages(id).await?.is_empty());
    let messages = history()?;
    let lease = store.claim_agent(id).await?;
    for (i, m) in messages.iter().enumerate() {
        assert_eq!(
            store.append_agent_message(&lease, m).await?,
            u64::try_from(i)?
        );
    }
    let back = store.agent_messages(id).await?;
    assert_eq!(
        back.iter().map(|m| &m.message).collect::<Vec<_>>(),
        messages.iter().collect::<Vec<_>>()
    );
    for (b, m) in back.iter().zip(&messages) {
        assert_eq!(b.message.content_json(), m.content_json());
    }
    let missing = AgentId::new();
    assert!(matches!(
        store
            .append_agent_message(
                &forkd_store::Lease {
                    agent_id: missing,
                    generation: 1
                },
                &messages[0]
            )
            .await,
        Err(StoreError::NotFound { kind: "agent", .. })
    ));
    assert!(matches!(
        store.agent_messages(missing).await,
        Err(StoreError::NotFound { kind: "agent", .. })
    ));
    Ok(())
}

fn request(agent: &forkd_core::Agent, turn: u32, usage: Usage, cost: f64) -> RequestRecord {
    RequestRecord {
        id: RequestId::new(),
        agent_id: agent.id,
        session_id: agent.session_id,
        batch_id: agent.batch_id,
        turn,
        model: "claude-test-1".into(),
        usage,
        cost_usd: cost,
        prefix_fingerprint: "sha256:abc".into(),
        prefix_parts: vec![
            forkd_store::PrefixPart {
                label: "tools".into(),
                offset: 60,
                digest: "00ff".into(),
            },
            forkd_store::PrefixPart {
                label: "system".into(),
                offset: 900,
                digest: "ab12".into(),
            },
        ],
        // Both a count and none (a record from before counts were kept) read back as written.
        message_count: (turn > 0).then_some(2 * turn + 1),
        body_bytes: 123_456,
        first_token_ms: (turn > 0).then_some(350),
        stop_reason: Some("tool_use".into()),
        // Both a send time and none (a record from before it was kept) read back as written.
        sent_at_ms: (turn > 0).then_some(40),
        created_at_ms: 42 + i64::from(turn),
    }
}

async fn requests_are_recorded_and_add_up_on_their_agent(store: TestStore) -> TestResult {
    let (session, fx) = seeded(&*store, 2).await?;
    let (a, b) = (&fx.children[0].agent, &fx.children[1].agent);
    let u = |n| Usage {
        input_tokens: n,
        cache_creation_input_tokens: 2 * n,
        cache_read_input_tokens: 3 * n,
        output_tokens: 4 * n,
    };
    let records = [
        request(a, 0, u(1), 0.25),
        request(a, 1, u(10), 0.5),
        request(b, 0, u(100), 1.0),
    ];
    for r in &records {
        store.record_request(r).await?;
    }
    let totals = store.get_agent(a.id).await?.ok_or("agent missing")?;
    assert_eq!(totals.usage, u(11));
    assert!((totals.cost_usd - 0.75).abs() < 1e-12);

    let by_agent = RequestFilter {
        agent_id: Some(a.id),
        ..RequestFilter::default()
    };
    assert_eq!(store.list_requests(&by_agent).await?, records[..2]);
    let by_batch = RequestFilter {
        batch_id: Some(fx.batch.id),
        ..RequestFilter::default()
    };
    assert_eq!(store.list_requests(&by_batch).await?, records);
    let by_session = RequestFilter {
        session_id: Some(session.id),
        ..RequestFilter::default()
    };
    assert_eq!(store.list_requests(&by_session).await?.len(), 3);
    // One request by id, its prefix parts read back as they were written.
    assert_eq!(
        store.get_request(records[2].id).await?.as_ref(),
        Some(&records[2])
    );
    assert_eq!(store.get_request(RequestId::new()).await?, None);

    assert!(matches!(
        store.record_request(&records[0]).await,
        Err(StoreError::Conflict(_))
    ));
    let mut ghost = request(a, 0, u(1), 0.0);
    ghost.agent_id = AgentId::new();
    assert!(matches!(
        store.record_request(&ghost).await,
        Err(StoreError::NotFound { kind: "agent", .. })
    ));
    // The failed writes left the totals alone.
    let after = store.get_agent(a.id).await?.ok_or("agent missing")?;
    assert_eq!(after.usage, u(11));
    Ok(())
}

/// An agent that reports to its caller adds nothing to the transcript when it ends; handing its
/// report back appends its notification then (ended) or at its end (live), exactly once.
async fn caller_reports_reach_the_transcript_only_when_handed_back(store: TestStore) -> TestResult {
    let session = support::session()?;
    store.create_session(&session, &history()?, None).await?;
    let mut fx = fork(&session, 4, 2)?;
    for child in &mut fx.children {
        child.agent.report_to = forkd_core::ReportTo::Caller;
    }
    store
        .create_fork_batch(
            &fx.batch,
            std::slice::from_ref(&fx.parent_results),
            &fx.children,
            &forkd_store::BatchExtras::default(),
        )
        .await?;
    let (ended_one, live_one) = (&fx.children[0].agent, &fx.children[1].agent);
    let len = store.session_message_count(session.id).await?;
    finish(
        &*store,
        &ended(ended_one, NotificationStatus::Completed, 7),
        None,
    )
    .await?;
    assert_eq!(store.session_message_count(session.id).await?, len);
    assert_eq!(
        store.caller_reports().await?,
        vec![ended_one.id, live_one.id]
    );

    let appended = store.redirect_reports(&[ended_one.id, live_one.id]).await?;
    assert_eq!(
        appended, 1,
        "only the ended agent has a report to append now"
    );
    assert_eq!(store.session_message_count(session.id).await?, len + 1);
    assert!(store.caller_reports().await?.is_empty());
    // Handing back twice appends nothing more.
    assert_eq!(store.redirect_reports(&[ended_one.id]).await?, 0);
    // The live one appends its own when it ends.
    finish(
        &*store,
        &ended(live_one, NotificationStatus::Failed, 8),
        Some("x"),
    )
    .await?;
    assert_eq!(store.session_message_count(session.id).await?, len + 2);
    Ok(())
}

/// The metrics snapshot: agents counted by kind and state, and a batch listed while it has a live
/// child or a child that changed within the window, with its children's usage summed.
async fn stats_count_agents_by_state_and_sum_recent_batches(store: TestStore) -> TestResult {
    use forkd_core::AgentKind;
    let (session, fx) = seeded(&*store, 3).await?;
    let kids: Vec<_> = fx.children.iter().map(|c| &c.agent).collect();
    let u = |n| Usage {
        input_tokens: n,
        cache_creation_input_tokens: 2 * n,
        cache_read_input_tokens: 3 * n,
        output_tokens: 4 * n,
    };
    store
        .record_request(&request(kids[0], 0, u(1), 0.5))
        .await?;
    store
        .record_request(&request(kids[1], 0, u(10), 0.25))
        .await?;
    finish(
        &*store,
        &ended(kids[0], NotificationStatus::Completed, 5_000),
        None,
    )
    .await?;
    store
        .set_agent_state(kids[1].id, AgentState::Running, None)
        .await?;

    let stats = store.stats(i64::MAX).await?;
    let forks = |stats: &forkd_store::Stats, state| {
        stats
            .agents
            .iter()
            .find(|c| c.kind == AgentKind::Fork && c.state == state)
            .map_or(0, |c| c.count)
    };
    assert_eq!(forks(&stats, AgentState::Completed), 1);
    assert_eq!(forks(&stats, AgentState::Running), 1);
    assert_eq!(forks(&stats, AgentState::Pending), 1);
    assert_eq!(forks(&stats, AgentState::Failed), 0);
    // Live children keep the batch listed whatever the window.
    assert_eq!(stats.batches.len(), 1);
    let batch = &stats.batches[0];
    assert_eq!(batch.batch_id, fx.batch.id);
    assert_eq!(batch.session_id, session.id);
    assert_eq!(batch.tenant, session.tenant);
    assert_eq!((batch.children, batch.ended), (3, 1));
    assert_eq!(batch.usage, u(11));
    assert!((batch.cost_usd - 0.75).abs() < 1e-12);

    // Once every child has ended, the batch is listed only while its last change is recent.
    for kid in &kids[1..] {
        finish(
            &*store,
            &ended(kid, NotificationStatus::Failed, 6_000),
            None,
        )
        .await?;
    }
    let stats = store.stats(6_000).await?;
    assert_eq!(forks(&stats, AgentState::Failed), 2);
    assert_eq!(stats.batches.len(), 1);
    assert_eq!(stats.batches[0].ended, 3);
    assert!(store.stats(6_001).await?.batches.is_empty());
    Ok(())
}
