//! Permission prompt RPCs: interactive clients watch a session's prompts and answer them.

use std::pin::Pin;

use forkd_engine::PermissionAnswer;
use forkd_proto::v1 as pb;
use futures::{Stream, StreamExt};
use tonic::Status;

use super::ForkdService;
use super::sessions::parse_session_id;
use crate::auth::Tenant;
use crate::status::ApiError;

pub type PromptStream = Pin<Box<dyn Stream<Item = Result<pb::PermissionPrompt, Status>> + Send>>;

impl ForkdService {
    pub(super) async fn subscribe_permissions_rpc(
        &self,
        tenant: Tenant,
        req: pb::SubscribePermissionsRequest,
    ) -> Result<PromptStream, ApiError> {
        let id = parse_session_id(&req.session_id)?;
        let prompts = self.engine.for_tenant(tenant).subscribe_prompts(id).await?;
        Ok(Box::pin(prompts.map(|p| {
            Ok(pb::PermissionPrompt {
                prompt_id: p.id.to_string(),
                session_id: p.session_id.to_string(),
                agent_id: p.agent_id.to_string(),
                tool_name: p.tool,
                input_json: p.input_json,
                question: p.question,
            })
        })))
    }

    pub(super) async fn answer_permission_rpc(
        &self,
        tenant: Tenant,
        req: pb::AnswerPermissionRequest,
    ) -> Result<pb::AnswerPermissionResponse, ApiError> {
        let answer = match pb::PermissionDecision::try_from(req.decision) {
            Ok(pb::PermissionDecision::AllowOnce) => PermissionAnswer::AllowOnce,
            Ok(pb::PermissionDecision::AllowAlways) => PermissionAnswer::AllowAlways,
            Ok(pb::PermissionDecision::Deny) => {
                PermissionAnswer::Deny(Some(req.reason).filter(|r| !r.is_empty()))
            }
            _ => {
                return Err(ApiError::BadRequest(
                    "decision must be ALLOW_ONCE, ALLOW_ALWAYS or DENY".into(),
                ));
            }
        };
        if req.prompt_id.is_empty() {
            return Err(ApiError::BadRequest("prompt_id is required".into()));
        }
        self.engine
            .for_tenant(tenant)
            .answer_prompt(&req.prompt_id, answer)
            .await?;
        Ok(pb::AnswerPermissionResponse {})
    }
}
