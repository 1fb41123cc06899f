//! A full disk, injected with SQLite's `max_page_count` (the daemon's `page_limit`): the daemon
//! says so (`RESOURCE_EXHAUSTED`, its health `NOT_SERVING`), its running agents stop where they
//! stand and resume by themselves once space returns, with nothing lost or repeated, and no
//! restart. And `min_free_disk` refuses new work while running agents go on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use forkd_core::BlockKind;
use forkd_engine::MinFreeDisk;
use forkd_proto::v1 as pb;
use forkd_proto::v1::forkd_client::ForkdClient;
use forkd_test_support::{
    ServingStatus, TestDaemon, create_session, eventually, fork, get_agent, hear_each_once,
    serving_status, spawn_daemon_with, trusted_session_request,
};
use tonic::Code;
use tonic::transport::Channel;

const DEADLINE: Duration = Duration::from_secs(30);
const CHILDREN: usize = 3;

/// A daemon whose free-space check is off: the fault here is injected, not the machine's.
async fn daemon() -> TestDaemon {
    spawn_daemon_with(|c| c.engine.min_free_disk = MinFreeDisk::Bytes(0))
        .await
        .unwrap()
}

/// The daemon's health, as a load balancer asks it.
async fn health(daemon: &TestDaemon) -> ServingStatus {
    serving_status(&daemon.addr()).await.unwrap()
}

async fn health_becomes(daemon: &TestDaemon, want: ServingStatus) {
    eventually(DEADLINE, format!("the health to be {want:?}"), || async {
        health(daemon).await == want
    })
    .await;
}

/// A workspace holding `big.txt`, a file whose content takes pages to store, and a session on it.
async fn big_workspace(client: &mut ForkdClient<Channel>) -> (tempfile::TempDir, pb::Session) {
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(
        workspace.path().join("big.txt"),
        "0123456789abcdef ".repeat(1_500) + "\n",
    )
    .unwrap();
    let session = create_session(client, trusted_session_request(workspace.path()))
        .await
        .unwrap();
    (workspace, session)
}

/// A session request whose context alone needs new pages.
fn bulky_session(workspace: &Path) -> pb::CreateSessionRequest {
    let mut request = trusted_session_request(workspace);
    request.context_files.push(pb::ContextFile {
        path: "bulk.md".into(),
        content: "bulk ".repeat(60_000),
    });
    request
}

fn fill(daemon: &TestDaemon) {
    // SQLite keeps the database's size now when the cap is below it: nothing more may grow it.
    daemon.daemon().unwrap().page_limit.as_ref().unwrap().set(1);
}

fn give_space_back(daemon: &TestDaemon) {
    daemon.daemon().unwrap().page_limit.as_ref().unwrap().lift();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_database_is_resource_exhausted_and_recovers_without_a_restart() {
    let daemon = daemon().await;
    let mut client = daemon.client().await.unwrap();
    let workspace = tempfile::tempdir().unwrap();
    assert_eq!(health(&daemon).await, ServingStatus::Serving);
    let session = create_session(&mut client, trusted_session_request(workspace.path()))
        .await
        .unwrap();

    fill(&daemon);
    let refused = client
        .create_session(bulky_session(workspace.path()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let msg = refused.message();
    assert!(
        msg.starts_with("forkd's database is out of disk space (")
            && msg.contains("free on the filesystem holding")
            && msg.contains("forkd.db"),
        "{msg}"
    );
    health_becomes(&daemon, ServingStatus::NotServing).await;
    // Still failing: the probe cannot write either.
    let again = client
        .create_session(bulky_session(workspace.path()))
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::ResourceExhausted);

    give_space_back(&daemon);
    health_becomes(&daemon, ServingStatus::Serving).await;
    let created = create_session(&mut client, bulky_session(workspace.path()))
        .await
        .unwrap();
    assert_ne!(created.session_id, session.session_id);
    assert_eq!(daemon.daemon().unwrap().engine.store().fault(), None);
}

/// A child's script: three reads of a file big enough that storing each result needs new pages,
/// each after a slow reply.
fn script(i: usize) -> String {
    let read = "@sim tool Read {\"file_path\":\"big.txt\"}";
    format!(
        "Part {i}.\n{read}\n@sim sleep 300ms\n{read}\n@sim sleep 300ms\n{read}\n\
         @sim sleep 200ms\n@sim say part {i} done"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_stops_while_its_database_is_full_and_completes_once_space_returns() {
    let daemon = daemon().await;
    let mut client = daemon.client().await.unwrap();
    let (_workspace, session) = big_workspace(&mut client).await;
    let heard = hear_each_once(
        daemon.client().await.unwrap(),
        session.session_id.clone(),
        CHILDREN,
        DEADLINE,
    );
    let prompts: Vec<String> = (0..CHILDREN).map(script).collect();
    let prompts: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let batch = fork(&mut client, &session.session_id, &prompts, None)
        .await
        .unwrap();
    let followed: Vec<_> = batch
        .agent_ids
        .iter()
        .map(|id| (id.clone(), follow(client.clone(), id.clone())))
        .collect();
    let store = daemon.daemon().unwrap().engine.store().clone();

    // Once each child has stored its first read, the disk fills.
    for id in &batch.agent_ids {
        let id: forkd_core::AgentId = id.parse().unwrap();
        eventually(DEADLINE, "each child to have read once", || {
            let store = store.clone();
            async move { store.agent_messages(id).await.unwrap().len() >= 3 }
        })
        .await;
    }
    fill(&daemon);
    health_becomes(&daemon, ServingStatus::NotServing).await;
    // Every child stops (its attached client hears it): its next result cannot be stored. It
    // stays running, and none ends.
    eventually(DEADLINE, "every child to stop", || {
        let followed = &followed;
        async move { followed.iter().all(|(_, events)| events.interrupted()) }
    })
    .await;
    for id in &batch.agent_ids {
        let agent = get_agent(&mut client, id).await;
        assert_eq!(agent.state, pb::AgentState::Running as i32, "{agent:?}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !heard.is_finished(),
        "no child may end while the disk is full"
    );

    give_space_back(&daemon);
    let heard = heard.await.unwrap();
    assert_eq!(heard.len(), CHILDREN, "{heard:?}");
    let mut ids: Vec<&str> = heard.iter().map(|n| n.agent_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), CHILDREN, "a child ended twice: {heard:?}");
    assert!(
        heard
            .iter()
            .all(|n| n.status == pb::NotificationStatus::Completed as i32),
        "{heard:?}"
    );
    assert_eq!(health(&daemon).await, ServingStatus::Serving);

    // Each transcript has no gap and alternates, and every read has its one result.
    for id in &batch.agent_ids {
        let stored = store.agent_messages(id.parse().unwrap()).await.unwrap();
        let seqs: Vec<u64> = stored.iter().map(|m| m.seq).collect();
        let first = seqs[0];
        assert_eq!(
            seqs,
            (first..first + seqs.len() as u64).collect::<Vec<_>>(),
            "{id}"
        );
        let roles: Vec<forkd_core::Role> = stored.iter().map(|m| m.message.role).collect();
        assert!(roles.windows(2).all(|w| w[0] != w[1]), "{id}: {roles:?}");
        let results: usize = stored
            .iter()
            .flat_map(|m| &m.message.blocks)
            .filter(|b| matches!(b.kind(), BlockKind::ToolResult { .. }))
            .count();
        assert_eq!(results, 3, "{id}: {roles:?}");
    }

    // Each attached client heard its child stop, then run again, then end.
    for (id, events) in followed {
        let order = events.finish().await;
        assert_eq!(order, ["interrupted", "resumed", "ended"], "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_turn_stops_on_a_full_disk_and_ends_in_the_background_once_space_returns() {
    let daemon = daemon().await;
    let mut client = daemon.client().await.unwrap();
    let (_workspace, session) = big_workspace(&mut client).await;
    let session_id: forkd_core::SessionId = session.session_id.parse().unwrap();
    let store = daemon.daemon().unwrap().engine.store().clone();
    let before = store
        .session_messages(session_id, None)
        .await
        .unwrap()
        .len();
    let mut notes = client
        .subscribe_notifications(pb::SubscribeNotificationsRequest {
            session_id: session.session_id.clone(),
            follow: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut turn = client
        .send_message(pb::SendMessageRequest {
            session_id: session.session_id.clone(),
            text: script(0),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();

    // The message, then the first read's call and result: then the disk fills.
    eventually(DEADLINE, "the turn's first read to be stored", || {
        let store = store.clone();
        async move {
            store
                .session_messages(session_id, None)
                .await
                .unwrap()
                .len()
                >= before + 3
        }
    })
    .await;
    fill(&daemon);
    let refused = loop {
        match tokio::time::timeout(DEADLINE, turn.message())
            .await
            .unwrap()
        {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the turn's stream ended without saying why"),
            Err(status) => break status,
        }
    };
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let parent = daemon
        .daemon()
        .unwrap()
        .engine
        .list_agents(&forkd_store::AgentFilter {
            session_id: Some(session_id),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_iter()
        .find(|a| a.kind == forkd_core::AgentKind::Parent)
        .unwrap();
    assert_eq!(
        parent.state,
        forkd_core::AgentState::Running,
        "the turn waits"
    );

    give_space_back(&daemon);
    let ended = tokio::time::timeout(DEADLINE, notes.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(ended.kind, "turn", "{ended:?}");
    assert_eq!(
        ended.status,
        pb::NotificationStatus::Completed as i32,
        "{ended:?}"
    );
    let transcript = store.session_messages(session_id, None).await.unwrap();
    let results = transcript
        .iter()
        .flat_map(|m| &m.message.blocks)
        .filter(|b| matches!(b.kind(), BlockKind::ToolResult { .. }))
        .count();
    assert_eq!(results, 3, "each read answered once");
    let last = transcript.last().unwrap().message.text();
    assert!(last.contains("part 0 done"), "{last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_min_free_disk_new_work_is_refused_and_running_agents_go_on() {
    let mut daemon = daemon().await;
    let mut client = daemon.client().await.unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let session = create_session(&mut client, trusted_session_request(workspace.path()))
        .await
        .unwrap();
    let slow = "Slowly.\n@sim sleep 1500ms\n@sim say done slowly";
    let batch = fork(&mut client, &session.session_id, &[slow, slow], None)
        .await
        .unwrap();

    // Restarted mid-batch with a threshold no filesystem meets: the children resume and end.
    daemon
        .restart(|c| c.engine.min_free_disk = MinFreeDisk::Percent(100.0))
        .await
        .unwrap();
    let mut client = daemon.client().await.unwrap();
    let created = client
        .create_session(trusted_session_request(workspace.path()))
        .await
        .unwrap_err();
    let forked = client
        .fork_batch(pb::ForkBatchRequest {
            session_id: session.session_id.clone(),
            directives: forkd_test_support::directives(&["more"]),
            ..Default::default()
        })
        .await
        .unwrap_err();
    let sent = client
        .send_message(pb::SendMessageRequest {
            session_id: session.session_id.clone(),
            text: "hello".into(),
            ..Default::default()
        })
        .await
        .expect_err("the message is refused");
    for refused in [&created, &forked, &sent] {
        assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
        let msg = refused.message();
        assert!(
            msg.contains("free on the filesystem holding") && msg.contains("min_free_disk (100%"),
            "{msg}"
        );
    }
    health_becomes(&daemon, ServingStatus::NotServing).await;
    let done = forkd_test_support::wait_for_batch(&mut client, &batch.batch_id, 2, DEADLINE)
        .await
        .unwrap();
    assert!(
        done.iter()
            .all(|n| n.status == pb::NotificationStatus::Completed as i32),
        "{done:?}"
    );
}

/// An attach stream followed until its agent ends: what it heard of interruptions.
struct Followed {
    interrupted: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<&'static str>>,
}

impl Followed {
    fn interrupted(&self) -> bool {
        self.interrupted.load(Ordering::SeqCst)
    }

    /// `interrupted`, `resumed` and `ended`, in the order the stream told them.
    async fn finish(self) -> Vec<&'static str> {
        self.task.await.unwrap()
    }
}

fn follow(mut client: ForkdClient<Channel>, agent_id: String) -> Followed {
    let interrupted = Arc::new(AtomicBool::new(false));
    let flag = interrupted.clone();
    let task = tokio::spawn(async move {
        let mut stream = client
            .attach(pb::AttachRequest {
                agent_id,
                since_seq: 0,
            })
            .await
            .unwrap()
            .into_inner();
        let mut heard = Vec::new();
        loop {
            let event = tokio::time::timeout(DEADLINE * 2, stream.message())
                .await
                .expect("the attach stream went quiet")
                .unwrap()
                .expect("the attach stream ended before the agent")
                .event
                .unwrap();
            match event {
                pb::agent_event::Event::Interrupted(i) => {
                    assert!(i.reason.contains("out of disk space"), "{i:?}");
                    flag.store(true, Ordering::SeqCst);
                    heard.push("interrupted");
                }
                pb::agent_event::Event::Resumed(_) => heard.push("resumed"),
                pb::agent_event::Event::Ended(_) => {
                    heard.push("ended");
                    return heard;
                }
                pb::agent_event::Event::Message(_) | pb::agent_event::Event::AsyncLaunched(_) => {}
            }
        }
    });
    Followed { interrupted, task }
}
