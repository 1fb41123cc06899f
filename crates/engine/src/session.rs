//! Creating sessions: the system prompt is rendered once, the tool pool assembled once, and both
//! stored as the exact bytes every request of the session and of its forks will carry.

use std::collections::BTreeMap;
use std::path::PathBuf;

use forkd_core::pricing;
use forkd_core::session::{
    CacheSafeParams, PermissionMode, Session, SystemTemplate, ThinkingConfig, ToolDef, ToolsJson,
};
use forkd_core::tools::builtin_definitions;
use forkd_core::{Block, Message, SessionId};

use crate::error::{EngineError, Result};
use crate::{Engine, now_ms};

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
    /// External (MCP) tool definitions as JSON objects.
    pub external_tools: Vec<String>,
    pub max_tokens: Option<u32>,
}

/// The smallest thinking budget the Messages API accepts.
const MIN_THINKING_BUDGET: u32 = 1024;

/// The text block a context file becomes in the session's first message.
pub fn context_block(file: &ContextFile) -> Block {
    Block::text(&format!(
        "<context path=\"{}\">\n{}\n</context>",
        file.path, file.content
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

impl Engine {
    /// Creates a session: validates the request, renders the system prompt and assembles the tool
    /// pool once, and stores them with the session's first message.
    pub async fn create_session(&self, req: NewSession) -> Result<Session> {
        let cfg = self.config();
        let model = req
            .model
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| cfg.default_model.clone());
        if pricing::model(&model).is_none() {
            return Err(EngineError::InvalidArgument(format!(
                "unknown model {model:?}; known models: {}",
                pricing::model_names()
            )));
        }
        let workspace = match req.workspace {
            Some(dir) => dir,
            None => std::env::current_dir().map_err(|e| {
                EngineError::InvalidArgument(format!("no workspace given and no current dir: {e}"))
            })?,
        };
        // Canonical once, so every later path check compares against the same root.
        let workspace = std::fs::canonicalize(&workspace).map_err(|e| {
            EngineError::InvalidArgument(format!(
                "workspace {} is not usable: {e}",
                workspace.display()
            ))
        })?;
        if !workspace.is_dir() {
            return Err(EngineError::InvalidArgument(format!(
                "workspace {} is not a directory",
                workspace.display()
            )));
        }
        if req.permission_mode == PermissionMode::Bubble && !req.interactive {
            return Err(EngineError::InvalidArgument(
                "permission mode bubble needs an interactive session: no client could answer its \
                 prompts; use dontAsk, acceptEdits or bypassPermissions"
                    .into(),
            ));
        }
        let thinking = match req.thinking_budget {
            None | Some(0) => None,
            Some(b) if b < MIN_THINKING_BUDGET => {
                return Err(EngineError::InvalidArgument(format!(
                    "thinking budget {b} is below the minimum of {MIN_THINKING_BUDGET} tokens"
                )));
            }
            Some(b) => Some(ThinkingConfig { budget_tokens: b }),
        };
        let max_tokens = req
            .max_tokens
            .filter(|m| *m > 0)
            .unwrap_or(cfg.default_max_tokens);
        if let Some(t) = thinking
            && t.budget_tokens >= max_tokens
        {
            return Err(EngineError::InvalidArgument(format!(
                "thinking budget {} must be below max_tokens {max_tokens}",
                t.budget_tokens
            )));
        }
        let external = req
            .external_tools
            .iter()
            .enumerate()
            .map(|(i, t)| {
                ToolDef::parse(t)
                    .map_err(|e| EngineError::InvalidArgument(format!("external tool {i}: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;

        let now = now_ms();
        let template = SystemTemplate {
            base: req.system_prompt,
            date: humantime::format_rfc3339_seconds(std::time::SystemTime::now())
                .to_string()
                .chars()
                .take(10)
                .collect(),
            workspace: workspace.display().to_string(),
            model: model.clone(),
            coordinator: req.coordinator,
            environment: BTreeMap::from([
                ("Platform".to_owned(), std::env::consts::OS.to_owned()),
                ("forkd".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
            ]),
        };
        let session = Session {
            id: SessionId::new(),
            params: CacheSafeParams {
                model,
                system: template.render(),
                tools: ToolsJson::assemble(builtin_definitions(), external),
                thinking,
                max_tokens,
            },
            workspace,
            coordinator: req.coordinator,
            interactive: req.interactive,
            permission_mode: req.permission_mode,
            created_at_ms: now,
        };
        self.inner
            .store
            .create_session(&session, &[first_message(&req.context_files)])
            .await?;
        tracing::info!(session.id = %session.id, model = %session.params.model, "Session created");
        Ok(session)
    }

    pub async fn get_session(&self, id: SessionId) -> Result<Session> {
        self.inner
            .store
            .get_session(id)
            .await?
            .ok_or_else(|| EngineError::NotFound {
                kind: "session",
                id: id.to_string(),
            })
    }

    pub async fn list_sessions(
        &self,
        after: Option<SessionId>,
        limit: u32,
    ) -> Result<Vec<Session>> {
        Ok(self.inner.store.list_sessions(after, limit).await?)
    }

    pub async fn session_message_count(&self, id: SessionId) -> Result<u64> {
        Ok(self.inner.store.session_message_count(id).await?)
    }
}
