//! Permission prompt RPCs: interactive clients watch a session's prompts and answer them.

use std::pin::Pin;

use forkd_engine::PermissionAnswer;
use forkd_proto::v1 as pb;
use futures::{Stream, StreamExt};
use tonic::Status;

use super::ForkdService;
use super::sessions::parse_session_id;
use crate::auth::Tenant;
use crate::status::to_status;

pub type PromptStream = Pin<Box<dyn Stream<Item = Result<pb::PermissionPrompt, Status>> + Send>>;

impl ForkdService {
    pub(super) async fn subscribe_permissions_rpc(
        &self,
        tenant: &Tenant,
        req: pb::SubscribePermissionsRequest,
    ) -> Result<PromptStream, Status> {
        let id = parse_session_id(&req.session_id)?;
        self.engine
            .check_session(tenant.name(), id)
            .await
            .map_err(to_status)?;
        let prompts = self.engine.subscribe_prompts(id).await.map_err(to_status)?;
        Ok(Box::pin(prompts.map(|p| {
            Ok(pb::PermissionPrompt {
                prompt_id: p.id,
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
        tenant: &Tenant,
        req: pb::AnswerPermissionRequest,
    ) -> Result<pb::AnswerPermissionResponse, Status> {
        let answer = match pb::PermissionDecision::try_from(req.decision) {
            Ok(pb::PermissionDecision::AllowOnce) => PermissionAnswer::AllowOnce,
            Ok(pb::PermissionDecision::AllowAlways) => PermissionAnswer::AllowAlways,
            Ok(pb::PermissionDecision::Deny) => {
                PermissionAnswer::Deny(Some(req.reason).filter(|r| !r.is_empty()))
            }
            _ => {
                return Err(Status::invalid_argument(
                    "decision must be ALLOW_ONCE, ALLOW_ALWAYS or DENY",
                ));
            }
        };
        if req.prompt_id.is_empty() {
            return Err(Status::invalid_argument("prompt_id is required"));
        }
        let unknown = || {
            Status::not_found(format!(
                "permission prompt {} not found",
                req.prompt_id.chars().take(64).collect::<String>()
            ))
        };
        let session = self
            .engine
            .prompt_session(&req.prompt_id)
            .ok_or_else(unknown)?;
        self.engine
            .check_session(tenant.name(), session)
            .await
            .map_err(|_| unknown())?;
        self.engine
            .answer_prompt(&req.prompt_id, answer)
            .map_err(to_status)?;
        Ok(pb::AnswerPermissionResponse {})
    }
}
