//! Fork batch and agent RPCs.

use forkd_core::{AgentId, BatchId, Directive};
use forkd_engine::BatchOptions;
use forkd_proto::v1 as pb;
use forkd_store::{AgentFilter, Budget};
use tonic::Status;

use super::sessions::parse_session_id;
use super::{ForkdService, page_size};
use crate::auth::Tenant;
use crate::convert;
use crate::status::{bad_id, to_status};

pub(crate) fn parse_agent_id(s: &str) -> Result<AgentId, Status> {
    if s.is_empty() {
        return Err(Status::invalid_argument("agent_id is required"));
    }
    s.parse().map_err(|e| bad_id("agent_id", e))
}

pub(crate) fn parse_batch_id(s: &str) -> Result<BatchId, Status> {
    if s.is_empty() {
        return Err(Status::invalid_argument("batch_id is required"));
    }
    s.parse().map_err(|e| bad_id("batch_id", e))
}

impl ForkdService {
    pub(super) async fn fork_batch_rpc(
        &self,
        tenant: &Tenant,
        req: pb::ForkBatchRequest,
    ) -> Result<pb::ForkBatchResponse, Status> {
        let session_id = parse_session_id(&req.session_id)?;
        self.engine
            .check_session(tenant.name(), session_id)
            .await
            .map_err(to_status)?;
        let directives = req
            .directives
            .into_iter()
            .map(|d| Directive {
                description: d.description,
                prompt: d.prompt,
            })
            .collect();
        let batch = self
            .engine
            .fork_batch(
                session_id,
                directives,
                BatchOptions {
                    warmup_gating: req.warmup_gating,
                    idempotency_key: Some(req.idempotency_key).filter(|k| !k.is_empty()),
                    budget: Budget {
                        usd: Some(req.budget_usd).filter(|u| *u != 0.0),
                        tokens: Some(req.budget_tokens).filter(|t| *t != 0),
                    },
                },
            )
            .await
            .map_err(to_status)?;
        Ok(pb::ForkBatchResponse {
            batch_id: batch.batch_id.to_string(),
            agent_ids: batch.agent_ids.iter().map(ToString::to_string).collect(),
        })
    }

    pub(super) async fn spawn_agent_rpc(
        &self,
        tenant: &Tenant,
        req: pb::SpawnAgentRequest,
    ) -> Result<pb::SpawnAgentResponse, Status> {
        let session_id = parse_session_id(&req.session_id)?;
        self.engine
            .check_session(tenant.name(), session_id)
            .await
            .map_err(to_status)?;
        if req.subagent_type.is_empty() {
            return Err(Status::invalid_argument(
                "subagent_type is required (general-purpose, Explore, Plan or a custom type); \
                 to fork, use ForkBatch",
            ));
        }
        let directive = Directive {
            description: req.description,
            prompt: req.prompt,
        };
        let id = self
            .engine
            .spawn_typed(session_id, &req.subagent_type, directive)
            .await
            .map_err(to_status)?;
        Ok(pb::SpawnAgentResponse {
            agent_id: id.to_string(),
        })
    }

    pub(super) async fn list_agents_rpc(
        &self,
        tenant: &Tenant,
        req: pb::ListAgentsRequest,
    ) -> Result<pb::ListAgentsResponse, Status> {
        let limit = page_size(req.page_size);
        let filter = AgentFilter {
            tenant: Some(tenant.name().to_owned()),
            session_id: match req.session_id.as_str() {
                "" => None,
                s => Some(parse_session_id(s)?),
            },
            batch_id: match req.batch_id.as_str() {
                "" => None,
                b => Some(parse_batch_id(b)?),
            },
            include_ended: req.include_ended,
            after: match req.page_token.as_str() {
                "" => None,
                t => Some(t.parse().map_err(|e| bad_id("page_token", e))?),
            },
            limit,
        };
        super::notifications::check_filter(
            &self.engine,
            tenant,
            filter.session_id,
            filter.batch_id,
            None,
        )
        .await?;
        let agents = self.engine.list_agents(&filter).await.map_err(to_status)?;
        let next_page_token = match agents.last() {
            Some(last) if agents.len() as u32 == limit => last.id.to_string(),
            _ => String::new(),
        };
        Ok(pb::ListAgentsResponse {
            agents: agents.iter().map(convert::agent).collect(),
            next_page_token,
        })
    }

    pub(super) async fn get_agent_rpc(
        &self,
        tenant: &Tenant,
        req: pb::GetAgentRequest,
    ) -> Result<pb::GetAgentResponse, Status> {
        let id = parse_agent_id(&req.agent_id)?;
        self.engine
            .check_agent(tenant.name(), id)
            .await
            .map_err(to_status)?;
        let agent = self.engine.get_agent(id).await.map_err(to_status)?;
        Ok(pb::GetAgentResponse {
            agent: Some(convert::agent(&agent)),
        })
    }

    pub(super) async fn attach_rpc(
        &self,
        tenant: &Tenant,
        req: pb::AttachRequest,
    ) -> Result<AgentEventStream, Status> {
        use futures::StreamExt;
        let id = parse_agent_id(&req.agent_id)?;
        self.engine
            .check_agent(tenant.name(), id)
            .await
            .map_err(to_status)?;
        let events = self
            .engine
            .attach(id, req.since_seq)
            .await
            .map_err(to_status)?;
        let agent_id = id.to_string();
        Ok(Box::pin(events.map(move |e| {
            e.map(|e| agent_event(e, &agent_id)).map_err(to_status)
        })))
    }

    pub(super) async fn background_rpc(
        &self,
        tenant: &Tenant,
        req: pb::BackgroundRequest,
    ) -> Result<pb::BackgroundResponse, Status> {
        let id = parse_agent_id(&req.agent_id)?;
        self.engine
            .check_agent(tenant.name(), id)
            .await
            .map_err(to_status)?;
        self.engine.background(id).await.map_err(to_status)?;
        Ok(pb::BackgroundResponse {
            agent_id: id.to_string(),
            status: "async_launched".into(),
        })
    }

    pub(super) async fn kill_rpc(
        &self,
        tenant: &Tenant,
        req: pb::KillRequest,
    ) -> Result<pb::KillResponse, Status> {
        let id = parse_agent_id(&req.agent_id)?;
        self.engine
            .check_agent(tenant.name(), id)
            .await
            .map_err(to_status)?;
        self.engine.kill(id).await.map_err(to_status)?;
        Ok(pb::KillResponse {
            agent_id: id.to_string(),
        })
    }

    pub(super) async fn get_transcript_rpc(
        &self,
        tenant: &Tenant,
        req: pb::GetTranscriptRequest,
    ) -> Result<pb::GetTranscriptResponse, Status> {
        let id = parse_agent_id(&req.agent_id)?;
        self.engine
            .check_agent(tenant.name(), id)
            .await
            .map_err(to_status)?;
        let entries = self
            .engine
            .transcript(id, req.include_shared_prefix)
            .await
            .map_err(to_status)?;
        Ok(pb::GetTranscriptResponse {
            agent_id: id.to_string(),
            messages: entries
                .into_iter()
                .map(|e| pb::TranscriptMessage {
                    role: e.message.role.as_str().to_owned(),
                    content_json: e.message.content_json(),
                    shared: e.shared,
                })
                .collect(),
        })
    }
}

pub type AgentEventStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::AgentEvent, Status>> + Send>>;

fn agent_event(event: forkd_engine::AgentEvent, agent_id: &str) -> pb::AgentEvent {
    use forkd_engine::AgentEvent as E;
    use pb::agent_event::Event;
    let event = match event {
        E::Message { seq, message } => Event::Message(pb::TranscriptEvent {
            seq,
            role: message.role.as_str().to_owned(),
            content_json: message.content_json(),
        }),
        E::Ended(n) => Event::Ended(convert::notification(&n)),
        E::AsyncLaunched => Event::AsyncLaunched(pb::AsyncLaunched {
            agent_id: agent_id.to_owned(),
        }),
    };
    pb::AgentEvent { event: Some(event) }
}
