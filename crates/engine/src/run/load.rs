//! What a run needs, loaded from the store: the agent, its params, what its conversation shares
//! with its siblings (a batch's prefix, loaded once and shared by reference), its directive, its
//! own messages and the compaction boundaries among them.

use super::Runs;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

use forkd_core::compaction::{self, Compaction};
use forkd_core::fork::ForkBatch;
use forkd_core::output::OutputSchema;
use forkd_core::request::{BlockPos, Conversation};
use forkd_core::session::{CacheSafeParams, PermissionMode, Session};
use forkd_core::store::RequestRecord;
use forkd_core::{Agent, AgentId, AgentKind, BatchId, Block, Message};

use super::RunFailure;
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
    /// The trace context of the batch's first request: its siblings' first requests link to it.
    pub first_span: std::sync::Mutex<Option<String>>,
}

/// A batch's context, loaded once for the children started together and held by each of them
/// (see [`super::gate::Launch`]).
#[derive(Default)]
pub(crate) struct SharedBatch(tokio::sync::OnceCell<Arc<BatchContext>>);

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
    /// All of the agent's own messages: a compaction deletes none.
    pub(crate) own: Vec<Message>,
    /// The compaction boundaries of its own messages, oldest first.
    pub(crate) compactions: Vec<Compaction>,
    /// A typed agent's tools and system prompt in tokens, counted at its first request.
    pub(crate) head_tokens: std::sync::OnceLock<u64>,
    /// A typed agent's output schema (a fork child's is its batch's).
    pub(crate) own_schema: Option<OutputSchema>,
}

impl AgentRun {
    /// The JSON Schema the agent's final reply must match, if any.
    pub(crate) fn output_schema(&self) -> Option<&OutputSchema> {
        match &self.shape {
            Shape::Fork { ctx } => ctx.batch.output_schema.as_ref(),
            Shape::Typed => self.own_schema.as_ref(),
        }
    }

    /// The conversation of the agent's next request: its view from its latest boundary.
    pub(crate) fn conversation(&self) -> Conversation {
        self.view(self.compactions.last(), self.own.len())
    }

    /// The latest boundary and the own messages the next request carries: those from it on, or
    /// all of them.
    pub(crate) fn view_parts(&self) -> (Option<&Compaction>, &[Message]) {
        let latest = self.compactions.last();
        (latest, &self.own[own_from(latest, self.own.len())..])
    }

    /// The conversation of a request on the agent's first `upto` own messages as `compaction`
    /// left them: its first message (the fork message, or a typed agent's prompt) whole with
    /// the summary's blocks after its own, then the own messages from the boundary; without a
    /// compaction, all of them.
    pub(crate) fn view(&self, compaction: Option<&Compaction>, upto: usize) -> Conversation {
        let upto = upto.min(self.own.len());
        let own = &self.own[own_from(compaction, upto)..upto];
        let mut conversation = match &self.shape {
            Shape::Fork { ctx } => ctx
                .batch
                .child_conversation(&ctx.history, &self.directive, own),
            Shape::Typed => {
                let mut messages = Vec::with_capacity(1 + own.len());
                // The schema block after the prompt, as a batch's follows its boilerplate.
                let first = std::iter::once(self.directive.clone())
                    .chain(self.own_schema.as_ref().map(OutputSchema::block))
                    .collect();
                messages.push(Message::user(first));
                messages.extend_from_slice(own);
                Conversation::plain(messages)
            }
        };
        if let Some(c) = compaction
            && let Some(first) = conversation.messages.get_mut(self.directive_pos().message)
        {
            compaction::append_summary(first, &c.summary);
        }
        conversation
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

/// Where the own messages after `compaction` start, within the first `upto`.
fn own_from(compaction: Option<&Compaction>, upto: usize) -> usize {
    compaction
        .map_or(0, |c| usize::try_from(c.to_seq).unwrap_or(usize::MAX))
        .min(upto)
}

impl Runs {
    async fn batch_context(
        self: &Arc<Self>,
        agent: &Agent,
    ) -> Result<Arc<BatchContext>, RunFailure> {
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
        let batch = crate::lookup::batch(&*self.store, batch_id).await?;
        let session = self.sessions.get(agent.session_id).await?;
        let history = self.compaction.inherited_history(&batch).await?;
        let ctx = Arc::new(BatchContext {
            session,
            batch,
            history,
            first_request: std::sync::Mutex::new(None),
            first_span: std::sync::Mutex::new(None),
        });
        let mut cache = self.batches.0.lock().unwrap_or_else(|p| p.into_inner());
        // Another sibling may have loaded it meanwhile: keep theirs, so all share one copy.
        if let Some(existing) = cache.get(&batch_id).and_then(Weak::upgrade) {
            return Ok(existing);
        }
        cache.retain(|_, weak| weak.strong_count() > 0);
        cache.insert(batch_id, Arc::downgrade(&ctx));
        Ok(ctx)
    }

    fn cached_batch(self: &Arc<Self>, id: BatchId) -> Option<Arc<BatchContext>> {
        let cache = self.batches.0.lock().unwrap_or_else(|p| p.into_inner());
        cache.get(&id).and_then(Weak::upgrade)
    }

    /// Loads what a run needs: the agent, its params, what its conversation shares, its
    /// directive block and its own messages so far.
    /// A child started with its batch loads the context its siblings hold (`shared`).
    pub(crate) async fn load_run(
        self: &Arc<Self>,
        id: AgentId,
        shared: Option<&SharedBatch>,
    ) -> Result<AgentRun, RunFailure> {
        let store = &self.store;
        let agent = crate::lookup::agent(&*self.store, id).await?;
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
        let compactions = store.agent_compactions(id).await?;
        let mut own_schema = None;
        let (session, params, permission_mode, shape) = match agent.kind {
            AgentKind::Fork => {
                let ctx = match shared {
                    Some(shared) => Arc::clone(
                        shared
                            .0
                            .get_or_try_init(|| self.batch_context(&agent))
                            .await?,
                    ),
                    None => self.batch_context(&agent).await?,
                };
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
                let session = self.sessions.get(agent.session_id).await?;
                own_schema = own_params.output_schema;
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
            compactions,
            head_tokens: std::sync::OnceLock::new(),
            own_schema,
        })
    }
}
