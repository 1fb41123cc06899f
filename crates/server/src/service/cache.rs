//! Cache statistics and the fork cost calculator.

use forkd_core::RequestId;
use forkd_core::pricing::CacheTtl;
use forkd_engine::StatsScope;
use forkd_proto::v1 as pb;
use forkd_proto::v1::get_cache_stats_request::Scope;
use tonic::Status;

use super::ForkdService;
use super::agents::{parse_agent_id, parse_batch_id};
use super::sessions::parse_session_id;
use crate::auth::Tenant;
use crate::convert;
use crate::status::{bad_id, to_status};
use forkd_store::RequestFilter;

impl ForkdService {
    pub(super) async fn cache_stats_rpc(
        &self,
        tenant: &Tenant,
        req: pb::GetCacheStatsRequest,
    ) -> Result<pb::GetCacheStatsResponse, Status> {
        let scope = match req.scope {
            Some(Scope::BatchId(b)) => StatsScope::Batch(parse_batch_id(&b)?),
            Some(Scope::SessionId(s)) => StatsScope::Session(parse_session_id(&s)?),
            None => return Err(Status::invalid_argument("give a batch_id or a session_id")),
        };
        match scope {
            StatsScope::Batch(id) => self.engine.check_batch(tenant.name(), id).await,
            StatsScope::Session(id) => self.engine.check_session(tenant.name(), id).await,
        }
        .map_err(to_status)?;
        let stats = self.engine.cache_stats(scope).await.map_err(to_status)?;
        Ok(convert::cache_stats(&stats))
    }

    pub(super) fn estimate_rpc(
        &self,
        req: pb::EstimateForkCostRequest,
    ) -> Result<pb::EstimateForkCostResponse, Status> {
        let ttl = if req.one_hour_cache {
            CacheTtl::OneHour
        } else {
            CacheTtl::FiveMinutes
        };
        let model = match req.model.as_str() {
            "" => self.engine.config().default_model.clone(),
            m => m.to_owned(),
        };
        let estimate = self
            .engine
            .estimate_fork_cost(
                Some(&model),
                req.prefix_tokens,
                req.directive_tokens,
                u64::from(req.children),
                ttl,
            )
            .map_err(to_status)?;
        Ok(convert::estimate(&estimate, &model))
    }
}

impl ForkdService {
    pub(super) async fn list_requests_rpc(
        &self,
        tenant: &Tenant,
        req: pb::ListRequestsRequest,
    ) -> Result<pb::ListRequestsResponse, Status> {
        use forkd_proto::v1::list_requests_request::Scope as RequestScope;
        let mut filter = RequestFilter::default();
        match req.scope {
            Some(RequestScope::AgentId(a)) => {
                let id = parse_agent_id(&a)?;
                self.engine
                    .check_agent(tenant.name(), id)
                    .await
                    .map_err(to_status)?;
                filter.agent_id = Some(id);
            }
            Some(RequestScope::BatchId(b)) => {
                let id = parse_batch_id(&b)?;
                self.engine
                    .check_batch(tenant.name(), id)
                    .await
                    .map_err(to_status)?;
                filter.batch_id = Some(id);
            }
            Some(RequestScope::SessionId(s)) => {
                let id = parse_session_id(&s)?;
                self.engine
                    .check_session(tenant.name(), id)
                    .await
                    .map_err(to_status)?;
                filter.session_id = Some(id);
            }
            None => {
                return Err(Status::invalid_argument(
                    "give an agent_id, a batch_id or a session_id",
                ));
            }
        }
        let records = self
            .engine
            .store()
            .list_requests(&filter)
            .await
            .map_err(|e| to_status(e.into()))?;
        Ok(pb::ListRequestsResponse {
            requests: records.iter().map(convert::request_record).collect(),
        })
    }

    pub(super) async fn explain_cache_rpc(
        &self,
        tenant: &Tenant,
        req: pb::ExplainCacheRequest,
    ) -> Result<pb::ExplainCacheResponse, Status> {
        let parse = |s: &str, field: &'static str| -> Result<RequestId, Status> {
            s.parse().map_err(|e| bad_id(field, e))
        };
        if req.request_id.is_empty() {
            return Err(Status::invalid_argument("request_id is required"));
        }
        let id = parse(&req.request_id, "request_id")?;
        let other = match req.other_request_id.as_str() {
            "" => None,
            s => Some(parse(s, "other_request_id")?),
        };
        // Both requests must be the caller's: a request is its session's.
        for id in std::iter::once(id).chain(other) {
            let record = self.engine.get_request(id).await.map_err(to_status)?;
            self.engine
                .check_session(tenant.name(), record.session_id)
                .await
                .map_err(to_status)?;
        }
        let why = self
            .engine
            .explain_cache(id, other)
            .await
            .map_err(to_status)?;
        Ok(pb::ExplainCacheResponse {
            request_id: why.request_id,
            other_request_id: why.other_request_id,
            same_prefix: why.same_prefix,
            part: why.part,
            kind: why.kind,
            byte: why.byte,
            exact: why.exact,
            excerpt: why.excerpt,
            other_excerpt: why.other_excerpt,
            note: why.note,
        })
    }
}
