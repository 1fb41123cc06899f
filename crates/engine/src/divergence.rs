//! Siblings whose prefixes differ: a fork child's request against its batch's first request of
//! the same turn, warned about and counted (they cannot share the cache).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use forkd_core::store::{PrefixPart, RequestFilter, RequestRecord, Store};
use forkd_core::{AgentId, BatchId, RequestId};

use crate::error::Result;

/// A fork child's first request whose prefix differs from its first sibling's.
#[derive(Debug, Clone, PartialEq)]
pub struct Divergence {
    pub request_id: RequestId,
    pub sibling_request_id: RequestId,
    /// The first part whose digest differs (`system`, `tools`, `message N`, …); empty
    /// when the records carry no parts.
    pub part: String,
}

/// The first part where two recorded prefixes differ (by label, offset or digest), or `None`
/// when they agree part for part.
pub fn first_differing_part<'a>(
    a: &'a [PrefixPart],
    b: &'a [PrefixPart],
) -> Option<&'a PrefixPart> {
    let i = a.iter().zip(b).position(|(x, y)| x != y);
    match i {
        Some(i) => a.get(i),
        None if a.len() != b.len() => a.get(b.len()).or_else(|| b.get(a.len())),
        None => None,
    }
}

/// The sibling prefix checks, and how many differed.
pub(crate) struct Divergences {
    store: Arc<dyn Store>,
    /// Sibling prefix divergences seen (also counted in the metrics).
    seen: AtomicU64,
}

impl Divergences {
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            seen: AtomicU64::new(0),
        }
    }

    /// The earliest recorded request of `turn` in `batch` made by another agent than `not`.
    pub(crate) async fn first_sibling_request(
        &self,
        batch: BatchId,
        turn: u32,
        not: AgentId,
    ) -> Result<Option<RequestRecord>> {
        let records = self
            .store
            .list_requests(&RequestFilter {
                batch_id: Some(batch),
                ..RequestFilter::default()
            })
            .await?;
        Ok(records
            .into_iter()
            .find(|r| r.turn == turn && r.agent_id != not))
    }

    /// Compares a fork child's request with its first sibling's request of the same turn (from
    /// the store); a different prefix is warned about and counted. Runs record their first
    /// request through the same comparison.
    pub(crate) async fn check(&self, record: &RequestRecord) -> Result<Option<Divergence>> {
        let Some(batch) = record.batch_id else {
            return Ok(None);
        };
        let first = self
            .first_sibling_request(batch, record.turn, record.agent_id)
            .await?;
        Ok(first.and_then(|first| self.compare(&first, record)))
    }

    /// Warns about and counts a request whose prefix differs from its first sibling's.
    pub(crate) fn compare(
        &self,
        first: &RequestRecord,
        record: &RequestRecord,
    ) -> Option<Divergence> {
        if first.prefix_fingerprint == record.prefix_fingerprint {
            return None;
        }
        let part = first_differing_part(&record.prefix_parts, &first.prefix_parts)
            .map(|p| p.label.clone())
            .unwrap_or_default();
        tracing::warn!(
            request.id = %record.id,
            sibling.request.id = %first.id,
            agent.id = %record.agent_id,
            batch.id = ?record.batch_id,
            part = %part,
            "A fork child's prefix differs from its first sibling's: its request will not read the \
             shared cache (`forkctl cache explain {}` shows where)",
            record.id
        );
        crate::metrics::prefix_divergence();
        self.seen.fetch_add(1, Ordering::Relaxed);
        Some(Divergence {
            request_id: record.id,
            sibling_request_id: first.id,
            part,
        })
    }

    /// How many sibling prefix divergences this engine has seen.
    pub(crate) fn seen(&self) -> u64 {
        self.seen.load(Ordering::Relaxed)
    }
}
