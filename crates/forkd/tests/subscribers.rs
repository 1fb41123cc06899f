//! Many subscribers on one daemon: a stalled one delays neither the others nor the agents.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_test_support::{create_session, session_request, spawn_daemon};
use futures::StreamExt;

const SUBSCRIBERS: usize = 100;
const CHILDREN: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_subscriber_never_delays_the_other_ninety_nine() {
    let daemon = spawn_daemon().await.unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    let subscribe = pb::SubscribeNotificationsRequest {
        session_id: session.session_id.clone(),
        follow: true,
        ..Default::default()
    };

    // Everyone subscribes before the batch, each on a connection of its own; the first never
    // reads a single message.
    let mut streams = Vec::new();
    for _ in 0..SUBSCRIBERS {
        let mut c = daemon.client().await.unwrap();
        streams.push(
            c.subscribe_notifications(subscribe.clone())
                .await
                .unwrap()
                .into_inner(),
        );
    }
    let stalled = streams.remove(0);

    let directives = (0..CHILDREN)
        .map(|i| pb::Directive {
            description: format!("child {i}"),
            prompt: format!("Report {i} with some words to make the notification longer."),
            limits: None,
        })
        .collect();
    let batch = client
        .fork_batch(pb::ForkBatchRequest {
            session_id: session.session_id.clone(),
            directives,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();

    let readers = streams.into_iter().map(|mut stream| {
        tokio::spawn(async move {
            let mut seqs = Vec::with_capacity(CHILDREN);
            while seqs.len() < CHILDREN {
                let note = stream.next().await.unwrap().unwrap();
                seqs.push(note.seq);
            }
            seqs
        })
    });
    let all = tokio::time::timeout(Duration::from_secs(120), futures::future::join_all(readers))
        .await
        .expect("every reading subscriber hears every child");
    let expected: Vec<u64> = (1..=CHILDREN as u64).collect();
    for seqs in all {
        assert_eq!(
            seqs.unwrap(),
            expected,
            "every notification, once, in order"
        );
    }
    // The agents were not held back either: all of them ended.
    let agents = client
        .list_agents(pb::ListAgentsRequest {
            batch_id: batch.batch_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(agents.agents.is_empty(), "no child is still live");
    drop(stalled);
}
