//! The Python client (`clients/python`) against the real daemon: its pytest suite, run with
//! `FORKD_BIN` set to this package's `forkd`, in a Python that has the client installed with its
//! `dev` extra (`FORKD_TEST_PYTHON_CLIENT`; `.ci/run` makes that virtual environment). Without
//! it the test says what is missing and passes; with `CI` set it fails instead.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

#[test]
fn the_python_client_passes_its_tests_against_the_daemon() {
    let Some(python) = std::env::var_os("FORKD_TEST_PYTHON_CLIENT").filter(|p| !p.is_empty())
    else {
        let why = "FORKD_TEST_PYTHON_CLIENT is not set (a Python with `pip install \
                   './clients/python[dev]'`; .ci/run makes one)";
        assert!(std::env::var_os("CI").is_none(), "{why}");
        eprintln!("skipping the Python client's tests: {why}");
        return;
    };
    // Run from the tests' directory, so that `forkd` is the installed package, not the source
    // tree beside them: what `pip install` put in place is what is tested.
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients/python/tests");
    let status = Command::new(&python)
        .args(["-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "."])
        .current_dir(&tests)
        .env("FORKD_BIN", env!("CARGO_BIN_EXE_forkd"))
        .env_remove("FORKD_ADDR")
        .env_remove("FORKD_TOKEN")
        .status()
        .expect("cannot run pytest");
    assert!(
        status.success(),
        "the Python client's tests failed: {status}"
    );
}
