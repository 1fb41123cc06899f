//! A session's main loop and what its turns store, on both backends: turns appended under the
//! main loop's lease, pending replies, a turn's end and its notification, delivered reports,
//! idempotency keys, budgets and spending, client batches and their digest.

mod support;

use forkd_core::{
    AgentState, Block, Message, NotificationKind, NotificationStatus, ReportTo, SessionId,
};
use forkd_store::{
    BatchExtras, Budget, IdempotencyRecord, IdempotentCall, NewNotification, SpendScope, StoreError,
};
use support::{
    TestResult, TestStore, client_fork, conformance, ended, finish, fork, history, main_loop,
    seeded, session, typed,
};

conformance!(
    a_turn_appends_under_the_main_loops_lease,
    a_turn_ends_idle_with_or_without_its_notification,
    a_turn_marks_the_reports_it_carries_delivered,
    a_turn_that_forks_stores_its_reply_with_the_batch,
    idempotency_keys_name_what_they_created,
    spending_adds_up_by_batch_and_by_tenant,
    workspaces_are_listed_once_each,
    a_client_batch_reports_with_one_digest_when_its_last_child_ends,
    the_main_loop_is_found_by_its_session_among_its_children,
    a_branch_reads_its_origins_transcript_to_its_point_then_its_own,
    a_branch_is_refused_past_its_origins_end_and_without_its_origin,
    a_sessions_latest_turn_keeps_its_trace_context,
);

fn key(kind: IdempotentCall, key: &str, resource_id: String) -> IdempotencyRecord {
    IdempotencyRecord {
        tenant: "local".into(),
        key: key.into(),
        kind,
        request_sha256: format!("sha256 of {key}"),
        resource_id,
        created_at_ms: 1_234,
    }
}

fn text(role_user: bool, text: &str) -> Message {
    let blocks = vec![Block::text(text)];
    if role_user {
        Message::user(blocks)
    } else {
        Message::assistant(blocks)
    }
}

fn turn_notification(agent: &forkd_core::Agent, at_ms: i64) -> NewNotification {
    let mut n = ended(agent, NotificationStatus::Completed, at_ms);
    n.batch_id = None;
    n
}

async fn a_sessions_latest_turn_keeps_its_trace_context(store: TestStore) -> TestResult {
    let session = session()?;
    store.create_session(&session, &history()?, None).await?;
    assert_eq!(store.turn_trace(session.id).await?, None);
    let first = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let later = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    store.set_turn_trace(session.id, first).await?;
    store.set_turn_trace(session.id, later).await?;
    assert_eq!(store.turn_trace(session.id).await?.as_deref(), Some(later));
    let missing = forkd_core::SessionId::new();
    assert!(matches!(
        store.set_turn_trace(missing, first).await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        store.turn_trace(missing).await,
        Err(StoreError::NotFound { .. })
    ));
    Ok(())
}

async fn the_main_loop_is_found_by_its_session_among_its_children(store: TestStore) -> TestResult {
    let (session, fixture) = seeded(&*store, 3).await?;
    // Before its first turn a session has children but no main loop.
    assert_eq!(store.main_loop_agent(session.id).await?, None);
    let parent = main_loop(&session);
    store.insert_agent(&parent, None, None).await?;
    let other = support::session()?;
    store.create_session(&other, &history()?, None).await?;
    store.insert_agent(&main_loop(&other), None, None).await?;
    let found = store.main_loop_agent(session.id).await?;
    assert_eq!(found.map(|a| a.id), Some(parent.id));
    assert!(fixture.children.iter().all(|c| c.agent.id != parent.id));
    Ok(())
}

async fn a_turn_appends_under_the_main_loops_lease(store: TestStore) -> TestResult {
    let session = session()?;
    store.create_session(&session, &history()?, None).await?;
    let parent = main_loop(&session);
    store.insert_agent(&parent, None, None).await?;
    let lease = store.claim_agent(parent.id).await?;
    assert_eq!(lease.generation, 1);

    // The reply is stored before its tool calls run, then answered with the turn.
    let reply = text(false, "I will read it.");
    assert_eq!(store.pending_reply(session.id).await?, None);
    store.set_pending_reply(&lease, session.id, &reply).await?;
    let newer = text(false, "I will read it — again.");
    store.set_pending_reply(&lease, session.id, &newer).await?;
    assert_eq!(store.pending_reply(session.id).await?, Some(newer.clone()));

    let record = key(
        IdempotentCall::SendMessage,
        "k-turn",
        format!("{}/4", session.id),
    );
    let messages = [newer.clone(), text(true, "results")];
    let first = store
        .append_turn(&lease, session.id, &messages, &[], Some(&record), 77)
        .await?;
    assert_eq!(first, 4);
    assert_eq!(store.pending_reply(session.id).await?, None);
    assert_eq!(
        store.idempotency_key("local", "k-turn").await?,
        Some(record.clone())
    );
    let tail = store.session_messages_from(session.id, 4, None).await?;
    assert_eq!(
        tail.iter()
            .map(|m| (m.seq, m.created_at_ms))
            .collect::<Vec<_>>(),
        [(4, 77), (5, 77)]
    );
    assert_eq!(tail[0].message, newer);
    let middle = store.session_messages_from(session.id, 2, Some(5)).await?;
    assert_eq!(middle.iter().map(|m| m.seq).collect::<Vec<_>>(), [2, 3, 4]);

    // The key is taken: nothing of the second call is stored.
    let again = store
        .append_turn(&lease, session.id, &messages, &[], Some(&record), 78)
        .await;
    assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
    assert_eq!(store.session_message_count(session.id).await?, 6);

    let missing = store
        .append_turn(&lease, SessionId::new(), &messages, &[], None, 79)
        .await;
    assert!(
        matches!(
            missing,
            Err(StoreError::NotFound {
                kind: "session",
                ..
            })
        ),
        "{missing:?}"
    );

    // A newer claim fences the turn: neither its reply nor its messages are stored.
    let newest = store.claim_agent(parent.id).await?;
    assert!(newest.generation > lease.generation);
    let fenced = store.set_pending_reply(&lease, session.id, &reply).await;
    assert!(
        matches!(fenced, Err(StoreError::Superseded { .. })),
        "{fenced:?}"
    );
    let fenced = store
        .append_turn(&lease, session.id, &messages, &[], None, 80)
        .await;
    assert!(
        matches!(fenced, Err(StoreError::Superseded { .. })),
        "{fenced:?}"
    );
    assert_eq!(store.session_message_count(session.id).await?, 6);
    assert_eq!(store.pending_reply(session.id).await?, None);
    Ok(())
}

async fn a_turn_ends_idle_with_or_without_its_notification(store: TestStore) -> TestResult {
    let (session, fx) = seeded(&*store, 1).await?;
    let parent = main_loop(&session);
    store.insert_agent(&parent, None, None).await?;
    let len = store.session_message_count(session.id).await?;

    let lease = store.claim_agent(parent.id).await?;
    assert_eq!(store.end_turn(&lease, None).await?, None);
    let idle = store
        .get_agent(parent.id)
        .await?
        .ok_or("main loop missing")?;
    assert_eq!(idle.state, AgentState::Idle);

    // A turn handed to the background ends with a notification of kind `turn`, and nothing is
    // appended to the transcript; a main loop has one per such turn.
    for round in 1..=2 {
        let lease = store.claim_agent(parent.id).await?;
        let stored = store
            .end_turn(&lease, Some(&turn_notification(&parent, 100 + round)))
            .await?
            .ok_or("no turn notification")?;
        assert_eq!(stored.kind, NotificationKind::Turn);
        assert_eq!(stored.seq, u64::try_from(round)?);
        assert_eq!(stored.batch_id, None);
    }
    assert_eq!(store.last_notification_seq().await?, 2);
    assert_eq!(store.session_message_count(session.id).await?, len);

    // Only a main loop has turns, and a main loop never ends.
    let child = &fx.children[0].agent;
    let child_lease = store.claim_agent(child.id).await?;
    let not_a_turn = store.end_turn(&child_lease, None).await;
    assert!(
        matches!(not_a_turn, Err(StoreError::Conflict(_))),
        "{not_a_turn:?}"
    );
    let lease = store.claim_agent(parent.id).await?;
    let never = store
        .finish_agent(&lease, &turn_notification(&parent, 200), None)
        .await;
    assert!(matches!(never, Err(StoreError::Conflict(_))), "{never:?}");
    // A turn's notification names its own agent.
    let stranger = store
        .end_turn(&lease, Some(&turn_notification(child, 201)))
        .await;
    assert!(
        matches!(stranger, Err(StoreError::Conflict(_))),
        "{stranger:?}"
    );
    // Nothing of the refused calls was stored.
    assert_eq!(store.last_notification_seq().await?, 2);
    let parent_now = store
        .get_agent(parent.id)
        .await?
        .ok_or("main loop missing")?;
    assert_eq!(parent_now.state, AgentState::Running);
    Ok(())
}

async fn a_turn_marks_the_reports_it_carries_delivered(store: TestStore) -> TestResult {
    let session = session()?;
    store.create_session(&session, &history()?, None).await?;
    let parent = main_loop(&session);
    store.insert_agent(&parent, None, None).await?;
    let (waited, other) = (
        typed(&session, ReportTo::Caller),
        typed(&session, ReportTo::Caller),
    );
    for agent in [&waited, &other] {
        store
            .insert_agent(agent, Some(&Block::text("Map the crate.")), None)
            .await?;
    }
    let mut expected = vec![waited.id, other.id];
    expected.sort();
    assert_eq!(store.caller_reports().await?, expected);

    let lease = store.claim_agent(parent.id).await?;
    store
        .append_turn(
            &lease,
            session.id,
            &[text(false, "Its report: done.")],
            &[waited.id],
            None,
            5,
        )
        .await?;
    assert_eq!(store.caller_reports().await?, vec![other.id]);
    let delivered = store.get_agent(waited.id).await?.ok_or("agent missing")?;
    assert_eq!(delivered.report_to, ReportTo::Transcript);
    store.mark_delivered(&[other.id]).await?;
    assert!(store.caller_reports().await?.is_empty());
    Ok(())
}

async fn a_turn_that_forks_stores_its_reply_with_the_batch(store: TestStore) -> TestResult {
    let session = session()?;
    store.create_session(&session, &history()?, None).await?;
    let parent = main_loop(&session);
    store.insert_agent(&parent, None, None).await?;
    let waited = typed(&session, ReportTo::Caller);
    store.insert_agent(&waited, None, None).await?;
    let lease = store.claim_agent(parent.id).await?;
    let fx = fork(&session, 4, 2)?;
    let reply = fx.batch.assistant().ok_or("a model's batch")?.clone();
    store.set_pending_reply(&lease, session.id, &reply).await?;

    let delivered = [waited.id];
    let turn = BatchExtras {
        turn: Some((&lease, &delivered)),
        ..BatchExtras::default()
    };
    // A superseded turn stores nothing of its batch.
    let newer = store.claim_agent(parent.id).await?;
    let fenced = store
        .create_fork_batch(
            &fx.batch,
            std::slice::from_ref(&fx.parent_results),
            &fx.children,
            &turn,
        )
        .await;
    assert!(
        matches!(fenced, Err(StoreError::Superseded { .. })),
        "{fenced:?}"
    );
    assert_eq!(store.get_batch(fx.batch.id).await?, None);
    assert_eq!(store.pending_reply(session.id).await?, Some(reply.clone()));

    let turn = BatchExtras {
        turn: Some((&newer, &delivered)),
        ..BatchExtras::default()
    };
    store
        .create_fork_batch(
            &fx.batch,
            std::slice::from_ref(&fx.parent_results),
            &fx.children,
            &turn,
        )
        .await?;
    assert_eq!(store.pending_reply(session.id).await?, None);
    assert!(store.caller_reports().await?.is_empty());
    let transcript = store.session_messages(session.id, None).await?;
    assert_eq!(transcript.len(), 6);
    assert_eq!(transcript[4].message, reply);
    Ok(())
}

async fn idempotency_keys_name_what_they_created(store: TestStore) -> TestResult {
    let first = session()?;
    let record = key(IdempotentCall::CreateSession, "k1", first.id.to_string());
    store.create_session(&first, &[], Some(&record)).await?;
    assert_eq!(store.idempotency_key("local", "k1").await?, Some(record));
    assert_eq!(store.idempotency_key("local", "k2").await?, None);
    assert_eq!(store.idempotency_key("other", "k1").await?, None);

    // The key is taken: the second session is not created.
    let second = session()?;
    let retry = key(IdempotentCall::CreateSession, "k1", second.id.to_string());
    let taken = store.create_session(&second, &[], Some(&retry)).await;
    assert!(matches!(taken, Err(StoreError::Conflict(_))), "{taken:?}");
    assert_eq!(store.get_session(second.id).await?, None);
    // Keys are per tenant.
    let mut elsewhere = retry.clone();
    elsewhere.tenant = "other".into();
    store.create_session(&second, &[], Some(&elsewhere)).await?;

    let fx = fork(&first, 0, 1)?;
    let batch_key = key(IdempotentCall::ForkBatch, "k3", fx.batch.id.to_string());
    let extras = BatchExtras {
        idempotency: Some(&batch_key),
        ..BatchExtras::default()
    };
    store
        .create_fork_batch(
            &fx.batch,
            std::slice::from_ref(&fx.parent_results),
            &fx.children,
            &extras,
        )
        .await?;
    let stored = store
        .idempotency_key("local", "k3")
        .await?
        .ok_or("batch key missing")?;
    assert_eq!(stored.kind, IdempotentCall::ForkBatch);
    assert_eq!(stored.resource_id, fx.batch.id.to_string());

    let len = store.session_message_count(first.id).await?;
    let again = fork(&first, len, 1)?;
    let taken = store
        .create_fork_batch(
            &again.batch,
            std::slice::from_ref(&again.parent_results),
            &again.children,
            &extras,
        )
        .await;
    assert!(matches!(taken, Err(StoreError::Conflict(_))), "{taken:?}");
    assert_eq!(store.get_batch(again.batch.id).await?, None);
    assert_eq!(store.session_message_count(first.id).await?, len);
    Ok(())
}

async fn spending_adds_up_by_batch_and_by_tenant(store: TestStore) -> TestResult {
    let session = session()?;
    store.create_session(&session, &history()?, None).await?;
    let budget = Budget {
        usd: Some(2.5),
        tokens: Some(1_000_000),
    };
    let fx = fork(&session, 4, 2)?;
    let extras = BatchExtras {
        budget,
        ..BatchExtras::default()
    };
    store
        .create_fork_batch(
            &fx.batch,
            std::slice::from_ref(&fx.parent_results),
            &fx.children,
            &extras,
        )
        .await?;
    assert_eq!(store.batch_budget(fx.batch.id).await?, budget);
    let unbounded = fork(&session, 6, 1)?;
    store
        .create_fork_batch(
            &unbounded.batch,
            std::slice::from_ref(&unbounded.parent_results),
            &unbounded.children,
            &BatchExtras::default(),
        )
        .await?;
    assert_eq!(
        store.batch_budget(unbounded.batch.id).await?,
        Budget::default()
    );
    let missing = store.batch_budget(forkd_core::BatchId::new()).await;
    assert!(
        matches!(missing, Err(StoreError::NotFound { kind: "batch", .. })),
        "{missing:?}"
    );

    let nothing = store.spend(SpendScope::Batch(fx.batch.id)).await?;
    assert_eq!((nothing.usd, nothing.tokens), (0.0, 0));
    for (i, child) in fx.children.iter().chain(&unbounded.children).enumerate() {
        let i = u64::try_from(i)? + 1;
        let record = forkd_store::RequestRecord {
            id: forkd_core::RequestId::new(),
            agent_id: child.agent.id,
            session_id: session.id,
            batch_id: child.agent.batch_id,
            turn: 0,
            model: "claude-test-1".into(),
            usage: forkd_core::Usage {
                input_tokens: i,
                cache_creation_input_tokens: 10 * i,
                cache_read_input_tokens: 100 * i,
                output_tokens: 1000 * i,
            },
            cost_usd: 0.25,
            prefix_fingerprint: "sha256:abc".into(),
            prefix_parts: vec![],
            message_count: None,
            body_bytes: 1,
            first_token_ms: None,
            stop_reason: None,
            sent_at_ms: None,
            created_at_ms: 1,
        };
        store.record_request(&record).await?;
    }
    let batch = store.spend(SpendScope::Batch(fx.batch.id)).await?;
    assert!((batch.usd - 0.5).abs() < 1e-12);
    assert_eq!(batch.tokens, 1111 * 3);
    let tenant = store.spend(SpendScope::Tenant("local")).await?;
    assert!((tenant.usd - 0.75).abs() < 1e-12);
    assert_eq!(tenant.tokens, 1111 * 6);
    let other = store.spend(SpendScope::Tenant("other")).await?;
    assert_eq!((other.usd, other.tokens), (0.0, 0));
    Ok(())
}

async fn workspaces_are_listed_once_each(store: TestStore) -> TestResult {
    assert!(store.workspaces().await?.is_empty());
    for (tenant, dir) in [
        ("local", "/srv/b"),
        ("local", "/srv/a"),
        ("local", "/srv/b"),
        ("ci", "/srv/a-z"),
    ] {
        let mut s = session()?;
        s.workspace = dir.into();
        s.tenant = tenant.into();
        store.create_session(&s, &[], None).await?;
    }
    assert_eq!(
        store.workspaces().await?,
        [("local", "/srv/a"), ("ci", "/srv/a-z"), ("local", "/srv/b")]
            .map(|(t, w)| (t.to_owned(), std::path::PathBuf::from(w)))
    );
    Ok(())
}

async fn a_client_batch_reports_with_one_digest_when_its_last_child_ends(
    store: TestStore,
) -> TestResult {
    let session = session()?;
    store.create_session(&session, &history()?, None).await?;
    // A client's batch may not fork past the transcript's end...
    let ahead = client_fork(&session, 5, 1)?;
    let refused = store
        .create_fork_batch(
            &ahead.batch,
            std::slice::from_ref(&ahead.parent_results),
            &ahead.children,
            &BatchExtras::default(),
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::Conflict(_))),
        "{refused:?}"
    );
    // ...but may fork before it (a finished turn, while a later one is in flight).
    // With an output schema, which the batch's row keeps beside its shared blocks.
    let mut fx = client_fork(&session, 3, 3)?;
    let schema = forkd_core::output::OutputSchema::parse(r#"{"type":"object","required":["v"]}"#)?;
    fx.batch = fx.batch.clone().with_output_schema(Some(schema));
    fx.batch.trace_parent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
    store
        .create_fork_batch(
            &fx.batch,
            std::slice::from_ref(&fx.parent_results),
            &fx.children,
            &BatchExtras::default(),
        )
        .await?;
    assert_eq!(store.get_batch(fx.batch.id).await?, Some(fx.batch.clone()));
    let transcript = store.session_messages(session.id, None).await?;
    assert_eq!(transcript.len(), 5);
    assert_eq!(transcript[4].message, fx.parent_results);

    let statuses = [
        NotificationStatus::Completed,
        NotificationStatus::Failed,
        NotificationStatus::Killed,
    ];
    for (i, (child, status)) in fx.children.iter().zip(statuses).enumerate() {
        finish(
            &*store,
            &ended(&child.agent, status, 500 + i64::try_from(i)?),
            None,
        )
        .await?;
        let len = store.session_message_count(session.id).await?;
        if i < 2 {
            assert_eq!(len, 5, "no digest while a child is live");
        } else {
            assert_eq!(len, 6, "one digest once the last child ended");
        }
    }
    let digest = store
        .session_messages_from(session.id, 5, None)
        .await?
        .pop()
        .ok_or("no digest")?;
    let text = digest.message.text();
    assert!(text.contains("<batch-notification>"), "{text}");
    assert!(
        text.contains("3 children: 1 completed, 1 failed, 1 killed"),
        "{text}"
    );
    assert_eq!(digest.created_at_ms, 502);
    Ok(())
}

fn branch_of(origin: &forkd_core::session::Session, point: u64) -> forkd_core::session::Session {
    forkd_core::session::Session {
        id: SessionId::new(),
        branch: Some(forkd_core::branch::Branch {
            origin: origin.id,
            point,
            compacted_to: None,
        }),
        created_at_ms: origin.created_at_ms + 1,
        ..origin.clone()
    }
}

/// Messages as stored, without their times.
async fn transcript(store: &TestStore, id: SessionId) -> TestResult<Vec<(u64, Message, bool)>> {
    Ok(store
        .session_messages(id, None)
        .await?
        .into_iter()
        .map(|m| (m.seq, m.message, m.starts_turn))
        .collect())
}

async fn a_branch_reads_its_origins_transcript_to_its_point_then_its_own(
    store: TestStore,
) -> TestResult {
    let origin = session()?;
    let first = history()?;
    store.create_session(&origin, &first, None).await?;
    let parent = main_loop(&origin);
    store.insert_agent(&parent, None, None).await?;
    let lease = store.claim_agent(parent.id).await?;
    let len = u64::try_from(first.len())?;
    // Two turns: a user's message each, and a reply.
    let one = store
        .append_user_message(&lease, origin.id, &text(true, "one"), None, 2)
        .await?;
    store
        .append_turn(&lease, origin.id, &[text(false, "ok one")], &[], None, 3)
        .await?;
    let two = store
        .append_user_message(&lease, origin.id, &text(true, "two"), None, 4)
        .await?;
    store
        .append_turn(&lease, origin.id, &[text(false, "ok two")], &[], None, 5)
        .await?;
    assert_eq!((one, two), (len, len + 2));
    assert_eq!(store.session_turns(origin.id).await?, vec![one, two]);

    // Branched before turn 2's message: the origin's first `two` messages are its history.
    let branch = branch_of(&origin, two);
    store.create_branch(&branch, None).await?;
    assert_eq!(store.get_session(branch.id).await?, Some(branch.clone()));
    let origin_messages = transcript(&store, origin.id).await?;
    let inherited: Vec<_> = origin_messages[..usize::try_from(two)?].to_vec();
    assert_eq!(transcript(&store, branch.id).await?, inherited);
    assert_eq!(store.session_message_count(branch.id).await?, two);
    assert_eq!(store.session_turns(branch.id).await?, vec![one]);

    // Its own turn goes on from the point, and the origin's later messages stay the origin's.
    let branch_loop = main_loop(&branch);
    store.insert_agent(&branch_loop, None, None).await?;
    let branch_lease = store.claim_agent(branch_loop.id).await?;
    let other = store
        .append_user_message(
            &branch_lease,
            branch.id,
            &text(true, "two, differently"),
            None,
            6,
        )
        .await?;
    store
        .append_turn(&branch_lease, branch.id, &[text(false, "ok")], &[], None, 7)
        .await?;
    assert_eq!(other, two);
    store
        .append_user_message(&lease, origin.id, &text(true, "three"), None, 8)
        .await?;
    let mine = transcript(&store, branch.id).await?;
    assert_eq!(mine.len(), usize::try_from(two + 2)?);
    assert_eq!(mine[..inherited.len()], inherited[..]);
    assert_eq!(mine[inherited.len()].1, text(true, "two, differently"));
    assert_eq!(store.session_turns(branch.id).await?, vec![one, two]);
    assert_eq!(
        store
            .session_messages_from(branch.id, one, Some(two + 1))
            .await?
            .len(),
        usize::try_from(two + 1 - one)?
    );

    // A branch of the branch, after its turn: three sessions' messages, in order.
    let grandchild = branch_of(&branch, two + 2);
    store.create_branch(&grandchild, None).await?;
    assert_eq!(transcript(&store, grandchild.id).await?, mine);
    assert_eq!(store.session_turns(grandchild.id).await?, vec![one, two]);

    // A branch of the branch at a point the branch inherited: the origin's messages up to it.
    let early = branch_of(&branch, one);
    store.create_branch(&early, None).await?;
    assert_eq!(
        transcript(&store, early.id).await?,
        origin_messages[..usize::try_from(one)?].to_vec()
    );
    assert_eq!(store.session_turns(early.id).await?, Vec::<u64>::new());

    // Each origin lists its own branches only.
    let listed: Vec<SessionId> = store
        .branches(origin.id)
        .await?
        .iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(listed, vec![branch.id]);
    let listed: Vec<SessionId> = store
        .branches(branch.id)
        .await?
        .iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(listed, vec![grandchild.id, early.id]);

    // A branch with a system prompt of its own (another workspace) keeps it.
    let mut moved = branch_of(&origin, one);
    moved.params.system = forkd_core::session::RenderedSystem::from_stored(
        "You help.\n<env>\nWorking directory: /b\n",
    );
    store.create_branch(&moved, None).await?;
    assert_eq!(store.get_session(moved.id).await?, Some(moved));
    Ok(())
}

async fn a_branch_is_refused_past_its_origins_end_and_without_its_origin(
    store: TestStore,
) -> TestResult {
    let origin = session()?;
    store.create_session(&origin, &history()?, None).await?;
    let len = u64::try_from(history()?.len())?;
    let past = branch_of(&origin, len + 1);
    assert!(matches!(
        store.create_branch(&past, None).await,
        Err(StoreError::Conflict(_))
    ));
    let orphan = branch_of(&session()?, 1);
    assert!(matches!(
        store.create_branch(&orphan, None).await,
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(store.get_session(past.id).await?, None);
    // At its end is fine, and an idempotency key is stored with it.
    let at_end = branch_of(&origin, len);
    let record = key(
        IdempotentCall::CreateSession,
        "branch-1",
        at_end.id.to_string(),
    );
    store.create_branch(&at_end, Some(&record)).await?;
    assert_eq!(
        store
            .idempotency_key("local", "branch-1")
            .await?
            .map(|r| r.resource_id),
        Some(at_end.id.to_string())
    );
    Ok(())
}
