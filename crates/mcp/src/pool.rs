//! The daemon's MCP servers: one connection (and, for stdio, one process) per tenant and server
//! definition, started when a session that uses it is created (or, after a daemon restart or a
//! stop for idleness, at its next call), kept while it is used, stopped once it has been idle
//! for a while ([`Pool::stop_idle`]), restarted with backoff after a crash, stopped at shutdown.
//!
//! A server is never shared across tenants: the key is the tenant plus a digest of the resolved
//! definition. Calls run concurrently on one connection; the state lock is held only to find or
//! start the connection, never across a call.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use forkd_tools::sandbox::SandboxPaths;
use forkd_tools::server::{ServerCommand, ServerProcess, log_tail, spawn_server};
use rmcp::model::CallToolRequestParams;
use rmcp::service::{Peer, RoleClient, RunningService, ServiceError, ServiceExt};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{ServerSpec, Transport};
use crate::output::{CallOutput, map_result};

/// How long a server may take to start and answer `initialize` and `tools/list`.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The first wait before restarting a server that failed; doubled at each failure in a row.
const BACKOFF_BASE: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// A tool as its server lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerTool {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// Why a server could not be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("MCP server {server:?} {message}")]
pub struct ServerError {
    pub server: String,
    pub message: String,
}

/// Where servers live on disk and what their sandbox hides.
#[derive(Debug, Clone, Default)]
pub struct PoolPaths {
    /// Each server gets a directory under this one (its cwd, `HOME`, temporary files, log).
    pub root: PathBuf,
    /// What a sandboxed server must not read (the daemon's home, the deny list, sessions'
    /// workspaces, other sandboxes' temporary directories).
    pub hidden: Vec<PathBuf>,
    /// The daemon user's home, covered but for its allow list.
    pub home: Option<forkd_tools::sandbox::HomeView>,
    /// Resource limits of each server.
    pub limits: forkd_tools::sandbox::ResourceLimits,
}

/// A server's identity in the pool: its tenant and the digest of its resolved definition.
type ServerKey = (String, String);

/// The daemon's servers.
#[derive(Clone, Default)]
pub struct Pool {
    servers: Arc<StdMutex<HashMap<ServerKey, Arc<Server>>>>,
    /// How sessions' own HTTP servers are reached: their URLs are a tenant's, checked against
    /// the daemon's address policy as webhooks' are. `None`: as the operator's, unchecked.
    egress: Option<forkd_egress::Egress>,
}

impl Pool {
    /// A pool whose sessions' own HTTP servers are reached through `egress` only.
    pub fn with_egress(egress: forkd_egress::Egress) -> Self {
        Self {
            egress: Some(egress),
            ..Self::default()
        }
    }

    /// The server for `tenant` and `spec`, created (not started) if it is new. `paths` are
    /// what hides and lends things now: an existing server's next start (a restart after a
    /// crash or an idle stop) makes its view from them, so a workspace created since it first
    /// started is hidden from it too.
    pub fn server(&self, tenant: &str, spec: &ServerSpec, paths: &PoolPaths) -> Arc<Server> {
        let key = (tenant.to_owned(), spec.digest());
        let mut servers = self
            .servers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let server = servers
            .entry(key)
            .or_insert_with(|| {
                let egress = (spec.origin == crate::Origin::Session)
                    .then(|| self.egress.clone())
                    .flatten();
                Arc::new(Server::new(tenant, spec.clone(), paths, egress))
            })
            .clone();
        *server
            .paths
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = paths.clone();
        server
    }

    /// Stops every server: connections closed, processes (and their groups) killed.
    pub async fn shutdown(&self) {
        let servers: Vec<Arc<Server>> = self
            .servers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain()
            .map(|(_, s)| s)
            .collect();
        for server in servers {
            server.stop().await;
        }
    }

    /// Stops the servers that are up but have served no call (and listed no tools) for
    /// `idle_for`, none in flight; the next call starts them again. Returns how many stopped.
    pub async fn stop_idle(&self, idle_for: Duration) -> usize {
        let servers: Vec<Arc<Server>> = self
            .servers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        let mut stopped = 0;
        for server in servers {
            if server.stop_if_idle(idle_for).await {
                stopped += 1;
            }
        }
        stopped
    }

    /// How many server processes or connections are up (for tests and metrics).
    pub async fn running(&self) -> usize {
        let servers: Vec<Arc<Server>> = self
            .servers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        let mut up = 0;
        for server in servers {
            if server.state.lock().await.conn.is_some() {
                up += 1;
            }
        }
        up
    }
}

/// One live connection.
struct Conn {
    peer: Peer<RoleClient>,
    service: StdMutex<Option<RunningService<RoleClient, ()>>>,
    /// The stdio server's process; dropping it kills the process group.
    process: StdMutex<Option<ServerProcess>>,
}

impl Conn {
    /// Ends the connection at once (its service is cancelled when dropped) and kills the stdio
    /// server's process group.
    fn close(&self) {
        drop(self.take_service());
        drop(
            self.process
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take(),
        );
    }

    fn take_service(&self) -> Option<RunningService<RoleClient, ()>> {
        self.service
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

/// How long a stopping server's connection may take to close (an HTTP server is told the
/// session ends) before it is dropped.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Default)]
struct State {
    conn: Option<Arc<Conn>>,
    /// Failures in a row, and when the next start may be tried.
    failures: u32,
    retry_at: Option<Instant>,
    /// The tools of the last listing.
    tools: Vec<ServerTool>,
}

/// One server of one tenant.
pub struct Server {
    spec: ServerSpec,
    dir: PathBuf,
    /// The latest paths the pool was given for it; each start reads them.
    paths: StdMutex<PoolPaths>,
    state: Mutex<State>,
    /// Calls in flight, and when the server last listed its tools or finished a call: it is
    /// idle when none is in flight and the last use is long enough ago.
    in_flight: AtomicU32,
    last_used: StdMutex<Option<Instant>>,
    /// A session's own HTTP server is reached through this, its address checked.
    egress: Option<forkd_egress::Egress>,
}

impl Server {
    fn new(
        tenant: &str,
        spec: ServerSpec,
        paths: &PoolPaths,
        egress: Option<forkd_egress::Egress>,
    ) -> Server {
        let tenant_digest = hex::encode(&Sha256::digest(tenant.as_bytes())[..6]);
        let dir = paths
            .root
            .join(format!("mcp-{tenant_digest}-{}", spec.digest()));
        Server {
            spec,
            egress,
            dir,
            paths: StdMutex::new(paths.clone()),
            state: Mutex::new(State::default()),
            in_flight: AtomicU32::new(0),
            last_used: StdMutex::new(None),
        }
    }

    pub fn spec(&self) -> &ServerSpec {
        &self.spec
    }

    fn err(&self, message: impl Into<String>) -> ServerError {
        ServerError {
            server: self.spec.name.clone(),
            message: message.into(),
        }
    }

    /// The server's tools, starting it if it is not up.
    pub async fn tools(&self) -> Result<Vec<ServerTool>, ServerError> {
        let mut state = self.state.lock().await;
        self.ensure(&mut state, None).await?;
        self.touch();
        Ok(state.tools.clone())
    }

    /// The live connection, started if there is none. A server that failed is started again
    /// after its backoff: a call that may wait until `wait_until` waits for that restart (the
    /// others waiting behind it on the state's lock), anything else is told when it will be.
    async fn ensure(
        &self,
        state: &mut State,
        wait_until: Option<Instant>,
    ) -> Result<Arc<Conn>, ServerError> {
        if let Some(conn) = &state.conn {
            if !conn.peer.is_transport_closed() {
                return Ok(conn.clone());
            }
            self.mark_failed(state, "Stopped");
        }
        if let Some(at) = state.retry_at {
            let now = Instant::now();
            if at > now {
                if wait_until.is_none_or(|until| at > until) {
                    return Err(self.err(format!(
                        "failed and is being restarted; the next attempt is in {} ms{}",
                        (at - now).as_millis(),
                        if wait_until.is_some() {
                            ", past this call's timeout"
                        } else {
                            ""
                        }
                    )));
                }
                tokio::time::sleep_until(at).await;
            }
        }
        match tokio::time::timeout(START_TIMEOUT, self.start()).await {
            Ok(Ok((conn, tools))) => {
                state.conn = Some(conn.clone());
                state.tools = tools;
                state.failures = 0;
                state.retry_at = None;
                tracing::info!(mcp.server = %self.spec.name, tools = state.tools.len(), "MCP server started");
                Ok(conn)
            }
            Ok(Err(message)) => {
                self.mark_failed(state, "Failed to start");
                Err(self.err(message))
            }
            Err(_) => {
                self.mark_failed(state, "Timed out starting");
                Err(self.err(format!(
                    "did not answer initialize and tools/list within {} s{}",
                    START_TIMEOUT.as_secs(),
                    self.stderr_note()
                )))
            }
        }
    }

    fn mark_failed(&self, state: &mut State, what: &str) {
        if let Some(conn) = state.conn.take() {
            conn.close();
        }
        state.failures = state.failures.saturating_add(1);
        let backoff = BACKOFF_BASE
            .saturating_mul(1 << state.failures.min(8).saturating_sub(1))
            .min(BACKOFF_MAX);
        state.retry_at = Some(Instant::now() + backoff);
        tracing::warn!(mcp.server = %self.spec.name, failures = state.failures, ?backoff, "{what}: MCP server down");
    }

    fn stderr_note(&self) -> String {
        // The server's own directory (`home`), where its stderr is logged.
        match log_tail(&self.dir.join("home").join("stderr.log"), 3) {
            tail if tail.is_empty() => String::new(),
            tail => format!("; its stderr ends with: {tail}"),
        }
    }

    /// Starts the server and lists its tools; the error is the message for the model or client.
    async fn start(&self) -> Result<(Arc<Conn>, Vec<ServerTool>), String> {
        let paths = self
            .paths
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let (service, process) = match &self.spec.transport {
            Transport::Stdio {
                command,
                args,
                env,
                sandbox,
            } => {
                let cmd = ServerCommand {
                    program: command.clone(),
                    args: args.clone(),
                    env: env.clone(),
                    dir: self.dir.join("home"),
                    sandbox: (sandbox.mode != forkd_core::session::SandboxMode::FullAccess).then(
                        || {
                            (
                                *sandbox,
                                SandboxPaths {
                                    hidden: paths.hidden.clone(),
                                    tmp: self.dir.join("tmp"),
                                    home: paths.home.clone(),
                                    limits: paths.limits,
                                    // One group per server: it serves many sessions.
                                    group: self
                                        .dir
                                        .file_name()
                                        .map(|n| n.to_string_lossy().into_owned()),
                                },
                            )
                        },
                    ),
                };
                let _ = std::fs::remove_file(cmd.log_path());
                // Preparing its sandbox and forking block: off the runtime's workers.
                let mut process = {
                    let cmd = cmd.clone();
                    tokio::task::spawn_blocking(move || spawn_server(&cmd))
                        .await
                        .map_err(|e| format!("internal: starting the server failed: {e}"))?
                        .map_err(|e| e.to_string())?
                };
                let (stdin, stdout) = process
                    .take_pipes()
                    .ok_or("internal: the server's pipes are gone")?;
                let service = ().serve((stdout, stdin)).await.map_err(|e| {
                    format!(
                        "did not start: {e}{}",
                        match log_tail(&cmd.log_path(), 3) {
                            tail if tail.is_empty() => String::new(),
                            tail => format!("; its stderr ends with: {tail}"),
                        }
                    )
                })?;
                (service, Some(process))
            }
            Transport::Http { url, headers } => {
                let mut map = HashMap::new();
                for (name, value) in headers {
                    let name = reqwest::header::HeaderName::try_from(name.as_str())
                        .map_err(|e| format!("has an invalid header name {name:?}: {e}"))?;
                    let value = reqwest::header::HeaderValue::try_from(value.as_str())
                        .map_err(|e| format!("has an invalid value for header {name}: {e}"))?;
                    map.insert(name, value);
                }
                let config =
                    StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(map);
                let client = match &self.egress {
                    Some(egress) => {
                        let parsed = forkd_egress::parse_url(url).map_err(|e| e.to_string())?;
                        egress
                            .check_literal(&parsed)
                            .map_err(|e| format!("at {url} refused: {e}"))?;
                        egress.client().clone()
                    }
                    None => reqwest::Client::new(),
                };
                let transport = StreamableHttpClientTransport::with_client(client, config);
                let service =
                    ().serve(transport)
                        .await
                        .map_err(|e| format!("at {url} did not start: {e}"))?;
                (service, None)
            }
        };
        let peer = service.peer().clone();
        let listed = peer
            .list_all_tools()
            .await
            .map_err(|e| format!("did not list its tools: {e}"))?;
        let tools = listed
            .into_iter()
            .map(|tool| ServerTool {
                name: tool.name.to_string(),
                description: tool
                    .description
                    .as_deref()
                    .map(str::to_owned)
                    .unwrap_or_default(),
                input_schema: Value::Object((*tool.input_schema).clone()),
            })
            .collect();
        let conn = Arc::new(Conn {
            peer,
            service: StdMutex::new(Some(service)),
            process: StdMutex::new(process),
        });
        Ok((conn, tools))
    }

    /// Calls `tool` (its name on the server) with `arguments`, within the server's time limit;
    /// a cancellation (the agent was killed) abandons the call and tells the server.
    pub async fn call(
        &self,
        tool: &str,
        arguments: Value,
        cancel: &CancellationToken,
    ) -> CallOutput {
        let limit = self.spec.call_timeout;
        let conn = {
            // A restart due within the call's timeout is waited for.
            let wait_for_restart = async {
                let mut state = self.state.lock().await;
                let conn = self.ensure(&mut state, Some(Instant::now() + limit)).await;
                (state, conn)
            };
            let (state, conn) = tokio::select! {
                got = wait_for_restart => got,
                () = cancel.cancelled() => {
                    return CallOutput::error("The call was cancelled: the agent was stopped.");
                }
            };
            match conn {
                Ok(conn) => {
                    if !state.tools.iter().any(|t| t.name == tool) {
                        return CallOutput::error(format!(
                            "MCP server {:?} no longer has the tool {tool:?} (it lists: {}). \
                             Work without it.",
                            self.spec.name,
                            state
                                .tools
                                .iter()
                                .map(|t| t.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ));
                    }
                    self.in_flight.fetch_add(1, Ordering::SeqCst);
                    conn
                }
                Err(e) => return CallOutput::error(format!("{e}. The call did not run.")),
            }
        };
        // Counted out however the call ends, a dropped future (a killed agent) included.
        let _in_flight = InFlight(self);
        let Value::Object(arguments) = arguments else {
            return CallOutput::error("The tool's input must be a JSON object.");
        };
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let outcome = tokio::select! {
            result = conn.peer.call_tool(params) => Some(result),
            () = tokio::time::sleep(limit) => None,
            () = cancel.cancelled() => {
                return CallOutput::error("The call was cancelled: the agent was stopped.");
            }
        };
        match outcome {
            None => CallOutput::error(format!(
                "MCP server {:?} did not answer the call within {} s (its timeout); the call \
                 was cancelled. It may or may not have taken effect.",
                self.spec.name,
                limit.as_secs()
            )),
            Some(Ok(result)) => match serde_json::to_value(&result) {
                Ok(value) => map_result(&value),
                Err(e) => CallOutput::error(format!("The server's result is not usable: {e}")),
            },
            Some(Err(ServiceError::McpError(e))) => CallOutput::error(format!(
                "MCP server {:?} refused the call: {}",
                self.spec.name, e.message
            )),
            Some(Err(e)) => {
                let mut state = self.state.lock().await;
                if state.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, &conn)) {
                    self.mark_failed(&mut state, "Crashed during a call");
                }
                CallOutput::error(format!(
                    "MCP server {:?} stopped during the call ({e}){}. It is restarted for the \
                     next call; this call may or may not have taken effect.",
                    self.spec.name,
                    self.stderr_note()
                ))
            }
        }
    }

    /// Stops the server if it is up, has no call in flight and was last used `idle_for` ago.
    /// Decided under the state lock, which a call holds while it counts itself in: no call can
    /// start between the check and the stop.
    async fn stop_if_idle(&self, idle_for: Duration) -> bool {
        let mut state = self.state.lock().await;
        let last_used = *self
            .last_used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let idle = state.conn.is_some()
            && self.in_flight.load(Ordering::SeqCst) == 0
            && last_used.is_none_or(|at| at.elapsed() >= idle_for);
        if idle {
            tracing::info!(mcp.server = %self.spec.name, idle_secs = idle_for.as_secs(), "Stopping an idle MCP server; its next call starts it again");
            Self::close_conn(&mut state).await;
        }
        idle
    }

    /// Marks the server used now.
    fn touch(&self) {
        *self
            .last_used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
    }

    async fn stop(&self) {
        Self::close_conn(&mut *self.state.lock().await).await;
    }

    /// Closes the live connection, if any: the session ended politely (within a bound), then the
    /// process group killed.
    async fn close_conn(state: &mut State) {
        if let Some(conn) = state.conn.take() {
            if let Some(mut service) = conn.take_service() {
                let _ = service.close_with_timeout(CLOSE_TIMEOUT).await;
            }
            conn.close();
        }
    }
}

/// One call in flight on a server, counted out when dropped.
struct InFlight<'a>(&'a Server);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::Origin;
    use std::collections::BTreeMap;

    fn paths(hidden: &str) -> PoolPaths {
        PoolPaths {
            root: PathBuf::from("/nonexistent-forkd-mcp"),
            hidden: vec![PathBuf::from(hidden)],
            ..PoolPaths::default()
        }
    }

    #[test]
    fn a_server_starts_with_the_paths_it_was_last_given() {
        let spec = ServerSpec {
            name: "s".into(),
            origin: Origin::Operator,
            transport: Transport::Stdio {
                command: "true".into(),
                args: Vec::new(),
                env: BTreeMap::new(),
                sandbox: forkd_core::session::Sandbox::default(),
            },
            read_only_tools: Default::default(),
            call_timeout: Duration::from_secs(1),
        };
        let pool = Pool::default();
        let first = pool.server("t", &spec, &paths("/ws/a"));
        // A session made since hides its workspace from the server's next start.
        let again = pool.server("t", &spec, &paths("/ws/b"));
        assert!(
            Arc::ptr_eq(&first, &again),
            "one server per tenant and definition"
        );
        let now = first.paths.lock().unwrap().hidden.clone();
        assert_eq!(now, [PathBuf::from("/ws/b")]);
    }
}
