//! Session RPCs.

use forkd_core::SessionId;
use forkd_core::session::PermissionMode;
use forkd_engine::{ContextFile, NewSession};
use forkd_proto::v1 as pb;
use tonic::Status;

use super::{ForkdService, page_size};
use crate::auth::Tenant;
use crate::convert;
use crate::status::{bad_id, to_status};

pub(crate) fn parse_session_id(s: &str) -> Result<SessionId, Status> {
    if s.is_empty() {
        return Err(Status::invalid_argument("session_id is required"));
    }
    s.parse().map_err(|e| bad_id("session_id", e))
}

impl ForkdService {
    pub(super) async fn create_session_rpc(
        &self,
        tenant: &Tenant,
        req: pb::CreateSessionRequest,
    ) -> Result<pb::CreateSessionResponse, Status> {
        let permission_mode = match req.permission_mode.as_str() {
            "" => PermissionMode::Default,
            other => PermissionMode::parse(other).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "unknown permission_mode {:?}; use default, acceptEdits, plan, \
                     bypassPermissions, dontAsk or bubble",
                    other.chars().take(64).collect::<String>()
                ))
            })?,
        };
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
            external_tools: req.external_tools_json,
            max_tokens: Some(req.max_tokens).filter(|m| *m > 0),
            allow_rules: req.allow_rules,
            deny_rules: req.deny_rules,
            tenant: tenant.name().to_owned(),
            idempotency_key: Some(req.idempotency_key).filter(|k| !k.is_empty()),
        };
        let session = self.engine.create_session(new).await.map_err(to_status)?;
        let count = self
            .engine
            .session_message_count(session.id)
            .await
            .map_err(to_status)?;
        Ok(pb::CreateSessionResponse {
            session: Some(convert::session(&session, count)),
        })
    }

    pub(super) async fn get_session_rpc(
        &self,
        tenant: &Tenant,
        req: pb::GetSessionRequest,
    ) -> Result<pb::GetSessionResponse, Status> {
        let id = parse_session_id(&req.session_id)?;
        self.engine
            .check_session(tenant.name(), id)
            .await
            .map_err(to_status)?;
        let session = self.engine.get_session(id).await.map_err(to_status)?;
        let count = self
            .engine
            .session_message_count(id)
            .await
            .map_err(to_status)?;
        Ok(pb::GetSessionResponse {
            session: Some(convert::session(&session, count)),
        })
    }

    pub(super) async fn list_sessions_rpc(
        &self,
        tenant: &Tenant,
        req: pb::ListSessionsRequest,
    ) -> Result<pb::ListSessionsResponse, Status> {
        let after = match req.page_token.as_str() {
            "" => None,
            token => Some(token.parse().map_err(|e| bad_id("page_token", e))?),
        };
        let limit = page_size(req.page_size);
        let sessions = self
            .engine
            .list_sessions(Some(tenant.name()), after, limit)
            .await
            .map_err(to_status)?;
        let next_page_token = match sessions.last() {
            Some(last) if sessions.len() as u32 == limit => last.id.to_string(),
            _ => String::new(),
        };
        let mut out = Vec::with_capacity(sessions.len());
        for s in &sessions {
            let count = self
                .engine
                .session_message_count(s.id)
                .await
                .map_err(to_status)?;
            out.push(convert::session(s, count));
        }
        Ok(pb::ListSessionsResponse {
            sessions: out,
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
        tenant: &Tenant,
        req: pb::SendMessageRequest,
    ) -> Result<SessionEventStream, Status> {
        use futures::StreamExt;
        let id = parse_session_id(&req.session_id)?;
        self.engine
            .check_session(tenant.name(), id)
            .await
            .map_err(to_status)?;
        let events = self
            .engine
            .send_message(id, req.text)
            .await
            .map_err(to_status)?;
        Ok(Box::pin(
            events.map(|e| e.map(session_event).map_err(to_status)),
        ))
    }
}
