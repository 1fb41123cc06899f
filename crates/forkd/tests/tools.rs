//! Fork children that do real work in the workspace, end to end through the daemon.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_test_support::{
    create_session, fork, session_request, spawn_daemon, transcript_text, wait_for_batch,
};

const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn children_read_write_and_edit_the_workspace_and_report_it() {
    let daemon = spawn_daemon().await.unwrap();
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("notes.txt"), "alpha\nbeta needle\ngamma\n").unwrap();
    std::fs::write(ws.path().join("../forkd-secret-outside.txt"), "secret").ok();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(
        &mut client,
        pb::CreateSessionRequest {
            permission_mode: "acceptEdits".into(),
            ..session_request(ws.path())
        },
    )
    .await
    .unwrap();
    let writer = r#"Write the greeting.
@sim tool Write {"file_path":"out/greeting.txt","content":"hello"}
@sim tool Edit {"file_path":"out/greeting.txt","old_string":"hello","new_string":"hello world"}
@sim tool Bash {"command":"rm -rf out"}
@sim say wrote the greeting"#;
    let reader = r#"Find the needle.
@sim tool Read {"file_path":"notes.txt"}
@sim tool Grep {"pattern":"needle","output_mode":"content"}
@sim tool Read {"file_path":"../forkd-secret-outside.txt"}
@sim say found it"#;
    let batch = fork(&mut client, &session.session_id, &[writer, reader], None)
        .await
        .unwrap();
    let done = wait_for_batch(&mut client, &batch.batch_id, 2, DEADLINE)
        .await
        .unwrap();
    let of = |i: usize| {
        done.iter()
            .find(|n| n.agent_id == batch.agent_ids[i])
            .unwrap()
    };

    // The writer's file exists, edited; Bash asked for permission and was denied (acceptEdits).
    assert_eq!(
        std::fs::read_to_string(ws.path().join("out/greeting.txt")).unwrap(),
        "hello world"
    );
    let report = of(0).report.clone().unwrap();
    assert_eq!(report.result, "wrote the greeting");
    assert_eq!(report.files_changed, vec!["out/greeting.txt".to_owned()]);

    let writer_log = transcript_text(&mut client, &batch.agent_ids[0])
        .await
        .unwrap();
    for tool in ["\"Write\"", "\"Edit\"", "\"Bash\""] {
        assert!(
            writer_log.contains(tool),
            "{tool} missing from the transcript"
        );
    }
    assert!(writer_log.contains("Permission denied"), "{writer_log}");

    // The reader saw the file and the match, and the escape was refused as a tool error.
    let reader_log = transcript_text(&mut client, &batch.agent_ids[1])
        .await
        .unwrap();
    assert!(reader_log.contains("beta needle"), "{reader_log}");
    assert!(
        reader_log.contains("notes.txt:2:beta needle"),
        "{reader_log}"
    );
    assert!(reader_log.contains("outside the workspace"), "{reader_log}");
    assert_eq!(of(1).report.clone().unwrap().result, "found it");
}

#[tokio::test]
async fn session_rules_allow_and_deny_before_the_mode() {
    let daemon = spawn_daemon().await.unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();
    // A typo in a rule is the client's error at creation.
    let status = client
        .create_session(pb::CreateSessionRequest {
            allow_rules: vec!["Bash(echo:*".into()],
            ..session_request(ws.path())
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");

    let session = create_session(
        &mut client,
        pb::CreateSessionRequest {
            permission_mode: "acceptEdits".into(),
            allow_rules: vec!["Bash(echo:*)".into()],
            deny_rules: vec!["Write(secrets/**)".into()],
            ..session_request(ws.path())
        },
    )
    .await
    .unwrap();
    assert_eq!(session.deny_rules, vec!["Write(secrets/**)".to_owned()]);
    let script = r#"Try the rules.
@sim tool Bash {"command":"echo allowed-by-rule"}
@sim tool Bash {"command":"touch asked"}
@sim tool Write {"file_path":"secrets/key","content":"k"}
@sim tool Write {"file_path":"open/note","content":"n"}
@sim say done"#;
    let batch = fork(&mut client, &session.session_id, &[script], None)
        .await
        .unwrap();
    wait_for_batch(&mut client, &batch.batch_id, 1, DEADLINE)
        .await
        .unwrap();
    assert!(!ws.path().join("secrets/key").exists(), "denied by rule");
    assert!(
        !ws.path().join("asked").exists(),
        "acceptEdits asks for Bash; nobody can answer"
    );
    assert!(
        ws.path().join("open/note").exists(),
        "acceptEdits allows edits"
    );
    let log = transcript_text(&mut client, &batch.agent_ids[0])
        .await
        .unwrap();
    assert!(log.contains("allowed-by-rule"), "{log}");
}
