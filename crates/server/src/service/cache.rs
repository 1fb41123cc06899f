//! Cache statistics and the fork cost calculator.

use forkd_core::pricing::CacheTtl;
use forkd_engine::StatsScope;
use forkd_proto::v1 as pb;
use forkd_proto::v1::get_cache_stats_request::Scope;
use tonic::Status;

use super::ForkdService;
use super::agents::parse_batch_id;
use super::sessions::parse_session_id;
use crate::convert;
use crate::status::to_status;

impl ForkdService {
    pub(super) async fn cache_stats_rpc(
        &self,
        req: pb::GetCacheStatsRequest,
    ) -> Result<pb::GetCacheStatsResponse, Status> {
        let scope = match req.scope {
            Some(Scope::BatchId(b)) => StatsScope::Batch(parse_batch_id(&b)?),
            Some(Scope::SessionId(s)) => StatsScope::Session(parse_session_id(&s)?),
            None => return Err(Status::invalid_argument("give a batch_id or a session_id")),
        };
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
