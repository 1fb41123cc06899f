//! forkctl over TCP with TLS and a bearer token, against the real daemon.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Output;

use forkd_test_support::{TestDaemon, TlsFiles, spawn_daemon_with, write_test_certs};

async fn forkctl(addr: &str, token: Option<&str>, args: &[&str]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_forkctl"));
    command
        .arg("--addr")
        .arg(addr)
        .args(args)
        .env_remove("FORKD_ADDR")
        .env_remove("FORKD_TOKEN")
        .env_remove("FORKD_CA_CERT")
        .kill_on_drop(true);
    if let Some(token) = token {
        command.env("FORKD_TOKEN", token);
    }
    tokio::time::timeout(std::time::Duration::from_secs(60), command.output())
        .await
        .expect("forkctl exited")
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn https_with_a_private_ca_and_a_token() {
    let certs_dir = tempfile::tempdir().unwrap();
    let certs = write_test_certs(certs_dir.path()).unwrap();
    let daemon: TestDaemon = spawn_daemon_with(|c| {
        c.listen = Some("127.0.0.1:0".parse().unwrap());
        c.tls = Some(TlsFiles {
            cert: certs.cert.clone(),
            key: certs.key.clone(),
        });
    })
    .await
    .unwrap();
    let secret = daemon.tokens().create("ci").unwrap();
    let port = daemon.tcp_addr().unwrap().port();
    // The certificate names `localhost` and `127.0.0.1`; the IP avoids depending on resolution.
    let addr = format!("https://127.0.0.1:{port}");
    let ca = certs.ca.to_str().unwrap();

    let ok = forkctl(
        &addr,
        Some(secret.expose()),
        &["--ca-cert", ca, "--json", "ps", "-a"],
    )
    .await;
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));

    let no_token = forkctl(&addr, None, &["--ca-cert", ca, "ps"]).await;
    assert_eq!(no_token.status.code(), Some(6), "{}", stderr(&no_token));
    let message = stderr(&no_token);
    assert!(message.contains("UNAUTHENTICATED"), "{message}");
    assert!(message.contains("FORKD_TOKEN"), "{message}");

    let wrong = forkctl(&addr, Some("fkd_wrong"), &["--ca-cert", ca, "ps"]).await;
    assert!(
        stderr(&wrong).contains("unknown or revoked bearer token"),
        "{}",
        stderr(&wrong)
    );

    // Without the CA the daemon's certificate is not trusted.
    let untrusted = forkctl(&addr, Some(secret.expose()), &["ps"]).await;
    assert_ne!(untrusted.status.code(), Some(0), "{}", stderr(&untrusted));

    // A broken CA file is the user's error, named as such.
    let bad = forkctl(
        &addr,
        Some(secret.expose()),
        &["--ca-cert", certs.key.to_str().unwrap(), "ps"],
    )
    .await;
    assert_eq!(bad.status.code(), Some(4), "{}", stderr(&bad));
    assert!(
        stderr(&bad).contains("holds no PEM certificate"),
        "{}",
        stderr(&bad)
    );
}
