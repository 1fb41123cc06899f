//! The web view in a real browser: `crates/web/e2e/browser.mjs` drives Debian's Chromium
//! (headless, through playwright-core) against a real `forkd serve --ui-listen`, with batches
//! submitted by the real `forkctl`.
//!
//! Needs `node`, Chromium (`/usr/bin/chromium`, or `FORKD_TEST_CHROMIUM`) and the driver's npm
//! package (`npm ci --prefix crates/web/e2e`). Without them the test says what is missing and
//! passes; with `CI` set it fails instead (`.ci/run` installs them). `FORKD_WEB_SCREENSHOTS=DIR`
//! saves the batch and agent views there, relative to the workspace's root (the README's
//! screenshots: `FORKD_WEB_SCREENSHOTS=docs`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod binary;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use binary::forkctl;

/// How long the whole browser script may take before it is stopped and the test fails.
const SCRIPT_LIMIT: Duration = Duration::from_secs(600);

fn e2e_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../web/e2e")
}

/// What the browser test needs and this machine lacks, if anything.
fn missing() -> Option<String> {
    let node = Command::new("node").arg("--version").output();
    if !node.is_ok_and(|o| o.status.success()) {
        return Some("node is not installed".into());
    }
    if !chromium().exists() {
        return Some(format!(
            "Chromium is not at {} (apt-get install chromium, or set FORKD_TEST_CHROMIUM)",
            chromium().display()
        ));
    }
    if !e2e_dir().join("node_modules/playwright-core").is_dir() {
        return Some("playwright-core is not installed (npm ci --prefix crates/web/e2e)".into());
    }
    None
}

fn chromium() -> PathBuf {
    std::env::var_os("FORKD_TEST_CHROMIUM")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from)
}

fn token(home: &Path, name: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_forkd"))
        .args(["token", "create", name])
        .env("FORKD_HOME", home)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// `forkd serve` with the web view on an ephemeral port, killed when dropped.
struct Daemon {
    child: Child,
    ui: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(home: &Path) -> Daemon {
    let mut child = Command::new(env!("CARGO_BIN_EXE_forkd"))
        .args(["serve", "--sim-speed", "1", "--ui-listen", "127.0.0.1:0"])
        .args(["--grace", "1s", "--log", "info"])
        .env("FORKD_HOME", home)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The log says where the view is; the rest of the log is read (so the daemon never blocks
    // on a full pipe) and dropped.
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let marker = "Serving the web view at ";
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(at) = line.find(marker) {
                let url = line[at + marker.len()..].split_whitespace().next();
                let _ = tx.send(url.unwrap_or_default().to_owned());
            }
        }
    });
    let ui = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("forkd did not say where the web view is");
    Daemon { child, ui }
}

#[test]
fn the_web_view_in_a_real_browser() {
    if let Some(what) = missing() {
        assert!(
            std::env::var_os("CI").is_none(),
            "the browser test cannot run: {what}; .ci/run installs it"
        );
        eprintln!("skipped: the browser test needs what this machine lacks: {what}");
        return;
    }
    let forkctl = forkctl();
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let (alice, bob) = (token(home.path(), "alice"), token(home.path(), "bob"));
    // Alice's sessions work in WORK: her root.
    let root = std::fs::canonicalize(work.path()).unwrap();
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "[tenants.alice]\nworkspace_roots = [{:?}]\n",
            root.display().to_string()
        ),
    )
    .unwrap();
    let daemon = start(home.path());

    let mut command = Command::new("node");
    command
        .arg(e2e_dir().join("browser.mjs"))
        .current_dir(e2e_dir())
        .env("FORKD_UI", &daemon.ui)
        .env("FORKCTL", &forkctl)
        .env("FORKD_HOME", home.path())
        .env("TOKEN_A", &alice)
        .env("TOKEN_B", &bob)
        .env("WORK", work.path())
        .env("CHROMIUM", chromium())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = std::env::var_os("FORKD_WEB_SCREENSHOTS").filter(|d| !d.is_empty()) {
        // Relative to the workspace's root, whichever directory the test runs in.
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        command.env("SCREENSHOTS", root.join(dir));
    }
    let child = command.spawn().unwrap();
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(SCRIPT_LIMIT) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").arg(pid.to_string()).status();
            panic!("the browser script did not finish within {SCRIPT_LIMIT:?}");
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The figures (the 1000-child page's load time) go to the test's output.
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the browser script failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("all browser checks passed"), "{stdout}");
    drop(daemon);
}
