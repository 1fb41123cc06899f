//! A dry run of a client's batch (docs/contracts.md, "Limits"): every check a batch passes
//! before it is stored, then what it would cost and what it would wait for — nothing stored,
//! nothing started, no idempotency key recorded.

use std::sync::Arc;

use forkd_core::Directive;
use forkd_core::calc::{self, ForkCostEstimate};
use forkd_core::fork::ForkBatch;
use forkd_core::pricing::CacheTtl;
use forkd_core::session::Session;

use super::{BatchOptions, Batches, Checked, SharedPrefix};
use crate::admission::KeyCapacity;
use crate::error::{EngineError, Result};
use crate::eta::{self, Demand, Eta, Load};
use crate::supervisor::Slots;
use crate::window::block_tokens;

/// What a batch would be, had it been submitted.
#[derive(Debug, Clone, PartialEq)]
pub struct DryRun {
    pub children: u64,
    /// The tokens every child's first request shares: the parent's history to the fork point
    /// and the fork boilerplate, as the window counts them.
    pub prefix_tokens: u64,
    /// The directives' blocks, on average (rounded up).
    pub directive_tokens: u64,
    /// The first requests' input cost: the calculator over that prefix (child 1 writes it, the
    /// others read it), and the same children as independent agents.
    pub estimate: ForkCostEstimate,
    /// The running slots now, and the caller's runs already waiting for one.
    pub slots: Slots,
    /// When it would start and finish, from the queue, the latest runs and the limiter.
    pub eta: Eta,
}

impl Batches {
    /// Checks `directives` and `options` on `session` as a submission would, and says what the
    /// batch would cost and wait for; `limiter` is the session's model's, when it has one.
    pub(crate) async fn dry_run(
        self: &Arc<Self>,
        session: &Session,
        directives: &[Directive],
        options: &BatchOptions,
        limiter: Option<&KeyCapacity>,
    ) -> Result<DryRun> {
        let Checked {
            forks, fork_point, ..
        } = self.check_batch(session, directives, options).await?;
        let point = fork_point.or_else(|| self.turn_starts.finished_turns_end(session.id));
        let SharedPrefix { tokens, .. } = self
            .shared_prefix(session, point, options.output_schema.as_ref())
            .await?;
        let children = forks.len() as u64;
        let directive_total: u64 = forks
            .iter()
            .map(|(_, d)| block_tokens(&ForkBatch::directive_block(d)))
            .sum();
        let directive_tokens = directive_total.div_ceil(children.max(1));
        let model = &session.params.model;
        let spec = self.config.models.get(model).ok_or_else(|| {
            EngineError::Invariant(format!(
                "session {} names unknown model {model}",
                session.id
            ))
        })?;
        let tenant = session.tenant.as_str();
        let slots = self.supervisor.slots(tenant);
        let n = forks.len().max(1);
        let max_tokens = f64::from(session.params.max_tokens);
        let eta = eta::estimate(&Load {
            slots,
            before_first: self.supervisor.served_before(tenant, 1),
            before_last: self.supervisor.served_before(tenant, n),
            run_time: self.supervisor.run_time(),
            limiter,
            first: Demand {
                requests: 1.0,
                input_tokens: (tokens + directive_tokens) as f64,
                output_tokens: max_tokens,
            },
            all: Demand {
                requests: n as f64,
                input_tokens: (tokens + directive_total) as f64,
                output_tokens: max_tokens * n as f64,
            },
        });
        Ok(DryRun {
            children,
            prefix_tokens: tokens,
            directive_tokens,
            estimate: calc::estimate(
                spec,
                tokens,
                directive_tokens,
                children,
                CacheTtl::FiveMinutes,
            ),
            slots,
            eta,
        })
    }
}
