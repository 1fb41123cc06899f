//! What a run needs, loaded from the store: the agent, its params, what its conversation shares
//! with its siblings (a batch's prefix, loaded once and shared by reference), its directive and
//! its own messages.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use forkd_core::fork::ForkBatch;
use forkd_core::request::{BlockPos, Conversation};
use forkd_core::session::{CacheSafeParams, PermissionMode, Session};
use forkd_core::store::RequestRecord;
use forkd_core::{Agent, AgentId, AgentKind, BatchId, Block, Message};

use super::RunFailure;
use crate::Engine;
use crate::error::EngineError;

/// What the children of one batch share, loaded once and held by reference: the prefix is
/// neither read from the store nor held in memory once per child.
pub(crate) struct BatchContext {
    pub session: Session,
    pub batch: ForkBatch,
    pub history: Vec<Message>,
    /// The batch's first recorded turn-0 request, which every sibling's first request is
    /// compared with (loaded from the store when a restart lost it).
    pub first_request: std::sync::Mutex<Option<RequestRecord>>,
}

/// Live batch contexts; entries die with the last child that holds them.
#[derive(Default)]
pub(crate) struct BatchCache(std::sync::Mutex<HashMap<BatchId, Weak<BatchContext>>>);

/// What an agent's conversation is made of besides its own messages.
pub(crate) enum Shape {
    /// A fork child: the batch's shared prefix, then its directive block.
    Fork { ctx: Arc<BatchContext> },
    /// A typed agent: its own params; its conversation starts with its directive.
    Typed,
}

/// An agent's run, loaded from the store.
pub(crate) struct AgentRun {
    pub(crate) agent: Agent,
    pub(crate) session: Session,
    pub(crate) params: CacheSafeParams,
    pub(crate) permission_mode: PermissionMode,
    pub(crate) shape: Shape,
    pub(crate) directive: Block,
    pub(crate) own: Vec<Message>,
}

impl AgentRun {
    pub(crate) fn conversation(&self) -> Conversation {
        match &self.shape {
            Shape::Fork { ctx } => {
                ctx.batch
                    .child_conversation(&ctx.history, &self.directive, &self.own)
            }
            Shape::Typed => {
                let mut messages = Vec::with_capacity(1 + self.own.len());
                messages.push(Message::user(vec![self.directive.clone()]));
                messages.extend_from_slice(&self.own);
                Conversation::plain(messages)
            }
        }
    }

    /// The agent's own first block: request fingerprints cover everything before it.
    pub(crate) fn directive_pos(&self) -> BlockPos {
        match &self.shape {
            Shape::Fork { ctx } => ctx.batch.directive_pos(&ctx.history),
            Shape::Typed => BlockPos {
                message: 0,
                block: 0,
            },
        }
    }
}

impl Engine {
    async fn batch_context(&self, agent: &Agent) -> Result<Arc<BatchContext>, RunFailure> {
        let Some(batch_id) = agent.batch_id else {
            return Err(EngineError::Invariant(format!(
                "agent {} is not a fork child; only fork children run in this build",
                agent.id
            ))
            .into());
        };
        if let Some(ctx) = self.cached_batch(batch_id) {
            return Ok(ctx);
        }
        let batch = self.get_batch(batch_id).await?;
        let session = self.get_session(agent.session_id).await?;
        let history = self.inherited_history(&batch).await?;
        let ctx = Arc::new(BatchContext {
            session,
            batch,
            history,
            first_request: std::sync::Mutex::new(None),
        });
        let mut cache = self
            .inner
            .batches
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Another sibling may have loaded it meanwhile: keep theirs, so all share one copy.
        if let Some(existing) = cache.get(&batch_id).and_then(Weak::upgrade) {
            return Ok(existing);
        }
        cache.retain(|_, weak| weak.strong_count() > 0);
        cache.insert(batch_id, Arc::downgrade(&ctx));
        Ok(ctx)
    }

    fn cached_batch(&self, id: BatchId) -> Option<Arc<BatchContext>> {
        let cache = self
            .inner
            .batches
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        cache.get(&id).and_then(Weak::upgrade)
    }

    /// Loads what a run needs: the agent, its params, what its conversation shares, its
    /// directive block and its own messages so far.
    pub(crate) async fn load_run(&self, id: AgentId) -> Result<AgentRun, RunFailure> {
        let store = &self.inner.store;
        let agent = self.get_agent(id).await?;
        let directive =
            store
                .agent_directive_block(id)
                .await?
                .ok_or_else(|| EngineError::NotFound {
                    kind: "directive of agent",
                    id: id.to_string(),
                })?;
        let own = store
            .agent_messages(id)
            .await?
            .into_iter()
            .map(|m| m.message)
            .collect();
        let (session, params, permission_mode, shape) = match agent.kind {
            AgentKind::Fork => {
                let ctx = self.batch_context(&agent).await?;
                let session = ctx.session.clone();
                let params = session.params.clone();
                let mode = session.permission_mode;
                (session, params, mode, Shape::Fork { ctx })
            }
            AgentKind::Typed => {
                let own_params =
                    store
                        .agent_params(id)
                        .await?
                        .ok_or_else(|| EngineError::NotFound {
                            kind: "params of typed agent",
                            id: id.to_string(),
                        })?;
                let session = self.get_session(agent.session_id).await?;
                (
                    session,
                    own_params.params,
                    own_params.permission_mode,
                    Shape::Typed,
                )
            }
            AgentKind::Parent => {
                return Err(EngineError::Invariant(
                    "a session's main loop runs through SendMessage".into(),
                )
                .into());
            }
        };
        Ok(AgentRun {
            agent,
            session,
            params,
            permission_mode,
            shape,
            directive,
            own,
        })
    }
}
