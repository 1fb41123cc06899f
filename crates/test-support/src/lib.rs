//! Test helpers: [`spawn_daemon`] starts the real daemon (the same `forkd::daemon::start` that
//! `forkd serve` runs) on a temporary `FORKD_HOME` and socket, and hands out connected clients;
//! [`eventually`] waits for a condition instead of sleeping for a time.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use forkd::daemon::{self, DaemonConfig, ProviderKind, RunningDaemon};
use forkd_proto::v1 as pb;
use forkd_proto::v1::forkd_client::ForkdClient;
use forkd_provider::{AnthropicConfig, SimProvider};
use forkd_sim_server::SimServerConfig;
use tempfile::TempDir;
use tonic::transport::{Channel, Endpoint};

pub use forkd::daemon::{DaemonConfig as Config, TlsFiles};
pub use tonic_health::pb::health_check_response::ServingStatus;

mod eventually;
pub mod otlp;
pub mod receiver;
mod turns;
pub use eventually::{Condition, POLL_INTERVAL, eventually};

/// A daemon on a temporary home. Dropping it without [`TestDaemon::stop`] leaves the runtime to
/// tear it down, which tests that only read results may do.
pub struct TestDaemon {
    pub home: TempDir,
    /// Outside the home (which is never a workspace): `workspace/` for the tests' local
    /// sessions, `tenants/NAME/` the roots of the token tenants, `workspaces/` the daemon's
    /// `workspaces_dir`.
    files: TempDir,
    daemon: Option<RunningDaemon>,
}

impl TestDaemon {
    pub fn home_path(&self) -> &Path {
        self.home.path()
    }

    /// A directory for the tests' sessions to work in, outside the home (which is never a
    /// workspace), made with the daemon and removed with it.
    pub fn workspace_path(&self) -> PathBuf {
        self.files.path().join("workspace")
    }

    /// Where the daemon makes tenants' fresh workspaces.
    pub fn workspaces_dir(&self) -> PathBuf {
        self.files.path().join("workspaces")
    }

    /// A workspace of the token tenant `name` (one of [`TEST_TENANTS`]), inside the root the
    /// test daemon gives it (`tenants/NAME`): made on first use.
    #[allow(
        clippy::expect_used,
        reason = "a test helper: its failure is the test's"
    )]
    pub fn tenant_workspace(&self, name: &str) -> PathBuf {
        assert!(
            TEST_TENANTS.contains(&name),
            "tenant {name:?} has no root in the test daemon; add it to TEST_TENANTS"
        );
        let dir = tenant_root(self.files.path(), name).join("ws");
        std::fs::create_dir_all(&dir).expect("a tenant's test workspace");
        dir
    }

    pub fn socket_path(&self) -> PathBuf {
        self.home.path().join("forkd.sock")
    }

    /// `unix:///…/forkd.sock`, as `forkctl --addr` takes it.
    pub fn addr(&self) -> String {
        format!("unix://{}", self.socket_path().display())
    }

    /// A new client on its own connection.
    pub async fn client(&self) -> anyhow::Result<ForkdClient<Channel>> {
        connect(&self.addr()).await
    }

    pub fn daemon(&self) -> Option<&RunningDaemon> {
        self.daemon.as_ref()
    }

    /// The TCP address the daemon bound for `config.listen` (an ephemeral port resolved), while
    /// it runs.
    pub fn tcp_addr(&self) -> Option<std::net::SocketAddr> {
        self.daemon.as_ref().and_then(|d| d.tcp_addr)
    }

    /// The address the daemon's metrics endpoint bound for `config.metrics_listen`, while it runs.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.daemon.as_ref().and_then(|d| d.metrics_addr)
    }

    /// The daemon's tokens (`tokens.json` in its home): tokens created or revoked here are seen
    /// by the running daemon at its next call.
    pub fn tokens(&self) -> forkd_server::TokenStore {
        forkd_server::TokenStore::in_home(self.home.path())
    }

    /// Shuts the daemon down gracefully, keeping its home (and database) for inspection.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        if let Some(d) = self.daemon.take() {
            d.shutdown(Duration::from_secs(5)).await?;
        }
        Ok(())
    }

    /// Starts a daemon again on the same home (after [`TestDaemon::stop`]).
    pub async fn restart(&mut self, tweak: impl FnOnce(&mut DaemonConfig)) -> anyhow::Result<()> {
        self.stop().await?;
        let mut config = DaemonConfig::new(self.home.path().to_path_buf());
        use_files(&mut config, self.files.path())?;
        tweak(&mut config);
        self.daemon = Some(daemon::start(config).await?);
        Ok(())
    }
}

/// The token tenants of the tests, each given a root of its own by every test daemon
/// ([`TestDaemon::tenant_workspace`]).
pub const TEST_TENANTS: [&str; 8] = [
    "alpha", "beta", "alice", "bob", "mallory", "ci", "web", "team-a",
];

/// The root of tenant `name`'s workspaces: beside the tests' local workspace, never inside it
/// (tenants never share files, the local user included).
fn tenant_root(files: &Path, name: &str) -> PathBuf {
    files.join("tenants").join(name)
}

/// Points `config` at the test files' directories: `workspaces_dir`, and each of
/// [`TEST_TENANTS`]'s root.
fn use_files(config: &mut DaemonConfig, files: &Path) -> anyhow::Result<()> {
    config.workspaces_dir = Some(files.join("workspaces"));
    std::fs::create_dir_all(files.join("workspace"))?;
    for name in TEST_TENANTS {
        let root = tenant_root(files, name);
        std::fs::create_dir_all(&root)?;
        config
            .engine
            .workspaces
            .roots
            .insert(name.to_owned(), vec![std::fs::canonicalize(&root)?]);
    }
    Ok(())
}

/// Connects a client to `addr` (`unix:///path` or `http://host:port`).
pub async fn connect(addr: &str) -> anyhow::Result<ForkdClient<Channel>> {
    let channel = Endpoint::from_shared(addr.to_owned())?
        .connect()
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    Ok(ForkdClient::new(channel))
}

/// A `forkd sim-server` serving `sim` on a loopback port for the rest of the test: its base
/// URL. Keep a clone of `sim` to read what it answered ([`SimProvider::answered`]).
pub async fn sim_server(sim: SimProvider, config: SimServerConfig) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(forkd_sim_server::serve(
        listener,
        sim,
        config,
        std::future::pending(),
    ));
    Ok(format!("http://{addr}"))
}

/// Points the daemon's `anthropic` provider at `base_url` (a [`sim_server`]) with `api_key`.
pub fn use_anthropic(config: &mut DaemonConfig, base_url: &str, api_key: &str) {
    config.provider = ProviderKind::Anthropic;
    let mut anthropic = AnthropicConfig::new(api_key);
    anthropic.base_url = base_url.to_owned();
    config.anthropic = Some(anthropic);
}

/// A client of one tenant over the daemon's TCP listener: every request carries its bearer
/// token.
#[derive(Clone)]
pub struct Caller {
    pub client: ForkdClient<Channel>,
    /// `None`: the local user, over the Unix socket.
    authorization: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl Caller {
    /// Connects to `daemon`'s TCP listener (the daemon must listen on one) as the tenant whose
    /// token is `secret`.
    pub async fn new(daemon: &TestDaemon, secret: &str) -> anyhow::Result<Self> {
        let addr = daemon
            .tcp_addr()
            .context("the daemon does not listen on TCP")?;
        Ok(Caller {
            client: connect(&format!("http://127.0.0.1:{}", addr.port())).await?,
            authorization: Some(format!("Bearer {secret}").parse()?),
        })
    }

    /// Connects to `daemon`'s Unix socket as its local user (no token).
    pub async fn local(daemon: &TestDaemon) -> anyhow::Result<Self> {
        Ok(Caller {
            client: daemon.client().await?,
            authorization: None,
        })
    }

    /// Creates a session as the tenant.
    pub async fn create_session(
        &mut self,
        request: pb::CreateSessionRequest,
    ) -> anyhow::Result<pb::Session> {
        let request = self.req(request);
        self.client
            .create_session(request)
            .await?
            .into_inner()
            .session
            .context("the daemon returned no session")
    }

    /// `message` as a request with the tenant's token.
    pub fn req<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(authorization) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", authorization.clone());
        }
        request
    }
}

/// Starts a daemon with the default test settings: the sim at speed 0, fast retries.
pub async fn spawn_daemon() -> anyhow::Result<TestDaemon> {
    spawn_daemon_with(|_| {}).await
}

/// Starts a daemon after `tweak` adjusts its settings.
pub async fn spawn_daemon_with(
    tweak: impl FnOnce(&mut DaemonConfig),
) -> anyhow::Result<TestDaemon> {
    let home = tempfile::Builder::new().prefix("forkd-test-").tempdir()?;
    let files = tempfile::Builder::new()
        .prefix("forkd-test-files-")
        .tempdir()?;
    let mut config = DaemonConfig::new(home.path().to_path_buf());
    use_files(&mut config, files.path())?;
    config.engine.admission.backoff_base = Duration::from_millis(5);
    config.engine.admission.backoff_cap = Duration::from_millis(50);
    tweak(&mut config);
    let daemon = daemon::start(config).await?;
    Ok(TestDaemon {
        home,
        files,
        daemon: Some(daemon),
    })
}

/// A daemon that also listens on loopback TCP, with a token for each of `tenants` (after
/// `tweak` adjusts its settings): each tenant's caller and token, in order.
pub async fn spawn_tenants(
    tenants: &[&str],
    tweak: impl FnOnce(&mut DaemonConfig),
) -> anyhow::Result<(TestDaemon, Vec<(Caller, String)>)> {
    let mut secrets = Vec::new();
    let mut made = Ok(());
    let daemon = spawn_daemon_with(|c| {
        c.listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
        tweak(c);
        let tokens = forkd_server::TokenStore::in_home(&c.home);
        for name in tenants {
            match tokens.create(name) {
                Ok(secret) => secrets.push(secret.expose().to_owned()),
                Err(e) => made = Err(anyhow::anyhow!("a token for {name}: {e}")),
            }
        }
    })
    .await?;
    made?;
    let mut callers = Vec::new();
    for secret in secrets {
        callers.push((Caller::new(&daemon, &secret).await?, secret));
    }
    Ok((daemon, callers))
}

/// A session request with a small context, ready for forks.
pub fn session_request(workspace: &Path) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        system_prompt: "You are a careful engineer.".into(),
        context_files: vec![pb::ContextFile {
            path: "notes.md".into(),
            content: "The project is forkd. ".repeat(400),
        }],
        workspace: workspace.display().to_string(),
        permission_mode: "dontAsk".into(),
        ..Default::default()
    }
}

/// [`session_request`] for a session whose agents run every tool without asking
/// (`bypassPermissions`): for tests whose children write files or run Bash.
pub fn trusted_session_request(workspace: &Path) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        permission_mode: "bypassPermissions".into(),
        ..session_request(workspace)
    }
}

/// Directives with the given prompts.
pub fn directives(prompts: &[&str]) -> Vec<pb::Directive> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| pb::Directive {
            description: format!("part {}", i + 1),
            prompt: (*p).to_owned(),
            limits: None,
        })
        .collect()
}

/// Reads notifications of a batch until `n` have arrived (replaying from seq 0).
pub async fn wait_for_batch(
    client: &mut ForkdClient<Channel>,
    batch_id: &str,
    n: usize,
    deadline: Duration,
) -> anyhow::Result<Vec<pb::Notification>> {
    let mut stream = client
        .subscribe_notifications(pb::SubscribeNotificationsRequest {
            batch_id: batch_id.to_owned(),
            follow: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    tokio::time::timeout(deadline, async {
        while out.len() < n {
            match stream.message().await? {
                Some(msg) => out.push(msg),
                None => anyhow::bail!("stream ended after {} notifications", out.len()),
            }
        }
        Ok(())
    })
    .await
    .context("timed out waiting for the batch's notifications")??;
    Ok(out)
}

/// Creates a session and returns it.
pub async fn create_session(
    client: &mut ForkdClient<Channel>,
    request: pb::CreateSessionRequest,
) -> anyhow::Result<pb::Session> {
    client
        .create_session(request)
        .await?
        .into_inner()
        .session
        .context("the daemon returned no session")
}

/// [`create_session`] retried until the daemon accepts it (at most `deadline`): for sessions
/// whose MCP server is a process the test just started, which answers once it has bound its port.
pub async fn create_session_when_ready(
    client: &ForkdClient<Channel>,
    request: pb::CreateSessionRequest,
    deadline: Duration,
) -> pb::Session {
    eventually(deadline, "the session's servers to answer", || {
        let mut client = client.clone();
        let request = request.clone();
        async move { create_session(&mut client, request).await.ok() }
    })
    .await
}

/// Forks one child running `script`, waits for it to end (at most `deadline`) and returns its
/// transcript (see [`transcript_text`]).
pub async fn run_child(
    client: &mut ForkdClient<Channel>,
    session_id: &str,
    script: &str,
    deadline: Duration,
) -> anyhow::Result<String> {
    let batch = fork(client, session_id, &[script], None).await?;
    wait_for_batch(client, &batch.batch_id, 1, deadline).await?;
    transcript_text(client, &batch.agent_ids[0]).await
}

/// An agent's whole transcript (shared prefix included) as one string of content arrays, for
/// tests that look for what the agent saw.
pub async fn transcript_text(
    client: &mut ForkdClient<Channel>,
    agent_id: &str,
) -> anyhow::Result<String> {
    Ok(client
        .get_transcript(pb::GetTranscriptRequest {
            agent_id: agent_id.to_owned(),
            include_shared_prefix: true,
        })
        .await?
        .into_inner()
        .messages
        .into_iter()
        .map(|m| m.content_json)
        .collect::<Vec<_>>()
        .join("\n"))
}

/// Runs one parent turn to its end (at most a minute): its events, or the status the call was
/// refused with or the stream ended with.
pub async fn run_turn(
    client: &mut ForkdClient<Channel>,
    request: pb::SendMessageRequest,
) -> Result<Vec<pb::session_event::Event>, tonic::Status> {
    let mut stream = client.send_message(request).await?.into_inner();
    let mut events = Vec::new();
    let read = async {
        while let Some(event) = stream.message().await? {
            events.extend(event.event);
        }
        Ok::<_, tonic::Status>(())
    };
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .map_err(|_| tonic::Status::deadline_exceeded("the turn did not end within a minute"))??;
    Ok(events)
}

/// The final reply's text of a turn's events, if it ended.
pub fn turn_text(events: &[pb::session_event::Event]) -> Option<&str> {
    events.iter().rev().find_map(|e| match e {
        pb::session_event::Event::TurnEnded(end) => Some(end.text.as_str()),
        _ => None,
    })
}

/// A session's own conversation: the transcript of its main-loop agent.
pub async fn session_transcript(
    client: &mut ForkdClient<Channel>,
    session_id: &str,
) -> anyhow::Result<Vec<pb::TranscriptMessage>> {
    let parent = client
        .list_agents(pb::ListAgentsRequest {
            session_id: session_id.to_owned(),
            include_ended: true,
            ..Default::default()
        })
        .await?
        .into_inner()
        .agents
        .into_iter()
        .find(|a| a.kind == "parent")
        .ok_or_else(|| anyhow::anyhow!("session {session_id} has no main-loop agent yet"))?;
    Ok(client
        .get_transcript(pb::GetTranscriptRequest {
            agent_id: parent.agent_id,
            include_shared_prefix: true,
        })
        .await?
        .into_inner()
        .messages)
}

/// Listens, from now on, to the session's notifications until `n` have arrived (waiting at most
/// `deadline` for each), then two seconds more: every one of them is returned, and the task
/// panics if any arrives after the `n`th (each agent ends once) or if the stream stops first.
#[allow(clippy::expect_used)] // Its checks are the test's: it fails the test that spawned it.
pub fn hear_each_once(
    mut client: ForkdClient<Channel>,
    session_id: String,
    n: usize,
    deadline: Duration,
) -> tokio::task::JoinHandle<Vec<pb::Notification>> {
    tokio::spawn(async move {
        let mut stream = client
            .subscribe_notifications(pb::SubscribeNotificationsRequest {
                session_id,
                follow: true,
                ..Default::default()
            })
            .await
            .expect("the daemon takes the subscription")
            .into_inner();
        let mut heard = Vec::new();
        while heard.len() < n {
            match tokio::time::timeout(deadline, stream.message()).await {
                Ok(Ok(Some(note))) => heard.push(note),
                other => panic!("the subscriber's stream stopped: {other:?} after {heard:?}"),
            }
        }
        if let Ok(Ok(Some(extra))) =
            tokio::time::timeout(Duration::from_secs(2), stream.message()).await
        {
            panic!("a notification after every agent had ended: {extra:?}");
        }
        heard
    })
}

/// An agent, read through `GetAgent`; a test that asks for one it did not make fails.
#[allow(clippy::expect_used)]
pub async fn get_agent(client: &mut ForkdClient<Channel>, id: &str) -> pb::Agent {
    client
        .get_agent(pb::GetAgentRequest {
            agent_id: id.to_owned(),
        })
        .await
        .expect("the daemon answers GetAgent")
        .into_inner()
        .agent
        .expect("GetAgent returns the agent")
}

/// What the daemon at `addr` answers `grpc.health.v1` for `forkd.v1.Forkd`.
pub async fn serving_status(addr: &str) -> anyhow::Result<ServingStatus> {
    let channel = Endpoint::from_shared(addr.to_owned())?.connect().await?;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "forkd.v1.Forkd".into(),
        })
        .await?
        .into_inner()
        .status;
    Ok(ServingStatus::try_from(status)?)
}

/// Submits a fork batch of `prompts` (see [`directives`]).
pub async fn fork(
    client: &mut ForkdClient<Channel>,
    session_id: &str,
    prompts: &[&str],
    warmup_gating: Option<bool>,
) -> anyhow::Result<pb::ForkBatchResponse> {
    Ok(client
        .fork_batch(pb::ForkBatchRequest {
            session_id: session_id.to_owned(),
            directives: directives(prompts),
            warmup_gating,
            ..Default::default()
        })
        .await?
        .into_inner())
}

/// PEM files for TLS tests: a private CA, and a server certificate it signed for `localhost` and
/// `127.0.0.1` with its key.
#[derive(Debug, Clone)]
pub struct TestCerts {
    /// The CA's certificate: what clients trust (`forkctl --ca-cert`).
    pub ca: PathBuf,
    /// The server's certificate (`forkd serve --tls-cert`).
    pub cert: PathBuf,
    /// The server's private key (`forkd serve --tls-key`).
    pub key: PathBuf,
}

/// Generates a private CA and a server certificate into `dir` (as `ca.pem`, `cert.pem` and
/// `key.pem`).
pub fn write_test_certs(dir: &Path) -> anyhow::Result<TestCerts> {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "forkd test CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let key = KeyPair::generate()?;
    let cert = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?
        .signed_by(&key, &ca)?;
    let certs = TestCerts {
        ca: dir.join("ca.pem"),
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
    };
    std::fs::write(&certs.ca, ca.pem())?;
    std::fs::write(&certs.cert, cert.pem())?;
    std::fs::write(&certs.key, key.serialize_pem())?;
    Ok(certs)
}

/// Waits (at most 20 s) until `path` exists: a tool call's side effect, say. Panics if it never
/// appears.
pub async fn wait_for_path(path: &Path) {
    let what = format!("{} to appear", path.display());
    eventually(Duration::from_secs(20), what, || async { path.exists() }).await;
}

/// The MCP server the tests run (`fixtures/mcp_server.py`, built on the official Python SDK).
pub fn mcp_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/mcp_server.py")
}

/// The reference MCP server `@modelcontextprotocol/server-everything` (npm, pinned by
/// `mcp-ecosystem/package-lock.json`): its entry script, run with `node SCRIPT stdio` or
/// `node SCRIPT streamableHttp`. `None` after saying the test is skipped when node or the
/// package is missing (`npm ci --prefix crates/test-support/mcp-ecosystem` installs it); with
/// `CI` set that fails the test instead: `.ci/run` installs it.
pub fn everything_server() -> Option<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("mcp-ecosystem/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if node && script.exists() {
        return Some(script);
    }
    let why = if node {
        "the reference MCP server is not installed (npm ci --prefix crates/test-support/mcp-ecosystem)"
    } else {
        "node is not installed"
    };
    assert!(
        std::env::var_os("CI").is_none(),
        "{why}; .ci/run installs it"
    );
    eprintln!("SKIPPED: {why}, which this test needs");
    None
}

/// A Python with the MCP SDK (`FORKD_TEST_MCP_PYTHON`, else `python3`), or `None` after saying
/// that the test is skipped. With `CI` set a missing SDK fails the test instead: `.ci/run`
/// installs it.
pub fn mcp_python() -> Option<String> {
    let python = std::env::var("FORKD_TEST_MCP_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = std::process::Command::new(&python)
        .args(["-c", "import mcp.server.mcpserver"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(python);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{python} lacks the MCP SDK (pip install mcp); .ci/run installs it"
    );
    eprintln!("SKIPPED: {python} lacks the MCP SDK (pip install mcp), which this test needs");
    None
}

/// The host's pid of a process that a sandboxed command or server reported as `inner` (its pid
/// in its own PID namespace), identified by working under `cwd`. An unsandboxed process's pid
/// is its own.
pub fn host_pid(inner: i32, cwd: &Path) -> Option<i32> {
    let cwd = std::fs::canonicalize(cwd).ok()?;
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            let innermost: i32 = status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))?
                .split_whitespace()
                .last()?
                .parse()
                .ok()?;
            let here = std::fs::read_link(entry.path().join("cwd")).ok()?;
            (innermost == inner && here.starts_with(&cwd)).then_some(pid)
        })
}
