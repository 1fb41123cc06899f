//! The daemon on PostgreSQL (`database_url`): a parent turn that forks, a client's batch, and a
//! restart, end to end through the real gRPC client, with nothing kept in `FORKD_HOME/forkd.db`.
//! The database is a fresh one on the server `FORKD_TEST_DATABASE_URL` names, dropped at the end;
//! without that variable the test says so and passes, unless `CI` is set.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use forkd::daemon::DatabaseUrl;
use forkd_proto::v1 as pb;
use forkd_test_support::{
    create_session, eventually, fork, run_turn, session_request, session_transcript,
    spawn_daemon_with, turn_text, wait_for_batch,
};

mod binary;
mod pg;

use pg::with_scratch_database;

const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_daemon_on_postgres_forks_restarts_and_keeps_everything() {
    with_scratch_database(forks_restarts_and_keeps_everything).await;
}

async fn forks_restarts_and_keeps_everything(url: String) {
    let database = DatabaseUrl::new(url.clone());
    let with_database = |c: &mut forkd::daemon::DaemonConfig| {
        c.database_url = Some(DatabaseUrl::new(url.clone()));
    };
    let mut daemon = spawn_daemon_with(|c| c.database_url = Some(database))
        .await
        .unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let sid = session.session_id.clone();

    // A parent turn whose reply forks two children, and a client's batch of three.
    let script = concat!(
        "Split the audit in two.\n",
        r#"@sim agent {"description":"audit a","prompt":"Audit part a.\n@sim say a is fine"}"#,
        "\n",
        r#"@sim agent {"description":"audit b","prompt":"Audit part b.\n@sim say b is fine"}"#,
        "\n@sim say forked both",
    );
    let events = run_turn(
        &mut client,
        pb::SendMessageRequest {
            session_id: sid.clone(),
            text: script.to_owned(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let reply = turn_text(&events).unwrap_or_default();
    assert!(reply.contains("forked both"), "{events:?}");
    let turns_batch = events
        .iter()
        .find_map(|e| match e {
            pb::session_event::Event::ForkLaunched(l) => Some(l.batch_id.clone()),
            _ => None,
        })
        .expect("the turn forked");
    let batch = fork(&mut client, &sid, &["audit c", "audit d", "audit e"], None)
        .await
        .unwrap();
    let mut done = wait_for_batch(&mut client, &batch.batch_id, 3, DEADLINE)
        .await
        .unwrap();
    done.extend(
        wait_for_batch(&mut client, &turns_batch, 2, DEADLINE)
            .await
            .unwrap(),
    );
    assert!(
        done.iter()
            .all(|n| n.status == pb::NotificationStatus::Completed as i32),
        "{done:?}"
    );
    let before = session_transcript(&mut client, &sid).await.unwrap();

    // Nothing went to the home's SQLite file: the state is in PostgreSQL, and a restarted daemon
    // (on the same home, the same database) finds all of it.
    assert!(!daemon.home_path().join("forkd.db").exists());
    drop(client);
    daemon.restart(with_database).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let after = session_transcript(&mut client, &sid).await.unwrap();
    assert_eq!(after.len(), before.len());
    assert!(after == before, "the transcript changed across the restart");
    let mut replay = client
        .subscribe_notifications(pb::SubscribeNotificationsRequest {
            session_id: sid.clone(),
            follow: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut replayed = Vec::new();
    while let Some(n) = replay.message().await.unwrap() {
        replayed.push(n);
    }
    // The turn's two children and the client batch's three, once each, in seq order.
    assert_eq!(replayed.len(), 5, "{replayed:?}");
    assert!(replayed.windows(2).all(|w| w[0].seq < w[1].seq));
    drop(client);
    daemon.stop().await.unwrap();
}

#[tokio::test]
async fn a_database_url_that_is_not_postgres_stops_the_start() {
    let result = spawn_daemon_with(|c| {
        c.database_url = Some(DatabaseUrl::new("mysql://root:hunter2@db.example/forkd"));
    })
    .await;
    let err = format!("{:#}", result.err().expect("the daemon started"));
    assert!(err.contains("is not a PostgreSQL URL"), "{err}");
    assert!(err.contains("mysql://root:***@db.example/forkd"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

/// Two real `forkd serve` processes on one database, each on its own home: a client of daemon B
/// sees and kills an agent that daemon A runs; when A is killed with SIGKILL, B adopts A's
/// running children once their leases expire, and each ends exactly once.
#[tokio::test]
async fn two_daemons_share_agents_kill_across_and_adopt_after_a_sigkill() {
    with_scratch_database(share_kill_and_adopt).await;
}

async fn share_kill_and_adopt(url: String) {
    const LEASE: Duration = Duration::from_secs(1);
    let env = [("FORKD_DATABASE_URL", url.as_str()), ("FORKD_LEASE", "1s")];
    let (home_a, home_b, workspace) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let a = binary::Daemon::start_with(home_a.path(), "1", &env);
    let b = binary::Daemon::start_with(home_b.path(), "1", &env);
    let mut on_a = binary::client(home_a.path()).await;
    let mut on_b = binary::client(home_b.path()).await;

    // A batch submitted to A: four children that each list the workspace (a reply that streams
    // over 2 s), then stream a slow final reply.
    let session = create_session(&mut on_a, session_request(workspace.path()))
        .await
        .unwrap();
    let prompts: Vec<String> = (0..4)
        .map(|i| {
            format!(
                "Check part {i}.\n@sim sleep 2s\n@sim tool Glob {{\"pattern\":\"*\"}}\n\
                 @sim sleep 8s\n@sim say part {i} checked"
            )
        })
        .collect();
    let prompts: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let batch = fork(&mut on_a, &session.session_id, &prompts, Some(false))
        .await
        .unwrap();

    // A subscriber on B, from before any child ends: it hears A's notifications live.
    let mut live = on_b
        .subscribe_notifications(pb::SubscribeNotificationsRequest {
            batch_id: batch.batch_id.clone(),
            follow: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let heard = tokio::spawn(async move {
        let mut heard = Vec::new();
        while heard.len() < 4 {
            match tokio::time::timeout(DEADLINE, live.message()).await {
                Ok(Ok(Some(n))) => heard.push(n),
                other => panic!("the live stream on B stopped: {other:?} after {heard:?}"),
            }
        }
        heard
    });

    // B serves the session and its agents too: all four running, on A.
    let agents = eventually(DEADLINE, "A to run the four children", || {
        let mut on_b = on_b.clone();
        let batch_id = batch.batch_id.clone();
        async move {
            let agents = binary::list_batch(&mut on_b, &batch_id).await;
            let running = agents
                .iter()
                .all(|a| a.state == pb::AgentState::Running as i32 && !a.daemon.is_empty());
            (agents.len() == 4 && running).then_some(agents)
        }
    })
    .await;
    let daemon_a = agents[0].daemon.clone();
    assert!(agents.iter().all(|x| x.daemon == daemon_a), "{agents:?}");
    let session_on_b = on_b
        .get_session(pb::GetSessionRequest {
            session_id: session.session_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(session_on_b.session.is_some());

    // Attached through B to a child that A runs: its messages arrive as A stores them, while A
    // still runs it; a background signal given through A reaches the client on B.
    let watched = batch.agent_ids[2].clone();
    let mut attached = on_b
        .attach(pb::AttachRequest {
            agent_id: watched.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(DEADLINE, attached.message())
        .await
        .expect("a message of the attached agent")
        .unwrap()
        .expect("the attach stream ended early");
    assert!(
        matches!(first.event, Some(pb::agent_event::Event::Message(_))),
        "{first:?}"
    );
    assert_eq!(
        forkd_test_support::get_agent(&mut on_b, &watched)
            .await
            .daemon,
        daemon_a
    );
    on_a.background(pb::BackgroundRequest {
        agent_id: watched.clone(),
    })
    .await
    .unwrap();
    let launched = loop {
        let event = tokio::time::timeout(DEADLINE, attached.message())
            .await
            .expect("the background signal through A")
            .unwrap()
            .expect("the attach stream ended without async_launched");
        if let Some(pb::agent_event::Event::AsyncLaunched(l)) = event.event {
            break l;
        }
    };
    assert_eq!(launched.agent_id, watched);

    // Killed through B: A stops it at its next heartbeat.
    let victim = batch.agent_ids[3].clone();
    on_b.kill(pb::KillRequest {
        agent_id: victim.clone(),
    })
    .await
    .unwrap();
    eventually(DEADLINE, "the kill to reach A", || {
        let mut on_b = on_b.clone();
        let victim = victim.clone();
        async move {
            let agent = forkd_test_support::get_agent(&mut on_b, &victim).await;
            (agent.state == pb::AgentState::Killed as i32).then_some(())
        }
    })
    .await;

    // A dies mid-run: B adopts the three others once A's leases expire, and finishes them.
    drop(on_a);
    a.kill9();
    let killed_at = std::time::Instant::now();
    let adopted = eventually(DEADLINE, "B to adopt A's children", || {
        let mut on_b = on_b.clone();
        let batch_id = batch.batch_id.clone();
        let (daemon_a, victim) = (daemon_a.clone(), victim.clone());
        async move {
            let agents = binary::list_batch(&mut on_b, &batch_id).await;
            let moved = agents
                .iter()
                .filter(|x| x.agent_id != victim)
                .all(|x| !x.daemon.is_empty() && x.daemon != daemon_a);
            moved.then_some(agents)
        }
    })
    .await;
    println!(
        "adopted {} children {:.2} s after SIGKILL (lease {} s)",
        adopted.len() - 1,
        killed_at.elapsed().as_secs_f64(),
        LEASE.as_secs()
    );
    let done = wait_for_batch(&mut on_b, &batch.batch_id, 4, DEADLINE)
        .await
        .unwrap();
    let mut ids: Vec<&str> = done.iter().map(|n| n.agent_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 4, "one notification per child: {done:?}");
    for n in &done {
        let expected = if n.agent_id == victim {
            pb::NotificationStatus::Killed
        } else {
            pb::NotificationStatus::Completed
        };
        assert_eq!(n.status, expected as i32, "{n:?}");
    }
    // The subscriber on B heard each end once, in seq order: the kill recorded by A, the others
    // by B after adopting them.
    let heard = heard.await.unwrap();
    assert!(heard.windows(2).all(|w| w[0].seq < w[1].seq), "{heard:?}");
    let mut heard_ids: Vec<&str> = heard.iter().map(|n| n.agent_id.as_str()).collect();
    heard_ids.sort_unstable();
    heard_ids.dedup();
    assert_eq!(heard_ids.len(), 4, "{heard:?}");

    // Each adopted child's transcript holds one final reply: it was not answered twice.
    for id in batch.agent_ids.iter().take(3) {
        // The listing, and the final reply: none answered twice.
        assert_eq!(binary::assistant_replies(&mut on_b, id).await, 2, "{id}");
    }
    drop(on_b);
    drop(b);
}

#[tokio::test]
async fn a_daemon_with_free_slots_takes_pending_children_from_a_busy_one() {
    with_scratch_database(share_out_pending_children).await;
}

async fn share_out_pending_children(url: String) {
    const CHILDREN: usize = 8;
    let common = [("FORKD_DATABASE_URL", url.as_str()), ("FORKD_LEASE", "1s")];
    let busy: Vec<(&str, &str)> = common
        .iter()
        .copied()
        .chain([("FORKD_MAX_RUNNING_AGENTS", "2")])
        .collect();
    let (home_a, home_b, workspace) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let _a = binary::Daemon::start_with(home_a.path(), "1", &busy);
    let _b = binary::Daemon::start_with(home_b.path(), "1", &common);
    let mut on_a = binary::client(home_a.path()).await;
    let mut on_b = binary::client(home_b.path()).await;

    let session = create_session(&mut on_a, session_request(workspace.path()))
        .await
        .unwrap();
    let prompts: Vec<String> = (0..CHILDREN)
        .map(|i| format!("Part {i}.\n@sim sleep 3s\n@sim say part {i} done"))
        .collect();
    let prompts: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let batch = fork(&mut on_a, &session.session_id, &prompts, None)
        .await
        .unwrap();
    let done = wait_for_batch(&mut on_b, &batch.batch_id, CHILDREN, DEADLINE)
        .await
        .unwrap();
    let mut ids: Vec<&str> = done.iter().map(|n| n.agent_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), CHILDREN, "{done:?}");
    assert!(
        done.iter()
            .all(|n| n.status == pb::NotificationStatus::Completed as i32),
        "{done:?}"
    );
    let agents = binary::list_batch(&mut on_b, &batch.batch_id).await;
    let mut by_daemon: std::collections::BTreeMap<&str, usize> = Default::default();
    for agent in &agents {
        *by_daemon.entry(agent.daemon.as_str()).or_default() += 1;
    }
    println!("children per daemon: {by_daemon:?}");
    assert_eq!(
        by_daemon.len(),
        2,
        "both daemons ran children: {by_daemon:?}"
    );
    // One reply each: nobody ran a child twice.
    for id in &batch.agent_ids {
        assert_eq!(binary::assistant_replies(&mut on_b, id).await, 1, "{id}");
    }
}

#[tokio::test]
async fn prompts_answers_and_idempotency_keys_reach_every_daemon() {
    with_scratch_database(prompts_and_keys_across_daemons).await;
}

async fn next_prompt(prompts: &mut tonic::Streaming<pb::PermissionPrompt>) -> pb::PermissionPrompt {
    tokio::time::timeout(DEADLINE, prompts.message())
        .await
        .expect("a permission prompt")
        .unwrap()
        .expect("the prompt stream ended")
}

async fn prompts_and_keys_across_daemons(url: String) {
    let env = [("FORKD_DATABASE_URL", url.as_str()), ("FORKD_LEASE", "1s")];
    let (home_a, home_b, workspace) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let ws = workspace.path();
    // Only A is up when the child starts: A runs it.
    let a = binary::Daemon::start_with(home_a.path(), "0", &env);
    let mut on_a = binary::client(home_a.path()).await;
    let session = create_session(
        &mut on_a,
        pb::CreateSessionRequest {
            permission_mode: "bubble".into(),
            interactive: true,
            ..session_request(ws)
        },
    )
    .await
    .unwrap();
    let script = "Write twice, then run a command.\n\
        @sim tool Write {\"file_path\":\"one.txt\",\"content\":\"1\"}\n\
        @sim tool Write {\"file_path\":\"two.txt\",\"content\":\"2\"}\n\
        @sim tool Bash {\"command\":\"touch three.txt\"}\n\
        @sim say done";
    let batch = fork(&mut on_a, &session.session_id, &[script], None)
        .await
        .unwrap();
    let subscribe = |mut client: binary::Client, session_id: String| async move {
        client
            .subscribe_permissions(pb::SubscribePermissionsRequest { session_id })
            .await
            .unwrap()
            .into_inner()
    };
    let mut prompts_a = subscribe(on_a.clone(), session.session_id.clone()).await;
    let first = next_prompt(&mut prompts_a).await;
    assert_eq!(first.tool_name, "Write");

    // B starts while A's child waits: its client is shown the prompt A's child asked.
    let b = binary::Daemon::start_with(home_b.path(), "0", &env);
    let mut on_b = binary::client(home_b.path()).await;
    let mut prompts_b = subscribe(on_b.clone(), session.session_id.clone()).await;
    let replayed = next_prompt(&mut prompts_b).await;
    assert_eq!(replayed.prompt_id, first.prompt_id);
    let runner = forkd_test_support::get_agent(&mut on_b, &batch.agent_ids[0])
        .await
        .daemon;
    assert!(!runner.is_empty());
    assert!(
        !ws.join("one.txt").exists(),
        "the child waits for the answer"
    );

    // Answered through B, "always": A's child goes on, and does not ask for the second Write.
    on_b.answer_permission(pb::AnswerPermissionRequest {
        prompt_id: first.prompt_id.clone(),
        decision: pb::PermissionDecision::AllowAlways as i32,
        reason: String::new(),
    })
    .await
    .unwrap();
    // The Bash prompt reaches both daemons' clients live; B answers it, A no longer can.
    let on_b_bash = next_prompt(&mut prompts_b).await;
    let on_a_bash = next_prompt(&mut prompts_a).await;
    assert_eq!(on_b_bash.tool_name, "Bash", "{on_b_bash:?}");
    assert_eq!(on_a_bash.prompt_id, on_b_bash.prompt_id);
    on_b.answer_permission(pb::AnswerPermissionRequest {
        prompt_id: on_b_bash.prompt_id.clone(),
        decision: pb::PermissionDecision::Deny as i32,
        reason: "not today".into(),
    })
    .await
    .unwrap();
    let again = on_a
        .answer_permission(pb::AnswerPermissionRequest {
            prompt_id: on_b_bash.prompt_id,
            decision: pb::PermissionDecision::AllowOnce as i32,
            reason: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), tonic::Code::NotFound);
    let done = wait_for_batch(&mut on_b, &batch.batch_id, 1, DEADLINE)
        .await
        .unwrap();
    assert_eq!(done[0].status, pb::NotificationStatus::Completed as i32);
    assert!(ws.join("one.txt").exists() && ws.join("two.txt").exists());
    assert!(!ws.join("three.txt").exists());
    assert_eq!(
        forkd_test_support::get_agent(&mut on_b, &batch.agent_ids[0])
            .await
            .daemon,
        runner,
        "the child ran on A throughout"
    );

    // An idempotency key used on A answers on B; racing retries through both make one batch.
    let keyed = |key: &str, text: &str| pb::ForkBatchRequest {
        session_id: session.session_id.clone(),
        directives: vec![pb::Directive {
            prompt: text.to_owned(),
            limits: None,
            ..Default::default()
        }],
        idempotency_key: key.to_owned(),
        ..Default::default()
    };
    let first = on_a
        .fork_batch(keyed("k-1", "@sim say one"))
        .await
        .unwrap()
        .into_inner();
    let retry = on_b
        .fork_batch(keyed("k-1", "@sim say one"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(retry.batch_id, first.batch_id);
    let other = on_b
        .fork_batch(keyed("k-1", "@sim say something else"))
        .await
        .unwrap_err();
    assert_eq!(other.code(), tonic::Code::FailedPrecondition, "{other:?}");
    for round in 0..5 {
        let key = format!("k-race-{round}");
        let (mut x, mut y) = (on_a.clone(), on_b.clone());
        let (ra, rb) = tokio::join!(
            x.fork_batch(keyed(&key, "@sim say raced")),
            y.fork_batch(keyed(&key, "@sim say raced")),
        );
        let (ra, rb) = (ra.unwrap().into_inner(), rb.unwrap().into_inner());
        assert_eq!(ra.batch_id, rb.batch_id, "round {round}");
    }
    drop((on_a, on_b));
    drop((a, b));
}

#[tokio::test]
async fn an_adopted_agent_s_mcp_servers_start_on_the_daemon_that_adopted_it() {
    let Some(python) = forkd_test_support::mcp_python() else {
        return;
    };
    with_scratch_database(|url| adopt_with_mcp(url, python)).await;
}

/// A child of a session with its own MCP server, killed with its daemon (A) in the middle of a
/// call: B adopts it, answers the cut-off call as interrupted (a session's own tools are never
/// read-only), and runs its next call on a server it starts from the sealed definition (both
/// daemons hold the same key).
async fn adopt_with_mcp(url: String, python: String) {
    let (home_a, home_b, workspace) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let key = workspace.path().join("shared.key");
    std::fs::write(&key, format!("{}\n", "5e".repeat(32))).unwrap();
    let env = [
        ("FORKD_DATABASE_URL", url.as_str()),
        ("FORKD_LEASE", "1s"),
        ("FORKD_SECRET_KEY_FILE", key.to_str().unwrap()),
    ];
    let a = binary::Daemon::start_with(home_a.path(), "0", &env);
    let mut on_a = binary::client(home_a.path()).await;
    let own = serde_json::json!({"mcpServers": {"mine": {
        "command": python,
        "args": [forkd_test_support::mcp_fixture().display().to_string(), "stdio"],
        // It writes a marker into the test's workspace, which a sandbox would hide.
        "sandbox": "full-access",
    }}})
    .to_string();
    let ws = workspace.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let session = create_session(
        &mut on_a,
        pb::CreateSessionRequest {
            mcp_config_json: own,
            permission_mode: "bypassPermissions".into(),
            ..session_request(&ws)
        },
    )
    .await
    .unwrap();
    let marker = ws.join("started.txt");
    let sleep = serde_json::json!({"seconds": 600, "marker": marker.display().to_string()});
    let script = format!(
        "Wait, then add.\n@sim tool mcp__mine__sleep {sleep}\n\
         @sim tool mcp__mine__add {{\"a\":20,\"b\":22}}\n@sim say added"
    );
    let batch = fork(&mut on_a, &session.session_id, &[script.as_str()], None)
        .await
        .unwrap();
    eventually(DEADLINE, "the call to start on A", || async {
        marker.exists()
    })
    .await;

    let b = binary::Daemon::start_with(home_b.path(), "0", &env);
    let mut on_b = binary::client(home_b.path()).await;
    let runner = forkd_test_support::get_agent(&mut on_b, &batch.agent_ids[0])
        .await
        .daemon;
    drop(on_a);
    a.kill9();
    let done = wait_for_batch(&mut on_b, &batch.batch_id, 1, DEADLINE)
        .await
        .unwrap();
    assert_eq!(done[0].status, pb::NotificationStatus::Completed as i32);
    let adopted = forkd_test_support::get_agent(&mut on_b, &batch.agent_ids[0]).await;
    assert_ne!(adopted.daemon, runner, "B finished it");
    let log = forkd_test_support::transcript_text(&mut on_b, &batch.agent_ids[0])
        .await
        .unwrap();
    assert!(log.contains("Interrupted: this call was started"), "{log}");
    assert!(log.contains(r#""content":"42""#), "{log}");
    drop(on_b);
    drop(b);
}

#[tokio::test]
async fn a_tenant_s_budget_counts_what_every_daemon_spent() {
    with_scratch_database(budget_across_daemons).await;
}

/// Each daemon's configuration gives the local tenant $0.01; the first child, run through A,
/// spends more than that; a child submitted through B then fails saying the budget is spent.
async fn budget_across_daemons(url: String) {
    let env = [("FORKD_DATABASE_URL", url.as_str()), ("FORKD_LEASE", "1s")];
    let (home_a, home_b, workspace) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    for home in [home_a.path(), home_b.path()] {
        std::fs::write(
            home.join("config.toml"),
            "[tenants.local]\nbudget_usd = 0.01\n",
        )
        .unwrap();
    }
    let a = binary::Daemon::start_with(home_a.path(), "0", &env);
    let b = binary::Daemon::start_with(home_b.path(), "0", &env);
    let mut on_a = binary::client(home_a.path()).await;
    let mut on_b = binary::client(home_b.path()).await;
    let session = create_session(&mut on_a, session_request(workspace.path()))
        .await
        .unwrap();
    let first = fork(&mut on_a, &session.session_id, &["@sim say first"], None)
        .await
        .unwrap();
    let done = wait_for_batch(&mut on_a, &first.batch_id, 1, DEADLINE)
        .await
        .unwrap();
    assert_eq!(done[0].status, pb::NotificationStatus::Completed as i32);

    let second = fork(&mut on_b, &session.session_id, &["@sim say second"], None)
        .await
        .unwrap();
    let done = wait_for_batch(&mut on_b, &second.batch_id, 1, DEADLINE)
        .await
        .unwrap();
    assert_eq!(done[0].status, pb::NotificationStatus::Failed as i32);
    let agent = forkd_test_support::get_agent(&mut on_b, &second.agent_ids[0]).await;
    assert!(
        agent.error.contains("budget") && agent.error.contains("tenant local"),
        "{agent:?}"
    );
    drop((on_a, on_b));
    drop((a, b));
}
