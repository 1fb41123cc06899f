//! Isolated fork children end to end through the daemon (`isolation: copy`): each child edits
//! its own copy of the workspace at the workspace's own path, its "Files changed" comes from
//! the files, and `ApplyChanges` merges the children back in order, leaving a child with a
//! conflict unapplied.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_test_support::{
    create_session, directives, spawn_daemon, transcript_text, trusted_session_request,
    wait_for_batch,
};
use tonic::Code;

const DEADLINE: Duration = Duration::from_secs(60);

type Client = pb::forkd_client::ForkdClient<tonic::transport::Channel>;

async fn fork_isolated(
    client: &mut Client,
    session: &str,
    prompts: &[&str],
) -> pb::ForkBatchResponse {
    fork_with(client, session, prompts, "copy").await.unwrap()
}

/// A batch of `prompts` asking for `isolation`.
async fn fork_with(
    client: &mut Client,
    session: &str,
    prompts: &[&str],
    isolation: &str,
) -> Result<pb::ForkBatchResponse, tonic::Status> {
    client
        .fork_batch(pb::ForkBatchRequest {
            session_id: session.to_owned(),
            directives: directives(prompts),
            isolation: isolation.into(),
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn changes(client: &mut Client, agent: &str) -> pb::GetChangesResponse {
    client
        .get_changes(pb::GetChangesRequest {
            agent_id: agent.to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// A daemon, a workspace whose `a.txt` holds `content`, a client, and a session on the
/// workspace whose agents run every tool without asking.
async fn world(
    content: &str,
) -> (
    forkd_test_support::TestDaemon,
    tempfile::TempDir,
    Client,
    pb::Session,
) {
    let daemon = spawn_daemon().await.unwrap();
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), content).unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, trusted_session_request(ws.path()))
        .await
        .unwrap();
    (daemon, ws, client, session)
}

fn read(ws: &Path, rel: &str) -> String {
    std::fs::read_to_string(ws.join(rel)).unwrap()
}

#[tokio::test]
async fn three_children_edit_one_line_each_sees_its_own_and_apply_takes_the_first() {
    let (daemon, ws, mut client, session) = world("line 1\nline 2\nline 3\n").await;
    let scripts: Vec<String> = (1..=3)
        .map(|i| {
            format!(
                "Change line 1.\n\
                 @sim tool Edit {{\"file_path\":\"a.txt\",\"old_string\":\"line 1\",\"new_string\":\"child {i}\"}}\n\
                 @sim tool Bash {{\"command\":\"head -n1 a.txt\"}}\n\
                 @sim say changed line 1\n\
                 Files changed: notes/made-up.md"
            )
        })
        .collect();
    let prompts: Vec<&str> = scripts.iter().map(String::as_str).collect();
    let batch = fork_isolated(&mut client, &session.session_id, &prompts).await;
    let done = wait_for_batch(&mut client, &batch.batch_id, 3, DEADLINE)
        .await
        .unwrap();
    // Nothing reached the live workspace.
    assert_eq!(read(ws.path(), "a.txt"), "line 1\nline 2\nline 3\n");
    for (i, agent) in batch.agent_ids.iter().enumerate() {
        let log = transcript_text(&mut client, agent).await.unwrap();
        let own = format!("child {}", i + 1);
        assert!(log.contains(&own), "{log}");
        for other in (1..=3).filter(|j| *j != i + 1) {
            assert!(!log.contains(&format!("\"child {other}")), "{log}");
        }
        // "Files changed" is the diff's, not the model's words.
        let note = done.iter().find(|n| &n.agent_id == agent).unwrap();
        let report = note.report.clone().unwrap();
        assert_eq!(report.files_changed, vec!["a.txt".to_owned()]);
        let c = changes(&mut client, agent).await;
        assert_eq!(c.state, "kept");
        let paths: Vec<&str> = c.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, report.files_changed);
        assert_eq!((c.files[0].added_lines, c.files[0].removed_lines), (1, 1));
        assert!(c.diff.contains(&format!("+{own}\n")), "{}", c.diff);
    }

    let applied = client
        .apply_changes(pb::ApplyChangesRequest {
            batch_id: batch.batch_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(applied.len(), 3);
    assert_eq!(applied[0].applied, vec!["a.txt".to_owned()]);
    assert!(applied[0].conflicts.is_empty());
    for later in &applied[1..] {
        assert!(later.applied.is_empty(), "{later:?}");
        let paths: Vec<&str> = later.conflicts.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(paths, vec!["a.txt"]);
    }
    assert_eq!(read(ws.path(), "a.txt"), "child 1\nline 2\nline 3\n");
    assert_eq!(
        changes(&mut client, &batch.agent_ids[0]).await.state,
        "applied"
    );
    assert_eq!(
        changes(&mut client, &batch.agent_ids[1]).await.state,
        "conflicted"
    );
    // Applied again: refused, nothing written twice.
    let again = client
        .apply_changes(pb::ApplyChangesRequest {
            agent_ids: vec![batch.agent_ids[0].clone()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition, "{again:?}");
    // The conflicted copies are discarded; the batch's files are gone with the last one.
    let discarded = client
        .discard_changes(pb::DiscardChangesRequest {
            batch_id: batch.batch_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .agent_ids;
    assert_eq!(discarded, batch.agent_ids[1..].to_vec());
    assert!(
        !daemon
            .home_path()
            .join("isolation")
            .join(&batch.batch_id)
            .exists()
    );
}

#[tokio::test]
async fn siblings_edit_and_cat_in_their_own_copies_and_a_parent_edit_stays_out() {
    let (_daemon, ws, mut client, session) = world("snapshot\n").await;
    std::fs::write(ws.path().join("b.txt"), "before the fork\n").unwrap();
    let editor = "Edit, then cat.\n\
        @sim tool Edit {\"file_path\":\"a.txt\",\"old_string\":\"snapshot\",\"new_string\":\"edited by one\"}\n\
        @sim tool Bash {\"command\":\"sleep 1; cat a.txt b.txt\"}\n\
        @sim say done";
    let basher = "Bash, then Read.\n\
        @sim tool Bash {\"command\":\"echo written by two > a.txt; sleep 1\"}\n\
        @sim tool Read {\"file_path\":\"a.txt\"}\n\
        @sim tool Read {\"file_path\":\"b.txt\"}\n\
        @sim say done";
    let batch = fork_isolated(&mut client, &session.session_id, &[editor, basher]).await;
    // The parent's workspace changes after the fork: no child sees it.
    std::fs::write(ws.path().join("b.txt"), "after the fork\n").unwrap();
    wait_for_batch(&mut client, &batch.batch_id, 2, DEADLINE)
        .await
        .unwrap();
    let one = transcript_text(&mut client, &batch.agent_ids[0])
        .await
        .unwrap();
    let two = transcript_text(&mut client, &batch.agent_ids[1])
        .await
        .unwrap();
    assert!(one.contains("edited by one\\nbefore the fork"), "{one}");
    assert!(
        !one.contains("written by two") && !one.contains("after the fork"),
        "{one}"
    );
    // Read's numbered line: its own Bash's write, read back through the file tool.
    assert!(two.contains("1\\twritten by two"), "{two}");
    assert!(two.contains("1\\tbefore the fork"), "{two}");
    assert!(
        !two.contains("edited by one") && !two.contains("after the fork"),
        "{two}"
    );
    assert_eq!(read(ws.path(), "a.txt"), "snapshot\n");
}

#[tokio::test]
async fn isolation_is_refused_for_full_access_sessions_and_changes_for_shared_children() {
    let daemon = spawn_daemon().await.unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();
    let open = create_session(
        &mut client,
        pb::CreateSessionRequest {
            sandbox: "full-access".into(),
            ..trusted_session_request(ws.path())
        },
    )
    .await
    .unwrap();
    let refused = fork_with(&mut client, &open.session_id, &["x"], "copy")
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("full-access"), "{refused:?}");
    let unknown = fork_with(&mut client, &open.session_id, &["x"], "worktree")
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::InvalidArgument, "{unknown:?}");

    let shared = forkd_test_support::fork(&mut client, &open.session_id, &["hello"], None)
        .await
        .unwrap();
    wait_for_batch(&mut client, &shared.batch_id, 1, DEADLINE)
        .await
        .unwrap();
    let none = client
        .get_changes(pb::GetChangesRequest {
            agent_id: shared.agent_ids[0].clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(none.code(), Code::FailedPrecondition, "{none:?}");
    assert!(none.message().contains("isolation"), "{none:?}");
}

#[tokio::test]
async fn a_child_resumed_after_a_restart_finds_its_own_earlier_edits() {
    let (mut daemon, ws, mut client, session) = world("snapshot\n").await;
    let slow = "Write, wait, read.\n\
        @sim tool Bash {\"command\":\"echo mine > a.txt\"}\n\
        @sim sleep 4s\n\
        @sim tool Bash {\"command\":\"cat a.txt\"}\n\
        @sim say done";
    let other = "Look.\n@sim tool Bash {\"command\":\"cat a.txt\"}\n@sim say looked";
    let batch = fork_isolated(&mut client, &session.session_id, &[slow, other]).await;
    // Wait for the first command's result, then restart in the middle of the slow reply.
    forkd_test_support::eventually(DEADLINE, "the first command's result", || {
        let mut client = client.clone();
        let agent = batch.agent_ids[0].clone();
        async move {
            let log = transcript_text(&mut client, &agent)
                .await
                .unwrap_or_default();
            log.contains("tool_result")
        }
    })
    .await;
    daemon.restart(|_| {}).await.unwrap();
    let mut client = daemon.client().await.unwrap();
    wait_for_batch(&mut client, &batch.batch_id, 2, DEADLINE)
        .await
        .unwrap();
    let log = transcript_text(&mut client, &batch.agent_ids[0])
        .await
        .unwrap();
    // Its second command read its own copy (the word "snapshot" is nowhere in its script).
    assert!(log.matches("tool_result").count() >= 2, "{log}");
    assert!(!log.contains("snapshot"), "{log}");
    let sibling = transcript_text(&mut client, &batch.agent_ids[1])
        .await
        .unwrap();
    assert!(
        sibling.contains("snapshot") && !sibling.contains("mine"),
        "{sibling}"
    );
    assert_eq!(read(ws.path(), "a.txt"), "snapshot\n");
}

#[tokio::test]
async fn a_models_fork_calls_each_say_whether_their_child_works_in_a_copy() {
    use pb::session_event::Event;
    let (_daemon, ws, mut client, session) = world("live\n").await;
    let script = concat!(
        "Try both ways.\n",
        r#"@sim agent {"description":"copied","prompt":"Edit in a copy.\n@sim tool Bash {\"command\":\"echo copied > a.txt\"}\n@sim say done","isolation":"copy"}"#,
        "\n",
        r#"@sim agent {"description":"shared","prompt":"Edit for real.\n@sim tool Bash {\"command\":\"echo shared > b.txt\"}\n@sim say done"}"#,
        "\n",
        r#"@sim agent {"description":"odd","prompt":"x","isolation":"worktree"}"#,
        "\n@sim say forked",
    );
    let events = forkd_test_support::run_turn(
        &mut client,
        pb::SendMessageRequest {
            session_id: session.session_id.clone(),
            text: script.into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let launched = events
        .iter()
        .find_map(|e| match e {
            Event::ForkLaunched(l) => Some(l.clone()),
            _ => None,
        })
        .expect("the reply forked");
    assert_eq!(
        launched.agent_ids.len(),
        2,
        "the bad isolation value is refused"
    );
    wait_for_batch(&mut client, &launched.batch_id, 2, DEADLINE)
        .await
        .unwrap();
    // The copied child's edit waits in its copy; the shared child's is in the workspace.
    assert_eq!(read(ws.path(), "a.txt"), "live\n");
    assert_eq!(read(ws.path(), "b.txt"), "shared\n");
    let copied = changes(&mut client, &launched.agent_ids[0]).await;
    assert_eq!(copied.files[0].path, "a.txt");
    let shared = client
        .get_changes(pb::GetChangesRequest {
            agent_id: launched.agent_ids[1].clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(shared.code(), Code::FailedPrecondition, "{shared:?}");
    let parent = forkd_test_support::session_transcript(&mut client, &session.session_id)
        .await
        .unwrap()
        .iter()
        .map(|m| m.content_json.clone())
        .collect::<String>();
    assert!(parent.contains("isolation must be"), "{parent}");
    // Named, the shared child has no copy to apply; a batch's apply takes its copies only.
    let named = client
        .apply_changes(pb::ApplyChangesRequest {
            agent_ids: launched.agent_ids.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(named.code(), Code::FailedPrecondition, "{named:?}");
    assert_eq!(
        read(ws.path(), "a.txt"),
        "live
",
        "nothing applied when one is refused"
    );
    let applied = client
        .apply_changes(pb::ApplyChangesRequest {
            batch_id: launched.batch_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(applied.results.len(), 1);
    assert_eq!(applied.results[0].agent_id, launched.agent_ids[0]);
    assert_eq!(applied.results[0].applied, vec!["a.txt".to_owned()]);
    assert_eq!(read(ws.path(), "a.txt"), "copied\n");
}

#[tokio::test]
async fn a_models_typed_agent_call_may_ask_for_a_copy() {
    let (_daemon, ws, mut client, session) = world("live\n").await;
    let script = concat!(
        "Delegate it.\n",
        r#"@sim agent {"description":"typed","prompt":"Edit in a copy.\n@sim tool Bash {\"command\":\"echo typed > a.txt\"}\n@sim say edited","subagent_type":"general-purpose","isolation":"copy"}"#,
        "\n@sim say delegated",
    );
    forkd_test_support::run_turn(
        &mut client,
        pb::SendMessageRequest {
            session_id: session.session_id.clone(),
            text: script.into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let typed = client
        .list_agents(pb::ListAgentsRequest {
            session_id: session.session_id.clone(),
            include_ended: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .agents
        .into_iter()
        .find(|a| a.kind == "typed")
        .expect("the typed agent");
    assert_eq!(typed.changes, "1 file (+1 -1), kept");
    assert_eq!(read(ws.path(), "a.txt"), "live\n");
    let c = changes(&mut client, &typed.agent_id).await;
    assert_eq!(c.files[0].path, "a.txt");
}
