//! Failed connections, as the real forkctl binary reports them against the real daemon: one clear
//! message that says what to do (an address whose TLS does not match the daemon's names the flag
//! to change), never a stack backtrace.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Output;

use forkd_test_support::{TestCerts, TestDaemon, TlsFiles, spawn_daemon_with, write_test_certs};

/// Runs the real forkctl against `addr`, with backtraces requested every way the standard library
/// and anyhow read them, and none of forkctl's own variables inherited.
async fn forkctl(addr: &str, args: &[&str]) -> Output {
    forkctl_as(addr, None, args).await
}

/// [`forkctl`] with `FORKD_TOKEN` set to `token` when given.
async fn forkctl_as(addr: &str, token: Option<&str>, args: &[&str]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_forkctl"));
    command
        .arg("--addr")
        .arg(addr)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
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

/// True when `stderr` looks like a backtrace: its header, or a numbered frame line (`  3: foo`).
fn has_backtrace(stderr: &str) -> bool {
    stderr.to_ascii_lowercase().contains("stack backtrace")
        || stderr.lines().any(|line| {
            line.trim_start()
                .split_once(": ")
                .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
}

#[tokio::test]
async fn a_missing_socket_is_one_message_and_a_hint_without_a_backtrace() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("unix:{}", dir.path().join("forkd.sock").display());
    let out = forkctl(&addr, &["ps"]).await;
    let message = stderr(&out);
    assert_eq!(out.status.code(), Some(5), "{message}");
    assert!(
        message.starts_with(&format!("forkctl: cannot connect to forkd at {addr}")),
        "{message}"
    );
    assert!(
        message.contains("forkctl: hint: is forkd running?"),
        "{message}"
    );
    assert!(!has_backtrace(&message), "{message}");
}

/// The real daemon on a loopback TCP port, with TLS from a private CA when `tls` is set; the
/// certificates' directory stays alive with it.
async fn tcp_daemon(tls: bool) -> (TestDaemon, u16, tempfile::TempDir, TestCerts) {
    let certs_dir = tempfile::tempdir().unwrap();
    let certs = write_test_certs(certs_dir.path()).unwrap();
    let daemon = spawn_daemon_with(|c| {
        c.listen = Some("127.0.0.1:0".parse().unwrap());
        c.tls = tls.then(|| TlsFiles {
            cert: certs.cert.clone(),
            key: certs.key.clone(),
        });
    })
    .await
    .unwrap();
    let port = daemon.tcp_addr().unwrap().port();
    (daemon, port, certs_dir, certs)
}

/// Checks that forkctl failed as an argument error (4) with exactly `expected` and no hint that
/// would send the user looking for a daemon that is running.
fn assert_told(out: &Output, expected: &str) {
    let message = stderr(out);
    assert_eq!(out.status.code(), Some(4), "{message}");
    assert_eq!(
        message.trim_end(),
        format!("forkctl: {expected}"),
        "{message}"
    );
}

#[tokio::test]
async fn http_on_a_tls_listener_says_to_use_https() {
    let (_daemon, port, _dir, _certs) = tcp_daemon(true).await;
    let out = forkctl(&format!("http://127.0.0.1:{port}"), &["ps"]).await;
    assert_told(
        &out,
        &format!(
            "cannot talk to forkd at http://127.0.0.1:{port}: this daemon speaks TLS: use \
             https://127.0.0.1:{port}"
        ),
    );
}

#[tokio::test]
async fn an_untrusted_certificate_says_to_pass_the_ca() {
    let (daemon, port, _dir, certs) = tcp_daemon(true).await;
    let addr = format!("https://127.0.0.1:{port}");
    let out = forkctl(&addr, &["ps"]).await;
    assert_told(
        &out,
        &format!(
            "cannot talk to forkd at {addr}: the daemon's certificate is not trusted: pass \
             --ca-cert FILE (the CA that signed it)"
        ),
    );
    // A CA file that did not sign it: the same fix, naming the file that was tried.
    let leaf = certs.cert.to_str().unwrap();
    let out = forkctl(&addr, &["--ca-cert", leaf, "ps"]).await;
    assert_told(
        &out,
        &format!(
            "cannot talk to forkd at {addr}: the daemon's certificate is not trusted: {leaf} did \
             not sign it; pass --ca-cert FILE (the CA that signed it)"
        ),
    );
    // With the right CA (and a token: TCP needs one) the same address works.
    let ca = certs.ca.to_str().unwrap();
    let secret = daemon.tokens().create("ci").unwrap();
    let ok = forkctl_as(&addr, Some(secret.expose()), &["--ca-cert", ca, "ps"]).await;
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
}

#[tokio::test]
async fn https_on_a_cleartext_listener_says_to_use_http() {
    let (_daemon, port, _dir, certs) = tcp_daemon(false).await;
    let ca = certs.ca.to_str().unwrap();
    let out = forkctl(
        &format!("https://127.0.0.1:{port}"),
        &["--ca-cert", ca, "ps"],
    )
    .await;
    assert_told(
        &out,
        &format!(
            "cannot talk to forkd at https://127.0.0.1:{port}: this daemon does not speak TLS: \
             use http://127.0.0.1:{port}"
        ),
    );
}
