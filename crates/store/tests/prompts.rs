//! Permission prompts: stored while their agent waits, open to any daemon's clients while the
//! asking daemon holds the agent, answered once; "allow always" stored with the session.

mod support;

use std::time::Duration;

use forkd_core::PromptId;
use forkd_core::prompt::{PermissionAnswer, PermissionPrompt};
use forkd_core::session::Session;
use forkd_core::store::Wakeup;
use forkd_store::StoreError;
use support::{Backend, TestResult, TestStore, conformance, seeded};

conformance!(
    a_prompt_is_open_to_every_daemon_and_answered_once,
    a_dead_daemons_prompts_are_closed,
);

const LONG: Duration = Duration::from_secs(600);
const SHORT: Duration = Duration::from_millis(100);

fn prompt(session: &Session, agent: forkd_core::AgentId, tool: &str) -> PermissionPrompt {
    PermissionPrompt {
        id: PromptId::new(),
        session_id: session.id,
        agent_id: agent,
        tool: tool.to_owned(),
        input_json: r#"{"command":"make"}"#.to_owned(),
        question: format!("Allow {tool}?"),
    }
}

async fn next_wakeup(wakeups: &mut Box<dyn forkd_core::store::Wakeups>) -> TestResult<Wakeup> {
    // Notifications of other tests' stores do not reach this database's listeners; only ours.
    Ok(tokio::time::timeout(Duration::from_secs(10), wakeups.next()).await??)
}

async fn a_prompt_is_open_to_every_daemon_and_answered_once(store: TestStore) -> TestResult {
    let a = store.daemon_with_lease(LONG).await?;
    let b = store.daemon_with_lease(LONG).await?;
    let mut heard = b.listen().await?;
    assert_eq!(heard.is_some(), store.backend() == Backend::Postgres);
    let (session, fx) = seeded(&*a, 1).await?;
    let child = fx.children[0].agent.id;
    let lease = a.claim_agent(child).await?;

    // A's agent asks; B's clients see it.
    let asked = prompt(&session, child, "Bash");
    a.insert_prompt(&lease, &asked).await?;
    assert_eq!(b.open_prompts(session.id).await?, vec![asked.clone()]);
    assert_eq!(b.prompt(asked.id).await?, Some((asked.clone(), None)));
    if let Some(heard) = &mut heard {
        assert_eq!(next_wakeup(heard).await?, Wakeup::Prompt(asked.id));
    }

    // Answered through B, once: A reads the answer, and the tool is allowed from now on.
    assert!(!a.tool_always_allowed(session.id, "Bash").await?);
    assert_eq!(
        b.answer_prompt(asked.id, &PermissionAnswer::AllowAlways)
            .await?,
        asked
    );
    if let Some(heard) = &mut heard {
        assert_eq!(next_wakeup(heard).await?, Wakeup::Answer(asked.id));
    }
    let again = b
        .answer_prompt(asked.id, &PermissionAnswer::AllowOnce)
        .await;
    assert!(
        matches!(again, Err(StoreError::NotFound { .. })),
        "{again:?}"
    );
    assert!(b.open_prompts(session.id).await?.is_empty());
    assert_eq!(
        a.prompt(asked.id).await?,
        Some((asked.clone(), Some(PermissionAnswer::AllowAlways)))
    );
    assert!(a.tool_always_allowed(session.id, "Bash").await?);
    assert!(!a.tool_always_allowed(session.id, "Write").await?);
    a.close_prompt(asked.id).await?;
    assert_eq!(a.prompt(asked.id).await?, None);

    // A denial keeps its reason; prompts come back oldest first.
    let first = prompt(&session, child, "Write");
    let second = prompt(&session, child, "Edit");
    a.insert_prompt(&lease, &first).await?;
    tokio::time::sleep(Duration::from_millis(2)).await;
    a.insert_prompt(&lease, &second).await?;
    assert_eq!(
        b.open_prompts(session.id).await?,
        vec![first.clone(), second.clone()]
    );
    let deny = PermissionAnswer::Deny(Some("not on main".to_owned()));
    b.answer_prompt(second.id, &deny).await?;
    assert_eq!(a.prompt(second.id).await?, Some((second, Some(deny))));
    assert!(!a.tool_always_allowed(session.id, "Edit").await?);
    assert_eq!(b.open_prompts(session.id).await?, vec![first]);

    // A run another claim superseded asks nothing.
    let newer = a.claim_agent(child).await?;
    assert!(newer.generation > lease.generation);
    let stale = a
        .insert_prompt(&lease, &prompt(&session, child, "Bash"))
        .await;
    assert!(
        matches!(stale, Err(StoreError::Superseded { .. })),
        "{stale:?}"
    );
    Ok(())
}

async fn a_dead_daemons_prompts_are_closed(store: TestStore) -> TestResult {
    let dead = store.daemon_with_lease(SHORT).await?;
    let (session, fx) = seeded(&*dead, 1).await?;
    let child = fx.children[0].agent.id;
    let lease = dead.claim_agent(child).await?;
    let asked = prompt(&session, child, "Bash");
    dead.insert_prompt(&lease, &asked).await?;
    // The daemon dies (its lease runs out; on SQLite the next daemon's start ends it).
    tokio::time::sleep(3 * SHORT).await;
    let next = store.daemon_with_lease(LONG).await?;
    assert!(next.open_prompts(session.id).await?.is_empty());
    let late = next
        .answer_prompt(asked.id, &PermissionAnswer::AllowOnce)
        .await;
    assert!(matches!(late, Err(StoreError::NotFound { .. })), "{late:?}");
    assert!(!next.tool_always_allowed(session.id, "Bash").await?);

    // The adopting daemon asks again: its prompt is the only one left.
    let adopted = next.claim_agent(child).await?;
    let again = prompt(&session, child, "Bash");
    next.insert_prompt(&adopted, &again).await?;
    assert_eq!(next.prompt(asked.id).await?, None);
    assert_eq!(next.open_prompts(session.id).await?, vec![again]);
    Ok(())
}
