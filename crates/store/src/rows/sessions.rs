//! Session rows.

use forkd_core::branch::Branch;
use forkd_core::session::{
    CacheSafeParams, PermissionMode, PermissionRules, RenderedSystem, Sandbox, SandboxMode,
    Session, ThinkingConfig, ToolsJson,
};

use super::convert::{corrupt, from_i64, parse_id, to_i64};
use crate::error::Result;
use crate::{DbError, StoreError};

/// The columns of a session row, in the order [`SessionRow`] and [`bind_session!`] use.
macro_rules! session_columns {
    () => {
        "id, model, system_prompt, tools_json, thinking_budget, max_tokens, workspace, \
         coordinator, interactive, permission_mode, created_at_ms, allow_rules, deny_rules, tenant, \
         sandbox, allow_network, mcp_json, unix_sockets, branch_of, branch_point, \
         branch_compacted_to, params_of, reply_breakpoint, hooks_json"
    };
}

/// `SELECT` and `FROM` of session rows as [`SessionRow`] reads them: a row whose system prompt
/// and tools another session holds (`params_of`) gets them from there. Rows are `s`.
macro_rules! select_sessions {
    () => {
        "SELECT s.id, s.model, COALESCE(p.system_prompt, s.system_prompt) AS system_prompt, \
         COALESCE(p.tools_json, s.tools_json) AS tools_json, s.thinking_budget, s.max_tokens, \
         s.workspace, s.coordinator, s.interactive, s.permission_mode, s.created_at_ms, \
         s.allow_rules, s.deny_rules, s.tenant, s.sandbox, s.allow_network, s.mcp_json, \
         s.unix_sockets, s.branch_of, s.branch_point, s.branch_compacted_to, s.reply_breakpoint, \
         s.hooks_json FROM sessions s LEFT JOIN sessions p ON p.id = s.params_of"
    };
}
pub(crate) use select_sessions;

/// Inserts a session: bind [`SessionValues`] with [`bind_session!`].
pub(crate) const INSERT_SESSION: &str = concat!(
    "INSERT INTO sessions (",
    session_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, \
     $19, $20, $21, $22, $23, $24)"
);

#[derive(sqlx::FromRow)]
pub(crate) struct SessionRow {
    id: String,
    model: String,
    system_prompt: String,
    tools_json: String,
    thinking_budget: Option<i64>,
    max_tokens: i64,
    workspace: String,
    coordinator: bool,
    interactive: bool,
    permission_mode: String,
    created_at_ms: i64,
    allow_rules: String,
    deny_rules: String,
    tenant: String,
    sandbox: String,
    allow_network: bool,
    mcp_json: String,
    unix_sockets: bool,
    branch_of: Option<String>,
    branch_point: Option<i64>,
    branch_compacted_to: Option<i64>,
    reply_breakpoint: bool,
    hooks_json: Option<String>,
}

impl TryFrom<SessionRow> for Session {
    type Error = DbError;

    fn try_from(row: SessionRow) -> Result<Self> {
        let tools =
            ToolsJson::from_stored(&row.tools_json).map_err(|e| corrupt("tools_json", e))?;
        let thinking = row
            .thinking_budget
            .map(|b| {
                from_i64(b, "thinking_budget").map(|budget_tokens| ThinkingConfig { budget_tokens })
            })
            .transpose()?;
        let branch = match (row.branch_of, row.branch_point) {
            (Some(origin), Some(point)) => Some(Branch {
                origin: parse_id(&origin, "branch origin")?,
                point: from_i64(point, "branch_point")?,
                compacted_to: row
                    .branch_compacted_to
                    .map(|c| from_i64(c, "branch_compacted_to"))
                    .transpose()?,
            }),
            (None, None) => None,
            _ => {
                return Err(corrupt(
                    "branch",
                    "an origin without a point, or the reverse",
                ));
            }
        };
        let permission_mode = PermissionMode::parse(&row.permission_mode).ok_or_else(|| {
            corrupt(
                "permission_mode",
                format!("unknown mode {:?}", row.permission_mode),
            )
        })?;
        Ok(Session {
            id: parse_id(&row.id, "session id")?,
            tenant: row.tenant,
            params: CacheSafeParams {
                model: row.model,
                system: RenderedSystem::from_stored(&row.system_prompt),
                tools,
                thinking,
                max_tokens: from_i64(row.max_tokens, "max_tokens")?,
            },
            workspace: row.workspace.into(),
            coordinator: row.coordinator,
            interactive: row.interactive,
            permission_mode,
            rules: PermissionRules {
                allow: serde_json::from_str(&row.allow_rules)
                    .map_err(|e| corrupt("allow rules", e))?,
                deny: serde_json::from_str(&row.deny_rules)
                    .map_err(|e| corrupt("deny rules", e))?,
            },
            sandbox: Sandbox {
                mode: SandboxMode::parse(&row.sandbox)
                    .ok_or_else(|| corrupt("sandbox", format!("unknown mode {:?}", row.sandbox)))?,
                allow_network: row.allow_network,
                unix_sockets: row.unix_sockets,
            },
            mcp: serde_json::from_str(&row.mcp_json).map_err(|e| corrupt("mcp_json", e))?,
            hooks: row
                .hooks_json
                .map(|h| serde_json::from_str(&h).map_err(|e| corrupt("hooks_json", e)))
                .transpose()?,
            created_at_ms: row.created_at_ms,
            branch,
            reply_breakpoint: row.reply_breakpoint,
        })
    }
}

/// A session as its row stores it.
pub(crate) struct SessionValues<'a> {
    pub id: String,
    pub model: &'a str,
    pub system_prompt: &'a str,
    pub tools_json: &'a str,
    pub thinking_budget: Option<i64>,
    pub max_tokens: i64,
    pub workspace: &'a str,
    pub coordinator: bool,
    pub interactive: bool,
    pub permission_mode: &'a str,
    pub created_at_ms: i64,
    pub allow_rules: String,
    pub deny_rules: String,
    pub tenant: &'a str,
    pub sandbox: &'a str,
    pub allow_network: bool,
    pub mcp_json: String,
    pub unix_sockets: bool,
    pub branch_of: Option<String>,
    pub branch_point: Option<i64>,
    pub branch_compacted_to: Option<i64>,
    /// The session whose system prompt and tools this row uses (its own columns hold '').
    pub params_of: Option<String>,
    pub reply_breakpoint: bool,
    /// The session's own hooks, sealed (`SessionHooks` as JSON); `None` for none.
    pub hooks_json: Option<String>,
}

impl<'a> SessionValues<'a> {
    pub fn new(session: &'a Session) -> Result<Self> {
        // The workspace is matched against tool paths as text; a path that is not UTF-8 could not
        // be stored and read back unchanged, so it is refused rather than mangled.
        let workspace = session.workspace.to_str().ok_or_else(|| {
            DbError::Database(sqlx::Error::Encode(
                format!("workspace {:?} is not UTF-8", session.workspace).into(),
            ))
        })?;
        let p = &session.params;
        Ok(Self {
            id: session.id.to_string(),
            model: &p.model,
            system_prompt: p.system.as_str(),
            tools_json: p.tools.raw().as_str(),
            thinking_budget: p
                .thinking
                .map(|t| to_i64(t.budget_tokens, "thinking budget"))
                .transpose()?,
            max_tokens: to_i64(p.max_tokens, "max_tokens")?,
            workspace,
            coordinator: session.coordinator,
            interactive: session.interactive,
            permission_mode: session.permission_mode.as_str(),
            created_at_ms: session.created_at_ms,
            allow_rules: serde_json::to_string(&session.rules.allow)
                .unwrap_or_else(|_| "[]".into()),
            deny_rules: serde_json::to_string(&session.rules.deny).unwrap_or_else(|_| "[]".into()),
            tenant: &session.tenant,
            sandbox: session.sandbox.mode.as_str(),
            allow_network: session.sandbox.allow_network,
            mcp_json: serde_json::to_string(&session.mcp)
                .unwrap_or_else(|_| r#"{"servers":[],"tools":[]}"#.into()),
            unix_sockets: session.sandbox.unix_sockets,
            branch_of: session.branch.map(|b| b.origin.to_string()),
            branch_point: session
                .branch
                .map(|b| to_i64(b.point, "branch_point"))
                .transpose()?,
            branch_compacted_to: session
                .branch
                .and_then(|b| b.compacted_to)
                .map(|c| to_i64(c, "branch_compacted_to"))
                .transpose()?,
            params_of: None,
            reply_breakpoint: session.reply_breakpoint,
            hooks_json: session
                .hooks
                .as_ref()
                .map(serde_json::to_string)
                .transpose()
                .map_err(|e| DbError::Database(sqlx::Error::Encode(e.into())))?,
        })
    }

    /// The row uses `holder`'s system prompt and tools instead of storing them again.
    pub fn share_params(&mut self, holder: String) {
        self.system_prompt = "";
        self.tools_json = "";
        self.params_of = Some(holder);
    }
}

/// Binds [`SessionValues`] to [`INSERT_SESSION`], on either driver.
macro_rules! bind_session {
    ($query:expr, $values:expr) => {{
        let v: &$crate::rows::sessions::SessionValues<'_> = $values;
        $query
            .bind(&v.id)
            .bind(v.model)
            .bind(v.system_prompt)
            .bind(v.tools_json)
            .bind(v.thinking_budget)
            .bind(v.max_tokens)
            .bind(v.workspace)
            .bind(v.coordinator)
            .bind(v.interactive)
            .bind(v.permission_mode)
            .bind(v.created_at_ms)
            .bind(&v.allow_rules)
            .bind(&v.deny_rules)
            .bind(v.tenant)
            .bind(v.sandbox)
            .bind(v.allow_network)
            .bind(&v.mcp_json)
            .bind(v.unix_sockets)
            .bind(&v.branch_of)
            .bind(v.branch_point)
            .bind(v.branch_compacted_to)
            .bind(&v.params_of)
            .bind(v.reply_breakpoint)
            .bind(&v.hooks_json)
    }};
}
pub(crate) use bind_session;

/// `NotFound` for a session.
pub(crate) fn not_found(id: impl ToString) -> DbError {
    DbError::Store(StoreError::NotFound {
        kind: "session",
        id: id.to_string(),
    })
}
