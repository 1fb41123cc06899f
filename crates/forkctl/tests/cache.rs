//! `forkctl cache explain` against a fake daemon: the part and byte, in text and JSON, and a
//! request the daemon does not know.

// The shared fake serves every test file; this one uses only part of it.
#[allow(dead_code, unused_imports)]
mod support;

use serde_json::Value;
use support::{FakeDaemon, Script, TOKEN, forkctl};

#[test]
fn cache_explain_prints_the_part_and_byte_where_requests_part() -> anyhow::Result<()> {
    let daemon = FakeDaemon::start(Script::default())?;
    let human = forkctl(&daemon.addr(), Some(TOKEN), &["cache", "explain", "r-2"])?;
    assert_eq!(human.code, Some(0), "{human:?}");
    assert!(human.stdout.contains("r-2 against r-1"), "{human:?}");
    assert!(
        human
            .stdout
            .contains("first difference: system (system), at byte 1234"),
        "{human:?}"
    );
    assert!(human.stdout.contains("Be brief!"), "{human:?}");

    let json = forkctl(
        &daemon.addr(),
        Some(TOKEN),
        &["cache", "explain", "r-2", "r-9", "--json"],
    )?;
    assert_eq!(json.code, Some(0), "{json:?}");
    let v: Value = serde_json::from_str(json.stdout.trim())?;
    assert_eq!(v["other_request_id"], "r-9");
    assert_eq!(v["part"], "system");
    assert_eq!(v["byte"], 1234);
    assert_eq!(v["same_prefix"], false);

    let missing = forkctl(&daemon.addr(), Some(TOKEN), &["cache", "explain", "nope"])?;
    assert_eq!(missing.code, Some(3), "{missing:?}");
    Ok(())
}
