//! Session RPCs.

use forkd_core::SessionId;
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

impl ForkdService {
    pub(super) async fn create_session_rpc(
        &self,
        tenant: Tenant,
        req: pb::CreateSessionRequest,
    ) -> Result<pb::CreateSessionResponse, ApiError> {
        let new = convert::new_session(req)?;
        let view = self.engine.for_tenant(tenant).create_session(new).await?;
        Ok(pb::CreateSessionResponse {
            session: Some(convert::session_view(&view)),
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
            session: Some(convert::session_view(&view)),
        })
    }

    pub(super) async fn branch_session_rpc(
        &self,
        tenant: Tenant,
        req: pb::BranchSessionRequest,
    ) -> Result<pb::BranchSessionResponse, ApiError> {
        let origin = parse_session_id(&req.session_id)?;
        let new = convert::new_branch(origin, req);
        let view = self.engine.for_tenant(tenant).branch_session(new).await?;
        Ok(pb::BranchSessionResponse {
            session: Some(convert::session_view(&view)),
        })
    }

    pub(super) async fn merge_branch_rpc(
        &self,
        tenant: Tenant,
        req: pb::MergeBranchRequest,
    ) -> Result<pb::MergeBranchResponse, ApiError> {
        let id = parse_session_id(&req.session_id)?;
        let merged = self
            .engine
            .for_tenant(tenant)
            .merge_branch(
                id,
                req.summary,
                Some(req.idempotency_key).filter(|k| !k.is_empty()),
            )
            .await?;
        Ok(pb::MergeBranchResponse {
            origin_session_id: merged.origin.to_string(),
            seq: merged.seq,
            note: merged.note,
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
            sessions: sessions.iter().map(convert::session_view).collect(),
            next_page_token,
        })
    }
}

pub type SessionEventStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::SessionEvent, Status>> + Send>>;

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
            events.map(|e| e.map(convert::session_event).map_err(status)),
        ))
    }
}
