//! Reading one stored record by id, answering a missing one as `NotFound`.

use forkd_core::fork::ForkBatch;
use forkd_core::store::Store;
use forkd_core::{Agent, AgentId, BatchId};

use crate::error::{EngineError, Result};

pub(crate) async fn agent(store: &dyn Store, id: AgentId) -> Result<Agent> {
    store
        .get_agent(id)
        .await?
        .ok_or_else(|| EngineError::NotFound {
            kind: "agent",
            id: id.to_string(),
        })
}

pub(crate) async fn batch(store: &dyn Store, id: BatchId) -> Result<ForkBatch> {
    store
        .get_batch(id)
        .await?
        .ok_or_else(|| EngineError::NotFound {
            kind: "batch",
            id: id.to_string(),
        })
}
