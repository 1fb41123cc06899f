//! Authentication end to end: the real daemon, real gRPC clients over the Unix socket, TCP and
//! TLS, and the real `forkd` binary for `forkd token` and the start-up refusals.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use forkd::daemon::TlsFiles;
use forkd_proto::v1 as pb;
use forkd_proto::v1::forkd_client::ForkdClient;
use forkd_server::TokenStore;
use forkd_test_support::{TestDaemon, connect, spawn_daemon_with, write_test_certs};
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

const LOOPBACK: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// `ListSessions` with an optional `authorization` header.
async fn list(
    client: &mut ForkdClient<Channel>,
    authorization: Option<&str>,
) -> Result<(), tonic::Status> {
    let mut request = tonic::Request::new(pb::ListSessionsRequest::default());
    if let Some(value) = authorization {
        request
            .metadata_mut()
            .insert("authorization", value.parse().unwrap());
    }
    client.list_sessions(request).await.map(drop)
}

fn bearer(secret: &str) -> String {
    format!("Bearer {secret}")
}

async fn tcp_client(daemon: &TestDaemon) -> ForkdClient<Channel> {
    let addr = daemon.tcp_addr().expect("the daemon listens on TCP");
    // Bound to 0.0.0.0 or 127.0.0.1: either way this machine reaches it on loopback.
    connect(&format!("http://127.0.0.1:{}", addr.port()))
        .await
        .unwrap()
}

/// Runs the real `forkd` binary on `home` with a clean environment for its settings.
async fn forkd(home: &Path, args: &[&str]) -> Output {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_forkd"))
        .args(args)
        .arg("--home")
        .arg(home)
        .env_remove("FORKD_HOME")
        .env_remove("FORKD_LISTEN")
        .env_remove("FORKD_PROVIDER")
        .env_remove("RUST_LOG")
        .env("FORKD_SIM_SPEED", "0")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .unwrap_or_else(|_| panic!("forkd {args:?} did not exit"))
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn tcp_needs_a_known_token_and_the_socket_stays_local() {
    let mut secret = None;
    let daemon = spawn_daemon_with(|c| {
        c.listen = Some(LOOPBACK);
        secret = Some(TokenStore::in_home(&c.home).create("ci").unwrap());
    })
    .await
    .unwrap();
    let secret = secret.unwrap();
    let mut tcp = tcp_client(&daemon).await;

    let missing = list(&mut tcp, None).await.unwrap_err();
    assert_eq!(missing.code(), Code::Unauthenticated, "{missing:?}");
    assert!(missing.message().contains("bearer token"), "{missing:?}");
    assert!(
        missing.message().contains("forkd token create"),
        "{missing:?}"
    );

    let wrong = list(&mut tcp, Some(&bearer("fkd_0000"))).await.unwrap_err();
    assert_eq!(wrong.code(), Code::Unauthenticated, "{wrong:?}");
    assert_eq!(wrong.message(), "unknown or revoked bearer token");

    let malformed = list(&mut tcp, Some(secret.expose())).await.unwrap_err();
    assert_eq!(malformed.code(), Code::Unauthenticated, "{malformed:?}");
    assert!(
        malformed.message().contains("Bearer <token>"),
        "{malformed:?}"
    );

    list(&mut tcp, Some(&bearer(secret.expose())))
        .await
        .unwrap();

    // Health stays open, so probes need no token.
    let channel = Endpoint::from_shared(format!("http://{}", daemon.tcp_addr().unwrap()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let health = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .unwrap();
    assert_eq!(health.into_inner().status, 1, "SERVING");

    // The socket's owner needs no token; a token it presents is still checked.
    let mut unix = daemon.client().await.unwrap();
    list(&mut unix, None).await.unwrap();
    list(&mut unix, Some(&bearer(secret.expose())))
        .await
        .unwrap();
    let wrong = list(&mut unix, Some(&bearer("fkd_0000")))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::Unauthenticated, "{wrong:?}");
}

/// What a sandboxed command allowed the network could do: reach the loopback listener without a
/// token. It is no one there, whether or not any token exists, so it can neither read the local
/// user's sessions nor create a `full-access` one; the socket's owner still needs no token.
#[tokio::test]
async fn tokenless_tcp_on_loopback_is_never_the_local_user() {
    let daemon = spawn_daemon_with(|c| c.listen = Some(LOOPBACK))
        .await
        .unwrap();
    let mut tcp = tcp_client(&daemon).await;
    let missing = list(&mut tcp, None).await.unwrap_err();
    assert_eq!(missing.code(), Code::Unauthenticated, "{missing:?}");
    assert!(missing.message().contains("Unix socket"), "{missing:?}");
    assert!(missing.message().contains("bearer token"), "{missing:?}");
    let full_access = pb::CreateSessionRequest {
        sandbox: "full-access".into(),
        ..forkd_test_support::trusted_session_request(&daemon.workspace_path())
    };
    let refused = tcp.create_session(full_access).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");

    // With a token, a TCP caller is the token's tenant: its sessions are not the local user's.
    let secret = daemon.tokens().create("ci").unwrap();
    let mut request = tonic::Request::new(forkd_test_support::session_request(
        &daemon.tenant_workspace("ci"),
    ));
    request
        .metadata_mut()
        .insert("authorization", bearer(secret.expose()).parse().unwrap());
    let created = tcp.create_session(request).await.unwrap().into_inner();
    let sid = created.session.unwrap().session_id;
    let mut request = tonic::Request::new(pb::ListSessionsRequest::default());
    request
        .metadata_mut()
        .insert("authorization", bearer(secret.expose()).parse().unwrap());
    let ci = tcp.list_sessions(request).await.unwrap().into_inner();
    assert_eq!(
        ci.sessions
            .iter()
            .map(|s| &s.session_id)
            .collect::<Vec<_>>(),
        [&sid]
    );
    let mut unix = daemon.client().await.unwrap();
    let local = unix
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(local.sessions.is_empty(), "{:?}", local.sessions);
}

#[tokio::test]
async fn forkd_token_prints_only_the_secret_and_a_running_daemon_follows_the_file() {
    let daemon = spawn_daemon_with(|c| c.listen = Some(LOOPBACK))
        .await
        .unwrap();
    let home = daemon.home_path();
    let mut tcp = tcp_client(&daemon).await;
    // No token exists yet: loopback TCP still serves no one without one.
    let missing = list(&mut tcp, None).await.unwrap_err();
    assert_eq!(missing.code(), Code::Unauthenticated);

    let created = forkd(home, &["token", "create", "ci"]).await;
    assert!(created.status.success(), "{}", text(&created.stderr));
    let stdout = text(&created.stdout);
    let secret = stdout.strip_suffix('\n').expect("one line");
    assert!(!secret.contains('\n'), "{stdout:?}");
    let hex = secret.strip_prefix("fkd_").expect("the fkd_ prefix");
    assert_eq!(hex.len(), 64, "{secret}");
    assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()), "{secret}");
    assert!(text(&created.stderr).contains("created token `ci`"));

    let file = home.join("tokens.json");
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(!std::fs::read_to_string(&file).unwrap().contains(hex));

    // The running daemon sees the new token at its next call, without a restart.
    let missing = list(&mut tcp, None).await.unwrap_err();
    assert_eq!(missing.code(), Code::Unauthenticated);
    list(&mut tcp, Some(&bearer(secret))).await.unwrap();

    let listed = forkd(home, &["token", "list"]).await;
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let listed = text(&listed.stdout);
    assert!(listed.starts_with("ci  "), "{listed}");
    assert!(!listed.contains(hex), "{listed}");
    let json = forkd(home, &["token", "list", "--json"]).await;
    let line: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(line["name"], "ci");
    assert!(
        line["created_at"].as_str().unwrap().ends_with('Z'),
        "{line}"
    );

    let again = forkd(home, &["token", "create", "ci"]).await;
    assert!(!again.status.success());
    assert!(again.stdout.is_empty());
    assert!(
        text(&again.stderr).contains("already exists"),
        "{}",
        text(&again.stderr)
    );

    let revoked = forkd(home, &["token", "revoke", "ci"]).await;
    assert!(revoked.status.success(), "{}", text(&revoked.stderr));
    let refused = list(&mut tcp, Some(&bearer(secret))).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    // With no token left, loopback TCP stays shut.
    let missing = list(&mut tcp, None).await.unwrap_err();
    assert_eq!(missing.code(), Code::Unauthenticated);

    let unknown = forkd(home, &["token", "revoke", "ci"]).await;
    assert!(!unknown.status.success());
    assert!(text(&unknown.stderr).contains("no token named `ci`"));
}

#[tokio::test]
async fn off_loopback_the_daemon_needs_tokens_to_start_and_always_asks_for_one() {
    let home = tempfile::tempdir().unwrap();
    let refused = forkd(home.path(), &["serve", "--listen", "0.0.0.0:0"]).await;
    assert!(!refused.status.success());
    let stderr = text(&refused.stderr);
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:0 without bearer tokens"),
        "{stderr}"
    );
    assert!(stderr.contains("forkd token create NAME"), "{stderr}");
    assert!(!home.path().join("forkd.sock").exists());

    // The library refuses too.
    let err = spawn_daemon_with(|c| c.listen = Some("0.0.0.0:0".parse().unwrap()))
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("without bearer tokens"), "{err}");

    // With a token it starts; every call without one is refused, even once none is left.
    let mut secret = None;
    let daemon = spawn_daemon_with(|c| {
        c.listen = Some("0.0.0.0:0".parse().unwrap());
        secret = Some(TokenStore::in_home(&c.home).create("team-a").unwrap());
    })
    .await
    .unwrap();
    let secret = secret.unwrap();
    let mut tcp = tcp_client(&daemon).await;
    list(&mut tcp, Some(&bearer(secret.expose())))
        .await
        .unwrap();
    assert_eq!(
        list(&mut tcp, None).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    daemon.tokens().revoke("team-a").unwrap();
    assert_eq!(
        list(&mut tcp, None).await.unwrap_err().code(),
        Code::Unauthenticated
    );
}

#[tokio::test]
async fn config_toml_is_read_and_its_mistakes_stop_the_start() {
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("config.toml");

    std::fs::write(&config, "sim_sped = 0\n").unwrap();
    let typo = forkd(home.path(), &["serve"]).await;
    assert!(!typo.status.success());
    let stderr = text(&typo.stderr);
    assert!(stderr.contains("config.toml"), "{stderr}");
    assert!(stderr.contains("unknown field `sim_sped`"), "{stderr}");

    // The file's listen address is used (and so refused off loopback without tokens)...
    std::fs::write(&config, "listen = \"0.0.0.0:0\"\n").unwrap();
    let refused = forkd(home.path(), &["serve"]).await;
    assert!(!refused.status.success());
    assert!(text(&refused.stderr).contains("refusing to listen on 0.0.0.0:0"));

    // ...and a flag wins over it: the bad TLS file named by the flag is what stops this start.
    let stopped = forkd(
        home.path(),
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            "/nonexistent/cert.pem",
            "--tls-key",
            "/nonexistent/key.pem",
        ],
    )
    .await;
    assert!(!stopped.status.success());
    let stderr = text(&stopped.stderr);
    assert!(
        stderr.contains("cannot read the TLS certificate /nonexistent/cert.pem"),
        "{stderr}"
    );
}

#[tokio::test]
async fn tls_round_trip_with_a_private_ca() {
    let certs_dir = tempfile::tempdir().unwrap();
    let certs = write_test_certs(certs_dir.path()).unwrap();
    let mut secret = None;
    let daemon = spawn_daemon_with(|c| {
        c.listen = Some(LOOPBACK);
        c.tls = Some(TlsFiles {
            cert: certs.cert.clone(),
            key: certs.key.clone(),
        });
        secret = Some(TokenStore::in_home(&c.home).create("ci").unwrap());
    })
    .await
    .unwrap();
    let secret = secret.unwrap();
    let addr = daemon.tcp_addr().unwrap();

    let ca = Certificate::from_pem(std::fs::read(&certs.ca).unwrap());
    let tls = ClientTlsConfig::new()
        .ca_certificate(ca)
        .domain_name("localhost");
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ForkdClient::new(channel);
    list(&mut client, Some(&bearer(secret.expose())))
        .await
        .unwrap();
    let missing = list(&mut client, None).await.unwrap_err();
    assert_eq!(missing.code(), Code::Unauthenticated);

    // Plain HTTP/2 on the TLS port gets nowhere.
    let plain = tokio::time::timeout(Duration::from_secs(20), async {
        let mut client = connect(&format!("http://{addr}")).await?;
        list(&mut client, Some(&bearer(secret.expose())))
            .await
            .map_err(anyhow::Error::from)
    })
    .await
    .expect("a plain client is answered or dropped, not left hanging");
    assert!(plain.is_err());

    // A client that does not trust the private CA refuses the server.
    let untrusted = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(ClientTlsConfig::new().domain_name("localhost"))
        .unwrap()
        .connect()
        .await;
    assert!(untrusted.is_err());
}
