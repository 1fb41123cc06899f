//! Cache statistics and the fork cost calculator.

use forkd_core::RequestId;
use forkd_core::pricing::CacheTtl;
use forkd_engine::StatsScope;
use forkd_proto::v1 as pb;
use forkd_proto::v1::get_cache_stats_request::Scope;

use super::ForkdService;
use super::agents::{parse_agent_id, parse_batch_id};
use super::sessions::parse_session_id;
use crate::auth::Tenant;
use crate::convert;
use crate::status::{ApiError, bad_id};
use forkd_core::query::RequestFilter;

impl ForkdService {
    pub(super) async fn cache_stats_rpc(
        &self,
        tenant: Tenant,
        req: pb::GetCacheStatsRequest,
    ) -> Result<pb::GetCacheStatsResponse, ApiError> {
        let scope = match req.scope {
            Some(Scope::BatchId(b)) => StatsScope::Batch(parse_batch_id(&b)?),
            Some(Scope::SessionId(s)) => StatsScope::Session(parse_session_id(&s)?),
            None => {
                return Err(ApiError::BadRequest(
                    "give a batch_id or a session_id".into(),
                ));
            }
        };
        let stats = self.engine.for_tenant(tenant).cache_stats(scope).await?;
        Ok(convert::cache_stats(&stats))
    }

    pub(super) async fn capacity_rpc(
        &self,
        tenant: Tenant,
    ) -> Result<pb::GetCapacityResponse, ApiError> {
        let engine = self.engine.for_tenant(tenant);
        let runs = engine.run_capacity().await?;
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let providers = engine
            .capacity()
            .into_iter()
            .map(|key| pb::ProviderCapacity {
                provider: key.provider.to_owned(),
                endpoint: key.endpoint,
                model: key.model,
                limits: key
                    .limits
                    .into_iter()
                    .map(|l| pb::PacedLimit {
                        name: l.name.to_owned(),
                        per_second: l.per_second,
                        burst: l.burst,
                        source: l.source.as_str().to_owned(),
                    })
                    .collect(),
                concurrency: key.concurrency,
                in_flight: u32::try_from(key.in_flight).unwrap_or(u32::MAX),
                waiting: u32::try_from(key.waiting).unwrap_or(u32::MAX),
                throttled: u32::try_from(key.throttled).unwrap_or(u32::MAX),
                refusals_last_minute: u32::try_from(key.refusals_last_minute).unwrap_or(u32::MAX),
                paused_for_ms: u64::try_from(key.paused_for.as_millis()).unwrap_or(u64::MAX),
            })
            .collect();
        let slots = runs.slots;
        Ok(pb::GetCapacityResponse {
            providers,
            slots: Some(convert::run_slots(&slots)),
            queued: count(slots.queued),
            budget_left: runs.budget_left.map(|left| pb::BudgetLeft {
                usd: left.usd,
                tokens: left.tokens,
            }),
        })
    }

    pub(super) fn estimate_rpc(
        &self,
        req: pb::EstimateForkCostRequest,
    ) -> Result<pb::EstimateForkCostResponse, ApiError> {
        let ttl = if req.one_hour_cache {
            CacheTtl::OneHour
        } else {
            CacheTtl::FiveMinutes
        };
        let model = match req.model.as_str() {
            "" => self.engine.config().default_model.clone(),
            m => m.to_owned(),
        };
        let estimate = self.engine.estimate_fork_cost(
            Some(&model),
            req.prefix_tokens,
            req.directive_tokens,
            u64::from(req.children),
            ttl,
        )?;
        Ok(convert::estimate(&estimate, &model))
    }
}

impl ForkdService {
    pub(super) async fn list_requests_rpc(
        &self,
        tenant: Tenant,
        req: pb::ListRequestsRequest,
    ) -> Result<pb::ListRequestsResponse, ApiError> {
        use forkd_proto::v1::list_requests_request::Scope as RequestScope;
        let mut filter = RequestFilter::default();
        match req.scope {
            Some(RequestScope::AgentId(a)) => filter.agent_id = Some(parse_agent_id(&a)?),
            Some(RequestScope::BatchId(b)) => filter.batch_id = Some(parse_batch_id(&b)?),
            Some(RequestScope::SessionId(s)) => filter.session_id = Some(parse_session_id(&s)?),
            None => {}
        }
        let records = self.engine.for_tenant(tenant).list_requests(filter).await?;
        Ok(pb::ListRequestsResponse {
            requests: records.iter().map(convert::request_record).collect(),
        })
    }

    pub(super) async fn explain_cache_rpc(
        &self,
        tenant: Tenant,
        req: pb::ExplainCacheRequest,
    ) -> Result<pb::ExplainCacheResponse, ApiError> {
        let parse = |s: &str, field: &'static str| -> Result<RequestId, ApiError> {
            s.parse().map_err(|e| bad_id(field, e))
        };
        if req.request_id.is_empty() {
            return Err(ApiError::BadRequest("request_id is required".into()));
        }
        let id = parse(&req.request_id, "request_id")?;
        let other = match req.other_request_id.as_str() {
            "" => None,
            s => Some(parse(s, "other_request_id")?),
        };
        let why = self
            .engine
            .for_tenant(tenant)
            .explain_cache(id, other)
            .await?;
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
