//! `--metrics-listen`: a daemon serves Prometheus metrics over plain HTTP, and a small batch shows
//! up in them. Then the batch's requests are listed and explained over gRPC. (One test in this
//! file: a process has one metrics recorder.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_test_support::{
    create_session, fork, session_request, spawn_daemon_with, wait_for_batch,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A free loopback port (the exporter takes an address, not a bound listener).
fn free_port() -> std::net::SocketAddr {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    probe.local_addr().unwrap()
}

async fn scrape(addr: std::net::SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    text
}

/// The value of a sample line `name{labels} value` (or `name value`).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_shows_up_in_the_metrics_and_its_requests_can_be_explained() {
    let addr = free_port();
    let daemon = spawn_daemon_with(|c| c.metrics_listen = Some(addr))
        .await
        .unwrap();
    let mut client = daemon.client().await.unwrap();
    let session = create_session(&mut client, session_request(daemon.home_path()))
        .await
        .unwrap();
    let batch = fork(
        &mut client,
        &session.session_id,
        &["audit a", "audit b"],
        None,
    )
    .await
    .unwrap();
    wait_for_batch(&mut client, &batch.batch_id, 2, Duration::from_secs(30))
        .await
        .unwrap();

    let text = scrape(addr).await;
    assert!(text.starts_with("HTTP/1."), "{text}");
    let fork_requests: f64 = text
        .lines()
        .filter(|l| l.starts_with("forkd_requests_total{") && l.contains("kind=\"fork\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(fork_requests >= 2.0, "{text}");
    assert_eq!(
        sample(&text, "forkd_agents_ended_total{status=\"completed\"}"),
        Some(2.0),
        "{text}"
    );
    assert!(
        sample(&text, "forkd_tokens_total{kind=\"cache_read\"}").is_some_and(|n| n > 0.0),
        "the second child read the shared prefix from the cache: {text}"
    );
    for series in [
        "forkd_tokens_total{kind=\"input\"}",
        "forkd_tokens_total{kind=\"cache_write\"}",
        "forkd_tokens_total{kind=\"output\"}",
        "forkd_agents_ended_total{status=\"completed\"}",
        "forkd_agent_runs",
    ] {
        assert!(sample(&text, series).is_some(), "{series} missing: {text}");
    }
    assert_eq!(
        sample(&text, "forkd_prefix_divergences_total"),
        Some(0.0),
        "{text}"
    );
    assert!(text.contains("forkd_notification_lag_seconds"), "{text}");
    assert!(text.contains("forkd_cost_usd"), "{text}");

    // The batch's requests are listed with their ids, and the second child's first request is
    // explained against the first's: the same prefix, parting in the child's own directive.
    let requests = client
        .list_requests(pb::ListRequestsRequest {
            scope: Some(pb::list_requests_request::Scope::BatchId(
                batch.batch_id.clone(),
            )),
        })
        .await
        .unwrap()
        .into_inner()
        .requests;
    assert!(requests.len() >= 2, "{requests:?}");
    let second = requests
        .iter()
        .find(|r| r.agent_id == batch.agent_ids[1] && r.turn == 0)
        .unwrap();
    let why = client
        .explain_cache(pb::ExplainCacheRequest {
            request_id: second.request_id.clone(),
            other_request_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(why.same_prefix, "{why:?}");
    assert!(why.exact, "{why:?}");
    assert_eq!(why.kind, "message", "{why:?}");
    let missing = client
        .explain_cache(pb::ExplainCacheRequest {
            request_id: "not-an-id".into(),
            other_request_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::InvalidArgument);
}
