//! The store's sessions and fork batches, on both backends: byte-exact round trips, pagination
//! and the fork batch's transcript check.

mod support;

use forkd_core::agent::Directive;
use forkd_core::{AgentId, AgentState, Message, Role, SessionId};
use forkd_store::{SqliteStore, Store, StoreError};
use support::{TestResult, TestStore, conformance, fork, history, seeded, session};

conformance!(
    sessions_and_transcripts_round_trip_byte_for_byte,
    sessions_page_in_creation_order,
    a_fork_batch_stores_its_shared_prefix_once_and_its_children,
    a_fork_batch_conflicts_when_the_transcript_moved_on,
    other_agents_can_be_inserted_beside_the_trait,
);

async fn sessions_and_transcripts_round_trip_byte_for_byte(store: TestStore) -> TestResult {
    let session = session()?;
    let history = history()?;
    store.create_session(&session, &history, None).await?;

    let back = store
        .get_session(session.id)
        .await?
        .ok_or("session missing")?;
    assert_eq!(back, session);
    assert_eq!(back.params.system.as_str(), session.params.system.as_str());
    assert_eq!(
        back.params.tools.raw().as_str(),
        session.params.tools.raw().as_str()
    );

    let stored = store.session_messages(session.id, None).await?;
    assert_eq!(stored.len(), history.len());
    for (i, (s, m)) in stored.iter().zip(&history).enumerate() {
        assert_eq!(s.seq, u64::try_from(i)?);
        assert_eq!(&s.message, m);
        assert_eq!(s.message.content_json(), m.content_json());
        assert_eq!(s.created_at_ms, session.created_at_ms);
    }
    assert_eq!(store.session_message_count(session.id).await?, 4);
    let first_two = store.session_messages(session.id, Some(2)).await?;
    assert_eq!(first_two.len(), 2);

    assert_eq!(store.get_session(SessionId::new()).await?, None);
    assert!(matches!(
        store.session_message_count(SessionId::new()).await,
        Err(StoreError::NotFound {
            kind: "session",
            ..
        })
    ));
    assert!(matches!(
        store.create_session(&session, &[], None).await,
        Err(StoreError::Conflict(_))
    ));
    store.check_integrity().await?;
    Ok(())
}

async fn sessions_page_in_creation_order(store: TestStore) -> TestResult {
    let mut ids = Vec::new();
    for _ in 0..5 {
        let s = session()?;
        store.create_session(&s, &[], None).await?;
        ids.push(s.id);
    }
    let page = |after, limit| {
        let store = store.clone();
        async move {
            let sessions = store.list_sessions(None, after, limit).await?;
            Ok::<_, StoreError>(sessions.into_iter().map(|s| s.id).collect::<Vec<_>>())
        }
    };
    assert_eq!(page(None, 0).await?, ids);
    assert_eq!(page(None, 2).await?, ids[..2]);
    assert_eq!(page(Some(ids[1]), 2).await?, ids[2..4]);
    assert_eq!(page(Some(ids[4]), 2).await?, Vec::<SessionId>::new());
    Ok(())
}

async fn a_fork_batch_stores_its_shared_prefix_once_and_its_children(
    store: TestStore,
) -> TestResult {
    let (session, fx) = seeded(&*store, 3).await?;

    let batch = store.get_batch(fx.batch.id).await?.ok_or("batch missing")?;
    assert_eq!(batch, fx.batch);
    for (a, b) in batch
        .shared_user_blocks
        .iter()
        .zip(&fx.batch.shared_user_blocks)
    {
        assert_eq!(a.raw().as_str(), b.raw().as_str());
    }
    assert_eq!(
        batch.assistant().map(Message::content_json),
        fx.batch.assistant().map(Message::content_json)
    );

    // The parent's transcript gained A at the fork point, then the results.
    let transcript = store.session_messages(session.id, None).await?;
    assert_eq!(transcript.len(), 6);
    assert_eq!(Some(&transcript[4].message), fx.batch.assistant());
    assert_eq!(transcript[5].message, fx.parent_results);
    assert_eq!(transcript[5].message.role, Role::User);

    for child in &fx.children {
        let agent = store
            .get_agent(child.agent.id)
            .await?
            .ok_or("agent missing")?;
        // Stored as given, and held by the daemon that created it (see `leases.rs`).
        let held = forkd_core::Agent {
            held_by: Some(store.holder().daemon),
            throttled_since_ms: None,
            ..child.agent.clone()
        };
        assert_eq!(agent, held);
        let block = store.agent_directive_block(child.agent.id).await?;
        assert_eq!(
            block.map(|b| b.raw().as_str().to_owned()),
            Some(child.directive_block.raw().as_str().to_owned())
        );
    }
    assert_eq!(store.agent_directive_block(AgentId::new()).await?, None);
    Ok(())
}

async fn a_fork_batch_conflicts_when_the_transcript_moved_on(store: TestStore) -> TestResult {
    let session = session()?;
    store.create_session(&session, &history()?, None).await?;

    let stale = fork(&session, 3, 2)?;
    let err = store
        .create_fork_batch(
            &stale.batch,
            std::slice::from_ref(&stale.parent_results),
            &stale.children,
            &forkd_store::BatchExtras::default(),
        )
        .await;
    assert!(matches!(err, Err(StoreError::Conflict(_))), "{err:?}");
    // Nothing of the failed batch was written.
    assert_eq!(store.session_message_count(session.id).await?, 4);
    assert_eq!(store.get_batch(stale.batch.id).await?, None);
    assert_eq!(store.get_agent(stale.children[0].agent.id).await?, None);

    let mut orphan = fork(&session, 4, 1)?;
    orphan.batch.session_id = SessionId::new();
    let err = store
        .create_fork_batch(
            &orphan.batch,
            std::slice::from_ref(&orphan.parent_results),
            &orphan.children,
            &forkd_store::BatchExtras::default(),
        )
        .await;
    assert!(
        matches!(
            err,
            Err(StoreError::NotFound {
                kind: "session",
                ..
            })
        ),
        "{err:?}"
    );

    // A second batch at the same point, after the first one landed, is stale too.
    let first = fork(&session, 4, 1)?;
    store
        .create_fork_batch(
            &first.batch,
            std::slice::from_ref(&first.parent_results),
            &first.children,
            &forkd_store::BatchExtras::default(),
        )
        .await?;
    let racing = fork(&session, 4, 1)?;
    let err = store
        .create_fork_batch(
            &racing.batch,
            std::slice::from_ref(&racing.parent_results),
            &racing.children,
            &forkd_store::BatchExtras::default(),
        )
        .await;
    assert!(matches!(err, Err(StoreError::Conflict(_))), "{err:?}");
    Ok(())
}

async fn other_agents_can_be_inserted_beside_the_trait(store: TestStore) -> TestResult {
    let session = session()?;
    store.create_session(&session, &[], None).await?;
    let typed = forkd_core::Agent {
        directive: Some(Directive {
            description: "explore".into(),
            prompt: "Map the crate.".into(),
        }),
        ..forkd_core::Agent::new(
            AgentId::new(),
            session.id,
            forkd_core::AgentKind::Typed,
            AgentState::Running,
            1,
        )
    };
    let own = forkd_store::AgentParams {
        params: forkd_core::session::CacheSafeParams {
            model: "claude-haiku-4-5".into(),
            system: forkd_core::session::RenderedSystem::from_stored("You explore. ünï 🦀\n"),
            tools: forkd_core::session::ToolsJson::from_stored(r#"[{"name":"Read"}]"#)?,
            thinking: None,
            max_tokens: 4096,
        },
        permission_mode: forkd_core::session::PermissionMode::Plan,
        output_schema: Some(forkd_core::output::OutputSchema::parse(
            r#"{"type":"object","properties":{"verdict":{"enum":["pass","fail"]}}}"#,
        )?),
    };
    store
        .insert_agent(
            &typed,
            Some(&forkd_core::Block::text("Map the crate.")),
            Some(&own),
        )
        .await?;
    let held = forkd_core::Agent {
        held_by: Some(store.holder().daemon),
        throttled_since_ms: None,
        ..typed.clone()
    };
    assert_eq!(store.get_agent(typed.id).await?, Some(held));
    assert_eq!(store.agent_params(typed.id).await?, Some(own));
    assert_eq!(store.agent_params(AgentId::new()).await?, None);
    assert!(matches!(
        store.insert_agent(&typed, None, None).await,
        Err(StoreError::Conflict(_))
    ));

    // A typed agent of a session that does not exist is refused.
    let mut orphan = typed.clone();
    orphan.id = AgentId::new();
    orphan.session_id = SessionId::new();
    assert!(matches!(
        store.insert_agent(&orphan, None, None).await,
        Err(StoreError::NotFound {
            kind: "session",
            ..
        })
    ));

    let fx = fork(&session, 0, 1)?;
    store
        .create_fork_batch(
            &fx.batch,
            std::slice::from_ref(&fx.parent_results),
            &fx.children,
            &forkd_store::BatchExtras::default(),
        )
        .await?;
    assert_eq!(store.session_message_count(session.id).await?, 2);
    Ok(())
}

/// SQLite only: a store in memory (the engine's unit tests use one) behaves like one on a file.
#[tokio::test]
async fn an_in_memory_sqlite_store_takes_a_batch() -> TestResult {
    let store = SqliteStore::open_in_memory().await?;
    let session = session()?;
    store.create_session(&session, &[], None).await?;
    let fx = fork(&session, 0, 2)?;
    store
        .create_fork_batch(
            &fx.batch,
            std::slice::from_ref(&fx.parent_results),
            &fx.children,
            &forkd_store::BatchExtras::default(),
        )
        .await?;
    assert_eq!(store.session_message_count(session.id).await?, 2);
    assert_eq!(store.get_batch(fx.batch.id).await?, Some(fx.batch));
    store.integrity_check().await?;
    Ok(())
}
