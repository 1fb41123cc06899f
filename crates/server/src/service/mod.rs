//! The `forkd.v1.Forkd` service. Each RPC parses its request, calls the engine and converts the
//! answer; the handlers live in one file per resource.

mod agents;
mod cache;
mod notifications;
mod permissions;
mod schedules;
mod sessions;
mod sign_in;
mod uploads;
mod webhooks;

pub(crate) use sign_in::SignInLinkError;

use forkd_engine::Engine;
use forkd_proto::v1 as pb;
use forkd_proto::v1::forkd_server::Forkd;
use tonic::{Request, Response, Status};

use crate::auth::{WebView, tenant};
use crate::status::ApiError;

/// The service: a handle on the engine, and the web view it links to.
#[derive(Clone)]
pub struct ForkdService {
    engine: Engine,
    web_view: Option<WebView>,
}

impl ForkdService {
    pub fn new(engine: Engine) -> Self {
        Self {
            engine,
            web_view: None,
        }
    }

    /// The daemon's web view, whose sign-in links `CreateSignInLink` makes (none: that call is
    /// `FAILED_PRECONDITION`).
    pub fn with_web_view(mut self, web_view: Option<WebView>) -> Self {
        self.web_view = web_view;
        self
    }
}

type Reply<T> = Result<Response<T>, Status>;

/// A handler's outcome as the wire's: the one place a handler's error becomes a status.
fn reply<T>(outcome: Result<T, ApiError>) -> Reply<T> {
    outcome.map(Response::new).map_err(Status::from)
}

/// Page sizes: the default when a client asks for none, and the most one page holds.
pub(crate) const DEFAULT_PAGE: u32 = 100;
pub(crate) const MAX_PAGE: u32 = 1000;

pub(crate) fn page_size(asked: u32) -> u32 {
    match asked {
        0 => DEFAULT_PAGE,
        n => n.min(MAX_PAGE),
    }
}

#[tonic::async_trait]
impl Forkd for ForkdService {
    async fn create_session(
        &self,
        req: Request<pb::CreateSessionRequest>,
    ) -> Reply<pb::CreateSessionResponse> {
        reply(
            self.create_session_rpc(tenant(&req)?, req.into_inner())
                .await,
        )
    }

    async fn get_session(
        &self,
        req: Request<pb::GetSessionRequest>,
    ) -> Reply<pb::GetSessionResponse> {
        reply(self.get_session_rpc(tenant(&req)?, req.into_inner()).await)
    }

    async fn list_sessions(
        &self,
        req: Request<pb::ListSessionsRequest>,
    ) -> Reply<pb::ListSessionsResponse> {
        reply(
            self.list_sessions_rpc(tenant(&req)?, req.into_inner())
                .await,
        )
    }

    type SendMessageStream = sessions::SessionEventStream;

    async fn send_message(
        &self,
        req: Request<pb::SendMessageRequest>,
    ) -> Reply<Self::SendMessageStream> {
        reply(self.send_message_rpc(tenant(&req)?, req.into_inner()).await)
    }

    async fn compact_session(
        &self,
        req: Request<pb::CompactSessionRequest>,
    ) -> Reply<pb::CompactSessionResponse> {
        reply(
            self.compact_session_rpc(tenant(&req)?, req.into_inner())
                .await,
        )
    }

    async fn branch_session(
        &self,
        req: Request<pb::BranchSessionRequest>,
    ) -> Reply<pb::BranchSessionResponse> {
        reply(
            self.branch_session_rpc(tenant(&req)?, req.into_inner())
                .await,
        )
    }

    async fn merge_branch(
        &self,
        req: Request<pb::MergeBranchRequest>,
    ) -> Reply<pb::MergeBranchResponse> {
        reply(self.merge_branch_rpc(tenant(&req)?, req.into_inner()).await)
    }

    async fn fork_batch(&self, req: Request<pb::ForkBatchRequest>) -> Reply<pb::ForkBatchResponse> {
        reply(self.fork_batch_rpc(tenant(&req)?, req.into_inner()).await)
    }

    async fn spawn_agent(
        &self,
        req: Request<pb::SpawnAgentRequest>,
    ) -> Reply<pb::SpawnAgentResponse> {
        reply(self.spawn_agent_rpc(tenant(&req)?, req.into_inner()).await)
    }

    async fn list_agents(
        &self,
        req: Request<pb::ListAgentsRequest>,
    ) -> Reply<pb::ListAgentsResponse> {
        reply(self.list_agents_rpc(tenant(&req)?, req.into_inner()).await)
    }

    async fn get_agent(&self, req: Request<pb::GetAgentRequest>) -> Reply<pb::GetAgentResponse> {
        reply(self.get_agent_rpc(tenant(&req)?, req.into_inner()).await)
    }

    async fn get_transcript(
        &self,
        req: Request<pb::GetTranscriptRequest>,
    ) -> Reply<pb::GetTranscriptResponse> {
        reply(
            self.get_transcript_rpc(tenant(&req)?, req.into_inner())
                .await,
        )
    }

    type AttachStream = agents::AgentEventStream;

    async fn attach(&self, req: Request<pb::AttachRequest>) -> Reply<Self::AttachStream> {
        reply(self.attach_rpc(tenant(&req)?, req.into_inner()).await)
    }

    async fn background(
        &self,
        req: Request<pb::BackgroundRequest>,
    ) -> Reply<pb::BackgroundResponse> {
        reply(self.background_rpc(tenant(&req)?, req.into_inner()).await)
    }

    async fn kill(&self, req: Request<pb::KillRequest>) -> Reply<pb::KillResponse> {
        reply(self.kill_rpc(tenant(&req)?, req.into_inner()).await)
    }

    async fn find_missing_blobs(
        &self,
        req: Request<pb::FindMissingBlobsRequest>,
    ) -> Reply<pb::FindMissingBlobsResponse> {
        reply(uploads::find_missing_blobs(&self.engine, tenant(&req)?, req.into_inner()).await)
    }

    async fn upload_workspace(
        &self,
        req: Request<tonic::Streaming<pb::UploadWorkspaceRequest>>,
    ) -> Reply<pb::UploadWorkspaceResponse> {
        let tenant = tenant(&req)?;
        reply(uploads::upload_workspace(&self.engine, tenant, req.into_inner()).await)
    }

    async fn get_session_changes(
        &self,
        req: Request<pb::GetSessionChangesRequest>,
    ) -> Reply<pb::GetSessionChangesResponse> {
        reply(uploads::session_changes(&self.engine, tenant(&req)?, req.into_inner()).await)
    }

    async fn get_changes(
        &self,
        req: Request<pb::GetChangesRequest>,
    ) -> Reply<pb::GetChangesResponse> {
        reply(self.get_changes_rpc(tenant(&req)?, req.into_inner()).await)
    }

    async fn apply_changes(
        &self,
        req: Request<pb::ApplyChangesRequest>,
    ) -> Reply<pb::ApplyChangesResponse> {
        reply(
            self.apply_changes_rpc(tenant(&req)?, req.into_inner())
                .await,
        )
    }

    async fn discard_changes(
        &self,
        req: Request<pb::DiscardChangesRequest>,
    ) -> Reply<pb::DiscardChangesResponse> {
        reply(
            self.discard_changes_rpc(tenant(&req)?, req.into_inner())
                .await,
        )
    }

    type SubscribeNotificationsStream = notifications::NotificationStream;

    async fn subscribe_notifications(
        &self,
        req: Request<pb::SubscribeNotificationsRequest>,
    ) -> Reply<Self::SubscribeNotificationsStream> {
        reply(self.subscribe_rpc(tenant(&req)?, req.into_inner()).await)
    }

    type SubscribePermissionsStream = permissions::PromptStream;

    async fn subscribe_permissions(
        &self,
        req: Request<pb::SubscribePermissionsRequest>,
    ) -> Reply<Self::SubscribePermissionsStream> {
        reply(
            self.subscribe_permissions_rpc(tenant(&req)?, req.into_inner())
                .await,
        )
    }

    async fn answer_permission(
        &self,
        req: Request<pb::AnswerPermissionRequest>,
    ) -> Reply<pb::AnswerPermissionResponse> {
        reply(
            self.answer_permission_rpc(tenant(&req)?, req.into_inner())
                .await,
        )
    }

    async fn get_cache_stats(
        &self,
        req: Request<pb::GetCacheStatsRequest>,
    ) -> Reply<pb::GetCacheStatsResponse> {
        reply(self.cache_stats_rpc(tenant(&req)?, req.into_inner()).await)
    }

    async fn get_capacity(
        &self,
        req: Request<pb::GetCapacityRequest>,
    ) -> Reply<pb::GetCapacityResponse> {
        reply(self.capacity_rpc(tenant(&req)?).await)
    }

    async fn estimate_fork_cost(
        &self,
        req: Request<pb::EstimateForkCostRequest>,
    ) -> Reply<pb::EstimateForkCostResponse> {
        reply(self.estimate_rpc(req.into_inner()))
    }

    async fn list_requests(
        &self,
        req: Request<pb::ListRequestsRequest>,
    ) -> Reply<pb::ListRequestsResponse> {
        reply(
            self.list_requests_rpc(tenant(&req)?, req.into_inner())
                .await,
        )
    }

    async fn explain_cache(
        &self,
        req: Request<pb::ExplainCacheRequest>,
    ) -> Reply<pb::ExplainCacheResponse> {
        reply(
            self.explain_cache_rpc(tenant(&req)?, req.into_inner())
                .await,
        )
    }

    async fn create_sign_in_link(
        &self,
        req: Request<pb::CreateSignInLinkRequest>,
    ) -> Reply<pb::CreateSignInLinkResponse> {
        reply(self.create_sign_in_link_rpc(tenant(&req)?, &req))
    }

    async fn create_webhook(
        &self,
        req: Request<pb::CreateWebhookRequest>,
    ) -> Reply<pb::CreateWebhookResponse> {
        reply(webhooks::create(&self.engine, tenant(&req)?, req.into_inner()).await)
    }

    async fn list_webhooks(
        &self,
        req: Request<pb::ListWebhooksRequest>,
    ) -> Reply<pb::ListWebhooksResponse> {
        reply(webhooks::list(&self.engine, tenant(&req)?).await)
    }

    async fn get_webhook(
        &self,
        req: Request<pb::GetWebhookRequest>,
    ) -> Reply<pb::GetWebhookResponse> {
        reply(webhooks::get(&self.engine, tenant(&req)?, req.into_inner()).await)
    }

    async fn delete_webhook(
        &self,
        req: Request<pb::DeleteWebhookRequest>,
    ) -> Reply<pb::DeleteWebhookResponse> {
        reply(webhooks::delete(&self.engine, tenant(&req)?, req.into_inner()).await)
    }

    async fn rotate_webhook_secret(
        &self,
        req: Request<pb::RotateWebhookSecretRequest>,
    ) -> Reply<pb::CreateWebhookResponse> {
        reply(webhooks::rotate(&self.engine, tenant(&req)?, req.into_inner()).await)
    }

    async fn test_webhook(
        &self,
        req: Request<pb::TestWebhookRequest>,
    ) -> Reply<pb::TestWebhookResponse> {
        reply(webhooks::test(&self.engine, tenant(&req)?, req.into_inner()).await)
    }

    async fn list_webhook_attempts(
        &self,
        req: Request<pb::ListWebhookAttemptsRequest>,
    ) -> Reply<pb::ListWebhookAttemptsResponse> {
        reply(webhooks::attempts(&self.engine, tenant(&req)?, req.into_inner()).await)
    }

    async fn create_schedule(
        &self,
        req: Request<pb::CreateScheduleRequest>,
    ) -> Reply<pb::ScheduleResponse> {
        reply(schedules::create(&self.engine, tenant(&req)?, req.into_inner()).await)
    }

    async fn list_schedules(
        &self,
        req: Request<pb::ListSchedulesRequest>,
    ) -> Reply<pb::ListSchedulesResponse> {
        reply(schedules::list(&self.engine, tenant(&req)?).await)
    }

    async fn get_schedule(
        &self,
        req: Request<pb::ScheduleNameRequest>,
    ) -> Reply<pb::ScheduleResponse> {
        reply(schedules::get(&self.engine, tenant(&req)?, req.into_inner()).await)
    }

    async fn pause_schedule(
        &self,
        req: Request<pb::ScheduleNameRequest>,
    ) -> Reply<pb::ScheduleResponse> {
        reply(schedules::set_paused(&self.engine, tenant(&req)?, req.into_inner(), true).await)
    }

    async fn resume_schedule(
        &self,
        req: Request<pb::ScheduleNameRequest>,
    ) -> Reply<pb::ScheduleResponse> {
        reply(schedules::set_paused(&self.engine, tenant(&req)?, req.into_inner(), false).await)
    }

    async fn delete_schedule(
        &self,
        req: Request<pb::ScheduleNameRequest>,
    ) -> Reply<pb::DeleteScheduleResponse> {
        reply(schedules::delete(&self.engine, tenant(&req)?, req.into_inner()).await)
    }

    async fn trigger_schedule(
        &self,
        req: Request<pb::ScheduleNameRequest>,
    ) -> Reply<pb::TriggerScheduleResponse> {
        reply(schedules::trigger(&self.engine, tenant(&req)?, req.into_inner()).await)
    }
}
