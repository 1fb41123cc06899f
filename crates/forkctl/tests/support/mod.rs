//! A fake forkd for forkctl's tests: the generated `Forkd` service with canned answers, served on
//! a Unix socket in a temp dir, plus a helper that runs the real `forkctl` binary against it.
//! It tests the client end to end (socket, token, streaming, exit codes) without the daemon.

mod fake;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow};
use forkd_proto::v1::forkd_server::ForkdServer;

use fake::Fake;
pub use fake::{Recorded, Script, TOKEN, notification};
/// A running fake daemon; dropping it stops the server.
pub struct FakeDaemon {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub recorded: Arc<Mutex<Recorded>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl FakeDaemon {
    /// Binds the socket before returning, so a client started next finds it.
    pub fn start(script: Script) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("forkd.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket)?;
        listener.set_nonblocking(true)?;
        let recorded = Arc::new(Mutex::new(Recorded::default()));
        let fake = Fake {
            script,
            recorded: Arc::clone(&recorded),
        };
        let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::UnixListener::from_std(listener) else {
                    return;
                };
                let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
                let _ = tonic::transport::Server::builder()
                    .add_service(ForkdServer::new(fake))
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        Ok(Self {
            dir,
            socket,
            recorded,
            shutdown: Some(shutdown),
        })
    }

    pub fn addr(&self) -> String {
        format!("unix:{}", self.socket.display())
    }

    pub fn recorded(&self) -> anyhow::Result<std::sync::MutexGuard<'_, Recorded>> {
        self.recorded
            .lock()
            .map_err(|_| anyhow!("the fake's record is poisoned"))
    }
}

impl Drop for FakeDaemon {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

/// What a `forkctl` run left behind.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `forkctl` with `args` and the given token, killing it if it outlives a generous deadline
/// (a hang is a failure, not a stuck test run).
pub fn forkctl(addr: &str, token: Option<&str>, args: &[&str]) -> anyhow::Result<Run> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_forkctl"));
    command
        .arg("--addr")
        .arg(addr)
        .args(args)
        .env_remove("FORKD_ADDR")
        .env_remove("FORKD_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(token) = token {
        command.env("FORKD_TOKEN", token);
    }
    let mut child = command.spawn().context("spawning forkctl")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            child.kill()?;
            let output = child.wait_with_output()?;
            return Err(anyhow!(
                "forkctl {args:?} hung; stderr: {}",
                lossy(&output.stderr)
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output()?;
    Ok(Run {
        code: status.code(),
        stdout: lossy(&stdout),
        stderr: lossy(&stderr),
    })
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
