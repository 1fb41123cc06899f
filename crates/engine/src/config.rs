//! The engine's settings, with the defaults a daemon runs on.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytesize::ByteSize;
use forkd_core::pricing::{DEFAULT_MODEL, Models};
use forkd_mcp::{McpFile, Origin, ServerSpec};

use crate::sealed::SecretKey;

/// The engine's settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Send child 1 first and release its siblings when its response starts, so they read the
    /// shared prefix from cache instead of all writing it.
    pub warmup_gating: bool,
    /// The largest directive (prompt + description), in bytes.
    pub max_directive_bytes: usize,
    /// The largest session (system prompt, context files and external tools), in bytes. Every
    /// child of every batch carries it, so it bounds the work one request can cause.
    pub max_session_bytes: usize,
    /// The most children one batch may fork.
    pub max_children_per_batch: usize,
    /// A parent's request whose input plus `max_tokens` would pass this share of its model's
    /// window compacts the transcript first.
    pub compact_threshold: f64,
    /// How many levels below its session an agent may be started: a session's fork children
    /// and typed agents are at 1, a typed agent a fork child starts at 2. A call past it is a
    /// tool error. (Typed agents are not offered the Agent tool.)
    pub max_agent_depth: u32,
    /// The daemon's limits on each fork child's and typed agent's run (docs/contracts.md,
    /// "Limits"), below a tenant's and a batch's; its `max_turns` also bounds a parent turn's
    /// model requests.
    pub agent_limits: forkd_core::Limits,
    /// Each tenant's default limits (by name), between a batch's and the daemon's.
    pub tenant_limits: std::collections::HashMap<String, forkd_core::Limits>,
    pub default_model: String,
    /// The models sessions may name: the price table and the configuration's `[models]`
    /// (prices and context windows).
    pub models: Models,
    /// `max_tokens` of each request when the session sets none.
    pub default_max_tokens: u32,
    /// When model requests may go, and how long a refused one keeps trying.
    pub admission: AdmissionConfig,
    /// Folders of custom agent type definitions (`$FORKD_HOME/agents`); a session's
    /// `<workspace>/.forkd/agents` is read after these and wins.
    pub agent_dirs: Vec<std::path::PathBuf>,
    /// An attached client is handed to the background after this long (`None`: never).
    pub auto_background: Option<Duration>,
    /// A parent's fork children run in the background and the parent's turn goes on at once,
    /// with placeholder results (`FORKD_FORK_ALWAYS_ASYNC`, the default). When false, a parent
    /// turn that forks waits for its children and continues with their notifications in its
    /// transcript. A client's `ForkBatch` is asynchronous either way.
    pub fork_always_async: bool,
    /// The most agents running at once (`None`: no cap). The others wait as `pending`, and
    /// start in the order they were started.
    pub max_running_agents: Option<usize>,
    /// The sandbox of sessions' Bash commands.
    pub sandbox: SandboxConfig,
    /// Where sessions' workspaces may be, per tenant.
    pub workspaces: WorkspacesConfig,
    /// Where isolated batches keep their snapshots and their children's copies.
    pub isolation: IsolationConfig,
    /// What one uploaded workspace may hold.
    pub uploads: forkd_core::upload::UploadLimits,
    /// MCP servers: the operator's, and who may define their own.
    pub mcp: McpConfig,
    /// Spending limits per tenant (by name); an agent of a tenant over its budget fails.
    pub tenant_budgets: std::collections::HashMap<String, forkd_core::store::Budget>,
    /// Put each model request's messages and its reply on its trace span
    /// (`gen_ai.input.messages`, `gen_ai.output.messages`). Off by default: they may hold
    /// secrets.
    pub trace_content: bool,
    /// Below this much free space on the filesystem holding the database, new sessions,
    /// messages and batches are refused (docs/operations.md, "Disk and database faults").
    pub min_free_disk: MinFreeDisk,
    /// Webhooks: where deliveries may go, how long they are retried.
    pub webhooks: WebhookConfig,
    /// The operator's hooks (`$FORKD_HOME/hooks.json`).
    pub hooks: HooksConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            warmup_gating: true,
            max_directive_bytes: 64 * 1024,
            max_session_bytes: 8 * 1024 * 1024,
            max_children_per_batch: 1000,
            max_agent_depth: 2,
            compact_threshold: 0.9,
            agent_limits: forkd_core::Limits {
                max_turns: Some(DEFAULT_MAX_TURNS),
                ..forkd_core::Limits::default()
            },
            tenant_limits: std::collections::HashMap::new(),
            default_model: DEFAULT_MODEL.to_owned(),
            models: Models::default(),
            default_max_tokens: 8192,
            admission: AdmissionConfig::default(),
            agent_dirs: Vec::new(),
            auto_background: Some(Duration::from_secs(120)),
            fork_always_async: true,
            tenant_budgets: std::collections::HashMap::new(),
            sandbox: SandboxConfig::default(),
            workspaces: WorkspacesConfig::default(),
            isolation: IsolationConfig::default(),
            uploads: forkd_core::upload::UploadLimits::default(),
            mcp: McpConfig::default(),
            webhooks: WebhookConfig::default(),
            hooks: HooksConfig::default(),
            max_running_agents: Some(256),
            trace_content: false,
            min_free_disk: MinFreeDisk::Default,
        }
    }
}

/// Model requests a run may make when no layer of limits sets `max_turns`.
pub const DEFAULT_MAX_TURNS: u32 = 50;

impl EngineConfig {
    /// The limits an agent of `tenant` asking for `given` runs under: `given` over the tenant's
    /// defaults over the daemon's.
    pub fn limits_for(&self, tenant: &str, given: forkd_core::Limits) -> forkd_core::Limits {
        let tenant = self.tenant_limits.get(tenant).copied().unwrap_or_default();
        given.over(tenant).over(self.agent_limits)
    }

    /// The model requests one parent turn may make.
    pub fn parent_max_turns(&self) -> u32 {
        self.agent_limits.max_turns.unwrap_or(DEFAULT_MAX_TURNS)
    }
}

/// Where sessions' workspaces may be (docs/contracts.md, "Workspaces"). Paths are canonical.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkspacesConfig {
    /// The daemon's home (`FORKD_HOME`): never a workspace, nor inside one; a token tenant's
    /// workspace may not hold it either.
    pub home: Option<std::path::PathBuf>,
    /// Where a token tenant that names no workspace gets a fresh empty one
    /// (`workspaces_dir/SESSION_ID`); never a workspace itself. `None`: such a tenant must name
    /// one.
    pub dir: Option<std::path::PathBuf>,
    /// Each token tenant's roots (`workspace_roots`): its workspaces lie inside one of them.
    /// A tenant with none may use only fresh workspaces.
    pub roots: HashMap<String, Vec<std::path::PathBuf>>,
    /// `/forkd/workspaces` where it is here (a directory, empty): sessions made from uploads
    /// work in layers over trees kept read-only, seen beneath it (`trees.rs`). `None`: each
    /// gets a copy of its tree in `workspaces_dir`.
    pub view_root: Option<std::path::PathBuf>,
}

/// Isolated batches (docs/contracts.md, "Isolation").
#[derive(Debug, Clone, PartialEq)]
pub struct IsolationConfig {
    /// Where snapshots and copies go (`ROOT/BATCH/…`): the daemon's home sets `HOME/isolation`;
    /// hidden from every sandboxed command.
    pub root: std::path::PathBuf,
    /// The most disk one child's copy may take (what it wrote, whole files); past it, its
    /// writing tools fail saying so. `None`: no cap.
    pub disk_cap: Option<u64>,
    /// How long a copy neither applied nor discarded is kept after its child ended.
    pub retention: Duration,
}

impl Default for IsolationConfig {
    fn default() -> Self {
        Self {
            root: forkd_tools::isolation::default_root(),
            disk_cap: Some(4 << 30),
            retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// How sessions' Bash commands are sandboxed (docs/contracts.md, "Sandbox").
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxConfig {
    /// The mode of a session that asks for none.
    pub default_mode: forkd_core::session::SandboxMode,
    /// Hidden from every sandboxed command: the daemon's home and the deny list. (The other
    /// sessions' workspaces are added per call.)
    pub hidden: Vec<std::path::PathBuf>,
    /// Where each session's private temporary directory is made (`ROOT/SESSION_ID`); the others
    /// are hidden from it.
    pub tmp_root: std::path::PathBuf,
    /// Tenants (by name) that may create `full-access` sessions; callers on the Unix socket
    /// always may.
    pub full_access_tenants: std::collections::HashSet<String>,
    /// Tenants (besides the local one) that may create sessions with the `unix_sockets` grant.
    pub unix_socket_tenants: std::collections::HashSet<String>,
    /// Tenants (besides the local one) whose sessions' commands may use the network
    /// (`allow_network`).
    pub network_tenants: std::collections::HashSet<String>,
    /// The daemon user's home, which commands see covered but for its allow list.
    pub home: Option<forkd_tools::sandbox::HomeView>,
    /// Resource limits of each command (MCP servers: without the CPU limit).
    pub limits: forkd_tools::sandbox::ResourceLimits,
}

impl SandboxConfig {
    /// The default deny list, under `home` (the daemon user's home directory).
    pub fn default_deny(home: &std::path::Path) -> Vec<std::path::PathBuf> {
        forkd_tools::sandbox::DEFAULT_DENY
            .iter()
            .map(|p| home.join(p))
            .collect()
    }
}

impl Default for SandboxConfig {
    fn default() -> Self {
        let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
        Self {
            default_mode: forkd_core::session::SandboxMode::default(),
            hidden: home.as_deref().map(Self::default_deny).unwrap_or_default(),
            tmp_root: forkd_tools::sandbox::default_tmp_root(),
            full_access_tenants: std::collections::HashSet::new(),
            unix_socket_tenants: std::collections::HashSet::new(),
            network_tenants: std::collections::HashSet::new(),
            home: home.as_deref().map(|dir| forkd_tools::sandbox::HomeView {
                dir: dir.to_path_buf(),
                allow: forkd_tools::sandbox::default_read_allow(
                    dir,
                    std::env::var_os("PATH").as_deref(),
                ),
            }),
            limits: forkd_tools::sandbox::ResourceLimits::default(),
        }
    }
}

/// The daemon's MCP configuration.
#[derive(Debug, Clone, Default)]
pub struct McpConfig {
    /// The operator's servers (`$FORKD_HOME/mcp.json`), resolved (`${VAR}` expanded) at start.
    pub servers: HashMap<String, ServerSpec>,
    /// Tenants that may send their own server definitions (`allow_mcp_config = true` under
    /// `[tenants.NAME]`); callers on the Unix socket always may.
    pub config_tenants: HashSet<String>,
    /// The key that seals sessions' own server definitions in the database (see `sealed.rs`).
    /// Without one they are kept in this daemon's memory only.
    pub secret_key: Option<Arc<SecretKey>>,
}

impl McpConfig {
    /// Reads the operator's `mcp.json`; `env` is the daemon's environment (for `${VAR}`).
    pub fn from_file(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> std::result::Result<HashMap<String, ServerSpec>, forkd_mcp::ConfigError> {
        McpFile::parse(text)?
            .servers
            .iter()
            .map(|(name, def)| Ok((name.clone(), def.resolve(name, Origin::Operator, env)?)))
            .collect()
    }
}

/// The operator's hooks (`$FORKD_HOME/hooks.json`, docs/contracts.md "Hooks"): Claude Code's
/// `hooks` block for every tenant, and under `tenants.NAME` for one.
#[derive(Debug, Clone, Default)]
pub struct HooksConfig {
    pub every_tenant: forkd_core::hooks::HookSet,
    pub tenants: HashMap<String, forkd_core::hooks::HookSet>,
}

impl HooksConfig {
    /// Reads `hooks.json`: `{"hooks": {…}, "tenants": {"NAME": {"hooks": {…}}}}`.
    pub fn from_file(text: &str) -> std::result::Result<Self, String> {
        let every_tenant = forkd_core::hooks::HookSet::parse(text, true)?;
        let doc: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let mut tenants = HashMap::new();
        if let Some(map) = doc.get("tenants") {
            let map = map
                .as_object()
                .ok_or("`tenants` is an object of tenants' names")?;
            for (name, settings) in map {
                let set = forkd_core::hooks::HookSet::parse(&settings.to_string(), true)
                    .map_err(|e| format!("tenants.{name}: {e}"))?;
                tenants.insert(name.clone(), set);
            }
        }
        Ok(Self {
            every_tenant,
            tenants,
        })
    }

    /// The hooks that run for `tenant`'s sessions: every tenant's, then its own.
    pub fn for_tenant(&self, tenant: &str) -> forkd_core::hooks::HookSet {
        match self.tenants.get(tenant) {
            Some(own) => self.every_tenant.clone().merged(own),
            None => self.every_tenant.clone(),
        }
    }
}

/// Webhooks (`[webhooks]` in `config.toml`; docs/operations.md, "Webhooks and schedules").
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookConfig {
    /// Allow loopback, private, link-local and CGNAT addresses (tests, private networks); cloud
    /// metadata addresses stay refused.
    pub allow_private: bool,
    /// One attempt's limit, connection to last byte.
    pub timeout: Duration,
    /// How long deliveries are retried, when a failing endpoint is disabled.
    pub retry: forkd_core::webhook::RetryPolicy,
    /// How long a rotated-out secret still signs.
    pub rotation_overlap: Duration,
    /// Attempts in flight at once on this daemon.
    pub concurrency: usize,
}

impl WebhookConfig {
    /// A client under this address policy (`allow_private`), each request cut off after
    /// `timeout` when one is given.
    pub(crate) fn egress(&self, timeout: Option<Duration>) -> forkd_egress::Egress {
        let policy = forkd_egress::Policy {
            allow_private: self.allow_private,
        };
        forkd_egress::Egress::new(policy, timeout)
            .unwrap_or_else(|e| panic!("an HTTP client cannot be built here: {e}"))
    }
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            allow_private: false,
            timeout: Duration::from_secs(10),
            retry: forkd_core::webhook::RetryPolicy::default(),
            rotation_overlap: Duration::from_secs(24 * 3600),
            concurrency: 64,
        }
    }
}

/// How the limiter waits and gives up.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionConfig {
    /// How long a request refused for a rate limit or an overload (429, 529, 503, a cut
    /// stream) keeps trying, from its first refusal.
    pub patience: Duration,
    /// The same for a provider that cannot be reached at all.
    pub unreachable_patience: Duration,
    /// Requests in flight per key at first; the window then grows by one per window of
    /// successes, up to `max_concurrency`, and halves on overload.
    pub initial_concurrency: usize,
    pub max_concurrency: usize,
    /// Backoff for a refusal that says no time: doubled per refusal, with jitter, capped.
    pub backoff_base: Duration,
    pub backoff_cap: Duration,
    /// Retries, at most, for a plain 500 (or another 5xx that is not an overload or gateway
    /// status).
    pub max_server_error_retries: u32,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            patience: Duration::from_secs(15 * 60),
            unreachable_patience: Duration::from_secs(60),
            initial_concurrency: 64,
            max_concurrency: 256,
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(30),
            max_server_error_retries: 2,
        }
    }
}

/// Where `min_free_disk` (docs/operations.md, "Disk and database faults") stands by default: 256 MiB, or 1% of the filesystem when that is less.
const DEFAULT_MIN_FREE: u64 = 256 * 1024 * 1024;
const DEFAULT_MIN_FREE_PERCENT: f64 = 1.0;

/// The free space below which new sessions, messages and batches are refused (`min_free_disk`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum MinFreeDisk {
    /// 256 MiB, or 1% of the filesystem when that is less.
    #[default]
    Default,
    /// A number of bytes; 0 turns the check off.
    Bytes(u64),
    /// A share of the filesystem, in percent.
    Percent(f64),
}

impl MinFreeDisk {
    /// The threshold in bytes on a filesystem of `total` bytes.
    pub fn bytes(self, total: u64) -> u64 {
        let share = |percent: f64| (total as f64 * percent / 100.0) as u64;
        match self {
            MinFreeDisk::Default => DEFAULT_MIN_FREE.min(share(DEFAULT_MIN_FREE_PERCENT)),
            MinFreeDisk::Bytes(bytes) => bytes,
            MinFreeDisk::Percent(percent) => share(percent),
        }
    }

    /// `256MiB`, `1 GB`, `5%`, or `0` to turn the check off.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if let Some(percent) = text.strip_suffix('%') {
            return match percent.trim().parse::<f64>() {
                Ok(p) if (0.0..=100.0).contains(&p) => Ok(MinFreeDisk::Percent(p)),
                _ => Err(format!(
                    "min_free_disk {text:?}: a percentage is a number from 0 to 100, e.g. 1%"
                )),
            };
        }
        text.parse::<ByteSize>()
            .map(|size| MinFreeDisk::Bytes(size.as_u64()))
            .map_err(|e| {
                format!("min_free_disk {text:?}: {e} (a size such as 256MiB or 1GB, or a share such as 1%)")
            })
    }
}

impl std::fmt::Display for MinFreeDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MinFreeDisk::Default => write!(f, "256 MiB or 1%, whichever is smaller"),
            MinFreeDisk::Bytes(bytes) => write!(f, "{}", ByteSize(*bytes).display().iec()),
            MinFreeDisk::Percent(percent) => write!(f, "{percent}%"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::MinFreeDisk;

    #[test]
    fn min_free_disk_parses_sizes_and_shares() {
        assert_eq!(
            MinFreeDisk::parse("256MiB"),
            Ok(MinFreeDisk::Bytes(256 * 1024 * 1024))
        );
        assert_eq!(
            MinFreeDisk::parse("1 GB"),
            Ok(MinFreeDisk::Bytes(1_000_000_000))
        );
        assert_eq!(MinFreeDisk::parse("0"), Ok(MinFreeDisk::Bytes(0)));
        assert_eq!(MinFreeDisk::parse("5%"), Ok(MinFreeDisk::Percent(5.0)));
        for bad in ["lots", "150%", "-1%", "12 parsecs"] {
            let err = MinFreeDisk::parse(bad).unwrap_err();
            assert!(err.starts_with("min_free_disk"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_default_is_the_smaller_of_256_mib_and_one_percent() {
        let gib = 1024 * 1024 * 1024_u64;
        assert_eq!(MinFreeDisk::Default.bytes(100 * gib), 256 * 1024 * 1024);
        assert_eq!(MinFreeDisk::Default.bytes(10 * gib), gib / 10);
        assert_eq!(MinFreeDisk::Percent(50.0).bytes(1000), 500);
        assert_eq!(MinFreeDisk::Bytes(0).bytes(1000), 0);
    }
}
