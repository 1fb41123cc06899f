//! Creating sessions: the system prompt is rendered once, the tool pool assembled once, and both
//! stored as the exact bytes every request of the session and of its forks will carry.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use forkd_core::pricing::Models;
use forkd_core::session::{
    CacheSafeParams, PermissionMode, PermissionRules, Session, SystemTemplate, ThinkingConfig,
    ToolsJson,
};
use forkd_core::session::{Sandbox, SandboxMode};
use forkd_core::tools::{AgentTypeListing, builtin_definitions_with_types};
use forkd_core::{Block, Message, SessionId};

use forkd_core::session::LOCAL_TENANT;
use forkd_core::store::{IdempotencyRecord, IdempotentCall, Store};

use crate::agent_types;
use crate::clock::{now_ms, today};
use crate::config::EngineConfig;
use crate::error::{EngineError, Result, clip};
use crate::hooks::Hooks;
use crate::mcp::McpServers;
use crate::tenancy::{Idempotent, Tenancy};
use crate::uploads::Uploads;
use crate::window::Window;
use crate::workspaces;

/// A file placed in the session's first message.
#[derive(Debug, Clone)]
pub struct ContextFile {
    pub path: String,
    pub content: String,
}

/// What a client asks for when it creates a session.
#[derive(Debug, Clone, Default)]
pub struct NewSession {
    pub system_prompt: String,
    pub context_files: Vec<ContextFile>,
    pub model: Option<String>,
    pub workspace: Option<PathBuf>,
    pub coordinator: bool,
    pub interactive: bool,
    pub permission_mode: PermissionMode,
    pub thinking_budget: Option<u32>,
    /// The MCP servers it uses: the operator's by name, and its own definitions.
    pub mcp: crate::mcp::McpRequest,
    pub max_tokens: Option<u32>,
    /// Permission rules such as `Bash(cargo test:*)` or `Write(src/**)`.
    pub allow_rules: Vec<String>,
    pub deny_rules: Vec<String>,
    /// The owner; empty for the local tenant.
    pub tenant: String,
    /// A retry with the same key and parameters returns the first call's session.
    pub idempotency_key: Option<String>,
    /// What its Bash commands may touch; `None`: the daemon's default mode.
    pub sandbox: Option<SandboxMode>,
    /// Its Bash commands may use the network.
    pub allow_network: bool,
    /// Its Bash commands may create Unix sockets (the `unix_sockets` grant).
    pub unix_sockets: bool,
    /// An upload of the tenant's to work in (a fresh workspace holding its tree) instead of
    /// `workspace`.
    pub upload: Option<forkd_core::UploadId>,
    /// Its model gets the read-only `Capacity` tool (how busy the daemon is).
    pub capacity_tool: bool,
    /// Its own hooks: the `hooks` block of a Claude Code `settings.json` (docs/contracts.md,
    /// "Hooks"), run beside the operator's in its sandbox view.
    pub hooks_json: Option<String>,
}

impl NewSession {
    /// A digest of everything that shapes the session: a retry under one idempotency key must
    /// ask for the same session. An upload counts by its tree (`tree`: its manifest's digest),
    /// not its id: the same tree uploaded again for a retry asks for the same session.
    fn digest(&self, tree: Option<&str>) -> String {
        let files: Vec<(&str, &str)> = self
            .context_files
            .iter()
            .map(|f| (f.path.as_str(), f.content.as_str()))
            .collect();
        let mut canonical = serde_json::json!([
            self.system_prompt,
            files,
            self.model,
            self.workspace.as_ref().map(|w| w.to_string_lossy()),
            self.coordinator,
            self.interactive,
            self.permission_mode.as_str(),
            self.thinking_budget,
            self.mcp.servers,
            self.mcp.config_json,
            self.max_tokens,
            self.sandbox.map(SandboxMode::as_str),
            self.allow_network,
            self.unix_sockets,
            self.allow_rules,
            self.deny_rules,
            tree,
        ]);
        // Added only when asked for, so that the digests of keys recorded before the option
        // came stay what they were.
        if let Some(parts) = canonical.as_array_mut() {
            if self.capacity_tool {
                parts.push(serde_json::json!({"capacity_tool": true}));
            }
            if let Some(hooks) = &self.hooks_json {
                parts.push(serde_json::json!({"hooks": hooks}));
            }
        }
        forkd_core::request::fingerprint(canonical.to_string().as_bytes())
    }
}

/// The built-in tools of a session: the `Agent` tool listing `types`, and `Capacity` when asked.
fn builtin_tools(
    types: &[AgentTypeListing<'_>],
    capacity: bool,
) -> Vec<forkd_core::session::ToolDef> {
    let mut defs = builtin_definitions_with_types(types);
    if capacity {
        defs.push(forkd_core::tools::capacity_definition());
    }
    defs
}

/// The smallest thinking budget the Messages API accepts.
const MIN_THINKING_BUDGET: u32 = 1024;

/// The text block a context file becomes in the session's first message.
pub fn context_block(file: &ContextFile) -> Block {
    Block::text(&format!(
        "<context path=\"{}\">\n{}\n</context>",
        // The path sits in an attribute: a quote in it must not end the attribute early.
        file.path.replace('"', "&quot;"),
        file.content
    ))
}

fn first_message(files: &[ContextFile]) -> Message {
    if files.is_empty() {
        return Message::user(vec![Block::text(
            "Session started. Instructions and fork directives follow.",
        )]);
    }
    Message::user(files.iter().map(context_block).collect())
}

/// The tag around what SessionStart hooks add to a session's first message.
const SESSION_START_TAG: &str = "session-start-hook";

/// A new session's SessionStart hooks, run before it is stored (by the runs' service: they run
/// as its agents' tools do); what they add for the model.
pub(crate) trait SessionStart: Send + Sync {
    fn context<'a>(
        &'a self,
        session: &'a Session,
    ) -> futures::future::BoxFuture<'a, Result<Option<String>>>;
}

/// What a new session's request came to once checked.
struct Checked {
    id: SessionId,
    tenant: String,
    /// The workspace's path, as stored and as its agents see it.
    workspace: PathBuf,
    /// A layered session's layer, through which its files are read.
    layer: Option<std::sync::Arc<forkd_tools::sandbox::layer::LayerView>>,
    model: String,
    max_tokens: u32,
    thinking: Option<ThinkingConfig>,
    rules: PermissionRules,
    sandbox: Sandbox,
}

/// Sessions: their creation (validated, rendered once, idempotent) and reading them.
pub(crate) struct Sessions {
    store: Arc<dyn Store>,
    /// Limits, defaults, models, the sandbox's settings, where agent types are defined.
    config: Arc<EngineConfig>,
    tenancy: Arc<Tenancy>,
    mcp: Arc<McpServers>,
    window: Arc<Window>,
    uploads: Arc<Uploads>,
    trees: Arc<crate::trees::Trees>,
    /// Which hooks run for each session: the operator's, and sessions' own (sealed).
    hooks: Arc<Hooks>,
}

impl Sessions {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        config: Arc<EngineConfig>,
        tenancy: Arc<Tenancy>,
        mcp: Arc<McpServers>,
        window: Arc<Window>,
        uploads: Arc<Uploads>,
        trees: Arc<crate::trees::Trees>,
    ) -> Self {
        Self {
            hooks: Arc::new(Hooks::new(&config.hooks, config.mcp.secret_key.clone())),
            store,
            config,
            tenancy,
            uploads,
            trees,
            mcp,
            window,
        }
    }

    /// The session's sandbox: the mode it asks for, or the daemon's default. `full-access`, the
    /// network and the `unix_sockets` grant are for callers on the Unix socket and for the
    /// tenants the configuration allows.
    fn check_sandbox(&self, req: &NewSession, tenant: &str) -> Result<Sandbox> {
        let cfg = &self.config.sandbox;
        let mode = req.sandbox.unwrap_or(cfg.default_mode);
        let local = tenant == forkd_core::session::LOCAL_TENANT;
        // Each grant: asked for, the tenants allowed it, what it gives, its setting. A
        // full-access session has the network and Unix sockets anyway.
        let sandboxed = mode != SandboxMode::FullAccess;
        let grants = [
            (
                !sandboxed,
                &cfg.full_access_tenants,
                "create full-access sessions (unsandboxed commands)",
                "allow_full_access",
            ),
            (
                req.unix_sockets && sandboxed,
                &cfg.unix_socket_tenants,
                "create sessions whose commands may use Unix sockets (any listener of the \
                 daemon's user would be reachable)",
                "allow_unix_sockets",
            ),
            (
                req.allow_network && sandboxed,
                &cfg.network_tenants,
                "create sessions whose commands use the network",
                "allow_network",
            ),
        ];
        for (asked, allowed, what, setting) in grants {
            if asked && !local && !allowed.contains(tenant) {
                return Err(EngineError::Forbidden(format!(
                    "tenant {tenant:?} may not {what}; the daemon's operator allows it with \
                     {setting} = true under [tenants.{tenant}] in config.toml"
                )));
            }
        }
        Ok(Sandbox {
            mode,
            allow_network: req.allow_network,
            unix_sockets: req.unix_sockets,
        })
    }
}

fn invalid(msg: String) -> EngineError {
    EngineError::InvalidRequest(msg)
}

fn check_model(models: &Models, model: &str) -> Result<()> {
    match models.get(model) {
        Some(_) => Ok(()),
        None => Err(invalid(format!(
            "unknown model {:?}; known models: {} (config.toml's [models] adds others)",
            clip(model, 64),
            models.names()
        ))),
    }
}

fn check_thinking(budget: Option<u32>, max_tokens: u32) -> Result<Option<ThinkingConfig>> {
    match budget {
        None | Some(0) => Ok(None),
        Some(b) if b < MIN_THINKING_BUDGET => Err(invalid(format!(
            "thinking budget {b} is below the minimum of {MIN_THINKING_BUDGET} tokens"
        ))),
        Some(b) if b >= max_tokens => Err(invalid(format!(
            "thinking budget {b} must be below max_tokens {max_tokens}"
        ))),
        Some(b) => Ok(Some(ThinkingConfig { budget_tokens: b })),
    }
}

/// Checks every rule now, so a typo is the client's error at creation, not a surprise later.
fn check_rules(allow: Vec<String>, deny: Vec<String>) -> Result<PermissionRules> {
    for (kind, rules) in [("allow", &allow), ("deny", &deny)] {
        for rule in rules {
            forkd_tools::Rule::parse(rule)
                .map_err(|e| invalid(format!("{kind} rule {:?}: {e}", clip(rule, 100))))?;
        }
    }
    Ok(PermissionRules { allow, deny })
}

fn session_bytes(req: &NewSession) -> usize {
    req.system_prompt.len()
        + req
            .context_files
            .iter()
            .map(|f| f.path.len() + f.content.len())
            .sum::<usize>()
        + req.mcp.config_json.as_ref().map_or(0, String::len)
        + req.hooks_json.as_ref().map_or(0, String::len)
}

fn template(req: &NewSession, workspace: &Path, model: &str) -> SystemTemplate {
    SystemTemplate {
        base: req.system_prompt.clone(),
        date: today(),
        workspace: workspace.display().to_string(),
        model: model.to_owned(),
        coordinator: req.coordinator,
        environment: BTreeMap::from([
            ("Platform".to_owned(), std::env::consts::OS.to_owned()),
            ("forkd".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
        ]),
    }
}

impl Sessions {
    /// Creates a session: validates the request, renders the system prompt and assembles the tool
    /// pool once, and stores them with the session's first message. With an idempotency key, a
    /// retry returns the session the key first created.
    pub(crate) async fn create(
        &self,
        req: NewSession,
        start: &dyn SessionStart,
    ) -> Result<Session> {
        let tenant = if req.tenant.is_empty() {
            LOCAL_TENANT.to_owned()
        } else {
            req.tenant.clone()
        };
        let Some(key) = req.idempotency_key.clone().filter(|k| !k.is_empty()) else {
            return self.new_session(req, tenant, None, start).await;
        };
        let id = SessionId::new();
        let tree = match req.upload {
            Some(upload) => Some(self.uploads.tree_digest(&tenant, upload).await?),
            None => None,
        };
        let outcome = self
            .tenancy
            .idempotent(
                &tenant,
                &key,
                IdempotentCall::CreateSession,
                req.digest(tree.as_deref()),
                id.to_string(),
                |record| self.new_session(req, tenant.clone(), Some((id, record)), start),
            )
            .await?;
        match outcome {
            Idempotent::Created(session) => Ok(session),
            Idempotent::Earlier(id) => self.get_stored(&id).await,
        }
    }

    /// The session an idempotency key names by its stored id.
    pub(crate) async fn get_stored(&self, id: &str) -> Result<Session> {
        let id = id.parse().map_err(|e| {
            EngineError::Invariant(format!("stored session id {id:?} does not parse: {e}"))
        })?;
        self.get(id).await
    }

    async fn new_session(
        &self,
        req: NewSession,
        tenant: String,
        keyed: Option<(SessionId, IdempotencyRecord)>,
        start: &dyn SessionStart,
    ) -> Result<Session> {
        let cfg = &self.config;
        let size = session_bytes(&req);
        if size > cfg.max_session_bytes {
            return Err(invalid(format!(
                "the session's system prompt, context files and tools come to {size} bytes; the \
                 limit is {}",
                cfg.max_session_bytes
            )));
        }
        let model = req
            .model
            .clone()
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| cfg.default_model.clone());
        check_model(&cfg.models, &model)?;
        if req.permission_mode == PermissionMode::Bubble && !req.interactive {
            return Err(invalid(
                "permission mode bubble needs an interactive session: no client could answer its \
                 prompts; use dontAsk, acceptEdits or bypassPermissions"
                    .into(),
            ));
        }
        let max_tokens = req
            .max_tokens
            .filter(|m| *m > 0)
            .unwrap_or(cfg.default_max_tokens);
        let thinking = check_thinking(req.thinking_budget, max_tokens)?;
        let rules = check_rules(req.allow_rules.clone(), req.deny_rules.clone())?;
        let sandbox = self.check_sandbox(&req, &tenant)?;
        let id = keyed.as_ref().map_or_else(SessionId::new, |(id, _)| *id);
        let (allowed, origin, workspace, layer) = match req.upload {
            Some(_) if req.workspace.is_some() => {
                return Err(invalid(
                    "a session works in a workspace directory or an upload, not both".into(),
                ));
            }
            Some(upload) => {
                let made = self.trees.make(&tenant, upload, id, sandbox.mode).await?;
                (
                    made.allowed,
                    Some(made.upload.origin()),
                    made.workspace,
                    made.layer,
                )
            }
            None => {
                let allowed = workspaces::allow(
                    &cfg.workspaces,
                    self.store.as_ref(),
                    workspaces::Asked {
                        tenant: &tenant,
                        dir: req.workspace.as_deref(),
                        session: id,
                    },
                )
                .await?;
                let path = allowed.path.clone();
                (allowed, None, path, None)
            }
        };
        let checked = Checked {
            id,
            tenant,
            workspace,
            layer,
            model,
            max_tokens,
            thinking,
            rules,
            sandbox,
        };
        // The layer, which `checked` holds, is let go before a fresh workspace is removed.
        let created = self.store_new(req, checked, keyed, start).await;
        if created.is_err() {
            allowed.discard();
        }
        if let (Ok(session), Some(origin)) = (&created, &origin) {
            self.store.record_session_origin(session.id, origin).await?;
        }
        created
    }

    /// The rest of [`Sessions::new_session`], once the request is checked and its workspace
    /// allowed (and perhaps made).
    async fn store_new(
        &self,
        req: NewSession,
        checked: Checked,
        keyed: Option<(SessionId, IdempotencyRecord)>,
        start: &dyn SessionStart,
    ) -> Result<Session> {
        let cfg = &self.config;
        let Checked {
            id,
            tenant,
            workspace,
            layer,
            model,
            max_tokens,
            thinking,
            rules,
            sandbox,
        } = checked;
        let hooks = match req.hooks_json.as_deref().filter(|h| !h.trim().is_empty()) {
            Some(text) => {
                let set = self.hooks.check_own(text)?;
                // A settings file without hooks is a session without hooks of its own.
                match set.is_empty() {
                    true => None,
                    false => Some(self.hooks.seal_own(id, text, &set)?),
                }
            }
            None => None,
        };
        // Last of the checks, as it starts processes: every server's tools, listed once now.
        let mut mcp = self.mcp.session_tools(&req.mcp, &tenant).await?;
        self.mcp.seal_own_servers(id, &mut mcp)?;
        // The types the Agent tool lists, as they are now: fixed with the session's tools.
        let types = match layer {
            Some(layer) => agent_types::for_layer(&cfg.agent_dirs, layer),
            None => agent_types::for_workspace(&cfg.agent_dirs, &workspace),
        };
        let listed: Vec<AgentTypeListing<'_>> = types
            .iter()
            .map(|t| AgentTypeListing {
                name: &t.name,
                description: &t.description,
            })
            .collect();
        let session = Session {
            id,
            tenant,
            params: CacheSafeParams {
                system: template(&req, &workspace, &model).render(),
                model,
                tools: ToolsJson::assemble(builtin_tools(&listed, req.capacity_tool), mcp.defs),
                thinking,
                max_tokens,
            },
            workspace,
            coordinator: req.coordinator,
            interactive: req.interactive,
            permission_mode: req.permission_mode,
            rules,
            sandbox,
            mcp: mcp.mcp,
            hooks,
            created_at_ms: now_ms(),
            branch: None,
            reply_breakpoint: true,
        };
        // Its SessionStart hooks run once, now: what they add is in its first message, which
        // every turn, branch and child reads as it is.
        let mut first = first_message(&req.context_files);
        if let Some(context) = start.context(&session).await? {
            first.blocks.push(Block::text(&format!(
                "<{SESSION_START_TAG}>\n{context}\n</{SESSION_START_TAG}>"
            )));
        }
        workspaces::apart_from_others(self.store.as_ref(), &session.tenant, &session.workspace)
            .await?;
        self.store
            .create_session(&session, &[first], keyed.as_ref().map(|(_, record)| record))
            .await?;
        self.mcp.keep_own_servers(session.id, mcp.own);
        tracing::info!(session.id = %session.id, model = %session.params.model, "Session created");
        // Counted now, once, so that a batch forked from the session does not pay for it.
        if let Err(e) = self.window.history_tokens(&session, None).await {
            tracing::debug!(error = %e, "Cannot count the session's first message");
        }
        Ok(session)
    }

    /// Which hooks run for each session.
    pub(crate) fn hooks(&self) -> &Arc<Hooks> {
        &self.hooks
    }

    /// Where workspaces may be: what a branch given another workspace is checked against too.
    pub(crate) fn workspaces_config(&self) -> &crate::config::WorkspacesConfig {
        &self.config.workspaces
    }

    pub(crate) async fn get(&self, id: SessionId) -> Result<Session> {
        self.store
            .get_session(id)
            .await?
            .ok_or_else(|| EngineError::NotFound {
                kind: "session",
                id: id.to_string(),
            })
    }

    /// Sessions of one tenant (or of all, for `None`), in creation order after the cursor.
    pub(crate) async fn list(
        &self,
        tenant: Option<&str>,
        after: Option<SessionId>,
        limit: u32,
    ) -> Result<Vec<Session>> {
        Ok(self.store.list_sessions(tenant, after, limit).await?)
    }

    pub(crate) async fn message_count(&self, id: SessionId) -> Result<u64> {
        Ok(self.store.session_message_count(id).await?)
    }
}
