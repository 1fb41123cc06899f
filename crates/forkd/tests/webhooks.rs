//! Webhooks (docs/operations.md, "Webhooks and schedules"): a tenant's notifications posted to
//! its URLs, signed to the Standard Webhooks specification (verified here with its own library),
//! at least once per `webhook-id`, retried while the receiver is down or asks for a pause,
//! refused for addresses a tenant must not reach, and a tenant's own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_test_support::receiver::{Answer, Receiver};
use forkd_test_support::{
    Caller, TestDaemon, directives, eventually, session_request, spawn_tenants,
};

mod binary;

const LOOPBACK: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// A daemon that reaches loopback (the receiver's address), with quick retries, and the callers
/// of two tenants.
async fn daemon(
    tweak: impl FnOnce(&mut forkd_engine::WebhookConfig),
) -> (TestDaemon, Caller, Caller) {
    let (daemon, alpha, beta, _) = daemon_with_secret(tweak).await;
    (daemon, alpha, beta)
}

/// [`daemon`], and alpha's token.
async fn daemon_with_secret(
    tweak: impl FnOnce(&mut forkd_engine::WebhookConfig),
) -> (TestDaemon, Caller, Caller, String) {
    let (daemon, mut callers) = spawn_tenants(&["alpha", "beta"], |c| {
        c.ui_listen = Some(LOOPBACK);
        c.engine.webhooks.allow_private = true;
        c.engine.webhooks.timeout = Duration::from_secs(2);
        c.engine.webhooks.retry.max_backoff = Duration::from_secs(1);
        tweak(&mut c.engine.webhooks);
    })
    .await
    .unwrap();
    let (beta, _) = callers.pop().unwrap();
    let (alpha, token) = callers.pop().unwrap();
    (daemon, alpha, beta, token)
}

/// The web view's `/api/automations`, signed in with `token`.
async fn automations_page(daemon: &TestDaemon, token: &str) -> serde_json::Value {
    let base = format!("http://{}", daemon.daemon().unwrap().ui_addr.unwrap());
    let http = reqwest::Client::new();
    let signed = http
        .post(format!("{base}/api/signin"))
        .json(&serde_json::json!({ "token": token }))
        .send()
        .await
        .unwrap();
    let cookie = signed.headers()[reqwest::header::SET_COOKIE]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    http.get(format!("{base}/api/automations"))
        .header(reqwest::header::COOKIE, cookie)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn add(c: &mut Caller, req: pb::CreateWebhookRequest) -> pb::CreateWebhookResponse {
    let request = c.req(req);
    c.client.create_webhook(request).await.unwrap().into_inner()
}

fn hook(url: String) -> pb::CreateWebhookRequest {
    pb::CreateWebhookRequest {
        url,
        ..Default::default()
    }
}

/// Forks `n` quick children on a new session of the caller's; their batch id, once all ended.
async fn fork_and_wait(
    c: &mut Caller,
    workspace: &std::path::Path,
    n: usize,
    webhook: &str,
) -> String {
    let session = c.create_session(session_request(workspace)).await.unwrap();
    let prompts: Vec<String> = (0..n).map(|i| format!("Part {i}.")).collect();
    let prompts: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let request = c.req(pb::ForkBatchRequest {
        session_id: session.session_id,
        directives: directives(&prompts),
        webhook_id: webhook.to_owned(),
        ..Default::default()
    });
    let batch = c.client.fork_batch(request).await.unwrap().into_inner();
    let follow = c.req(pb::SubscribeNotificationsRequest {
        batch_id: batch.batch_id.clone(),
        follow: true,
        ..Default::default()
    });
    let mut stream = c
        .client
        .subscribe_notifications(follow)
        .await
        .unwrap()
        .into_inner();
    for _ in 0..n {
        tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .expect("the batch ends in time")
            .unwrap()
            .expect("a notification per child");
    }
    batch.batch_id
}

async fn attempts(c: &mut Caller, webhook_id: &str) -> Vec<pb::WebhookAttempt> {
    let request = c.req(pb::ListWebhookAttemptsRequest {
        webhook_id: webhook_id.to_owned(),
        limit: 0,
    });
    c.client
        .list_webhook_attempts(request)
        .await
        .unwrap()
        .into_inner()
        .attempts
}

#[tokio::test]
async fn each_notification_arrives_signed_once_with_the_json_watch_prints() {
    let (daemon, mut alpha, _, token) = daemon_with_secret(|_| {}).await;
    let receiver = Receiver::start().await.unwrap();
    let created = add(&mut alpha, hook(receiver.url("/hook"))).await;
    assert!(created.secret.starts_with("whsec_"), "{}", created.secret);
    receiver.trust(&[&created.secret]);

    let batch = fork_and_wait(&mut alpha, &daemon.tenant_workspace("alpha"), 3, "").await;
    let got = eventually(Duration::from_secs(20), "three deliveries", || async {
        let taken = receiver.taken_ids();
        (taken.len() == 3).then_some(receiver.received())
    })
    .await;
    assert!(
        got.iter().all(|r| r.verified),
        "every signature verifies: {got:?}"
    );
    // What the body carries is the notification as a subscriber sees it.
    let mut stream = alpha
        .client
        .subscribe_notifications(alpha.req(pb::SubscribeNotificationsRequest {
            batch_id: batch.clone(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    let mut seen = Vec::new();
    while let Some(n) = stream.message().await.unwrap() {
        seen.push(n);
    }
    for n in &seen {
        let body = got
            .iter()
            .map(|r| &r.body)
            .find(|b| b["data"]["agent_id"] == n.agent_id.as_str())
            .expect("a delivery per notification");
        assert_eq!(body["type"], "notification");
        assert_eq!(body["data"]["seq"], n.seq);
        assert_eq!(body["data"]["batch_id"], batch.as_str());
        assert_eq!(body["data"]["status"], "completed");
        assert_eq!(body["data"]["kind"], "fork");
        assert!(body["data"]["usage"]["output_tokens"].as_u64().unwrap() > 0);
        assert!(body["timestamp"].as_str().unwrap().ends_with('Z'));
    }
    // And exactly as `forkctl --json watch` prints it.
    // Not blocking: the daemon answers on this test's runtime.
    let watched = tokio::process::Command::new(binary::forkctl())
        .args(["--json", "watch", "--no-follow", "--batch", &batch])
        .arg("--addr")
        .arg(format!("http://{}", daemon.tcp_addr().unwrap()))
        .env("FORKD_TOKEN", &token)
        .output()
        .await
        .unwrap();
    assert!(watched.status.success(), "{watched:?}");
    let lines = String::from_utf8(watched.stdout).unwrap();
    assert_eq!(lines.lines().count(), 3, "{lines}");
    for line in lines.lines() {
        let printed: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(
            got.iter().any(|r| r.body["data"] == printed),
            "no delivery carries {printed}"
        );
    }
    // The web view lists the attempts too.
    let page = automations_page(&daemon, &token).await;
    let shown = page["webhooks"][0]["attempts"].as_array().unwrap();
    assert_eq!(shown.len(), 3, "{page}");
    assert!(
        shown
            .iter()
            .all(|a| a["status"] == 200 && a["latency_ms"].is_u64())
    );
    // Listed, each taken at its first attempt.
    let listed = attempts(&mut alpha, &created.webhook.unwrap().webhook_id).await;
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert!(
        listed
            .iter()
            .all(|a| a.status == 200 && a.state == "delivered" && a.number == 1)
    );
}

#[tokio::test]
async fn a_receiver_down_or_asking_for_a_pause_gets_the_delivery_later() {
    let (daemon, mut alpha, _) = daemon(|_| {}).await;
    // Nothing listens on the port yet.
    let port = std::net::TcpListener::bind(LOOPBACK)
        .unwrap()
        .local_addr()
        .unwrap();
    let created = add(&mut alpha, hook(format!("http://{port}/hook"))).await;
    let webhook_id = created.webhook.unwrap().webhook_id;
    fork_and_wait(&mut alpha, &daemon.tenant_workspace("alpha"), 1, "").await;
    eventually(Duration::from_secs(20), "two failed attempts", || async {
        let listed = attempts(&mut alpha.clone(), &webhook_id).await;
        (listed.len() >= 2).then_some(())
    })
    .await;
    let failed = attempts(&mut alpha, &webhook_id).await;
    assert!(
        failed.iter().all(|a| a.status == 0 && a.state == "pending"),
        "{failed:?}"
    );
    assert!(failed[0].error.contains("connect"), "{}", failed[0].error);

    // The receiver comes up, asks for a 2 s pause once, then takes it.
    let receiver = Receiver::start_on(port).await.unwrap();
    receiver.trust(&[&created.secret]);
    receiver.answer(vec![Answer::SlowDown(2)], None);
    let got = eventually(Duration::from_secs(20), "the delivery", || async {
        (receiver.taken_ids().len() == 1).then_some(receiver.received())
    })
    .await;
    assert_eq!(got.len(), 2, "asked to pause, then took it: {got:?}");
    assert_eq!(got[0].id, got[1].id, "one webhook-id across attempts");
    assert!(
        got[1].at - got[0].at >= Duration::from_millis(1900),
        "retry-after honoured: {:?}",
        got[1].at - got[0].at
    );
    assert!(got.iter().all(|r| r.verified));
    let listed = attempts(&mut alpha, &webhook_id).await;
    assert_eq!(listed[0].state, "delivered");
    assert_eq!(listed[0].status, 200);
    assert_eq!(listed[1].status, 429);
}

#[tokio::test]
async fn a_delivery_is_given_up_after_its_window() {
    let (daemon, mut alpha, _) = daemon(|w| w.retry.retry_for = Duration::from_secs(2)).await;
    let receiver = Receiver::start().await.unwrap();
    receiver.answer(Vec::new(), Some(Answer::Fail(503)));
    let created = add(&mut alpha, hook(receiver.url("/hook"))).await;
    let webhook_id = created.webhook.unwrap().webhook_id;
    fork_and_wait(&mut alpha, &daemon.tenant_workspace("alpha"), 1, "").await;
    let listed = eventually(Duration::from_secs(30), "the delivery given up", || async {
        let listed = attempts(&mut alpha.clone(), &webhook_id).await;
        listed
            .first()
            .is_some_and(|a| a.state == "failed")
            .then_some(listed)
    })
    .await;
    assert!(listed.len() >= 2, "retried before giving up: {listed:?}");
    assert!(listed.iter().all(|a| a.status == 503));
    // Not for long enough to disable the endpoint (5 days by default).
    let request = alpha.req(pb::GetWebhookRequest {
        webhook_id: webhook_id.clone(),
    });
    let w = alpha
        .client
        .get_webhook(request)
        .await
        .unwrap()
        .into_inner();
    let w = w.webhook.unwrap();
    assert!(
        w.disabled_reason.is_empty() && w.failing_since.is_some(),
        "{w:?}"
    );
}

#[tokio::test]
async fn an_endpoint_failing_for_too_long_is_disabled() {
    let (daemon, mut alpha, _) = daemon(|w| {
        // The endpoint is disabled (2 s of failures) while its delivery is still retried.
        w.retry.retry_for = Duration::from_secs(20);
        w.retry.disable_after = Duration::from_secs(2);
    })
    .await;
    let receiver = Receiver::start().await.unwrap();
    receiver.answer(Vec::new(), Some(Answer::Fail(500)));
    let created = add(&mut alpha, hook(receiver.url("/hook"))).await;
    let webhook_id = created.webhook.unwrap().webhook_id;
    fork_and_wait(&mut alpha, &daemon.tenant_workspace("alpha"), 1, "").await;
    let disabled = eventually(Duration::from_secs(30), "the webhook disabled", || async {
        let mut c = alpha.clone();
        let request = c.req(pb::GetWebhookRequest {
            webhook_id: webhook_id.clone(),
        });
        let w = c
            .client
            .get_webhook(request)
            .await
            .ok()?
            .into_inner()
            .webhook?;
        (!w.disabled_reason.is_empty()).then_some(w)
    })
    .await;
    assert!(
        disabled.disabled_reason.contains("HTTP 500"),
        "{}",
        disabled.disabled_reason
    );
    assert!(disabled.failing_since.is_some());
    let listed = attempts(&mut alpha, &webhook_id).await;
    assert!(listed.iter().all(|a| a.state == "failed"), "{listed:?}");
    // Nothing more is attempted.
    let before = receiver.received().len();
    fork_and_wait(&mut alpha, &daemon.tenant_workspace("alpha"), 1, "").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(receiver.received().len(), before);
}

#[tokio::test]
async fn addresses_a_tenant_must_not_reach_are_refused_and_redirects_not_followed() {
    let (_daemon, mut strict, _) = {
        let (d, a, b) = daemon(|w| w.allow_private = false).await;
        (d, a, b)
    };
    for url in [
        "http://127.0.0.1:9/hook",
        "http://localhost:9/hook",
        "http://10.1.2.3/hook",
        "http://100.64.0.1/hook",
        "http://[::1]/hook",
        "http://[::ffff:192.168.1.1]/hook",
        "http://169.254.169.254/latest/meta-data",
        "ftp://example.com/hook",
    ] {
        let request = strict.req(hook(url.to_owned()));
        let err = strict.client.create_webhook(request).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{url}: {err:?}");
        assert!(
            err.message().contains("refused"),
            "{url}: {}",
            err.message()
        );
    }

    // Allowed private addresses still never reach a metadata service.
    let (daemon, mut alpha, _) = daemon(|_| {}).await;
    for url in [
        "http://169.254.169.254/",
        "http://[fd00:ec2::254]/",
        "http://[::ffff:169.254.169.254]/",
    ] {
        let request = alpha.req(hook(url.to_owned()));
        let err = alpha.client.create_webhook(request).await.unwrap_err();
        assert!(
            err.message().contains("metadata"),
            "{url}: {}",
            err.message()
        );
    }
    // A redirect is an answer, not a new destination.
    let receiver = Receiver::start().await.unwrap();
    receiver.answer(vec![Answer::Redirect(receiver.url("/elsewhere"))], None);
    let created = add(&mut alpha, hook(receiver.url("/hook"))).await;
    let webhook_id = created.webhook.unwrap().webhook_id;
    fork_and_wait(&mut alpha, &daemon.tenant_workspace("alpha"), 1, "").await;
    eventually(
        Duration::from_secs(20),
        "the retry after the redirect",
        || async { (receiver.taken_ids().len() == 1).then_some(()) },
    )
    .await;
    assert!(
        receiver.received().iter().all(|r| r.path == "/hook"),
        "never /elsewhere"
    );
    let listed = attempts(&mut alpha, &webhook_id).await;
    let redirected = listed.iter().find(|a| a.status == 302).expect("the 302");
    assert!(
        redirected.error.contains("not followed"),
        "{}",
        redirected.error
    );
}

#[tokio::test]
async fn webhooks_are_their_tenant_s_and_batches_may_name_one() {
    let (daemon, mut alpha, mut beta) = daemon(|_| {}).await;
    let all = Receiver::start().await.unwrap();
    let named = Receiver::start().await.unwrap();
    let alpha_all = add(&mut alpha, hook(all.url("/all"))).await;
    let only_named = add(
        &mut alpha,
        pb::CreateWebhookRequest {
            url: named.url("/named"),
            named_only: true,
            ..Default::default()
        },
    )
    .await;
    let only_named_id = only_named.webhook.unwrap().webhook_id;
    let beta_hook = add(&mut beta, hook(all.url("/beta"))).await;
    all.trust(&[&alpha_all.secret, &beta_hook.secret]);
    named.trust(&[&only_named.secret]);

    // Another tenant's webhook is missing to beta, in every call and as a batch's webhook.
    let get = beta.req(pb::GetWebhookRequest {
        webhook_id: only_named_id.clone(),
    });
    assert_eq!(
        beta.client.get_webhook(get).await.unwrap_err().code(),
        tonic::Code::NotFound
    );
    let delete = beta.req(pb::DeleteWebhookRequest {
        webhook_id: only_named_id.clone(),
    });
    assert_eq!(
        beta.client.delete_webhook(delete).await.unwrap_err().code(),
        tonic::Code::NotFound
    );
    let listed = beta
        .client
        .list_webhooks(beta.req(pb::ListWebhooksRequest {}))
        .await
        .unwrap();
    assert_eq!(listed.into_inner().webhooks.len(), 1);
    let session = beta
        .create_session(session_request(&daemon.tenant_workspace("beta")))
        .await
        .unwrap();
    let naming = beta.req(pb::ForkBatchRequest {
        session_id: session.session_id.clone(),
        directives: directives(&["Hi."]),
        webhook_id: only_named_id.clone(),
        ..Default::default()
    });
    assert_eq!(
        beta.client.fork_batch(naming).await.unwrap_err().code(),
        tonic::Code::NotFound
    );
    let dry = beta.req(pb::ForkBatchRequest {
        session_id: session.session_id.clone(),
        directives: directives(&["Hi."]),
        webhook_id: only_named_id.clone(),
        dry_run: true,
        ..Default::default()
    });
    assert_eq!(
        beta.client.fork_batch(dry).await.unwrap_err().code(),
        tonic::Code::NotFound,
        "a dry run checks the webhook as a submission does"
    );

    // Alpha's plain batch reaches its catch-all webhook, not the named-only one nor beta's.
    fork_and_wait(&mut alpha, &daemon.tenant_workspace("alpha"), 2, "").await;
    // A batch naming the named-only webhook reaches both of alpha's.
    fork_and_wait(
        &mut alpha,
        &daemon.tenant_workspace("alpha"),
        1,
        &only_named_id,
    )
    .await;
    eventually(Duration::from_secs(20), "the deliveries", || async {
        (all.taken_ids().len() == 3 && named.taken_ids().len() == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        all.received()
            .iter()
            .all(|r| r.path == "/all" && r.verified)
    );
    assert_eq!(named.received().len(), 1);
    assert!(named.received()[0].verified);
}

#[tokio::test]
async fn a_rotated_secret_signs_beside_the_new_one_for_the_overlap() {
    let (daemon, mut alpha, _) = daemon(|_| {}).await;
    let receiver = Receiver::start().await.unwrap();
    let created = add(&mut alpha, hook(receiver.url("/hook"))).await;
    let webhook_id = created.webhook.unwrap().webhook_id;
    let rotated = alpha
        .client
        .rotate_webhook_secret(alpha.req(pb::RotateWebhookSecretRequest {
            webhook_id: webhook_id.clone(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(rotated.secret, created.secret);
    assert!(rotated.webhook.unwrap().previous_secret_until.is_some());

    // A receiver that knows only the old secret, and one that knows only the new, both verify.
    for secret in [&created.secret, &rotated.secret] {
        receiver.trust(&[secret]);
        let tested = alpha
            .client
            .test_webhook(alpha.req(pb::TestWebhookRequest {
                webhook_id: webhook_id.clone(),
            }))
            .await
            .unwrap()
            .into_inner()
            .attempt
            .unwrap();
        assert_eq!(tested.status, 200, "{tested:?}");
        assert_eq!(tested.event, "ping");
        let last = receiver.received().pop().unwrap();
        assert!(last.verified, "verified with {secret}");
        assert_eq!(last.body["type"], "ping");
    }
    drop(daemon);
}

/// The real binary killed with SIGKILL while an attempt is in flight: the delivery is made after
/// the restart, under the same `webhook-id`.
#[tokio::test]
async fn a_delivery_cut_off_by_sigkill_is_made_after_the_restart() {
    let home = tempfile::Builder::new()
        .prefix("forkd-webhook-")
        .tempdir()
        .unwrap();
    let workspace = tempfile::Builder::new()
        .prefix("forkd-webhook-ws-")
        .tempdir()
        .unwrap();
    std::fs::write(
        home.path().join("config.toml"),
        "[webhooks]\nallow_private = true\ntimeout = \"60s\"\n",
    )
    .unwrap();
    let receiver = Receiver::start().await.unwrap();
    receiver.answer(vec![Answer::Hang], None);

    let daemon = binary::Daemon::start(home.path(), "0");
    let mut client = binary::client(home.path()).await;
    let created = client
        .create_webhook(hook(receiver.url("/hook")))
        .await
        .unwrap()
        .into_inner();
    receiver.trust(&[&created.secret]);
    let session =
        forkd_test_support::create_session(&mut client, session_request(workspace.path()))
            .await
            .unwrap();
    let batch = client
        .fork_batch(pb::ForkBatchRequest {
            session_id: session.session_id,
            directives: directives(&["Hi."]),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    forkd_test_support::wait_for_batch(&mut client, &batch.batch_id, 1, Duration::from_secs(30))
        .await
        .unwrap();
    // The attempt is in flight (the receiver holds it) when the daemon dies.
    eventually(Duration::from_secs(20), "the first attempt", || async {
        (receiver.received().len() == 1).then_some(())
    })
    .await;
    daemon.kill9();

    let _daemon = binary::Daemon::start(home.path(), "0");
    let got = eventually(
        Duration::from_secs(30),
        "the delivery after the restart",
        || async { (receiver.taken_ids().len() == 1).then_some(receiver.received()) },
    )
    .await;
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        got[0].id, got[1].id,
        "the same webhook-id: a receiver drops the repeat"
    );
    assert!(got.iter().all(|r| r.verified));
}

/// A tenant has at most 32 webhooks: the 33rd is refused saying so, another tenant's count is
/// its own, and deleting one makes room.
#[tokio::test]
async fn a_tenant_s_webhooks_are_capped() {
    let (_daemon, mut alpha, mut beta) = daemon(|_| {}).await;
    let receiver = Receiver::start().await.unwrap();
    let mut ids = Vec::new();
    for i in 0..32 {
        let made = add(&mut alpha, hook(receiver.url(&format!("/{i}")))).await;
        ids.push(made.webhook.unwrap().webhook_id);
    }
    let request = alpha.req(hook(receiver.url("/one-more")));
    let err = alpha.client.create_webhook(request).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message()
            .contains("has 32 webhooks, the most a tenant may have"),
        "{}",
        err.message()
    );
    add(&mut beta, hook(receiver.url("/beta"))).await;
    let delete = alpha.req(pb::DeleteWebhookRequest {
        webhook_id: ids.pop().unwrap(),
    });
    alpha.client.delete_webhook(delete).await.unwrap();
    add(&mut alpha, hook(receiver.url("/one-more"))).await;
}
