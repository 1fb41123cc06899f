//! Sessions and their cache-safe params: the rendered system prompt, the tool pool, the model and
//! the thinking config, all fixed when the session is created.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::ids::SessionId;
use crate::json::{JsonError, RawJson};
use crate::tools;

/// The inputs of a session's system prompt. Rendered exactly once, at creation; children get the
/// rendered bytes, never a re-render (a date, a flag or a file may have changed since).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemTemplate {
    /// The client's own system prompt.
    pub base: String,
    /// Today's date as the session saw it.
    pub date: String,
    pub workspace: String,
    pub model: String,
    pub coordinator: bool,
    /// Further environment facts (platform, shell…), rendered in key order.
    pub environment: BTreeMap<String, String>,
}

impl SystemTemplate {
    pub fn render(&self) -> RenderedSystem {
        let mut out = String::with_capacity(self.base.len() + 512);
        out.push_str(self.base.trim_end());
        out.push_str("\n\n<env>\n");
        out.push_str(&format!("Working directory: {}\n", self.workspace));
        out.push_str(&format!("Model: {}\n", self.model));
        out.push_str(&format!("Today's date: {}\n", self.date));
        for (key, value) in &self.environment {
            out.push_str(&format!("{key}: {value}\n"));
        }
        out.push_str("</env>\n");
        if self.coordinator {
            out.push_str(
                "\nYou are a coordinator: plan the work and delegate it to typed agents \
                 (subagent_type). Do not fork.\n",
            );
        } else {
            out.push_str(
                "\nWhen work splits into independent parts, prefer forking: call the Agent tool \
                 once per part, without subagent_type, in one message.\n",
            );
        }
        RenderedSystem(Arc::from(out))
    }
}

/// The system prompt's final text, as sent. Held by reference; never rebuilt.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RenderedSystem(Arc<str>);

impl RenderedSystem {
    /// Wraps text that was rendered earlier (read back from the store).
    pub fn from_stored(text: &str) -> Self {
        Self(Arc::from(text))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The same text naming another working directory: `Working directory: FROM` in its
    /// `<env>` becomes `TO`. `None` when the text names no such line (it was not rendered by
    /// [`SystemTemplate::render`] with `from`).
    pub fn with_workspace(&self, from: &str, to: &str) -> Option<Self> {
        let line = format!("\nWorking directory: {from}\n");
        let at = self.0.find("\n<env>\n")?;
        let found = at + self.0[at..].find(&line)?;
        let mut out = String::with_capacity(self.0.len() + to.len());
        out.push_str(&self.0[..found]);
        out.push_str(&format!("\nWorking directory: {to}\n"));
        out.push_str(&self.0[found + line.len()..]);
        Some(Self(Arc::from(out)))
    }
}

/// One tool definition: its name and its exact JSON bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolDef {
    pub name: String,
    pub raw: RawJson,
}

/// A tool definition that is not usable.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ToolDefError {
    #[error(transparent)]
    Json(#[from] JsonError),
    #[error("tool definition has no \"name\"")]
    MissingName,
    #[error("tool definitions must not carry \"cache_control\": forkd places breakpoints itself")]
    CacheControl,
}

impl ToolDef {
    /// Ingests an external (MCP) tool definition.
    pub fn parse(text: &str) -> Result<Self, ToolDefError> {
        let raw = RawJson::parse(text)?;
        raw.expect_object()?;
        let value = raw.value();
        if value.get("cache_control").is_some() {
            return Err(ToolDefError::CacheControl);
        }
        let name = value
            .get("name")
            .and_then(serde_json::Value::as_str)
            .ok_or(ToolDefError::MissingName)?
            .to_owned();
        Ok(Self { name, raw })
    }
}

/// The exact tools array of a session, as sent on every request of it and of its fork children.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ToolsJson(RawJson);

impl ToolsJson {
    /// Assembles the pool once: built-ins sorted by name, then external tools sorted by name,
    /// duplicates dropped (the first wins, so a built-in is never shadowed).
    pub fn assemble(mut builtin: Vec<ToolDef>, mut external: Vec<ToolDef>) -> Self {
        builtin.sort_by(|a, b| a.name.cmp(&b.name));
        external.sort_by(|a, b| a.name.cmp(&b.name));
        let mut seen = std::collections::HashSet::new();
        let mut out = String::from("[");
        for tool in builtin.iter().chain(external.iter()) {
            if !seen.insert(tool.name.clone()) {
                continue;
            }
            if out.len() > 1 {
                out.push(',');
            }
            out.push_str(tool.raw.as_str());
        }
        out.push(']');
        // Joining compact JSON objects with commas yields a valid compact array.
        Self(RawJson::from_stored(&out).unwrap_or_else(|_| RawJson::encode(&[0u8; 0])))
    }

    /// The pool of forkd's built-in tools only.
    pub fn builtin() -> Self {
        Self::assemble(tools::builtin_definitions(), Vec::new())
    }

    pub fn from_stored(text: &str) -> Result<Self, JsonError> {
        let raw = RawJson::from_stored(text)?;
        raw.expect_array()?;
        Ok(Self(raw))
    }

    pub fn raw(&self) -> &RawJson {
        &self.0
    }

    /// The pool's tool definitions, each keeping its bytes (to build a typed agent's subset).
    pub fn defs(&self) -> Vec<ToolDef> {
        let items: Vec<&serde_json::value::RawValue> =
            serde_json::from_str(self.0.as_str()).unwrap_or_default();
        items
            .into_iter()
            .filter_map(|item| {
                let raw = RawJson::from_stored(item.get()).ok()?;
                let name = raw.value().get("name")?.as_str()?.to_owned();
                Some(ToolDef { name, raw })
            })
            .collect()
    }

    /// The tool names, in pool order.
    pub fn names(&self) -> Vec<String> {
        match self.0.value() {
            serde_json::Value::Array(items) => items
                .iter()
                .filter_map(|t| t.get("name").and_then(|n| n.as_str()).map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// Extended thinking, part of the cache key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ThinkingConfig {
    pub budget_tokens: u32,
}

impl ThinkingConfig {
    /// The request's `thinking` field, serialized the same way every time.
    pub fn to_json(self) -> String {
        format!(
            r#"{{"type":"enabled","budget_tokens":{}}}"#,
            self.budget_tokens
        )
    }
}

/// Permission modes (docs/contracts.md). Stored with the session; enforced by the tool layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PermissionMode {
    #[default]
    Default,
    AcceptEdits,
    Plan,
    BypassPermissions,
    DontAsk,
    Bubble,
}

impl PermissionMode {
    /// Every mode, in the order docs and errors list them: the one table of modes.
    pub const ALL: [PermissionMode; 6] = [
        PermissionMode::Default,
        PermissionMode::AcceptEdits,
        PermissionMode::Plan,
        PermissionMode::BypassPermissions,
        PermissionMode::DontAsk,
        PermissionMode::Bubble,
    ];

    /// The modes' names, for an error that says what would be accepted: `default, …, or bubble`.
    pub fn choices() -> String {
        crate::choices(Self::ALL.map(Self::as_str))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PermissionMode::Default => "default",
            PermissionMode::AcceptEdits => "acceptEdits",
            PermissionMode::Plan => "plan",
            PermissionMode::BypassPermissions => "bypassPermissions",
            PermissionMode::DontAsk => "dontAsk",
            PermissionMode::Bubble => "bubble",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.as_str() == s)
    }

    /// How much a mode lets happen without a person: `plan` (read-only) least, then `dontAsk`
    /// (refuses what would ask), `default` and `bubble` (ask), `acceptEdits`,
    /// `bypassPermissions`.
    fn latitude(self) -> u8 {
        match self {
            PermissionMode::Plan => 0,
            PermissionMode::DontAsk => 1,
            PermissionMode::Default | PermissionMode::Bubble => 2,
            PermissionMode::AcceptEdits => 3,
            PermissionMode::BypassPermissions => 4,
        }
    }

    /// This mode where it lets no more happen than `ceiling`, else `ceiling`: what an agent
    /// type's own mode comes to in a session (a type narrows its session's mode, never widens
    /// it).
    pub fn within(self, ceiling: PermissionMode) -> PermissionMode {
        if self == ceiling || self.latitude() < ceiling.latitude() {
            self
        } else {
            ceiling
        }
    }
}

/// What a session's `Bash` commands may touch (docs/contracts.md, "Sandbox").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    /// Writes only inside the workspace and a private temporary directory; reads everything but
    /// the daemon's home, other sessions' workspaces and the deny list.
    #[default]
    WorkspaceWrite,
    /// The same reads; writes only in the private temporary directory.
    ReadOnly,
    /// No sandbox: whatever the daemon's user may do.
    FullAccess,
}

impl SandboxMode {
    /// Every mode: the one table of sandbox modes.
    pub const ALL: [SandboxMode; 3] = [
        SandboxMode::WorkspaceWrite,
        SandboxMode::ReadOnly,
        SandboxMode::FullAccess,
    ];

    /// The modes' names, for an error that says what would be accepted.
    pub fn choices() -> String {
        crate::choices(Self::ALL.map(Self::as_str))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::WorkspaceWrite => "workspace-write",
            SandboxMode::ReadOnly => "read-only",
            SandboxMode::FullAccess => "full-access",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.as_str() == s)
    }
}

/// A session's sandbox: its mode, whether its commands may use the network, and whether they
/// may create Unix sockets (the `unix_sockets` grant: any pathname-socket listener the daemon's
/// user can reach, which seccomp cannot tell apart by address; given as `full-access` is).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Sandbox {
    pub mode: SandboxMode,
    pub allow_network: bool,
    #[serde(default)]
    pub unix_sockets: bool,
}

/// Everything that decides a request's cache key, except the messages: one type, so no caller can
/// assemble a child's request from anything but the parent's stored values.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheSafeParams {
    pub model: String,
    pub system: RenderedSystem,
    pub tools: ToolsJson,
    pub thinking: Option<ThinkingConfig>,
    pub max_tokens: u32,
}

/// A parent session.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    pub id: SessionId,
    /// Who owns the session, and with it its agents, transcripts and notifications.
    pub tenant: String,
    pub params: CacheSafeParams,
    pub workspace: PathBuf,
    pub coordinator: bool,
    pub interactive: bool,
    pub permission_mode: PermissionMode,
    /// Allow and deny rules (`Bash(cargo test:*)`, `Write(src/**)`); deny wins.
    pub rules: PermissionRules,
    /// What its `Bash` commands may touch.
    pub sandbox: Sandbox,
    /// The MCP servers it uses and the tools it got from them, fixed at creation.
    pub mcp: SessionMcp,
    /// Its own hooks (`forkctl session create --hooks`), run beside the operator's.
    pub hooks: Option<SessionHooks>,
    pub created_at_ms: i64,
    /// Where a branch starts in its origin's transcript; `None` for a session created afresh.
    pub branch: Option<crate::branch::Branch>,
    /// Its main loop's requests also carry a breakpoint at the end of the last assistant reply
    /// ([`crate::request::Conversation::main_loop`]), so a branch or a batch that starts after
    /// that reply reads it from the cache. Set for sessions created since branches came; earlier
    /// sessions keep the bytes their requests always had.
    pub reply_breakpoint: bool,
}

/// A session's own hooks (docs/contracts.md, "Hooks"): the `hooks` block of a `settings.json`
/// its client sent, sealed with the daemon's secret key for this session (a command may hold a
/// secret), so never in the clear in the database; inherited by its children and sealed again
/// for each branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionHooks {
    /// The events they are for, by Claude Code's names (what a reader of the session sees).
    pub events: Vec<String>,
    /// The settings text, sealed for this session.
    pub sealed: String,
}

/// Who defined one of a session's MCP servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum McpOrigin {
    /// The daemon's operator (`$FORKD_HOME/mcp.json`): found again by name after a restart.
    Operator,
    /// The session's own definition (it may hold secrets): stored only sealed with the daemon's
    /// secret key ([`SessionMcp::sealed_config`]), opened again after a restart or by another
    /// daemon holding the same key.
    Session,
}

/// One MCP server a session uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpServerRef {
    pub name: String,
    pub origin: McpOrigin,
}

/// One MCP tool in a session's pool: its name there, and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpToolRef {
    /// `mcp__SERVER__TOOL`, valid for every provider.
    pub name: String,
    pub server: String,
    /// Its name on the server, as the call sends it.
    pub tool: String,
    /// Read-only because the operator's configuration says so (never because the server does):
    /// allowed in every permission mode, and run again when a restart cut it off.
    pub read_only: bool,
}

/// A session's MCP servers and tools.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionMcp {
    pub servers: Vec<McpServerRef>,
    pub tools: Vec<McpToolRef>,
    /// The session's own server definitions (its `.mcp.json` text), sealed with the daemon's
    /// secret key for this session: never in the clear in the database. `None` when the session
    /// defined none (or its daemon had no key: then they live in that daemon's memory only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed_config: Option<String>,
}

impl SessionMcp {
    /// The MCP tool the pool names `name`, if it is one.
    pub fn tool(&self, name: &str) -> Option<&McpToolRef> {
        self.tools.iter().find(|t| t.name == name)
    }

    pub fn server(&self, name: &str) -> Option<&McpServerRef> {
        self.servers.iter().find(|s| s.name == name)
    }

    /// The pool names of the tools that count as read-only.
    pub fn read_only_tools(&self) -> Vec<String> {
        self.tools
            .iter()
            .filter(|t| t.read_only)
            .map(|t| t.name.clone())
            .collect()
    }
}

/// The tenant of callers that present no token on the daemon's Unix socket.
pub const LOCAL_TENANT: &str = "local";

/// A session's permission rules, as the rule strings the client gave (checked at creation).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermissionRules {
    pub allow: Vec<String>,
    pub deny: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, extra: &str) -> ToolDef {
        let text = format!(r#"{{"name":"{name}","description":"{extra}","input_schema":{{}}}}"#);
        ToolDef::parse(&text).unwrap_or_else(|_| ToolDef {
            name: name.into(),
            raw: RawJson::encode(name),
        })
    }

    #[test]
    fn a_type_s_mode_narrows_its_session_s_and_never_widens_it() {
        use PermissionMode as M;
        assert_eq!(M::BypassPermissions.within(M::Default), M::Default);
        assert_eq!(M::AcceptEdits.within(M::DontAsk), M::DontAsk);
        assert_eq!(M::Plan.within(M::BypassPermissions), M::Plan);
        assert_eq!(M::DontAsk.within(M::Default), M::DontAsk);
        // Asking the parent is no narrower than asking the session's clients: kept as it was.
        assert_eq!(M::Bubble.within(M::Default), M::Default);
        for mode in M::ALL {
            assert_eq!(mode.within(mode), mode);
            assert_eq!(mode.within(M::Plan), M::Plan);
        }
    }

    #[test]
    fn pool_sorts_each_group_and_keeps_the_first_duplicate() {
        let pool = ToolsJson::assemble(
            vec![tool("Write", "b"), tool("Agent", "b")],
            vec![tool("zeta", "m"), tool("Write", "mcp"), tool("alpha", "m")],
        );
        assert_eq!(pool.names(), ["Agent", "Write", "alpha", "zeta"]);
        assert!(!pool.raw().as_str().contains("mcp"));
    }

    #[test]
    fn rendering_is_a_pure_function_of_the_template() {
        let t = SystemTemplate {
            base: "You help.".into(),
            date: "2026-11-29".into(),
            workspace: "/ws".into(),
            model: "m".into(),
            coordinator: false,
            environment: BTreeMap::from([("Platform".into(), "linux".into())]),
        };
        assert_eq!(t.render(), t.clone().render());
        assert!(t.render().as_str().contains("Platform: linux"));
    }

    #[test]
    fn another_workspace_changes_only_its_line() {
        let t = SystemTemplate {
            base: "Work in /ws.\nWorking directory: /ws\n".into(),
            date: "2026-11-29".into(),
            workspace: "/ws".into(),
            model: "m".into(),
            coordinator: false,
            environment: BTreeMap::new(),
        };
        let moved = t.render().with_workspace("/ws", "/other");
        let expected = SystemTemplate {
            workspace: "/other".into(),
            ..t.clone()
        };
        // The client's own text (before <env>) is left as it was written.
        assert_eq!(moved, Some(expected.render()));
        assert_eq!(t.render().with_workspace("/elsewhere", "/other"), None);
    }

    #[test]
    fn permission_modes_round_trip() {
        for s in [
            "default",
            "acceptEdits",
            "plan",
            "bypassPermissions",
            "dontAsk",
            "bubble",
        ] {
            assert_eq!(PermissionMode::parse(s).map(|m| m.as_str()), Some(s));
        }
        assert_eq!(PermissionMode::parse("yolo"), None);
    }
}
