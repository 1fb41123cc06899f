//! Session RPCs.

use forkd_core::SessionId;
use forkd_core::session::{PermissionMode, SandboxMode};
use forkd_engine::{ContextFile, NewSession, SessionView};
use forkd_proto::v1 as pb;
use tonic::Status;

use super::{ForkdService, page_size};
use crate::auth::Tenant;
use crate::convert;
use crate::status::{ApiError, bad_id, status};

pub(crate) fn parse_session_id(s: &str) -> Result<SessionId, ApiError> {
    if s.is_empty() {
        return Err(ApiError::BadRequest("session_id is required".into()));
    }
    s.parse().map_err(|e| bad_id("session_id", e))
}

fn session(view: &SessionView) -> pb::Session {
    convert::session(&view.session, view.message_count, &view.sandbox_layers)
}

impl ForkdService {
    pub(super) async fn create_session_rpc(
        &self,
        tenant: Tenant,
        req: pb::CreateSessionRequest,
    ) -> Result<pb::CreateSessionResponse, ApiError> {
        let permission_mode = match req.permission_mode.as_str() {
            "" => PermissionMode::Default,
            other => PermissionMode::parse(other).ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "unknown permission_mode {:?}; use {}",
                    other.chars().take(64).collect::<String>(),
                    PermissionMode::choices()
                ))
            })?,
        };
        let sandbox = match req.sandbox.as_str() {
            "" => None,
            other => Some(SandboxMode::parse(other).ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "unknown sandbox {:?}; use {}",
                    other.chars().take(64).collect::<String>(),
                    SandboxMode::choices()
                ))
            })?),
        };
        #[allow(deprecated, reason = "read only to refuse it")]
        if !req.external_tools_json.is_empty() {
            return Err(ApiError::BadRequest(
                "external_tools_json is no longer accepted: it advertised tools that nothing \
                 could run. Enable MCP servers instead (mcp_servers: the operator's, by name; \
                 mcp_config_json: the session's own .mcp.json), whose tools forkd runs"
                    .into(),
            ));
        }
        let new = NewSession {
            system_prompt: req.system_prompt,
            context_files: req
                .context_files
                .into_iter()
                .map(|f| ContextFile {
                    path: f.path,
                    content: f.content,
                })
                .collect(),
            model: Some(req.model).filter(|m| !m.is_empty()),
            workspace: Some(req.workspace)
                .filter(|w| !w.is_empty())
                .map(Into::into),
            coordinator: req.coordinator,
            interactive: req.interactive,
            permission_mode,
            thinking_budget: Some(req.thinking_budget_tokens).filter(|b| *b > 0),
            mcp: forkd_engine::McpRequest {
                servers: req.mcp_servers,
                config_json: Some(req.mcp_config_json).filter(|c| !c.trim().is_empty()),
            },
            max_tokens: Some(req.max_tokens).filter(|m| *m > 0),
            allow_rules: req.allow_rules,
            deny_rules: req.deny_rules,
            tenant: String::new(),
            idempotency_key: Some(req.idempotency_key).filter(|k| !k.is_empty()),
            sandbox,
            allow_network: req.allow_network,
            unix_sockets: req.unix_sockets,
        };
        let view = self.engine.for_tenant(tenant).create_session(new).await?;
        Ok(pb::CreateSessionResponse {
            session: Some(session(&view)),
        })
    }

    pub(super) async fn get_session_rpc(
        &self,
        tenant: Tenant,
        req: pb::GetSessionRequest,
    ) -> Result<pb::GetSessionResponse, ApiError> {
        let id = parse_session_id(&req.session_id)?;
        let view = self.engine.for_tenant(tenant).session(id).await?;
        Ok(pb::GetSessionResponse {
            session: Some(session(&view)),
        })
    }

    pub(super) async fn compact_session_rpc(
        &self,
        tenant: Tenant,
        req: pb::CompactSessionRequest,
    ) -> Result<pb::CompactSessionResponse, ApiError> {
        let id = parse_session_id(&req.session_id)?;
        let instructions = Some(req.instructions).filter(|i| !i.trim().is_empty());
        let c = self
            .engine
            .for_tenant(tenant)
            .compact_session(id, instructions)
            .await?;
        Ok(pb::CompactSessionResponse {
            from_seq: c.from_seq,
            to_seq: c.to_seq,
            summary_json: c.summary.content_json(),
        })
    }

    pub(super) async fn list_sessions_rpc(
        &self,
        tenant: Tenant,
        req: pb::ListSessionsRequest,
    ) -> Result<pb::ListSessionsResponse, ApiError> {
        let after = match req.page_token.as_str() {
            "" => None,
            token => Some(token.parse().map_err(|e| bad_id("page_token", e))?),
        };
        let limit = page_size(req.page_size);
        let sessions = self
            .engine
            .for_tenant(tenant)
            .list_sessions(after, limit)
            .await?;
        let next_page_token = match sessions.last() {
            Some(last) if sessions.len() as u32 == limit => last.session.id.to_string(),
            _ => String::new(),
        };
        Ok(pb::ListSessionsResponse {
            sessions: sessions.iter().map(session).collect(),
            next_page_token,
        })
    }
}

pub type SessionEventStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::SessionEvent, Status>> + Send>>;

fn session_event(event: forkd_engine::ParentEvent) -> pb::SessionEvent {
    use forkd_engine::ParentEvent as E;
    use pb::session_event::Event;
    let event = match event {
        E::TextDelta(text) => Event::TextDelta(text),
        E::ToolCall {
            tool_use_id,
            name,
            input_json,
        } => Event::ToolCall(pb::ToolCall {
            tool_use_id,
            name,
            input_json,
        }),
        E::ToolResult {
            tool_use_id,
            content,
            is_error,
        } => Event::ToolResult(pb::ToolResult {
            tool_use_id,
            content,
            is_error,
        }),
        E::AsyncLaunched(agent) => Event::AsyncLaunched(pb::AsyncLaunched {
            agent_id: agent.to_string(),
        }),
        E::ForkLaunched(batch) => Event::ForkLaunched(pb::ForkLaunched {
            batch_id: batch.batch_id.to_string(),
            agent_ids: batch.agent_ids.iter().map(ToString::to_string).collect(),
        }),
        E::TurnEnded {
            stop_reason,
            usage,
            cost_usd,
            text,
        } => Event::TurnEnded(pb::TurnEnded {
            stop_reason: stop_reason.unwrap_or_default(),
            usage: Some(convert::usage(&usage)),
            cost_usd,
            text,
        }),
    };
    pb::SessionEvent { event: Some(event) }
}

impl ForkdService {
    pub(super) async fn send_message_rpc(
        &self,
        tenant: Tenant,
        req: pb::SendMessageRequest,
    ) -> Result<SessionEventStream, ApiError> {
        use futures::StreamExt;
        let id = parse_session_id(&req.session_id)?;
        let key = Some(req.idempotency_key).filter(|k| !k.is_empty());
        let events = self
            .engine
            .for_tenant(tenant)
            .send_message(id, req.text, key)
            .await?;
        Ok(Box::pin(
            events.map(|e| e.map(session_event).map_err(status)),
        ))
    }
}
