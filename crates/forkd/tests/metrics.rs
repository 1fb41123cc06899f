//! `--metrics-listen`: a daemon serves Prometheus metrics over plain HTTP, and what it stores
//! and does shows up in them — agents by state, per-batch cache-read share, a real sibling prefix
//! divergence. Then the batch's requests are listed and explained over gRPC. (One test in this
//! file: a process has one metrics recorder.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_test_support::{
    create_session, eventually, fork, session_request, spawn_daemon_with, wait_for_batch,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
        .map(without_daemon)
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next().map(str::to_owned))
        .and_then(|v| v.parse().ok())
}

/// A line of the scrape without its `daemon` label (every series carries the daemon's id, see
/// [`every_series_names_its_daemon`]); any other line as it is.
fn without_daemon(line: &str) -> String {
    let Some(start) = line.find("daemon=\"") else {
        return line.to_owned();
    };
    let value_end = line[start + 8..]
        .find('"')
        .map_or(line.len(), |i| start + 8 + i + 1);
    let end = if line[value_end..].starts_with(',') {
        value_end + 1
    } else {
        value_end
    };
    format!("{}{}", &line[..start], &line[end..])
        .replace("{}", "")
        .replace(",}", "}")
}

/// Every sample of forkd's series carries the label `daemon`: several daemons on one database
/// report to one Prometheus.
fn every_series_names_its_daemon(text: &str) {
    let samples: Vec<&str> = text.lines().filter(|l| l.starts_with("forkd_")).collect();
    assert!(!samples.is_empty(), "{text}");
    for line in samples {
        assert!(
            line.contains("daemon=\""),
            "a series without its daemon: {line}"
        );
    }
}

/// The requests recorded for a batch.
async fn requests_of(
    client: &mut pb::forkd_client::ForkdClient<tonic::transport::Channel>,
    batch: &str,
) -> Vec<pb::ModelRequestRecord> {
    client
        .list_requests(pb::ListRequestsRequest {
            scope: Some(pb::list_requests_request::Scope::BatchId(batch.to_owned())),
        })
        .await
        .unwrap()
        .into_inner()
        .requests
}

/// `ExplainCache` for `agent`'s first request against its first sibling's.
async fn explain_first_request(
    client: &mut pb::forkd_client::ForkdClient<tonic::transport::Channel>,
    requests: &[pb::ModelRequestRecord],
    agent: &str,
) -> pb::ExplainCacheResponse {
    let first = requests
        .iter()
        .find(|r| r.agent_id == agent && r.turn == 0)
        .unwrap();
    client
        .explain_cache(pb::ExplainCacheRequest {
            request_id: first.request_id.clone(),
            other_request_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// The value of the one sample of `name` whose labels include every `label="value"` given.
fn labelled(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_shows_up_in_the_metrics_and_its_requests_can_be_explained() {
    // A real divergence: a batch whose first child has made its first request when the daemon
    // stops, and whose stored system prompt then comes back one byte different (as a store that
    // lost the bytes would hand it back). The next daemon resumes the batch; the second child's
    // first request parts from its sibling's in the system prompt.
    let mut daemon = spawn_daemon_with(|c| c.engine.max_running_agents = Some(1))
        .await
        .unwrap();
    let mut client = daemon.client().await.unwrap();
    let mut request = session_request(&daemon.workspace_path());
    request.permission_mode = "bypassPermissions".into();
    let session = create_session(&mut client, request).await.unwrap();
    let odd = fork(
        &mut client,
        &session.session_id,
        &[
            "audit a\n@sim tool Bash {\"command\":\"sleep 3\"}\n@sim say a done",
            "audit b",
        ],
        None,
    )
    .await
    .unwrap();
    let what = "the first child's first request to be recorded";
    eventually(Duration::from_secs(30), what, || {
        let mut client = client.clone();
        let batch = odd.batch_id.clone();
        async move { !requests_of(&mut client, &batch).await.is_empty() }
    })
    .await;
    // One running at a time: the second child waits while the first one's Bash sleeps.
    daemon.stop().await.unwrap();
    let db = daemon.home_path().join("forkd.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    let changed = sqlx::query(
        "UPDATE sessions SET system_prompt = replace(system_prompt, 'careful engineer.', \
         'careful engineer!') WHERE id = ?",
    )
    .bind(&session.session_id)
    .execute(&pool)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(changed, 1);
    pool.close().await;

    // Port 0: the daemon reports the port it bound.
    daemon
        .restart(|c| c.metrics_listen = Some("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let addr = daemon.metrics_addr().expect("a metrics address");
    assert_ne!(addr.port(), 0);
    let mut client = daemon.client().await.unwrap();
    wait_for_batch(&mut client, &odd.batch_id, 2, Duration::from_secs(30))
        .await
        .unwrap();
    let text = scrape(addr).await;
    assert!(text.starts_with("HTTP/1."), "{text}");
    every_series_names_its_daemon(&text);
    assert_eq!(
        sample(&text, "forkd_prefix_divergences_total"),
        Some(1.0),
        "the second child's first request was caught: {text}"
    );
    let odd_requests = requests_of(&mut client, &odd.batch_id).await;
    let why = explain_first_request(&mut client, &odd_requests, &odd.agent_ids[1]).await;
    assert!(!why.same_prefix, "{why:?}");
    assert_eq!(why.part, "system", "{why:?}");

    // A second session, untouched: its batch shows up, and nothing more diverges.
    let session = create_session(&mut client, session_request(&daemon.workspace_path()))
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
    let fork_requests: f64 = text
        .lines()
        .filter(|l| l.starts_with("forkd_requests_total{") && l.contains("kind=\"fork\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(fork_requests >= 2.0, "{text}");
    assert!(
        sample(&text, "forkd_agents_ended_total{status=\"completed\"}").is_some_and(|n| n >= 2.0),
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
        "forkd_agent_runs",
    ] {
        assert!(sample(&text, series).is_some(), "{series} missing: {text}");
    }
    assert_eq!(
        sample(&text, "forkd_prefix_divergences_total"),
        Some(1.0),
        "{text}"
    );
    assert!(text.contains("forkd_notification_lag_seconds"), "{text}");
    assert!(text.contains("forkd_model_first_token_seconds"), "{text}");
    assert!(text.contains("forkd_cost_usd"), "{text}");

    // Agents by stored state, across both daemons' lives: the four fork children have ended,
    // none is left pending or running, and every (kind, state) pair is reported.
    let stored = |state: &str| {
        labelled(
            &text,
            "forkd_agents",
            &["kind=\"fork\"", &format!("state=\"{state}\"")],
        )
    };
    let ended: f64 = ["completed", "failed", "killed"]
        .iter()
        .filter_map(|s| stored(s))
        .sum();
    assert_eq!(ended, 4.0, "{text}");
    assert_eq!(stored("pending"), Some(0.0), "{text}");
    assert_eq!(stored("running"), Some(0.0), "{text}");
    // Each batch's cache-read share: the untouched batch's second child read the prefix.
    let share = |batch: &str| {
        labelled(
            &text,
            "forkd_batch_cache_read_share",
            &[&format!("batch_id=\"{batch}\"")],
        )
    };
    assert!(
        share(&batch.batch_id).is_some_and(|s| s > 0.3 && s < 1.0),
        "{text}"
    );
    assert!(share(&odd.batch_id).is_some(), "{text}");
    assert!(
        text.contains("# TYPE forkd_batch_cache_read_share gauge"),
        "{text}"
    );

    // The batch's requests are listed with their ids, and the second child's first request is
    // explained against the first's: the same prefix, parting in the child's own directive.
    let requests = requests_of(&mut client, &batch.batch_id).await;
    assert!(requests.len() >= 2, "{requests:?}");
    // Each record carries its time to first token.
    assert!(
        requests.iter().all(|r| r.first_token_ms.is_some()),
        "{requests:?}"
    );
    let why = explain_first_request(&mut client, &requests, &batch.agent_ids[1]).await;
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
