//! Several daemons on one PostgreSQL database with uploaded workspaces: a session made on one
//! daemon from an upload another received, and its agents kept with the daemon that holds its
//! files. The database is a fresh one on the server `FORKD_TEST_DATABASE_URL` names, dropped at
//! the end; without that variable the test says so and passes, unless `CI` is set.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_test_support::{create_session, fork, session_request, wait_for_batch};

mod binary;
mod pg;

use pg::with_scratch_database;

const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_session_on_one_daemon_starts_from_an_upload_another_received() {
    with_scratch_database(upload_across_daemons).await;
}

async fn upload_across_daemons(url: String) {
    use pb::upload_entry::Kind;
    use pb::upload_workspace_request::Part;
    // A short lease: a batch left for the daemon that holds the files is taken at its heartbeat.
    let env = [("FORKD_DATABASE_URL", url.as_str()), ("FORKD_LEASE", "1s")];
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let _a = binary::Daemon::start_with(home_a.path(), "0", &env);
    let _b = binary::Daemon::start_with(home_b.path(), "0", &env);
    let mut on_a = binary::client(home_a.path()).await;
    let mut on_b = binary::client(home_b.path()).await;
    let content = b"uploaded to A\n".to_vec();
    let sha256 = forkd_core::upload::blob_hash(&content);
    let manifest = pb::UploadManifest {
        entries: vec![pb::UploadEntry {
            path: "src/a.txt".into(),
            kind: Some(Kind::File(pb::UploadFile {
                sha256: sha256.clone(),
                size: content.len() as u64,
                executable: false,
            })),
        }],
        git_commit: String::new(),
    };
    let messages = vec![
        pb::UploadWorkspaceRequest {
            part: Some(Part::Manifest(manifest)),
        },
        pb::UploadWorkspaceRequest {
            part: Some(Part::Blob(pb::BlobChunk {
                sha256: sha256.clone(),
                data: content.clone(),
                last: true,
            })),
        },
    ];
    let uploaded = on_a
        .upload_workspace(tokio_stream::iter(messages))
        .await
        .unwrap()
        .into_inner();
    // B finds the blob the tenant has, and starts a session from A's upload.
    let missing = on_b
        .find_missing_blobs(pb::FindMissingBlobsRequest {
            hashes: vec![sha256],
        })
        .await
        .unwrap()
        .into_inner()
        .missing;
    assert!(missing.is_empty(), "{missing:?}");
    let session = create_session(
        &mut on_b,
        pb::CreateSessionRequest {
            workspace: String::new(),
            upload_id: uploaded.upload_id,
            ..session_request(std::path::Path::new(""))
        },
    )
    .await
    .unwrap();
    let ws = std::path::Path::new(&session.workspace);
    let b_workspaces = format!("{}-workspaces", home_b.path().display());
    if ws.starts_with("/forkd/workspaces") {
        // A layer over the tree B keeps; its edits go in B's workspaces_dir.
        let upload = session.upload_origin.as_ref().unwrap().upload_id.clone();
        let kept = home_b.path().join("trees").join(upload);
        assert_eq!(std::fs::read(kept.join("src/a.txt")).unwrap(), content);
        let upper = std::path::Path::new(&b_workspaces)
            .join(&session.session_id)
            .join("upper");
        assert!(upper.is_dir(), "{upper:?}");
    } else {
        assert!(ws.starts_with(&b_workspaces), "{ws:?}");
        assert_eq!(std::fs::read(ws.join("src/a.txt")).unwrap(), content);
    }

    // A batch forked through A, which lacks the session's files, runs on B, which holds them.
    let sid = session.session_id.clone();
    let on_b_batch = fork(&mut on_b, &sid, &["@sim say on B"], None)
        .await
        .unwrap();
    wait_for_batch(&mut on_b, &on_b_batch.batch_id, 1, DEADLINE)
        .await
        .unwrap();
    let b_id = forkd_test_support::get_agent(&mut on_b, &on_b_batch.agent_ids[0])
        .await
        .daemon;
    let read = format!(
        "@sim tool Read {{\"file_path\":\"{}\"}}\n@sim say read it",
        ws.join("src/a.txt").display()
    );
    let batch = fork(&mut on_a, &sid, &[read.as_str()], None).await.unwrap();
    let done = wait_for_batch(&mut on_a, &batch.batch_id, 1, DEADLINE)
        .await
        .unwrap();
    assert_eq!(
        done[0].status,
        pb::NotificationStatus::Completed as i32,
        "{done:?}"
    );
    let log = forkd_test_support::transcript_text(&mut on_a, &batch.agent_ids[0])
        .await
        .unwrap();
    assert!(log.contains("uploaded to A"), "{log}");
    let ran = forkd_test_support::get_agent(&mut on_a, &batch.agent_ids[0]).await;
    assert_eq!(ran.daemon, b_id, "the daemon that holds the files ran it");

    // What must run where the files are now is refused through A, saying why.
    let turn = on_a
        .send_message(pb::SendMessageRequest {
            session_id: sid.clone(),
            text: "@sim say hi".into(),
            ..Default::default()
        })
        .await;
    let refused = match turn {
        Err(status) => status,
        Ok(stream) => {
            use tokio_stream::StreamExt;
            let mut stream = stream.into_inner();
            loop {
                match stream.next().await {
                    Some(Ok(_)) => continue,
                    Some(Err(status)) => break status,
                    None => panic!("the turn ran on a daemon without the session's files"),
                }
            }
        }
    };
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(refused.message().contains("another daemon"), "{refused:?}");
    let isolated = on_a
        .fork_batch(pb::ForkBatchRequest {
            session_id: sid,
            directives: forkd_test_support::directives(&["@sim say copied"]),
            isolation: "copy".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        isolated.code(),
        tonic::Code::FailedPrecondition,
        "{isolated:?}"
    );
    assert!(
        isolated.message().contains("another daemon"),
        "{isolated:?}"
    );
}
