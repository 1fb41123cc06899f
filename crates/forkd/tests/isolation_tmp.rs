//! An isolated child's temporary directory is out of its session's reach. Its session's own
//! commands write in the session's `TMPDIR`; were a child's directory inside it, a command could
//! plant a link where the child's directory goes, and the daemon would make the link's target
//! the child's writable `TMPDIR` (and keep it in the child's view, even where it is another
//! session's hidden workspace). Both ways are tried here: a link planted before the child's
//! first command, to another session's workspace; and one swapped in between its commands, to a
//! directory nobody may write.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_test_support::{
    create_session, directives, run_turn, spawn_daemon, transcript_text, trusted_session_request,
    wait_for_batch,
};

const DEADLINE: Duration = Duration::from_secs(60);

type Client = pb::forkd_client::ForkdClient<tonic::transport::Channel>;

async fn fork_isolated(client: &mut Client, session: &str, script: &str) -> pb::ForkBatchResponse {
    client
        .fork_batch(pb::ForkBatchRequest {
            session_id: session.to_owned(),
            directives: directives(&[script]),
            isolation: "copy".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

/// A turn of `session`'s own in which its Bash plants a link named `child` in its `TMPDIR`,
/// pointing at `target` (once a directory of that name shows up there, if `after_first`, or
/// after ten seconds).
async fn plant(client: &mut Client, session: &str, child: &str, target: &Path, after_first: bool) {
    let wait = if after_first {
        format!(
            r#"for i in $(seq 200); do [ -d \"$TMPDIR/{child}\" ] && break; sleep 0.05; done; "#
        )
    } else {
        String::new()
    };
    let command = format!(
        r#"{wait}rm -rf \"$TMPDIR/{child}\"; ln -s {} \"$TMPDIR/{child}\" && echo planted"#,
        target.display()
    );
    let events = run_turn(
        client,
        pb::SendMessageRequest {
            session_id: session.to_owned(),
            text: format!("Plant.\n@sim tool Bash {{\"command\":\"{command}\"}}\n@sim say done"),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(format!("{events:?}").contains("planted"), "{events:?}");
}

/// Plants the link (see [`plant`]) for the batch's child, waits for the child to end, and
/// returns what it did.
async fn plant_and_finish(
    client: &mut Client,
    session: &pb::Session,
    batch: &pb::ForkBatchResponse,
    target: &Path,
    after_first: bool,
) -> String {
    let child = &batch.agent_ids[0];
    plant(client, &session.session_id, child, target, after_first).await;
    wait_for_batch(client, &batch.batch_id, 1, DEADLINE)
        .await
        .unwrap();
    tail(&transcript_text(client, child).await.unwrap())
}

/// What the child did (its transcript's end, past the shared prefix).
fn tail(transcript: &str) -> String {
    let from = transcript.len().saturating_sub(2_000);
    let from = (from..transcript.len())
        .find(|&i| transcript.is_char_boundary(i))
        .unwrap_or(transcript.len());
    transcript[from..].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_planted_before_the_childs_first_command_does_not_reach_another_workspace() {
    let daemon = spawn_daemon().await.unwrap();
    let mut client = daemon.client().await.unwrap();
    // Another session's workspace: hidden from this one's commands.
    let theirs = tempfile::tempdir().unwrap();
    std::fs::write(theirs.path().join("secret.txt"), "their secret words").unwrap();
    create_session(&mut client, trusted_session_request(theirs.path()))
        .await
        .unwrap();
    let ws = tempfile::tempdir().unwrap();
    let session = create_session(&mut client, trusted_session_request(ws.path()))
        .await
        .unwrap();
    // The child's first response is slow: the link is there before its first command.
    let script = "Look around.\n@sim sleep 3s\n\
                  @sim tool Bash {\"command\":\"cat $TMPDIR/secret.txt; echo pwned > $TMPDIR/pwned.txt; echo tmp=$TMPDIR\"}\n\
                  @sim say looked";
    let batch = fork_isolated(&mut client, &session.session_id, script).await;
    let transcript = plant_and_finish(&mut client, &session, &batch, theirs.path(), false).await;
    assert!(transcript.contains("tmp="), "the command ran: {transcript}");
    assert!(
        !transcript.contains("their secret words"),
        "the child read another session's file: {transcript}"
    );
    assert!(
        !theirs.path().join("pwned.txt").exists(),
        "the child wrote in another session's workspace: {transcript}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_swapped_in_between_the_childs_commands_gives_it_no_other_writable_place() {
    let daemon = spawn_daemon().await.unwrap();
    let mut client = daemon.client().await.unwrap();
    // A directory the session's commands see and may not write.
    let elsewhere = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let session = create_session(&mut client, trusted_session_request(ws.path()))
        .await
        .unwrap();
    let control = format!(
        "echo control > {}/control.txt; echo first > $TMPDIR/first.txt",
        elsewhere.path().display()
    );
    let script = format!(
        "Write twice.\n@sim tool Bash {{\"command\":\"{control}\"}}\n@sim sleep 4s\n\
         @sim think again\n\
         @sim tool Bash {{\"command\":\"echo pwned > $TMPDIR/pwned.txt; echo tmp=$TMPDIR\"}}\n\
         @sim say wrote"
    );
    let batch = fork_isolated(&mut client, &session.session_id, &script).await;
    let transcript = plant_and_finish(&mut client, &session, &batch, elsewhere.path(), true).await;
    assert!(
        transcript.contains("tmp="),
        "the commands ran: {transcript}"
    );
    assert!(
        !elsewhere.path().join("control.txt").exists(),
        "the sandbox let a command write outside its places: {transcript}"
    );
    assert!(
        !elsewhere.path().join("pwned.txt").exists(),
        "the child's TMPDIR followed its session's link: {transcript}"
    );
}
