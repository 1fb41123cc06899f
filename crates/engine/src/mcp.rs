//! MCP servers in sessions: which servers a session may use (the operator's by name; its own
//! definitions only for the local user and the tenants the configuration allows), their tools
//! listed once at creation into the session's pool, and their calls.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use forkd_core::session::{
    LOCAL_TENANT, McpOrigin, McpServerRef, McpToolRef, Session, SessionMcp, ToolDef,
};
use forkd_core::store::Store;
use forkd_core::{Block, RawJson, SessionId};
use forkd_mcp::{CallOutput, McpFile, Origin, Pool, PoolPaths, Server, ServerSpec, ServerTool};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::config::{McpConfig, SandboxConfig};
use crate::error::{EngineError, Result};

/// The most characters of a tool's description that reach the model (each is in every request).
const DESCRIPTION_CHARS: usize = 2_000;

/// How long an MCP server may go without a call before it is stopped (its next call starts it
/// again, as after a restart).
const IDLE_SERVER: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// What a client asks for: servers of the operator's by name, and its own definitions (a
/// `.mcp.json` text).
#[derive(Debug, Clone, Default)]
pub struct McpRequest {
    pub servers: Vec<String>,
    pub config_json: Option<String>,
}

/// A session's MCP set-up, before the session is stored.
pub(crate) struct SessionTools {
    pub defs: Vec<ToolDef>,
    pub mcp: SessionMcp,
    /// The session's own definitions (kept in memory, and stored only sealed).
    pub own: Vec<ServerSpec>,
    /// Their text, as the client sent it (what is sealed).
    pub own_config: Option<String>,
}

fn invalid(msg: String) -> EngineError {
    EngineError::InvalidRequest(msg)
}

/// The MCP servers of sessions: which a session may use, their tools listed at its creation,
/// its own definitions (in memory, and stored sealed), and calls.
pub(crate) struct McpServers {
    store: Arc<dyn Store>,
    /// The operator's servers, who may define their own, and the sealing key.
    config: McpConfig,
    /// What a sandboxed server must not read, and who may run unsandboxed.
    sandbox: SandboxConfig,
    /// The servers this daemon started (one per tenant and definition).
    pool: Pool,
    /// Checks sessions' own HTTP servers' URLs when a session defines them.
    egress: forkd_egress::Egress,
    /// Sessions' own server definitions: in memory only, since they may hold secrets.
    own: Mutex<HashMap<SessionId, Vec<ServerSpec>>>,
}

impl McpServers {
    /// `egress` reaches sessions' own HTTP servers, whose URLs are checked as webhooks' are.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        config: McpConfig,
        sandbox: SandboxConfig,
        egress: forkd_egress::Egress,
    ) -> Self {
        Self {
            store,
            config,
            sandbox,
            pool: Pool::with_egress(egress.clone()),
            egress,
            own: Mutex::default(),
        }
    }

    /// Stops every server (their process groups are killed): at shutdown, once no run calls one.
    pub(crate) async fn shutdown(&self) {
        self.pool.shutdown().await;
    }

    /// Stops the MCP servers that have served no call for [`IDLE_SERVER`].
    pub(crate) async fn stop_idle_servers(&self) {
        let stopped = self.pool.stop_idle(IDLE_SERVER).await;
        if stopped > 0 {
            tracing::debug!(stopped, "Stopped idle MCP servers");
        }
    }

    /// Where the MCP servers live, and what a sandboxed one must not read: the daemon's home,
    /// the deny list, the sandboxes' temporary directories and every session's workspace.
    async fn mcp_paths(&self) -> Result<PoolPaths> {
        let cfg = &self.sandbox;
        forkd_tools::sandbox::private_root(&cfg.tmp_root)
            .map_err(|e| EngineError::Sandbox(e.to_string()))?;
        let mut hidden = cfg.hidden.clone();
        hidden.push(cfg.tmp_root.clone());
        hidden.extend(self.store.workspaces().await?.into_iter().map(|(_, w)| w));
        hidden.extend(forkd_tools::sandbox::other_homes(
            cfg.home.as_ref().map(|h| h.dir.as_path()),
        ));
        Ok(PoolPaths {
            root: cfg.tmp_root.join("mcp"),
            hidden,
            home: cfg.home.clone(),
            limits: cfg.limits.for_server(),
        })
    }

    /// Resolves, starts and lists the servers a new session asks for.
    pub(crate) async fn session_tools(
        &self,
        req: &McpRequest,
        tenant: &str,
    ) -> Result<SessionTools> {
        let cfg = &self.config;
        let mut specs: Vec<ServerSpec> = Vec::new();
        for name in &req.servers {
            let spec = cfg.servers.get(name).ok_or_else(|| {
                let mut known: Vec<&str> = cfg.servers.keys().map(String::as_str).collect();
                known.sort_unstable();
                invalid(format!(
                    "unknown MCP server {:?}; the daemon's operator defines servers in \
                     $FORKD_HOME/mcp.json (defined: {})",
                    crate::error::clip(name, 64),
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ))
            })?;
            specs.push(spec.clone());
        }
        let mut own = Vec::new();
        let own_config = req.config_json.clone().filter(|t| !t.trim().is_empty());
        if let Some(text) = own_config.as_deref() {
            if tenant != LOCAL_TENANT && !cfg.config_tenants.contains(tenant) {
                return Err(EngineError::Forbidden(format!(
                    "tenant {tenant:?} may not define its own MCP servers (a stdio server is a \
                     command run on the daemon's host); it may enable the operator's servers by \
                     name (--mcp NAME), or the operator allows it with allow_mcp_config = true \
                     under [tenants.{tenant}] in config.toml"
                )));
            }
            let file = McpFile::parse(text).map_err(|e| invalid(e.to_string()))?;
            for (name, def) in &file.servers {
                let spec = def
                    .resolve(name, Origin::Session, &|_| None)
                    .map_err(|e| invalid(e.to_string()))?;
                if let forkd_mcp::Transport::Http { url, .. } = &spec.transport {
                    self.egress.check_url(url).await.map_err(|e| {
                        invalid(format!("MCP server {name:?}: its URL is refused: {e}"))
                    })?;
                }
                if let forkd_mcp::Transport::Stdio { sandbox, .. } = &spec.transport {
                    let full = sandbox.mode == forkd_core::session::SandboxMode::FullAccess;
                    let allowed =
                        tenant == LOCAL_TENANT || self.sandbox.full_access_tenants.contains(tenant);
                    if full && !allowed {
                        return Err(EngineError::Forbidden(format!(
                            "MCP server {name:?}: tenant {tenant:?} may not run unsandboxed \
                             (full-access) servers"
                        )));
                    }
                }
                own.push(spec);
            }
        }
        let mut seen = BTreeSet::new();
        for spec in specs.iter().chain(&own) {
            if !seen.insert(spec.name.clone()) {
                return Err(invalid(format!(
                    "MCP server {:?} is named twice (by --mcp and in the session's own \
                     definitions)",
                    spec.name
                )));
            }
        }
        let paths = self.mcp_paths().await?;
        let mut listed: Vec<(ServerSpec, Vec<ServerTool>)> = Vec::new();
        for spec in specs.iter().chain(&own) {
            let server = self.pool.server(tenant, spec, &paths);
            let tools = server.tools().await.map_err(EngineError::McpServer)?;
            listed.push((spec.clone(), tools));
        }
        let mut mcp = SessionMcp::default();
        for spec in &specs {
            mcp.servers.push(McpServerRef {
                name: spec.name.clone(),
                origin: McpOrigin::Operator,
            });
        }
        for spec in &own {
            mcp.servers.push(McpServerRef {
                name: spec.name.clone(),
                origin: McpOrigin::Session,
            });
        }
        let (defs, tools) = tool_defs(&listed);
        mcp.tools = tools;
        Ok(SessionTools {
            defs,
            mcp,
            own,
            own_config,
        })
    }

    /// Seals the session's own definitions for storing with it, when the daemon has a key.
    pub(crate) fn seal_own_servers(
        &self,
        session: SessionId,
        tools: &mut SessionTools,
    ) -> Result<()> {
        let (Some(key), Some(text)) = (&self.config.secret_key, &tools.own_config) else {
            return Ok(());
        };
        if tools.own.is_empty() {
            return Ok(());
        }
        let sealed = key
            .seal(&session.to_string(), text.as_bytes())
            .map_err(|e| EngineError::Invariant(format!("cannot seal MCP definitions: {e}")))?;
        tools.mcp.sealed_config = Some(sealed);
        Ok(())
    }

    /// A branch's sealed copy of its origin's own definitions: opened with the origin's id and
    /// sealed again for the branch's (a sealed copy is bound to its session). `None` when the
    /// origin has none sealed, or this daemon has no key to open them with. Definitions that
    /// cannot be opened are `WrongState`, naming why.
    pub(crate) fn reseal_for_branch(
        &self,
        origin: &Session,
        branch: SessionId,
    ) -> Result<Option<String>> {
        let (Some(sealed), Some(key)) = (&origin.mcp.sealed_config, &self.config.secret_key) else {
            return Ok(None);
        };
        let refused = |e: String| {
            EngineError::WrongState(format!(
                "session {}'s own MCP server definitions cannot be sealed for a branch: {e}",
                origin.id
            ))
        };
        let text = key
            .open(&origin.id.to_string(), sealed)
            .map_err(|e| refused(e.to_string()))?;
        let sealed = key
            .seal(&branch.to_string(), &text)
            .map_err(|e| refused(e.to_string()))?;
        Ok(Some(sealed))
    }

    /// Keeps a stored branch's own definitions in memory, as its origin's are here.
    pub(crate) fn keep_for_branch(&self, origin: &Session, branch: SessionId) {
        if origin
            .mcp
            .servers
            .iter()
            .any(|s| s.origin == McpOrigin::Session)
            && let Ok(own) = self.own_servers(origin)
        {
            self.keep_own_servers(branch, own);
        }
    }

    /// The session's own server definitions: kept in memory since its creation or an earlier
    /// call, or opened from the sealed copy stored with it (after a restart, or on a daemon that
    /// did not create it).
    fn own_servers(&self, session: &Session) -> std::result::Result<Vec<ServerSpec>, String> {
        let kept = self
            .own
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&session.id)
            .cloned();
        if let Some(own) = kept {
            return Ok(own);
        }
        let not_kept = "such definitions (which may hold secrets) are stored only sealed with \
                        the daemon's secret key";
        let Some(sealed) = &session.mcp.sealed_config else {
            return Err(format!(
                "{not_kept}, and the daemon that created the session had none"
            ));
        };
        let Some(key) = &self.config.secret_key else {
            return Err(format!(
                "{not_kept}, and this daemon has none (secret_key_file)"
            ));
        };
        let text = key
            .open(&session.id.to_string(), sealed)
            .map_err(|e| format!("its definitions cannot be opened: {e}"))?;
        let file = std::str::from_utf8(&text)
            .map_err(|e| e.to_string())
            .and_then(|t| McpFile::parse(t).map_err(|e| e.to_string()))
            .map_err(|e| format!("its stored definitions cannot be read: {e}"))?;
        let own = file
            .servers
            .iter()
            .map(|(name, def)| def.resolve(name, Origin::Session, &|_| None))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| format!("its stored definitions cannot be read: {e}"))?;
        self.keep_own_servers(session.id, own.clone());
        Ok(own)
    }

    /// Keeps a session's own server definitions for its calls (in memory only).
    pub(crate) fn keep_own_servers(&self, session: SessionId, own: Vec<ServerSpec>) {
        if own.is_empty() {
            return;
        }
        self.own
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(session, own);
    }

    /// The server a session's MCP tool belongs to, or why it cannot be reached.
    async fn mcp_server(
        &self,
        session: &Session,
        server: &str,
    ) -> std::result::Result<Arc<Server>, String> {
        let origin = session
            .mcp
            .server(server)
            .map_or(McpOrigin::Operator, |s| s.origin);
        let spec = match origin {
            McpOrigin::Operator => self.config.servers.get(server).cloned().ok_or_else(|| {
                format!(
                    "MCP server {server:?} is no longer defined in the daemon's mcp.json; the \
                     call did not run. Work without it."
                )
            })?,
            McpOrigin::Session => self
                .own_servers(session)
                .and_then(|own| {
                    own.into_iter()
                        .find(|s| s.name == server)
                        .ok_or_else(|| "its definition is not among them".to_owned())
                })
                .map_err(|why| {
                    format!(
                        "MCP server {server:?} was defined by this session, and {why}; the call \
                         did not run. Work without it."
                    )
                })?,
        };
        let paths = self.mcp_paths().await.map_err(|e| e.to_string())?;
        Ok(self.pool.server(&session.tenant, &spec, &paths))
    }

    /// Runs an MCP tool of the session's pool.
    pub(crate) async fn call(
        &self,
        session: &Session,
        tool: &McpToolRef,
        input: &Value,
        cancel: &CancellationToken,
    ) -> CallOutput {
        let started = std::time::Instant::now();
        let output = match self.mcp_server(session, &tool.server).await {
            Ok(server) => server.call(&tool.tool, input.clone(), cancel).await,
            Err(message) => CallOutput::error(message),
        };
        crate::metrics::mcp_call(&tool.server, output.is_error, started.elapsed());
        output
    }
}

/// The pool's definitions of the listed tools, named `mcp__SERVER__TOOL` (sorted by server,
/// then tool, so collision suffixes never depend on listing order), with where each comes from.
fn tool_defs(listed: &[(ServerSpec, Vec<ServerTool>)]) -> (Vec<ToolDef>, Vec<McpToolRef>) {
    let mut all: Vec<(&ServerSpec, &ServerTool)> = listed
        .iter()
        .flat_map(|(spec, tools)| tools.iter().map(move |t| (spec, t)))
        .collect();
    all.sort_by(|a, b| (&a.0.name, &a.1.name).cmp(&(&b.0.name, &b.1.name)));
    // Built-in names are taken, so no MCP tool can shadow one.
    let mut taken: BTreeSet<String> = forkd_core::tools::builtin_definitions()
        .into_iter()
        .map(|d| d.name)
        .collect();
    let mut defs = Vec::new();
    let mut refs = Vec::new();
    for (spec, tool) in all {
        let name = forkd_mcp::names::tool_name(&spec.name, &tool.name, &mut taken);
        let description: String = tool.description.chars().take(DESCRIPTION_CHARS).collect();
        let mut schema = tool.input_schema.clone();
        if !schema.is_object() {
            schema = json!({"type": "object"});
        }
        defs.push(ToolDef {
            name: name.clone(),
            raw: RawJson::encode(&json!({
                "name": name,
                "description": description,
                "input_schema": schema,
            })),
        });
        refs.push(McpToolRef {
            name,
            server: spec.name.clone(),
            tool: tool.name.clone(),
            read_only: spec.read_only_tools.contains(&tool.name),
        });
    }
    (defs, refs)
}

/// Images of a result over this many bytes (base64) are left out with a note.
const MAX_IMAGE_BYTES: usize = 5 * 1024 * 1024;

/// The tool_result of a call that returned images: its text (already shortened) and the images
/// as image blocks.
pub(crate) fn result_with_images(tool_use_id: &str, text: &str, out: &CallOutput) -> Block {
    let mut content = Vec::new();
    let mut notes = Vec::new();
    for image in &out.images {
        if image.data.len() > MAX_IMAGE_BYTES {
            notes.push(format!(
                "[an image of {} bytes was left out: over the {MAX_IMAGE_BYTES}-byte limit]",
                image.data.len()
            ));
            continue;
        }
        content.push(json!({
            "type": "image",
            "source": {"type": "base64", "media_type": image.media_type, "data": image.data},
        }));
    }
    let mut text = text.to_owned();
    for note in notes {
        text.push('\n');
        text.push_str(&note);
    }
    if !text.is_empty() {
        content.insert(0, json!({"type": "text", "text": text}));
    }
    Block::tool_result_content(tool_use_id, &RawJson::encode(&content), out.is_error)
}
