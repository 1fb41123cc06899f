//! What the hooks tests share: their fixtures, a `hooks` block of one command, and one child
//! forked and waited for.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_test_support::{fork, wait_for_batch};
use serde_json::json;

pub type Client = pb::forkd_client::ForkdClient<tonic::transport::Channel>;

/// A fixture under `tests/fixtures/hooks`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hooks")
        .join(name)
}

/// The command that runs a Python fixture.
pub fn python(name: &str) -> String {
    format!("python3 {}", fixture(name).display())
}

/// One event's hooks: `command` for tools `matcher` matches (ignored by events without one).
pub fn on(event: &str, matcher: &str, command: &str) -> serde_json::Value {
    json!({ event: [{ "matcher": matcher, "hooks": [{ "type": "command", "command": command }] }] })
}

/// Forks one child of `session` running `script` and waits for it to end; its agent id.
pub async fn one_child(client: &mut Client, session: &str, script: &str) -> String {
    let batch = fork(client, session, &[script], None).await.unwrap();
    wait_for_batch(client, &batch.batch_id, 1, Duration::from_secs(60))
        .await
        .unwrap();
    batch.agent_ids[0].clone()
}

/// An agent's hooks' runs, as `GetTranscript` returns them.
pub async fn hook_runs(client: &mut Client, agent: &str) -> Vec<pb::HookRun> {
    client
        .get_transcript(pb::GetTranscriptRequest {
            agent_id: agent.to_owned(),
            include_shared_prefix: false,
        })
        .await
        .unwrap()
        .into_inner()
        .hook_runs
}
