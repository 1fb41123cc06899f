//! Fork batch and agent RPCs.

use forkd_core::query::AgentFilter;
use forkd_core::{AgentId, BatchId, Directive};
use forkd_proto::v1 as pb;
use tonic::Status;

use super::sessions::parse_session_id;
use super::{ForkdService, page_size};
use crate::auth::Tenant;
use crate::convert;
use crate::status::{ApiError, bad_id, status};

pub(crate) fn parse_agent_id(s: &str) -> Result<AgentId, ApiError> {
    if s.is_empty() {
        return Err(ApiError::BadRequest("agent_id is required".into()));
    }
    s.parse().map_err(|e| bad_id("agent_id", e))
}

pub(crate) fn parse_batch_id(s: &str) -> Result<BatchId, ApiError> {
    if s.is_empty() {
        return Err(ApiError::BadRequest("batch_id is required".into()));
    }
    s.parse().map_err(|e| bad_id("batch_id", e))
}

/// An optional id: empty on the wire is none.
pub(crate) fn optional<T>(
    s: &str,
    parse: impl FnOnce(&str) -> Result<T, ApiError>,
) -> Result<Option<T>, ApiError> {
    match s {
        "" => Ok(None),
        s => parse(s).map(Some),
    }
}

/// The children an apply or a discard names: agents, or a batch, never both.
fn copy_targets(agents: &[String], batch: &str) -> Result<forkd_engine::CopyTargets, ApiError> {
    match (agents.is_empty(), batch.is_empty()) {
        (false, true) => Ok(forkd_engine::CopyTargets::Agents(
            agents
                .iter()
                .map(|a| parse_agent_id(a))
                .collect::<Result<_, _>>()?,
        )),
        (true, false) => Ok(forkd_engine::CopyTargets::Batch(parse_batch_id(batch)?)),
        _ => Err(ApiError::BadRequest(
            "name the children: agent_ids or batch_id, not both".into(),
        )),
    }
}

impl ForkdService {
    pub(super) async fn fork_batch_rpc(
        &self,
        tenant: Tenant,
        req: pb::ForkBatchRequest,
    ) -> Result<pb::ForkBatchResponse, ApiError> {
        let session_id = parse_session_id(&req.session_id)?;
        let options = convert::batch_options(&req).map_err(ApiError::BadRequest)?;
        let dry_run = req.dry_run;
        let directives = req.directives.into_iter().map(convert::directive).collect();
        let engine = self.engine.for_tenant(tenant);
        if dry_run {
            let run = engine.dry_run(session_id, directives, options).await?;
            return Ok(pb::ForkBatchResponse {
                dry_run: Some(convert::dry_run(&run)),
                ..Default::default()
            });
        }
        let batch = engine.fork_batch(session_id, directives, options).await?;
        Ok(pb::ForkBatchResponse {
            batch_id: batch.batch_id.to_string(),
            agent_ids: batch.agent_ids.iter().map(ToString::to_string).collect(),
            fork_point: batch.fork_point,
            existing: batch.existing,
            dry_run: None,
        })
    }

    pub(super) async fn spawn_agent_rpc(
        &self,
        tenant: Tenant,
        req: pb::SpawnAgentRequest,
    ) -> Result<pb::SpawnAgentResponse, ApiError> {
        let session_id = parse_session_id(&req.session_id)?;
        if req.subagent_type.is_empty() {
            return Err(ApiError::BadRequest(
                "subagent_type is required (general-purpose, Explore, Plan or a custom type); \
                 to fork, use ForkBatch"
                    .into(),
            ));
        }
        let options = forkd_engine::TypedOptions {
            isolation: req.isolation.parse().map_err(ApiError::BadRequest)?,
            output_schema: convert::output_schema(&req.output_schema)
                .map_err(ApiError::BadRequest)?,
            limits: convert::limits_from(req.limits.as_ref()),
        };
        let directive = Directive {
            description: req.description,
            prompt: req.prompt,
        };
        let id = self
            .engine
            .for_tenant(tenant)
            .spawn_typed(session_id, &req.subagent_type, directive, &options)
            .await?;
        Ok(pb::SpawnAgentResponse {
            agent_id: id.to_string(),
        })
    }

    pub(super) async fn list_agents_rpc(
        &self,
        tenant: Tenant,
        req: pb::ListAgentsRequest,
    ) -> Result<pb::ListAgentsResponse, ApiError> {
        let limit = page_size(req.page_size);
        let filter = AgentFilter {
            tenant: None,
            session_id: optional(&req.session_id, parse_session_id)?,
            batch_id: optional(&req.batch_id, parse_batch_id)?,
            include_ended: req.include_ended,
            after: optional(&req.page_token, |t| {
                t.parse().map_err(|e| bad_id("page_token", e))
            })?,
            limit,
        };
        let engine = self.engine.for_tenant(tenant);
        let agents = engine.list_agents(filter).await?;
        let copies = engine.copies_of(&agents).await?;
        let next_page_token = match agents.last() {
            Some(last) if agents.len() as u32 == limit => last.id.to_string(),
            _ => String::new(),
        };
        Ok(pb::ListAgentsResponse {
            agents: agents
                .iter()
                .map(|a| convert::agent(a, copies.get(&a.id)))
                .collect(),
            next_page_token,
        })
    }

    pub(super) async fn get_agent_rpc(
        &self,
        tenant: Tenant,
        req: pb::GetAgentRequest,
    ) -> Result<pb::GetAgentResponse, ApiError> {
        let id = parse_agent_id(&req.agent_id)?;
        let engine = self.engine.for_tenant(tenant);
        let agent = engine.agent(id).await?;
        let copies = engine.copies_of(std::slice::from_ref(&agent)).await?;
        Ok(pb::GetAgentResponse {
            agent: Some(convert::agent(&agent, copies.get(&agent.id))),
        })
    }

    pub(super) async fn attach_rpc(
        &self,
        tenant: Tenant,
        req: pb::AttachRequest,
    ) -> Result<AgentEventStream, ApiError> {
        use futures::StreamExt;
        let id = parse_agent_id(&req.agent_id)?;
        let events = self
            .engine
            .for_tenant(tenant)
            .attach(id, req.since_seq)
            .await?;
        let agent_id = id.to_string();
        Ok(Box::pin(events.map(move |e| {
            e.map(|e| convert::agent_event(e, &agent_id))
                .map_err(status)
        })))
    }

    pub(super) async fn background_rpc(
        &self,
        tenant: Tenant,
        req: pb::BackgroundRequest,
    ) -> Result<pb::BackgroundResponse, ApiError> {
        let id = parse_agent_id(&req.agent_id)?;
        self.engine.for_tenant(tenant).background(id).await?;
        Ok(pb::BackgroundResponse {
            agent_id: id.to_string(),
            status: "async_launched".into(),
        })
    }

    pub(super) async fn get_changes_rpc(
        &self,
        tenant: Tenant,
        req: pb::GetChangesRequest,
    ) -> Result<pb::GetChangesResponse, ApiError> {
        let id = parse_agent_id(&req.agent_id)?;
        let changes = self.engine.for_tenant(tenant).changes(id).await?;
        Ok(convert::changes(changes))
    }

    pub(super) async fn apply_changes_rpc(
        &self,
        tenant: Tenant,
        req: pb::ApplyChangesRequest,
    ) -> Result<pb::ApplyChangesResponse, ApiError> {
        let targets = copy_targets(&req.agent_ids, &req.batch_id)?;
        let applied = self
            .engine
            .for_tenant(tenant)
            .apply_changes(&targets)
            .await?;
        Ok(pb::ApplyChangesResponse {
            results: applied
                .into_iter()
                .map(|a| pb::AppliedChanges {
                    agent_id: a.agent_id.to_string(),
                    applied: a.outcome.applied,
                    conflicts: a
                        .outcome
                        .conflicts
                        .into_iter()
                        .map(convert::conflict)
                        .collect(),
                })
                .collect(),
        })
    }

    pub(super) async fn discard_changes_rpc(
        &self,
        tenant: Tenant,
        req: pb::DiscardChangesRequest,
    ) -> Result<pb::DiscardChangesResponse, ApiError> {
        let targets = copy_targets(&req.agent_ids, &req.batch_id)?;
        let discarded = self
            .engine
            .for_tenant(tenant)
            .discard_changes(&targets)
            .await?;
        Ok(pb::DiscardChangesResponse {
            agent_ids: discarded.iter().map(ToString::to_string).collect(),
        })
    }

    pub(super) async fn kill_rpc(
        &self,
        tenant: Tenant,
        req: pb::KillRequest,
    ) -> Result<pb::KillResponse, ApiError> {
        let id = parse_agent_id(&req.agent_id)?;
        self.engine.for_tenant(tenant).kill(id).await?;
        Ok(pb::KillResponse {
            agent_id: id.to_string(),
        })
    }

    pub(super) async fn get_transcript_rpc(
        &self,
        tenant: Tenant,
        req: pb::GetTranscriptRequest,
    ) -> Result<pb::GetTranscriptResponse, ApiError> {
        let id = parse_agent_id(&req.agent_id)?;
        let scoped = self.engine.for_tenant(tenant);
        let entries = scoped.transcript(id, req.include_shared_prefix).await?;
        let hook_runs = scoped.hook_runs(id).await?;
        Ok(pb::GetTranscriptResponse {
            agent_id: id.to_string(),
            messages: entries
                .into_iter()
                .map(convert::transcript_message)
                .collect(),
            hook_runs: hook_runs.iter().map(convert::hook_run).collect(),
        })
    }
}

pub type AgentEventStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::AgentEvent, Status>> + Send>>;
