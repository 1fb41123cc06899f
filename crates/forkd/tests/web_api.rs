//! The web view's HTTP API against the real daemon, without a browser: sign-in (with a token,
//! or with a link minted over the Unix socket) and its cookie, tenants, cross-site protection,
//! live streams resumed with `Last-Event-ID`, the listener rules and TLS. (`web.rs` drives the page itself in Chromium.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use eventsource_stream::Eventsource as _;
use forkd::daemon::TlsFiles;
use forkd_proto::v1 as pb;
use forkd_test_support::{
    TestDaemon, eventually, session_request, spawn_daemon_with, write_test_certs,
};
use futures::StreamExt as _;
use reqwest::StatusCode;
use reqwest::header::{COOKIE, SET_COOKIE};
use serde_json::{Value, json};

const LOOPBACK: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

fn http() -> reqwest::Client {
    reqwest::Client::builder().build().unwrap()
}

/// A signed-in browser, as far as the API can tell: its cookie and the page's CSRF token.
struct SignedIn {
    base: String,
    cookie: String,
    csrf: String,
}

impl SignedIn {
    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let res = http()
            .get(format!("{}{path}", self.base))
            .header(COOKIE, &self.cookie)
            .send()
            .await
            .unwrap();
        let status = res.status();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, csrf: Option<&str>, origin: Option<&str>) -> StatusCode {
        let mut req = http()
            .post(format!("{}{path}", self.base))
            .header(COOKIE, &self.cookie)
            .header("content-type", "application/json")
            .body("{}");
        if let Some(csrf) = csrf {
            req = req.header("x-forkd-csrf", csrf);
        }
        if let Some(origin) = origin {
            req = req.header("origin", origin);
        }
        req.send().await.unwrap().status()
    }
}

async fn sign_in(client: &reqwest::Client, base: &str, token: &str) -> reqwest::Response {
    client
        .post(format!("{base}/api/signin"))
        .json(&json!({ "token": token }))
        .send()
        .await
        .unwrap()
}

async fn signed_in(base: &str, token: &str) -> SignedIn {
    let res = sign_in(&http(), base, token).await;
    assert_eq!(res.status(), StatusCode::OK);
    let cookie = res.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    let body: Value = res.json().await.unwrap();
    SignedIn {
        base: base.to_owned(),
        cookie: cookie.split(';').next().unwrap().to_owned(),
        csrf: body["csrf"].as_str().unwrap().to_owned(),
    }
}

async fn daemon_with_ui() -> (TestDaemon, String) {
    let daemon = spawn_daemon_with(|c| c.ui_listen = Some(LOOPBACK))
        .await
        .unwrap();
    let addr = daemon.daemon().unwrap().ui_addr.unwrap();
    (daemon, format!("http://{addr}"))
}

/// A session and a batch of `n` children made by `token`'s tenant over gRPC; waits for the
/// children to end. Returns the session, the batch and the children.
async fn batch_of(daemon: &TestDaemon, token: &str, n: usize) -> (String, String, Vec<String>) {
    let mut client = daemon.client().await.unwrap();
    let auth: tonic::metadata::MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
    // No workspace named: the token's tenant gets a fresh one of its own.
    let mut req = tonic::Request::new(session_request(std::path::Path::new("")));
    req.metadata_mut().insert("authorization", auth.clone());
    let session = client
        .create_session(req)
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap()
        .session_id;
    let directives = (0..n)
        .map(|i| pb::Directive {
            description: format!("child {i}"),
            prompt: format!("Child {i}\n@sim say done {i}"),
            limits: None,
        })
        .collect();
    let mut req = tonic::Request::new(pb::ForkBatchRequest {
        session_id: session.clone(),
        directives,
        ..Default::default()
    });
    req.metadata_mut().insert("authorization", auth.clone());
    let batch = client.fork_batch(req).await.unwrap().into_inner();
    let engine = daemon.daemon().unwrap().engine.clone();
    let ids = batch.agent_ids.clone();
    eventually(Duration::from_secs(30), "the children to end", || {
        let (engine, ids) = (engine.clone(), ids.clone());
        async move {
            for id in &ids {
                let agent = engine.get_agent(id.parse().ok()?).await.ok()?;
                if !agent.state.is_terminal() {
                    return None;
                }
            }
            Some(())
        }
    })
    .await;
    (session, batch.batch_id, batch.agent_ids)
}

#[tokio::test]
async fn sign_in_keeps_the_token_in_the_daemon_and_a_cookie_in_the_browser() {
    let (daemon, base) = daemon_with_ui().await;
    let alice = daemon.tokens().create("alice").unwrap();
    let secret = alice.expose().to_owned();

    // The page itself is public and carries no secret; the API is not.
    let page = http().get(format!("{base}/")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(
        page.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("script-src 'self'")
    );
    assert!(page.text().await.unwrap().contains("/app.js"));
    let res = http()
        .get(format!("{base}/api/sessions"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);

    let wrong = sign_in(&http(), &base, &format!("fkd_{}", "0".repeat(64))).await;
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert!(wrong.headers().get(SET_COOKIE).is_none());

    let res = sign_in(&http(), &base, &secret).await;
    assert_eq!(res.status(), StatusCode::OK);
    let cookie = res.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    assert!(cookie.starts_with("forkd_ui="), "{cookie}");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(!cookie.contains("Secure"), "plain HTTP: {cookie}");
    assert!(
        !cookie.contains(&secret[4..]),
        "the cookie never holds the token"
    );
    let body = res.text().await.unwrap();
    assert!(
        !body.contains(&secret[4..]),
        "the answer never holds the token"
    );

    // A revoked token ends its sign-ins at their next call, as over gRPC.
    let session = signed_in(&base, &secret).await;
    assert_eq!(session.get("/api/sessions").await.0, StatusCode::OK);
    daemon.tokens().revoke("alice").unwrap();
    assert_eq!(
        session.get("/api/sessions").await.0,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn tenants_see_only_their_own_and_actions_refuse_other_sites() {
    let (daemon, base) = daemon_with_ui().await;
    let alice = daemon.tokens().create("alice").unwrap().expose().to_owned();
    let bob = daemon.tokens().create("bob").unwrap().expose().to_owned();
    let (session, batch, children) = batch_of(&daemon, &alice, 2).await;
    let (a, b) = (signed_in(&base, &alice).await, signed_in(&base, &bob).await);

    let (status, list) = a.get("/api/sessions").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["sessions"][0]["id"], session.as_str());
    let (status, page) = a.get(&format!("/api/batches/{batch}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["figures"]["timeline"].as_array().unwrap().len(), 2);
    let (status, agent) = a.get(&format!("/api/agents/{}", children[0])).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(agent["agent"]["state"], "completed");

    let (status, list) = b.get("/api/sessions").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["sessions"], json!([]));
    for path in [
        format!("/api/sessions/{session}"),
        format!("/api/batches/{batch}"),
        format!("/api/agents/{}", children[0]),
        format!("/api/live/batches/{batch}"),
        format!("/api/live/agents/{}", children[0]),
    ] {
        let (status, body) = b.get(&path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert!(
            body["error"].as_str().unwrap().contains("not found"),
            "{path}: {body}"
        );
    }

    // Actions need the page's CSRF token, from this very site; with both, the engine answers
    // (the child has ended, so there is nothing to hand to the background).
    let action = format!("/api/agents/{}/background", children[0]);
    assert_eq!(a.post(&action, None, None).await, StatusCode::FORBIDDEN);
    assert_eq!(
        a.post(&action, Some("forged"), None).await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        a.post(&action, Some(&b.csrf), None).await,
        StatusCode::FORBIDDEN
    );
    let evil = Some("https://evil.example");
    assert_eq!(
        a.post(&action, Some(&a.csrf), evil).await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        a.post(&action, Some(&a.csrf), Some(&base)).await,
        StatusCode::CONFLICT
    );
    // Another tenant's agent is not found, with a valid token of its own.
    assert_eq!(
        b.post(&action, Some(&b.csrf), None).await,
        StatusCode::NOT_FOUND
    );
}

/// The `notification` events of a live stream, in order, until `n` have come.
async fn notifications(res: reqwest::Response, n: usize) -> Vec<u64> {
    let mut events = res.bytes_stream().eventsource();
    let mut seqs = Vec::new();
    let read = async {
        while let Some(event) = events.next().await {
            let event = event.unwrap();
            if event.event == "notification" {
                let body: Value = serde_json::from_str(&event.data).unwrap();
                assert_eq!(event.id, body["seq"].to_string(), "the event id is the seq");
                seqs.push(event.id.parse().unwrap());
                if seqs.len() == n {
                    break;
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("the stream stalled");
    seqs
}

#[tokio::test]
async fn a_live_stream_resumes_after_the_last_event_id_without_gaps() {
    let (daemon, base) = daemon_with_ui().await;
    let alice = daemon.tokens().create("alice").unwrap().expose().to_owned();
    let (_, batch, children) = batch_of(&daemon, &alice, 3).await;
    let a = signed_in(&base, &alice).await;
    let live = |last: Option<u64>| {
        let mut req = http()
            .get(format!("{base}/api/live/batches/{batch}"))
            .header(COOKIE, &a.cookie);
        if let Some(last) = last {
            req = req.header("last-event-id", last.to_string());
        }
        req.send()
    };
    let all = notifications(live(None).await.unwrap(), 3).await;
    assert!(all.windows(2).all(|w| w[0] < w[1]), "{all:?}");
    let resumed = notifications(live(Some(all[0])).await.unwrap(), 2).await;
    assert_eq!(
        resumed,
        all[1..],
        "resumed after the last seen event, nothing skipped or repeated"
    );

    // An agent's transcript: its own messages by seq, then its end; resumed after the last one.
    let agent_stream = |last: Option<u64>| {
        let mut req = http()
            .get(format!("{base}/api/live/agents/{}?from=0", children[0]))
            .header(COOKIE, &a.cookie);
        if let Some(last) = last {
            req = req.header("last-event-id", last.to_string());
        }
        req.send()
    };
    let messages = |res: reqwest::Response| async move {
        let mut events = res.bytes_stream().eventsource();
        let mut seqs = Vec::new();
        let read = async {
            while let Some(event) = events.next().await {
                let event = event.unwrap();
                match event.event.as_str() {
                    "message" => seqs.push(event.id.parse::<u64>().unwrap()),
                    "ended" => break,
                    _ => {}
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .expect("the stream stalled");
        seqs
    };
    let all = messages(agent_stream(None).await.unwrap()).await;
    assert_eq!(all, (0..all.len() as u64).collect::<Vec<_>>());
    assert!(!all.is_empty());
    let resumed = messages(agent_stream(Some(0)).await.unwrap()).await;
    assert_eq!(resumed, all[1..]);
}

#[tokio::test]
async fn off_loopback_the_view_needs_tokens_and_on_loopback_it_still_needs_a_sign_in() {
    let anywhere = SocketAddr::from(([0, 0, 0, 0], 0));
    let refused = spawn_daemon_with(|c| c.ui_listen = Some(anywhere)).await;
    let err = format!("{:#}", refused.err().expect("started without tokens"));
    assert!(err.contains("without bearer tokens"), "{err}");

    // On loopback with no token at all, a caller without a sign-in is still no one: any local
    // process (a sandboxed command allowed the network) could be asking.
    let (daemon, base) = daemon_with_ui().await;
    let mut local = daemon.client().await.unwrap();
    local
        .create_session(session_request(&daemon.workspace_path()))
        .await
        .unwrap();
    for path in ["/api/me", "/api/sessions", "/api/live/sessions"] {
        let res = http().get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    let res = http()
        .post(format!("{base}/api/prompts/x"))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
}

/// `CreateSignInLink` over the daemon's Unix socket, without a token.
async fn sign_in_link(daemon: &TestDaemon) -> Result<pb::CreateSignInLinkResponse, tonic::Status> {
    let mut client = daemon.client().await.unwrap();
    client
        .create_sign_in_link(pb::CreateSignInLinkRequest {})
        .await
        .map(tonic::Response::into_inner)
}

/// A client that does not follow redirects, so the sign-in's own answer can be read.
fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_sign_in_link_from_the_socket_signs_in_as_local_once() {
    let (daemon, base) = daemon_with_ui().await;
    let mut local = daemon.client().await.unwrap();
    let sid = local
        .create_session(session_request(&daemon.workspace_path()))
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap()
        .session_id;

    let link = sign_in_link(&daemon).await.unwrap();
    let code = link
        .url
        .strip_prefix(&format!("{base}/signin?code="))
        .unwrap_or_else(|| panic!("{} is not a link to {base}", link.url));
    assert!(code.len() >= 32, "at least 128 bits: {code}");
    let expires = link.expires_at.unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!((55..=61).contains(&(expires.seconds - now)), "{expires:?}");

    let res = no_redirects().get(&link.url).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(res.headers()["location"], "/");
    let cookie = res.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    assert!(
        cookie.starts_with("forkd_ui=") && cookie.contains("HttpOnly"),
        "{cookie}"
    );
    assert!(cookie.contains("SameSite=Strict"), "{cookie}");
    assert!(!cookie.contains(code), "the cookie is not the code");
    let cookie = cookie.split(';').next().unwrap().to_owned();
    let me: Value = http()
        .get(format!("{base}/api/me"))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(me["tenant"], "local");
    let session = SignedIn {
        base: base.clone(),
        cookie,
        csrf: me["csrf"].as_str().unwrap().to_owned(),
    };
    let (status, list) = session.get("/api/sessions").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["sessions"][0]["id"], sid.as_str());
    // Actions work as for any sign-in: CSRF token, this site.
    assert_eq!(
        session
            .post("/api/signout", Some(&session.csrf), None)
            .await,
        StatusCode::OK
    );
    assert_eq!(
        session.get("/api/sessions").await.0,
        StatusCode::UNAUTHORIZED
    );

    // The same code again, or one never made, or none: refused, saying what to do.
    for url in [
        link.url.clone(),
        format!("{base}/signin?code={}", "0".repeat(64)),
        format!("{base}/signin"),
    ] {
        let res = no_redirects().get(&url).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{url}");
        assert!(res.headers().get(SET_COOKIE).is_none(), "{url}");
        let body: Value = res.json().await.unwrap();
        let error = body["error"].as_str().unwrap();
        assert!(error.contains("not valid"), "{error}");
        assert!(error.contains("forkctl ui"), "{error}");
    }
}

#[tokio::test]
async fn sign_in_links_are_only_for_the_socket_s_owner_and_need_a_web_view() {
    let mut secret = None;
    let daemon = spawn_daemon_with(|c| {
        c.listen = Some(LOOPBACK);
        c.ui_listen = Some(LOOPBACK);
        secret = Some(
            forkd_server::TokenStore::in_home(&c.home)
                .create("alice")
                .unwrap(),
        );
    })
    .await
    .unwrap();
    let secret = secret.unwrap();
    let with_token = || {
        let mut request = tonic::Request::new(pb::CreateSignInLinkRequest {});
        let value = format!("Bearer {}", secret.expose()).parse().unwrap();
        request.metadata_mut().insert("authorization", value);
        request
    };
    let tcp_addr = format!("http://{}", daemon.tcp_addr().unwrap());
    let mut tcp = forkd_test_support::connect(&tcp_addr).await.unwrap();
    let refused = tcp.create_sign_in_link(with_token()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("Unix socket"), "{refused:?}");
    assert!(refused.message().contains("`alice`"), "{refused:?}");
    let refused = tcp
        .create_sign_in_link(pb::CreateSignInLinkRequest {})
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    // A token on the socket names its tenant, not the socket's owner.
    let mut unix = daemon.client().await.unwrap();
    let refused = unix.create_sign_in_link(with_token()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    sign_in_link(&daemon).await.unwrap();

    let no_view = spawn_daemon_with(|_| {}).await.unwrap();
    let refused = sign_in_link(&no_view).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(refused.message().contains("--ui-listen"), "{refused:?}");
}

#[tokio::test]
async fn the_view_serves_tls_with_the_listeners_certificate_and_a_secure_cookie() {
    let dir = tempfile::tempdir().unwrap();
    let certs = write_test_certs(dir.path()).unwrap();
    let tls = TlsFiles {
        cert: certs.cert.clone(),
        key: certs.key.clone(),
    };
    let daemon = spawn_daemon_with(|c| {
        c.ui_listen = Some(LOOPBACK);
        c.tls = Some(tls);
    })
    .await
    .unwrap();
    let port = daemon.daemon().unwrap().ui_addr.unwrap().port();
    let token = daemon.tokens().create("alice").unwrap().expose().to_owned();
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&certs.ca).unwrap()).unwrap();
    let client = reqwest::Client::builder()
        .tls_certs_only([ca])
        .build()
        .unwrap();
    let base = format!("https://localhost:{port}");
    let page = client.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let res = sign_in(&client, &base, &token).await;
    assert_eq!(res.status(), StatusCode::OK);
    let cookie = res.headers()[SET_COOKIE].to_str().unwrap();
    assert!(cookie.contains("Secure"), "{cookie}");
    // Plain HTTP on the TLS port gets no page.
    let plain = http().get(format!("http://127.0.0.1:{port}/")).send().await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success());
}

#[tokio::test]
async fn an_isolated_childs_page_carries_its_diff() {
    let (daemon, base) = daemon_with_ui().await;
    let alice = daemon.tokens().create("alice").unwrap();
    let secret = alice.expose().to_owned();
    let ws = daemon.tenant_workspace("alice");
    std::fs::write(ws.join("a.txt"), "before\n").unwrap();
    let mut client = daemon.client().await.unwrap();
    let auth: tonic::metadata::MetadataValue<_> = format!("Bearer {secret}").parse().unwrap();
    let mut req = tonic::Request::new(forkd_test_support::trusted_session_request(&ws));
    req.metadata_mut().insert("authorization", auth.clone());
    let session = client.create_session(req).await.unwrap().into_inner();
    let mut req = tonic::Request::new(pb::ForkBatchRequest {
        session_id: session.session.unwrap().session_id,
        directives: vec![pb::Directive {
            description: "edit".into(),
            prompt: "Edit.\n@sim tool Bash {\"command\":\"echo after > a.txt\"}\n@sim say done"
                .into(),
            limits: None,
        }],
        isolation: "copy".into(),
        ..Default::default()
    });
    req.metadata_mut().insert("authorization", auth.clone());
    let batch = client.fork_batch(req).await.unwrap().into_inner();
    let child = batch.agent_ids[0].clone();
    let page = signed_in(&base, &secret).await;
    let changes = eventually(Duration::from_secs(30), "the child's changes", || {
        let (page, child) = (&page, child.clone());
        async move {
            let (_, body) = page.get(&format!("/api/agents/{child}")).await;
            (!body["changes"].is_null()).then_some(body["changes"].clone())
        }
    })
    .await;
    assert_eq!(changes["state"], "kept");
    assert_eq!(changes["summary"], "1 file (+1 -1)");
    assert_eq!(changes["files"][0]["path"], "a.txt");
    let diff = changes["diff"].as_str().unwrap();
    assert!(diff.contains("-before\n+after\n"), "{diff}");
    // `ps` shows the copy too.
    let mut req = tonic::Request::new(pb::ListAgentsRequest {
        batch_id: batch.batch_id.clone(),
        include_ended: true,
        ..Default::default()
    });
    req.metadata_mut().insert("authorization", auth);
    let listed = client.list_agents(req).await.unwrap().into_inner().agents;
    assert_eq!(listed[0].changes, "1 file (+1 -1), kept");
}

#[tokio::test]
async fn a_branch_and_its_origin_link_to_each_other() {
    let (daemon, base) = daemon_with_ui().await;
    let alice = daemon.tokens().create("alice").unwrap();
    let secret = alice.expose().to_owned();
    let (session, _, _) = batch_of(&daemon, &secret, 1).await;
    let mut client = daemon.client().await.unwrap();
    let auth: tonic::metadata::MetadataValue<_> = format!("Bearer {secret}").parse().unwrap();
    let mut req = tonic::Request::new(pb::BranchSessionRequest {
        session_id: session.clone(),
        ..Default::default()
    });
    req.metadata_mut().insert("authorization", auth);
    let branch = client
        .branch_session(req)
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    let page = signed_in(&base, &secret).await;
    let (status, origin) = page.get(&format!("/api/sessions/{session}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(origin["branch"], Value::Null);
    assert_eq!(origin["branches"][0]["id"], branch.session_id.as_str());
    assert_eq!(origin["branches"][0]["after_turn"], 0);
    let (_, shown) = page
        .get(&format!("/api/sessions/{}", branch.session_id))
        .await;
    assert_eq!(shown["branch"]["origin"], session.as_str());
    assert_eq!(shown["branch"]["point"], branch.branch_point);
    assert_eq!(shown["branches"], json!([]));
}

#[tokio::test]
async fn a_schema_childs_page_gets_its_structured_report() {
    let (daemon, base) = daemon_with_ui().await;
    let alice = daemon.tokens().create("alice").unwrap().expose().to_owned();
    let mut client = daemon.client().await.unwrap();
    let auth: tonic::metadata::MetadataValue<_> = format!("Bearer {alice}").parse().unwrap();
    let mut req = tonic::Request::new(session_request(&daemon.tenant_workspace("alice")));
    req.metadata_mut().insert("authorization", auth.clone());
    let session = client.create_session(req).await.unwrap().into_inner();
    let mut req = tonic::Request::new(pb::ForkBatchRequest {
        session_id: session.session.unwrap().session_id,
        directives: vec![pb::Directive {
            description: "judge".into(),
            prompt: "Judge.\n@sim json {\"verdict\":\"pass\"}".into(),
            limits: None,
        }],
        output_schema: r#"{"type":"object","required":["verdict"]}"#.into(),
        ..Default::default()
    });
    req.metadata_mut().insert("authorization", auth);
    let child = client.fork_batch(req).await.unwrap().into_inner().agent_ids[0].clone();
    let page = signed_in(&base, &alice).await;
    let res = http()
        .get(format!("{base}/api/live/agents/{child}?from=0"))
        .header(COOKIE, &page.cookie)
        .send()
        .await
        .unwrap();
    let mut events = res.bytes_stream().eventsource();
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(event) = events.next().await {
            let event = event.unwrap();
            if event.event == "ended" {
                return serde_json::from_str::<Value>(&event.data).unwrap();
            }
        }
        panic!("the stream ended without the agent's end");
    })
    .await
    .expect("the stream stalled");
    assert_eq!(
        ended["report"]["structured"],
        serde_json::json!({"verdict": "pass"})
    );
}

#[tokio::test]
async fn revoking_a_token_ends_the_live_streams_it_signed_in() {
    let (daemon, base) = daemon_with_ui().await;
    let alice = daemon.tokens().create("alice").unwrap().expose().to_owned();
    let a = signed_in(&base, &alice).await;
    let res = http()
        .get(format!("{base}/api/live/sessions"))
        .header(COOKIE, &a.cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut events = res.bytes_stream().eventsource();
    daemon.tokens().revoke("alice").unwrap();
    let ended = async {
        let mut last = None;
        while let Some(event) = events.next().await {
            last = Some(event.unwrap());
        }
        last
    };
    let last = tokio::time::timeout(Duration::from_secs(20), ended)
        .await
        .expect("the stream ends once its token is revoked")
        .expect("an event before the end");
    assert_eq!(last.event, "unauthorized", "{last:?}");
    let body: Value = serde_json::from_str(&last.data).unwrap();
    assert_eq!(body["status"], 401);
    // And the sign-in is gone with it.
    assert_eq!(a.get("/api/me").await.0, StatusCode::UNAUTHORIZED);
}
