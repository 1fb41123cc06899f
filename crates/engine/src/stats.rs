//! Cache figures of a batch or a session, computed from the stored request records.

use std::collections::HashMap;

use forkd_core::calc::{self, ForkCostEstimate};
use forkd_core::pricing::CacheTtl;
use forkd_core::store::{AgentFilter, RequestFilter};
use forkd_core::{AgentId, AgentKind, BatchId, SessionId, Usage};

use crate::Engine;
use crate::error::{EngineError, Result};

/// What the figures cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsScope {
    Batch(BatchId),
    Session(SessionId),
}

/// Cache efficiency of a set of fork children.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CacheStats {
    pub children: u32,
    /// Tokens every child's first request shares: everything before its directive.
    pub shared_prefix_tokens: u64,
    pub usage: Usage,
    pub requests: u32,
    pub cost_usd: f64,
    /// The input side of `cost_usd`.
    pub input_cost_usd: f64,
    /// The same children as independent agents: their first requests' input at the base price,
    /// everything else as it was.
    pub independent_cost_usd: f64,
    pub saving: f64,
}

impl Engine {
    /// This daemon's provider limiter, per key and model: the limits it paces by and where
    /// they came from, what is in flight, waiting and throttled, the last minute's refusals.
    pub fn capacity(&self) -> Vec<crate::KeyCapacity> {
        self.inner.calls.capacity()
    }

    pub async fn cache_stats(&self, scope: StatsScope) -> Result<CacheStats> {
        let store = &self.inner.store;
        let (agent_filter, request_filter) = match scope {
            StatsScope::Batch(id) => {
                crate::lookup::batch(&**store, id).await?;
                (
                    AgentFilter {
                        batch_id: Some(id),
                        include_ended: true,
                        ..AgentFilter::default()
                    },
                    RequestFilter {
                        batch_id: Some(id),
                        ..RequestFilter::default()
                    },
                )
            }
            StatsScope::Session(id) => {
                self.get_session(id).await?;
                (
                    AgentFilter {
                        session_id: Some(id),
                        include_ended: true,
                        ..AgentFilter::default()
                    },
                    RequestFilter {
                        session_id: Some(id),
                        ..RequestFilter::default()
                    },
                )
            }
        };
        let children: Vec<_> = store
            .list_agents(&agent_filter)
            .await?
            .into_iter()
            .filter(|a| a.kind == AgentKind::Fork)
            .collect();
        let requests = store.list_requests(&request_filter).await?;

        let mut directive_tokens: HashMap<AgentId, u64> = HashMap::new();
        for child in &children {
            if let Some(block) = store.agent_directive_block(child.id).await? {
                directive_tokens.insert(
                    child.id,
                    forkd_provider::tokens::block_tokens(block.raw().as_str()),
                );
            }
        }
        let mut stats = CacheStats {
            children: children.len() as u32,
            requests: requests.len() as u32,
            ..CacheStats::default()
        };
        for r in &requests {
            let Some(model) = self.config().models.get(&r.model) else {
                continue;
            };
            let ttl = CacheTtl::FiveMinutes;
            let input_cost = r.usage.input_cost_usd(model, ttl);
            stats.usage += r.usage;
            stats.cost_usd += r.cost_usd;
            stats.input_cost_usd += input_cost;
            stats.independent_cost_usd += r.cost_usd;
            if r.turn == 0 {
                stats.independent_cost_usd +=
                    r.usage.total_input() as f64 * model.input_per_mtok / 1e6 - input_cost;
                let d = directive_tokens.get(&r.agent_id).copied().unwrap_or(0);
                stats.shared_prefix_tokens = stats
                    .shared_prefix_tokens
                    .max(r.usage.total_input().saturating_sub(d));
            }
        }
        if stats.independent_cost_usd > 0.0 {
            stats.saving = 1.0 - stats.cost_usd / stats.independent_cost_usd;
        }
        Ok(stats)
    }

    /// The fork cost calculator for a model in the price table.
    pub fn estimate_fork_cost(
        &self,
        model: Option<&str>,
        prefix_tokens: u64,
        directive_tokens: u64,
        children: u64,
        ttl: CacheTtl,
    ) -> Result<ForkCostEstimate> {
        let name = model
            .filter(|m| !m.is_empty())
            .unwrap_or(&self.config().default_model);
        let models = &self.config().models;
        let spec = models.get(name).ok_or_else(|| {
            EngineError::InvalidRequest(format!(
                "unknown model {name:?}; known models: {}",
                models.names()
            ))
        })?;
        if children == 0 {
            return Err(EngineError::InvalidRequest(
                "children must be at least 1".into(),
            ));
        }
        Ok(calc::estimate(
            spec,
            prefix_tokens,
            directive_tokens,
            children,
            ttl,
        ))
    }
}
