//! Bubble permissions: a child's permission request reaches the parent session's interactive
//! client, the child waits, and the answer is honoured.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_test_support::{
    create_session, fork, session_request, spawn_daemon, transcript_text, wait_for_batch,
};
use tonic::Code;

const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn bubble_prompts_reach_the_client_and_answers_are_honoured() {
    let daemon = spawn_daemon().await.unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut client = daemon.client().await.unwrap();

    // bubble needs someone to answer.
    let status = client
        .create_session(pb::CreateSessionRequest {
            permission_mode: "bubble".into(),
            interactive: false,
            ..session_request(ws.path())
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);

    let session = create_session(
        &mut client,
        pb::CreateSessionRequest {
            permission_mode: "bubble".into(),
            interactive: true,
            ..session_request(ws.path())
        },
    )
    .await
    .unwrap();
    let mut prompts = client
        .subscribe_permissions(pb::SubscribePermissionsRequest {
            session_id: session.session_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let script = r#"Write twice, then run a command.
@sim tool Write {"file_path":"one.txt","content":"1"}
@sim tool Write {"file_path":"two.txt","content":"2"}
@sim tool Bash {"command":"touch three.txt"}
@sim say done"#;
    let batch = fork(&mut client, &session.session_id, &[script], None)
        .await
        .unwrap();

    // The first Write asks; the child waits until the answer, which allows Write from now on.
    let first = next(&mut prompts).await;
    assert_eq!(first.tool_name, "Write");
    assert_eq!(first.agent_id, batch.agent_ids[0]);
    assert!(
        !ws.path().join("one.txt").exists(),
        "the child waits for the answer"
    );
    client
        .answer_permission(pb::AnswerPermissionRequest {
            prompt_id: first.prompt_id.clone(),
            decision: pb::PermissionDecision::AllowAlways as i32,
            reason: String::new(),
        })
        .await
        .unwrap();
    // The second Write is not asked; Bash is, and is denied.
    let second = next(&mut prompts).await;
    assert_eq!(second.tool_name, "Bash", "{second:?}");
    client
        .answer_permission(pb::AnswerPermissionRequest {
            prompt_id: second.prompt_id.clone(),
            decision: pb::PermissionDecision::Deny as i32,
            reason: "not today".into(),
        })
        .await
        .unwrap();
    // An answered prompt cannot be answered again.
    let status = client
        .answer_permission(pb::AnswerPermissionRequest {
            prompt_id: second.prompt_id,
            decision: pb::PermissionDecision::AllowOnce as i32,
            reason: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);

    let done = wait_for_batch(&mut client, &batch.batch_id, 1, DEADLINE)
        .await
        .unwrap();
    assert_eq!(done[0].status, pb::NotificationStatus::Completed as i32);
    assert!(ws.path().join("one.txt").exists());
    assert!(ws.path().join("two.txt").exists());
    assert!(!ws.path().join("three.txt").exists());
    let log = transcript_text(&mut client, &batch.agent_ids[0])
        .await
        .unwrap();
    assert!(log.contains("denied by the user: not today"), "{log}");
}

async fn next(prompts: &mut tonic::Streaming<pb::PermissionPrompt>) -> pb::PermissionPrompt {
    tokio::time::timeout(DEADLINE, prompts.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}
