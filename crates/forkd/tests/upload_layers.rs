//! Sessions made from uploads (docs/contracts.md, "Uploaded workspaces"): their agents see the
//! tree at `/forkd/workspaces/SESSION_ID`, a layer over the tree the daemon keeps read-only,
//! their edits their own; without that directory each gets a copy. Isolated batches, applies,
//! branches, restarts and the session's diff go through the layer; another session reaches
//! nothing of it; the tree's agent types are the session's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod uploading;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use forkd_core::upload::blob_hash;
use forkd_proto::v1 as pb;
use forkd_test_support::{Caller, TestDaemon, spawn_daemon_with};
use uploading::*;

/// What an agent of the session sees of its workspace: where it is, a file, the run bit, the
/// link, the empty file, `src/lib.rs`'s size.
async fn seen(c: &mut Caller, session: &pb::Session) -> String {
    c.bash(
        &session.session_id,
        "pwd; cat README.md; stat -c '%A' bin/run.sh; readlink src/readme; wc -c < empty; \
         wc -c < src/lib.rs",
    )
    .await
    .unwrap()
}

/// `seen` of the first tree: at `ws`, with `lib` bytes of `src/lib.rs`.
fn tree_at(ws: &str, lib: usize) -> String {
    format!("{ws}\n# the project\n-rwxr-xr-x\n../README.md\n0\n{lib}\n")
}

/// Uploads the tree, then it again with one file changed; a session from each. Their agents
/// see each tree where their session says its workspace is, and their edits stay their own.
async fn round_trip(layered: bool) {
    let mut t = two_tenants_with(layered).await;
    let tree = tree();
    let lacking = missing(&mut t.alice, &tree).await;
    assert_eq!(lacking.len(), 4, "every file's blob at first");
    let first = upload(&mut t.alice, &tree, &lacking).await.unwrap();
    assert_eq!((first.files, first.blobs_received), (5, 4));
    assert_eq!(
        first.bytes,
        tree.iter().map(|(_, c)| c.len() as u64).sum::<u64>()
    );

    let session = session_from(&mut t.alice, &first.upload_id).await.unwrap();
    let origin = session.upload_origin.clone().expect("the session's origin");
    assert_eq!(
        (origin.upload_id.as_str(), origin.files, origin.bytes),
        (first.upload_id.as_str(), 5, first.bytes)
    );
    let ws = Path::new(&session.workspace);
    let lib = "fn x() {}\n".len() * 300;
    assert_eq!(
        seen(&mut t.alice, &session).await,
        tree_at(&session.workspace, lib)
    );
    let kept = t.daemon.home_path().join("trees").join(&first.upload_id);
    if layered {
        // The same path on every daemon, which only the session's views have; the tree is
        // kept once, read-only, in the daemon's home.
        assert_eq!(ws, Path::new("/forkd/workspaces").join(&session.session_id));
        assert!(!ws.exists(), "the path is the views' alone");
        assert_eq!(
            std::fs::read_to_string(kept.join("README.md")).unwrap(),
            "# the project\n"
        );
    } else {
        // A copy of its own, in workspaces_dir.
        assert!(ws.starts_with(t.daemon.workspaces_dir()), "{ws:?}");
        let run = std::fs::metadata(ws.join("bin/run.sh")).unwrap();
        assert_eq!(run.permissions().mode() & 0o111, 0o111);
        assert!(!kept.exists());
    }

    // The same tree with one file changed: only that blob is missing, and only it is sent.
    let mut changed = tree.clone();
    changed[2] = file("src/lib.rs", b"fn y() {}\n", false);
    let lacking = missing(&mut t.alice, &changed).await;
    assert_eq!(lacking, vec![blob_hash(b"fn y() {}\n")]);
    let second = upload(&mut t.alice, &changed, &lacking).await.unwrap();
    assert_eq!((second.blobs_received, second.bytes_received), (1, 10));
    let again = session_from(&mut t.alice, &second.upload_id).await.unwrap();
    assert_eq!(
        seen(&mut t.alice, &again).await,
        tree_at(&again.workspace, 10)
    );

    // An edit in the first session is its own: neither a later session from the same upload
    // nor the kept tree has it.
    t.alice
        .bash(&session.session_id, "echo edited > README.md && rm empty")
        .await
        .unwrap();
    let third = session_from(&mut t.alice, &first.upload_id).await.unwrap();
    assert_eq!(
        seen(&mut t.alice, &third).await,
        tree_at(&third.workspace, lib)
    );
    let edited = t
        .alice
        .bash(&session.session_id, "cat README.md; ls empty")
        .await
        .unwrap();
    assert!(edited.starts_with("edited\n"), "{edited}");
    assert!(edited.contains("No such file"), "{edited}");
    if layered {
        assert_eq!(
            std::fs::read_to_string(kept.join("README.md")).unwrap(),
            "# the project\n"
        );
        // What the session wrote is in its own directory, not where views see it.
        let upper = t
            .daemon
            .workspaces_dir()
            .join(&session.session_id)
            .join("upper");
        assert_eq!(
            std::fs::read_to_string(upper.join("README.md")).unwrap(),
            "edited\n"
        );
        assert_eq!(
            std::fs::read_dir("/forkd/workspaces").unwrap().count(),
            0,
            "nothing is ever made in /forkd/workspaces here"
        );
    }
}

#[tokio::test]
async fn an_uploaded_tree_is_a_session_s_workspace_and_again_only_changes_are_sent() {
    if !Path::new("/forkd/workspaces").is_dir() && !running_as_root() {
        eprintln!(
            "skipped: /forkd/workspaces is missing and the daemon cannot make it (not root); \
             sessions get copies (covered by the next test)"
        );
        return;
    }
    round_trip(true).await;
}

#[tokio::test]
async fn without_the_view_root_a_session_gets_a_copy_of_the_tree() {
    round_trip(false).await;
}

fn running_as_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// Whether this machine has `/forkd/workspaces` (or the daemon, as root, can make it): where it
/// has not, sessions made from uploads get copies, and the layer tests say so and stop.
fn layers_here() -> bool {
    let here = Path::new("/forkd/workspaces").is_dir() || running_as_root();
    if !here {
        eprintln!("skipped: /forkd/workspaces is missing and the daemon cannot make it");
    }
    here
}

/// The local user's session from the tree of [`tree`], uploaded.
async fn local_session(daemon: &TestDaemon) -> (Caller, pb::Session) {
    let mut local = Caller::local(daemon).await.unwrap();
    let tree = tree();
    let lacking = missing(&mut local, &tree).await;
    let uploaded = upload(&mut local, &tree, &lacking).await.unwrap();
    let session = session_from(&mut local, &uploaded.upload_id).await.unwrap();
    (local, session)
}

#[tokio::test]
async fn an_isolated_batch_of_an_uploaded_session_applies_into_its_layer_and_it_survives_a_restart()
{
    if !layers_here() {
        return;
    }
    let mut daemon = spawn_daemon_with(|_| {}).await.unwrap();
    let (mut local, session) = local_session(&daemon).await;
    let sid = session.session_id.clone();
    let child = "Edit.\n@sim tool Bash {\"command\":\"echo child > README.md && echo added > \
                 new.txt && pwd\"}\n@sim say edited";
    let batch = local
        .client
        .fork_batch(pb::ForkBatchRequest {
            session_id: sid.clone(),
            directives: forkd_test_support::directives(&[child]),
            isolation: "copy".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    forkd_test_support::wait_for_batch(
        &mut local.client,
        &batch.batch_id,
        1,
        std::time::Duration::from_secs(60),
    )
    .await
    .unwrap();
    // The child worked in its own copy, at the session's path; the session saw nothing yet.
    let log = forkd_test_support::transcript_text(&mut local.client, &batch.agent_ids[0])
        .await
        .unwrap();
    assert!(log.contains(&session.workspace), "{log}");
    assert_eq!(
        local.bash(&sid, "cat README.md").await.unwrap(),
        "# the project\n"
    );
    let applied = local
        .client
        .apply_changes(pb::ApplyChangesRequest {
            batch_id: batch.batch_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(applied.results[0].conflicts.is_empty(), "{applied:?}");
    assert_eq!(
        local.bash(&sid, "cat README.md new.txt").await.unwrap(),
        "child\nadded\n"
    );

    // After a restart the layer is made again over the same edits.
    daemon.restart(|_| {}).await.unwrap();
    let mut local = Caller::local(&daemon).await.unwrap();
    assert_eq!(
        local
            .bash(&sid, "cat README.md new.txt; pwd")
            .await
            .unwrap(),
        format!("child\nadded\n{}\n", session.workspace)
    );
    // A branch works in its origin's workspace: the same layer, the same files.
    let branch = local
        .client
        .branch_session(pb::BranchSessionRequest {
            session_id: sid.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    assert_eq!(branch.workspace, session.workspace);
    assert_eq!(
        local
            .bash(&branch.session_id, "cat new.txt; echo from-branch > b.txt")
            .await
            .unwrap(),
        "added\n"
    );
    assert_eq!(
        local.bash(&sid, "cat b.txt").await.unwrap(),
        "from-branch\n"
    );
    // And the session's diff since its upload reads through it.
    let changes = local
        .client
        .get_session_changes(pb::GetSessionChangesRequest {
            session_id: sid.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut paths: Vec<(String, String)> = changes
        .files
        .iter()
        .map(|f| (f.path.clone(), f.kind.clone()))
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            ("README.md".to_owned(), "modified".to_owned()),
            ("b.txt".to_owned(), "added".to_owned()),
            ("new.txt".to_owned(), "added".to_owned())
        ]
    );
}

#[tokio::test]
async fn another_session_sees_nothing_of_an_uploaded_session_s_files() {
    if !layers_here() {
        return;
    }
    let mut t = two_tenants().await;
    let tree = tree();
    let lacking = missing(&mut t.alice, &tree).await;
    let first = upload(&mut t.alice, &tree, &lacking).await.unwrap();
    let alice_s = session_from(&mut t.alice, &first.upload_id).await.unwrap();
    t.alice
        .bash(&alice_s.session_id, "echo secret > mine.txt")
        .await
        .unwrap();
    // Mallory's own uploaded session: beside its workspace, nothing; alice's edits and the kept
    // tree are not reachable by any path.
    let theirs = vec![file("m.txt", b"m\n", false)];
    let lacking = missing(&mut t.mallory, &theirs).await;
    let up = upload(&mut t.mallory, &theirs, &lacking).await.unwrap();
    let mallory_s = session_from(&mut t.mallory, &up.upload_id).await.unwrap();
    let upper = t
        .daemon
        .workspaces_dir()
        .join(&alice_s.session_id)
        .join("upper/mine.txt");
    let kept = t.daemon.home_path().join("trees").join(&first.upload_id);
    let probe = format!(
        "ls -A /forkd/workspaces; cat /forkd/workspaces/{}/mine.txt {} {}/README.md",
        alice_s.session_id,
        upper.display(),
        kept.display()
    );
    let seen = t.mallory.bash(&mallory_s.session_id, &probe).await.unwrap();
    assert!(
        seen.starts_with(&format!("{}\n", mallory_s.session_id)),
        "{seen}"
    );
    assert!(
        !seen.contains("secret") && !seen.contains("# the project"),
        "{seen}"
    );
}

#[tokio::test]
async fn an_uploaded_tree_s_agent_types_are_the_session_s() {
    if !layers_here() {
        return;
    }
    let daemon = spawn_daemon_with(|_| {}).await.unwrap();
    let mut local = Caller::local(&daemon).await.unwrap();
    let tree = vec![
        file("lib.rs", b"fn main() {}\n", false),
        file(
            ".forkd/agents/reviewer.md",
            b"---\nname: reviewer\ndescription: Reviews code\ntools: Read, Grep\n---\nYou review.\n",
            false,
        ),
    ];
    let lacking = missing(&mut local, &tree).await;
    let uploaded = upload(&mut local, &tree, &lacking).await.unwrap();
    let session = session_from(&mut local, &uploaded.upload_id).await.unwrap();
    assert!(session.workspace.starts_with("/forkd/workspaces/"));
    // The type defined in the uploaded tree is found (read through the session's layer).
    let spawned = local
        .client
        .spawn_agent(pb::SpawnAgentRequest {
            session_id: session.session_id.clone(),
            subagent_type: "reviewer".into(),
            description: "look".into(),
            prompt: "Look.\n@sim say looked".into(),
            ..Default::default()
        })
        .await;
    assert!(spawned.is_ok(), "{spawned:?}");
    let unknown = local
        .client
        .spawn_agent(pb::SpawnAgentRequest {
            session_id: session.session_id,
            subagent_type: "nobody".into(),
            description: "look".into(),
            prompt: "Look.".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(unknown.message().contains("reviewer"), "{unknown:?}");
}
