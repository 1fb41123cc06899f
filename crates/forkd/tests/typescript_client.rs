//! The TypeScript client (`clients/typescript`) against the real daemon: its `node --test`
//! suite, run with `FORKD_BIN` set to this package's `forkd`, once the package is installed and
//! built (`npm ci && npm run build` in `clients/typescript`; `.ci/run` does both and sets
//! `FORKD_TEST_TYPESCRIPT_CLIENT=1`). Without that the test says what is missing and passes;
//! with `CI` set it fails instead.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

#[test]
fn the_typescript_client_passes_its_tests_against_the_daemon() {
    let package = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients/typescript");
    if std::env::var_os("FORKD_TEST_TYPESCRIPT_CLIENT").is_none() {
        let why = "FORKD_TEST_TYPESCRIPT_CLIENT is not set (run `npm ci && npm run build` in \
                   clients/typescript, then set it; .ci/run does)";
        assert!(std::env::var_os("CI").is_none(), "{why}");
        eprintln!("skipping the TypeScript client's tests: {why}");
        return;
    }
    assert!(
        package.join("dist/index.js").is_file(),
        "clients/typescript is not built: run `npm run build` there"
    );
    let status = Command::new("node")
        .args(["--test", "test/client.test.mjs", "test/schedules.test.mjs"])
        .current_dir(&package)
        .env("FORKD_BIN", env!("CARGO_BIN_EXE_forkd"))
        .env_remove("FORKD_ADDR")
        .env_remove("FORKD_TOKEN")
        .status()
        .expect("cannot run node");
    assert!(
        status.success(),
        "the TypeScript client's tests failed: {status}"
    );
}
