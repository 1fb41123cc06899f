//! The real `forkd serve` binary, for tests that kill it with SIGKILL and start it again on the
//! same home.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use forkd_proto::v1 as pb;
use forkd_test_support::{connect, eventually};

pub type Client = pb::forkd_client::ForkdClient<tonic::transport::Channel>;

/// A `forkd serve` process, killed with SIGKILL when dropped: by the test on purpose, or by a
/// failing test's unwinding, which must not leave a daemon behind.
pub struct Daemon(Child);

impl Daemon {
    /// Starts `forkd serve` on `home` with the sim at `sim_speed`.
    pub fn start(home: &Path, sim_speed: &str) -> Daemon {
        Self::start_with(home, sim_speed, &[])
    }

    /// [`Daemon::start`] with more environment (`FORKD_DATABASE_URL`, `FORKD_LEASE`).
    pub fn start_with(home: &Path, sim_speed: &str, env: &[(&str, &str)]) -> Daemon {
        let child = Command::new(env!("CARGO_BIN_EXE_forkd"))
            .args(["serve", "--sim-speed", sim_speed, "--grace", "1s"])
            .env("FORKD_HOME", home)
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Daemon(child)
    }

    /// SIGKILL, and reaped.
    pub fn kill9(mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A client of the daemon on `home`, once it answers.
pub async fn client(home: &Path) -> Client {
    let addr = format!("unix://{}", home.join("forkd.sock").display());
    eventually(Duration::from_secs(30), "forkd to come up", || async {
        let mut c = connect(&addr).await.ok()?;
        c.list_sessions(pb::ListSessionsRequest::default())
            .await
            .ok()?;
        Some(c)
    })
    .await
}

/// Every agent of a batch, ended ones included.
pub async fn list_batch(client: &mut Client, batch_id: &str) -> Vec<pb::Agent> {
    client
        .list_agents(pb::ListAgentsRequest {
            batch_id: batch_id.to_owned(),
            include_ended: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .agents
}

/// How many replies the agent's own transcript holds.
pub async fn assistant_replies(client: &mut Client, id: &str) -> usize {
    let transcript = client
        .get_transcript(pb::GetTranscriptRequest {
            agent_id: id.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    transcript
        .messages
        .iter()
        .filter(|m| m.role == "assistant")
        .count()
}

pub fn is_terminal(state: i32) -> bool {
    [
        pb::AgentState::Completed,
        pb::AgentState::Failed,
        pb::AgentState::Killed,
        pb::AgentState::TimedOut,
    ]
    .iter()
    .any(|s| *s as i32 == state)
}

/// The `forkctl` binary beside this package's `forkd` (built by `cargo test --workspace`); built
/// here when only this package's tests were built.
pub fn forkctl() -> PathBuf {
    let forkd = Path::new(env!("CARGO_BIN_EXE_forkd"));
    let dir = forkd.parent().unwrap();
    let path = dir.join("forkctl");
    if !path.exists() {
        let target = dir.parent().unwrap();
        let mut build = Command::new(env!("CARGO"));
        build.args(["build", "--locked", "-p", "forkctl", "--target-dir"]);
        build.arg(target);
        if dir.file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        assert!(build.status().unwrap().success(), "cannot build forkctl");
    }
    path
}
