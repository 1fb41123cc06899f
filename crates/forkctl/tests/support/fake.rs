//! The fake daemon's `Forkd` service: canned answers, a token check, and a record of requests.

use std::pin::Pin;
use std::sync::{Arc, Mutex};

use forkd_proto::v1::forkd_server::Forkd;
use forkd_proto::v1::*;
use tokio_stream::{Stream, StreamExt as _};
use tonic::{Request, Response, Status};

/// The token the fake demands when one is configured.
pub const TOKEN: &str = "t0k3n";

/// A notification of batch `B1` of session `S1`: 1,000 tokens read from the cache, $0.01.
pub fn notification(seq: u64, agent: &str, status: NotificationStatus) -> Notification {
    Notification {
        seq,
        session_id: "S1".into(),
        batch_id: "B1".into(),
        agent_id: agent.into(),
        status: status as i32,
        summary: format!("{agent} done"),
        usage: Some(Usage {
            cache_read_input_tokens: 1000,
            ..Default::default()
        }),
        cost_usd: 0.01,
        ..Default::default()
    }
}

/// What the fake received, for the tests to inspect.
#[derive(Debug, Default)]
pub struct Recorded {
    pub create: Vec<CreateSessionRequest>,
    pub branch: Vec<forkd_proto::v1::BranchSessionRequest>,
    pub fork: Vec<ForkBatchRequest>,
    pub subscribe: Vec<SubscribeNotificationsRequest>,
    pub list_agents: Vec<ListAgentsRequest>,
}

/// How the fake answers.
#[derive(Debug, Default, Clone)]
pub struct Script {
    /// Notifications the subscription replays (the fake does not filter them).
    pub notifications: Vec<Notification>,
    /// End the notification stream after the replay even when the client asked to follow.
    pub close_stream: bool,
    /// Agents of `ListAgents`, served one per page to exercise paging.
    pub agents: Vec<Agent>,
}

pub struct Fake {
    pub script: Script,
    pub recorded: Arc<Mutex<Recorded>>,
}

type NotificationStream = Pin<Box<dyn Stream<Item = Result<Notification, Status>> + Send>>;

impl Fake {
    fn record(&self, f: impl FnOnce(&mut Recorded)) -> Result<(), Status> {
        let mut recorded = self
            .recorded
            .lock()
            .map_err(|_| Status::internal("poisoned"))?;
        f(&mut recorded);
        Ok(())
    }
}

fn check_token<T>(request: &Request<T>) -> Result<(), Status> {
    let header = request
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    if header == Some(&format!("Bearer {TOKEN}")) {
        Ok(())
    } else {
        Err(Status::unauthenticated("a bearer token is required"))
    }
}

fn not_found<T>(what: &str) -> Result<Response<T>, Status> {
    Err(Status::not_found(format!("{what} not found")))
}

#[tonic::async_trait]
impl Forkd for Fake {
    async fn create_session(
        &self,
        request: Request<CreateSessionRequest>,
    ) -> Result<Response<CreateSessionResponse>, Status> {
        check_token(&request)?;
        self.record(|r| r.create.push(request.into_inner()))?;
        let session = Session {
            session_id: "S1".into(),
            ..Default::default()
        };
        Ok(Response::new(CreateSessionResponse {
            session: Some(session),
        }))
    }

    async fn get_session(
        &self,
        request: Request<GetSessionRequest>,
    ) -> Result<Response<GetSessionResponse>, Status> {
        check_token(&request)?;
        not_found(&format!("session {}", request.get_ref().session_id))
    }

    async fn list_sessions(
        &self,
        request: Request<ListSessionsRequest>,
    ) -> Result<Response<ListSessionsResponse>, Status> {
        check_token(&request)?;
        Ok(Response::new(ListSessionsResponse::default()))
    }

    type SendMessageStream = Pin<Box<dyn Stream<Item = Result<SessionEvent, Status>> + Send>>;

    async fn send_message(
        &self,
        request: Request<SendMessageRequest>,
    ) -> Result<Response<Self::SendMessageStream>, Status> {
        check_token(&request)?;
        Err(Status::unimplemented(
            "the fake daemon runs no parent turns",
        ))
    }

    async fn branch_session(
        &self,
        request: Request<forkd_proto::v1::BranchSessionRequest>,
    ) -> Result<Response<forkd_proto::v1::BranchSessionResponse>, Status> {
        check_token(&request)?;
        let request = request.into_inner();
        let session = Session {
            session_id: "B1".into(),
            branch_of: request.session_id.clone(),
            branch_point: 5,
            branch_turn: 2,
            turn_seqs: vec![1, 3],
            finished_turns: 2,
            ..Default::default()
        };
        self.record(|r| r.branch.push(request))?;
        Ok(Response::new(forkd_proto::v1::BranchSessionResponse {
            session: Some(session),
        }))
    }

    async fn merge_branch(
        &self,
        request: Request<forkd_proto::v1::MergeBranchRequest>,
    ) -> Result<Response<forkd_proto::v1::MergeBranchResponse>, Status> {
        check_token(&request)?;
        Err(Status::unimplemented("the fake daemon merges nothing"))
    }

    async fn compact_session(
        &self,
        request: Request<forkd_proto::v1::CompactSessionRequest>,
    ) -> Result<Response<forkd_proto::v1::CompactSessionResponse>, Status> {
        check_token(&request)?;
        Err(Status::unimplemented("the fake daemon compacts nothing"))
    }

    async fn get_changes(
        &self,
        request: Request<GetChangesRequest>,
    ) -> Result<Response<GetChangesResponse>, Status> {
        check_token(&request)?;
        Err(Status::unimplemented("the fake daemon isolates nothing"))
    }

    async fn apply_changes(
        &self,
        request: Request<ApplyChangesRequest>,
    ) -> Result<Response<ApplyChangesResponse>, Status> {
        check_token(&request)?;
        Err(Status::unimplemented("the fake daemon isolates nothing"))
    }

    async fn discard_changes(
        &self,
        request: Request<DiscardChangesRequest>,
    ) -> Result<Response<DiscardChangesResponse>, Status> {
        check_token(&request)?;
        Err(Status::unimplemented("the fake daemon isolates nothing"))
    }

    async fn find_missing_blobs(
        &self,
        request: Request<forkd_proto::v1::FindMissingBlobsRequest>,
    ) -> Result<Response<forkd_proto::v1::FindMissingBlobsResponse>, Status> {
        check_token(&request)?;
        Err(Status::unimplemented("the fake daemon takes no uploads"))
    }

    async fn upload_workspace(
        &self,
        request: Request<tonic::Streaming<forkd_proto::v1::UploadWorkspaceRequest>>,
    ) -> Result<Response<forkd_proto::v1::UploadWorkspaceResponse>, Status> {
        check_token(&request)?;
        Err(Status::unimplemented("the fake daemon takes no uploads"))
    }

    async fn get_session_changes(
        &self,
        request: Request<forkd_proto::v1::GetSessionChangesRequest>,
    ) -> Result<Response<forkd_proto::v1::GetSessionChangesResponse>, Status> {
        check_token(&request)?;
        Err(Status::unimplemented("the fake daemon takes no uploads"))
    }

    async fn spawn_agent(
        &self,
        request: Request<SpawnAgentRequest>,
    ) -> Result<Response<SpawnAgentResponse>, Status> {
        check_token(&request)?;
        Err(Status::unimplemented(
            "the fake daemon runs no typed agents",
        ))
    }

    type SubscribePermissionsStream =
        Pin<Box<dyn Stream<Item = Result<PermissionPrompt, Status>> + Send>>;

    async fn subscribe_permissions(
        &self,
        request: Request<SubscribePermissionsRequest>,
    ) -> Result<Response<Self::SubscribePermissionsStream>, Status> {
        check_token(&request)?;
        Err(Status::unimplemented("the fake daemon asks nothing"))
    }

    async fn answer_permission(
        &self,
        request: Request<AnswerPermissionRequest>,
    ) -> Result<Response<AnswerPermissionResponse>, Status> {
        check_token(&request)?;
        Err(Status::unimplemented("the fake daemon asks nothing"))
    }

    type AttachStream = Pin<Box<dyn Stream<Item = Result<AgentEvent, Status>> + Send>>;

    async fn attach(
        &self,
        request: Request<AttachRequest>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        check_token(&request)?;
        not_found(&format!("agent {}", request.get_ref().agent_id))
    }

    async fn background(
        &self,
        request: Request<BackgroundRequest>,
    ) -> Result<Response<BackgroundResponse>, Status> {
        check_token(&request)?;
        not_found(&format!("agent {}", request.get_ref().agent_id))
    }

    async fn kill(&self, request: Request<KillRequest>) -> Result<Response<KillResponse>, Status> {
        check_token(&request)?;
        not_found(&format!("agent {}", request.get_ref().agent_id))
    }

    async fn fork_batch(
        &self,
        request: Request<ForkBatchRequest>,
    ) -> Result<Response<ForkBatchResponse>, Status> {
        check_token(&request)?;
        let request = request.into_inner();
        let agent_ids = (1..=request.directives.len())
            .map(|i| format!("A{i}"))
            .collect();
        self.record(|r| r.fork.push(request))?;
        Ok(Response::new(ForkBatchResponse {
            batch_id: "B1".into(),
            agent_ids,
            ..Default::default()
        }))
    }

    async fn list_agents(
        &self,
        request: Request<ListAgentsRequest>,
    ) -> Result<Response<ListAgentsResponse>, Status> {
        check_token(&request)?;
        let request = request.into_inner();
        // Page tokens are indexes into the list: one agent per page.
        let index: usize = if request.page_token.is_empty() {
            0
        } else {
            request
                .page_token
                .parse()
                .map_err(|_| Status::invalid_argument("bad page token"))?
        };
        self.record(|r| r.list_agents.push(request))?;
        let agents = self.script.agents.get(index).cloned().into_iter().collect();
        let next = index + 1;
        let next_page_token = if next < self.script.agents.len() {
            next.to_string()
        } else {
            String::new()
        };
        Ok(Response::new(ListAgentsResponse {
            agents,
            next_page_token,
        }))
    }

    async fn get_agent(
        &self,
        request: Request<GetAgentRequest>,
    ) -> Result<Response<GetAgentResponse>, Status> {
        check_token(&request)?;
        not_found("agent")
    }

    async fn get_transcript(
        &self,
        request: Request<GetTranscriptRequest>,
    ) -> Result<Response<GetTranscriptResponse>, Status> {
        check_token(&request)?;
        not_found("agent")
    }

    type SubscribeNotificationsStream = NotificationStream;

    async fn subscribe_notifications(
        &self,
        request: Request<SubscribeNotificationsRequest>,
    ) -> Result<Response<NotificationStream>, Status> {
        check_token(&request)?;
        let request = request.into_inner();
        let follow = request.follow && !self.script.close_stream;
        self.record(|r| r.subscribe.push(request))?;
        let replay = tokio_stream::iter(self.script.notifications.clone().into_iter().map(Ok));
        let stream: NotificationStream = if follow {
            // Following: the stream stays open, as the real daemon's would with no news.
            Box::pin(replay.chain(tokio_stream::pending()))
        } else {
            Box::pin(replay)
        };
        Ok(Response::new(stream))
    }

    async fn get_cache_stats(
        &self,
        request: Request<GetCacheStatsRequest>,
    ) -> Result<Response<GetCacheStatsResponse>, Status> {
        check_token(&request)?;
        Ok(Response::new(GetCacheStatsResponse::default()))
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        check_token(&request)?;
        Ok(Response::new(GetCapacityResponse::default()))
    }

    async fn estimate_fork_cost(
        &self,
        request: Request<EstimateForkCostRequest>,
    ) -> Result<Response<EstimateForkCostResponse>, Status> {
        check_token(&request)?;
        if request.get_ref().children == 0 {
            return Err(Status::invalid_argument("children must be at least 1"));
        }
        Ok(Response::new(EstimateForkCostResponse {
            independent_cost_usd: 0.75,
            fork_cost_usd: 0.25,
            saving: 0.5,
            break_even_children: 0,
            seed_simplified_saving: 0.625,
            model: "sim".into(),
        }))
    }

    async fn list_requests(
        &self,
        request: Request<ListRequestsRequest>,
    ) -> Result<Response<ListRequestsResponse>, Status> {
        check_token(&request)?;
        Err(Status::unimplemented("the fake daemon records no requests"))
    }

    async fn explain_cache(
        &self,
        request: Request<ExplainCacheRequest>,
    ) -> Result<Response<ExplainCacheResponse>, Status> {
        check_token(&request)?;
        let req = request.into_inner();
        if req.request_id != "r-2" {
            return Err(Status::not_found(format!(
                "request {} not found",
                req.request_id
            )));
        }
        Ok(Response::new(ExplainCacheResponse {
            request_id: req.request_id,
            other_request_id: match req.other_request_id.as_str() {
                "" => "r-1".into(),
                other => other.into(),
            },
            same_prefix: false,
            part: "system".into(),
            kind: "system".into(),
            byte: 1234,
            exact: true,
            excerpt: "You review code. Be brief!".into(),
            other_excerpt: "You review code. Be brief.".into(),
            note: String::new(),
        }))
    }

    /// As the daemon: for the socket's owner only, who sends no token.
    async fn create_sign_in_link(
        &self,
        request: Request<CreateSignInLinkRequest>,
    ) -> Result<Response<CreateSignInLinkResponse>, Status> {
        if request.metadata().get("authorization").is_some() {
            return Err(Status::permission_denied(
                "sign-in links are for the daemon's own user",
            ));
        }
        let expires = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
        Ok(Response::new(CreateSignInLinkResponse {
            url: "http://127.0.0.1:8080/signin?code=c0de".into(),
            expires_at: Some(expires.into()),
        }))
    }

    async fn create_webhook(
        &self,
        request: Request<CreateWebhookRequest>,
    ) -> Result<Response<CreateWebhookResponse>, Status> {
        let request = request.into_inner();
        Ok(Response::new(CreateWebhookResponse {
            webhook: Some(Webhook {
                webhook_id: "W1".into(),
                url: request.url,
                kinds: request.kinds,
                named_only: request.named_only,
                ..Default::default()
            }),
            secret: "whsec_c2VjcmV0".into(),
        }))
    }

    async fn list_webhooks(
        &self,
        _: Request<ListWebhooksRequest>,
    ) -> Result<Response<ListWebhooksResponse>, Status> {
        Err(Status::unimplemented("the fake daemon lists no webhooks"))
    }

    async fn get_webhook(
        &self,
        _: Request<GetWebhookRequest>,
    ) -> Result<Response<GetWebhookResponse>, Status> {
        Err(Status::not_found("webhook W9 not found"))
    }

    async fn delete_webhook(
        &self,
        _: Request<DeleteWebhookRequest>,
    ) -> Result<Response<DeleteWebhookResponse>, Status> {
        Err(Status::not_found("webhook W9 not found"))
    }

    async fn rotate_webhook_secret(
        &self,
        _: Request<RotateWebhookSecretRequest>,
    ) -> Result<Response<CreateWebhookResponse>, Status> {
        Err(Status::not_found("webhook W9 not found"))
    }

    /// A receiver that answers 503.
    async fn test_webhook(
        &self,
        _: Request<TestWebhookRequest>,
    ) -> Result<Response<TestWebhookResponse>, Status> {
        Ok(Response::new(TestWebhookResponse {
            attempt: Some(WebhookAttempt {
                delivery_id: "D1".into(),
                number: 1,
                status: 503,
                error: "HTTP 503 Service Unavailable: later".into(),
                latency_ms: 12,
                event: "ping".into(),
                state: "failed".into(),
                ..Default::default()
            }),
        }))
    }

    async fn list_webhook_attempts(
        &self,
        _: Request<ListWebhookAttemptsRequest>,
    ) -> Result<Response<ListWebhookAttemptsResponse>, Status> {
        Err(Status::unimplemented("the fake daemon lists no attempts"))
    }

    async fn create_schedule(
        &self,
        _: Request<CreateScheduleRequest>,
    ) -> Result<Response<ScheduleResponse>, Status> {
        Err(Status::unimplemented("the fake daemon keeps no schedules"))
    }

    async fn list_schedules(
        &self,
        _: Request<ListSchedulesRequest>,
    ) -> Result<Response<ListSchedulesResponse>, Status> {
        Err(Status::unimplemented("the fake daemon keeps no schedules"))
    }

    async fn get_schedule(
        &self,
        _: Request<ScheduleNameRequest>,
    ) -> Result<Response<ScheduleResponse>, Status> {
        Err(Status::not_found("schedule nightly not found"))
    }

    async fn pause_schedule(
        &self,
        _: Request<ScheduleNameRequest>,
    ) -> Result<Response<ScheduleResponse>, Status> {
        Err(Status::not_found("schedule nightly not found"))
    }

    async fn resume_schedule(
        &self,
        _: Request<ScheduleNameRequest>,
    ) -> Result<Response<ScheduleResponse>, Status> {
        Err(Status::not_found("schedule nightly not found"))
    }

    async fn delete_schedule(
        &self,
        _: Request<ScheduleNameRequest>,
    ) -> Result<Response<DeleteScheduleResponse>, Status> {
        Err(Status::not_found("schedule nightly not found"))
    }

    async fn trigger_schedule(
        &self,
        _: Request<ScheduleNameRequest>,
    ) -> Result<Response<TriggerScheduleResponse>, Status> {
        Err(Status::not_found("schedule nightly not found"))
    }
}
