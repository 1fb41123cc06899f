//! Explicit compaction through the API: `CompactSession` summarizes the transcript up to the
//! model's last reply, `GetTranscript` shows the boundary where it sits, and asking again before
//! the model has replied once more is `FAILED_PRECONDITION`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use forkd_proto::v1 as pb;
use forkd_test_support::{
    create_session, run_turn, session_request, session_transcript, spawn_daemon, turn_text,
};

#[tokio::test]
async fn compact_session_marks_the_boundary_and_the_next_turn_goes_on() {
    let daemon = spawn_daemon().await.unwrap();
    let mut c = daemon.client().await.unwrap();
    let ws = tempfile::tempdir().unwrap();
    let session = create_session(&mut c, session_request(ws.path()))
        .await
        .unwrap();
    let send = |text: &str| pb::SendMessageRequest {
        session_id: session.session_id.clone(),
        text: text.into(),
        ..Default::default()
    };
    let first = run_turn(&mut c, send("Plan the release.\n@sim say planned"))
        .await
        .unwrap();
    assert!(turn_text(&first).unwrap().contains("planned"));

    let compact = |instructions: &str| pb::CompactSessionRequest {
        session_id: session.session_id.clone(),
        instructions: instructions.into(),
    };
    let done = c
        .compact_session(compact("Keep the release plan."))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.from_seq, 0);
    assert!(done.summary_json.contains("compaction-summary"), "{done:?}");
    let again = c.compact_session(compact("")).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::FailedPrecondition, "{again:?}");

    // The boundary sits right before the reply the requests go on from; nothing was deleted.
    let transcript = session_transcript(&mut c, &session.session_id)
        .await
        .unwrap();
    let at = transcript.iter().position(|m| m.compaction).unwrap();
    assert_eq!(at as u64, done.to_seq, "{transcript:#?}");
    assert_eq!(transcript[at + 1].role, "assistant");
    assert!(transcript[at + 1].content_json.contains("planned"));
    assert_eq!(transcript.iter().filter(|m| !m.compaction).count(), 3);

    let next = run_turn(&mut c, send("Ship it.\n@sim say shipped"))
        .await
        .unwrap();
    assert!(turn_text(&next).unwrap().contains("shipped"));
    let later = c.compact_session(compact("")).await.unwrap().into_inner();
    assert_eq!(later.from_seq, done.to_seq);
}
