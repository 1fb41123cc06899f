//! One agent run: model ↔ tools until the model ends its turn, then a task notification.
//!
//! A fork child's state is its transcript: the run rebuilds the conversation from the store (the
//! parent's history up to the fork point, the batch's shared blocks, the child's directive and its
//! own messages), so any later run of the same agent id continues where the last one stopped.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use forkd_core::fork::ForkBatch;
use forkd_core::pricing::{self, CacheTtl};
use forkd_core::report::Report;
use forkd_core::request::Conversation;
use forkd_core::request::{self, BlockPos};
use forkd_core::session::{CacheSafeParams, PermissionMode, Session};
use forkd_core::{
    Agent, AgentId, AgentKind, BatchId, Block, Message, NotificationStatus, RequestId, Role,
};
use forkd_provider::{Completion, ModelRequest, ProviderError, StreamEvent};
use forkd_store::{Lease, NewNotification, RequestRecord, StoreError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tracing::Instrument;

use tokio_util::sync::CancellationToken;

use crate::batch::WarmupGate;
use crate::error::EngineError;
use crate::tools::ToolTurn;
use crate::{Engine, now_ms};

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

/// How often an agent's end is attempted before giving up (about a minute in all).
const FINISH_ATTEMPTS: u32 = 16;

/// A run waiting for a slot under the cap on running agents.
pub(crate) struct Queued {
    id: AgentId,
    gate: Option<WarmupGate>,
    wait: Option<watch::Receiver<bool>>,
    token: CancellationToken,
}

/// Live batch contexts; entries die with the last child that holds them.
#[derive(Default)]
pub(crate) struct BatchCache(std::sync::Mutex<HashMap<BatchId, Weak<BatchContext>>>);

/// What an agent's conversation is made of besides its own messages.
enum Shape {
    /// A fork child: the batch's shared prefix, then its directive block.
    Fork { ctx: Arc<BatchContext> },
    /// A typed agent: its own params; its conversation starts with its directive.
    Typed,
}

/// An agent's run, loaded from the store.
pub(crate) struct AgentRun {
    agent: Agent,
    session: Session,
    pub(crate) params: CacheSafeParams,
    permission_mode: PermissionMode,
    shape: Shape,
    directive: Block,
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
            Shape::Fork { ctx } => BlockPos {
                message: ctx.history.len() + 1,
                block: ctx.batch.shared_user_blocks.len(),
            },
            Shape::Typed => BlockPos {
                message: 0,
                block: 0,
            },
        }
    }
}

/// Why a run ended without completing.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunFailure {
    #[error("model request failed: {0}")]
    Provider(#[from] ProviderError),
    #[error("no final answer after {0} turns")]
    TurnLimit(u32),
    #[error("{0}")]
    Engine(EngineError),
    /// The daemon is shutting down: the run stopped between calls, and the agent stays
    /// `running` for the next start to resume.
    #[error("stopped for shutdown")]
    Draining,
    /// A newer run claimed the agent: this one stops without a word, the newer one goes on.
    #[error("superseded by a newer run of the agent")]
    Superseded,
}

impl From<EngineError> for RunFailure {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Draining => RunFailure::Draining,
            EngineError::Store(StoreError::Superseded { .. }) => RunFailure::Superseded,
            other => RunFailure::Engine(other),
        }
    }
}

impl From<StoreError> for RunFailure {
    fn from(e: StoreError) -> Self {
        EngineError::from(e).into()
    }
}

/// How a run ended: its end to record, or nothing to record (paused for shutdown, superseded,
/// never claimed).
type RunOutcome = Option<(Lease, NotificationStatus, Option<String>, Option<String>)>;

impl Engine {
    /// Starts a new run of an existing agent: it rebuilds its conversation from the store and
    /// continues from wherever its transcript stands.
    /// Does nothing if a run of the agent is already in progress: two runs of one agent would
    /// write one transcript twice.
    pub fn start_agent(&self, id: AgentId) {
        if self.runs().contains_key(&id) {
            tracing::debug!(agent.id = %id, "Agent already running; not starting another run");
            return;
        }
        self.spawn_agent(id, None, None);
    }

    /// Spawns an agent's run on the engine's tracker. `gate` is held by a batch's first child;
    /// `wait` makes a sibling wait for that gate. Under a cap on running agents the run waits
    /// its turn first, in the order agents were started, staying `pending` until then.
    pub(crate) fn spawn_agent(
        &self,
        id: AgentId,
        gate: Option<WarmupGate>,
        wait: Option<watch::Receiver<bool>>,
    ) {
        // The run's own token: cancelled on shutdown or by a kill, and what its tool calls (a
        // Bash process group) watch so they stop with it. Registered at once, so a kill reaches
        // an agent still waiting for a slot.
        let token = self.inner.shutdown.child_token();
        self.runs().insert(id, token.clone());
        let queued = Queued {
            id,
            gate,
            wait,
            token,
        };
        match &self.inner.run_slots {
            None => self.spawn_run(queued, None),
            Some(slots) => {
                let queue = self
                    .inner
                    .run_queue
                    .get_or_init(|| self.dispatch(slots.clone()));
                if let Err(refused) = queue.send(queued) {
                    // The dispatcher stopped for shutdown: the agent stays pending for the next
                    // start.
                    self.runs().remove(&refused.0.id);
                }
            }
        }
    }

    /// The dispatcher of a capped engine: hands out run slots in the order runs were queued.
    fn dispatch(&self, slots: Arc<Semaphore>) -> mpsc::UnboundedSender<Queued> {
        let (tx, mut rx) = mpsc::unbounded_channel::<Queued>();
        let engine = self.clone();
        let draining = self.inner.draining.clone();
        tokio::spawn(async move {
            loop {
                let queued = tokio::select! {
                    next = rx.recv() => match next {
                        Some(q) => q,
                        None => return,
                    },
                    () = draining.cancelled() => return,
                };
                let permit = tokio::select! {
                    biased;
                    // Killed (or shut down) while waiting: its run ends at once, without a slot.
                    () = queued.token.cancelled() => None,
                    permit = slots.clone().acquire_owned() => permit.ok(),
                    () = draining.cancelled() => return,
                };
                engine.spawn_run(queued, permit);
            }
        });
        tx
    }

    fn spawn_run(&self, queued: Queued, slot: Option<OwnedSemaphorePermit>) {
        let Queued {
            id,
            gate,
            wait,
            token,
        } = queued;
        let engine = self.clone();
        let span = tracing::info_span!("agent", agent.id = %id);
        self.inner.tasks.spawn(
            async move {
                let _slot = slot;
                let _counted = crate::metrics::RunGauge::start();
                // Only the run itself is raced against cancellation; its end is recorded after,
                // outside the race, so a kill can never cut a finish in half.
                let outcome = tokio::select! {
                    // Cancellation first: a run released at the same moment must not start writing.
                    biased;
                    () = token.cancelled() => None,
                    outcome = engine.run_agent(id, gate, wait, &token) => Some(outcome),
                };
                match outcome {
                    Some(Some((lease, status, text, error))) => {
                        engine
                            .finish_with_retries(&lease, status, text, error)
                            .await;
                    }
                    // Paused by the shutdown drain (stays `running` for the next start), or
                    // superseded by a newer run, which records the end.
                    Some(None) => {}
                    // Recorded only now that the run (and any process group it started) is
                    // gone, so a killed notification means the agent has stopped. A run
                    // cancelled by shutdown stays `running` for the next start.
                    None if engine.take_killed(id) => engine.record_kill(id).await,
                    None => tracing::debug!("Agent run stopped by shutdown"),
                }
                engine.take_killed(id);
                engine.runs().remove(&id);
            }
            .instrument(span),
        );
    }

    pub(crate) fn killed(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<AgentId>> {
        self.inner.killed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the agent's run was cancelled by a kill (and forgets it).
    pub(crate) fn take_killed(&self, id: AgentId) -> bool {
        self.killed().remove(&id)
    }

    pub(crate) fn runs(&self) -> std::sync::MutexGuard<'_, HashMap<AgentId, CancellationToken>> {
        self.inner.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Kills an agent: its run stops at once (its Bash process group with it), and it ends
    /// `killed`, with a notification carrying whatever it had said so far.
    ///
    /// A session's main loop is never killed (the session lives on): killing it cancels the
    /// turn it is running. The turn's stored messages stay; its unfinished reply is dropped.
    pub async fn kill(&self, id: AgentId) -> Result<(), EngineError> {
        let agent = self.get_agent(id).await?;
        if agent.kind == AgentKind::Parent {
            let turn = self.runs().get(&id).cloned();
            let Some(token) = turn else {
                return Err(EngineError::WrongState(format!(
                    "session {} is not running a turn; there is nothing to cancel",
                    agent.session_id
                )));
            };
            self.killed().insert(id);
            token.cancel();
            tracing::info!(agent.id = %id, "Parent turn cancelled");
            return Ok(());
        }
        if agent.state.is_terminal() {
            return Err(EngineError::WrongState(format!(
                "agent {id} already ended ({})",
                agent.state.as_str()
            )));
        }
        let run = self.runs().get(&id).cloned();
        match run {
            Some(token) => {
                self.killed().insert(id);
                token.cancel();
            }
            // Nothing runs it (it never started here): record the kill directly.
            None => self.record_kill(id).await,
        }
        tracing::info!(agent.id = %id, "Agent killed");
        Ok(())
    }

    /// Ends a killed agent with its partial result: the text of its last reply, if any. It
    /// claims the agent first, so a run still alive anywhere (another daemon on the same
    /// database) is fenced off before the agent is marked killed.
    async fn record_kill(&self, id: AgentId) {
        let lease = match self.inner.store.claim_agent(id).await {
            Ok(lease) => lease,
            // Ended meanwhile: its own end stands.
            Err(StoreError::Conflict(_)) => return,
            Err(e) => {
                tracing::error!(error = %e, "Cannot claim the killed agent; it stays live in the store");
                return;
            }
        };
        let partial = match self.inner.store.agent_messages(id).await {
            Ok(messages) => messages
                .into_iter()
                .rev()
                .map(|m| m.message)
                .find(|m| m.role == Role::Assistant)
                .map(|m| m.text())
                .filter(|t| !t.trim().is_empty()),
            Err(e) => {
                tracing::warn!(error = %e, "Cannot read the killed agent's transcript");
                None
            }
        };
        self.finish_with_retries(
            &lease,
            NotificationStatus::Killed,
            partial,
            Some("killed by a client before it finished".to_owned()),
        )
        .await;
    }

    async fn run_agent(
        &self,
        id: AgentId,
        mut gate: Option<WarmupGate>,
        wait: Option<watch::Receiver<bool>>,
        cancel: &CancellationToken,
    ) -> RunOutcome {
        if let Some(mut rx) = wait {
            // A closed gate (its sender dropped) releases the sibling too.
            let _ = rx.wait_for(|open| *open).await;
        }
        // Claimed before the transcript is read: from here on an older run cannot write, so
        // what this run loads is final.
        let lease = match self.inner.store.claim_agent(id).await {
            Ok(lease) => Some(lease),
            Err(StoreError::Conflict(reason)) => {
                tracing::debug!(%reason, "Agent not run");
                None
            }
            Err(e) => {
                tracing::error!(error = %e, "Cannot claim the agent; it stays live for the next start");
                None
            }
        };
        let outcome = match &lease {
            Some(lease) => Some(self.drive(lease, &mut gate, cancel).await),
            None => None,
        };
        if let Some(g) = gate.as_mut() {
            g.open();
        }
        let (lease, outcome) = lease.zip(outcome)?;
        match outcome {
            Ok(text) => Some((lease, NotificationStatus::Completed, Some(text), None)),
            Err(RunFailure::Draining) => {
                tracing::info!("Agent run paused for shutdown; it resumes at the next start");
                None
            }
            Err(RunFailure::Superseded) => {
                tracing::info!("A newer run of the agent took over; this one stops");
                None
            }
            Err(failure) => {
                tracing::warn!(error = %failure, "Agent failed");
                Some((
                    lease,
                    NotificationStatus::Failed,
                    None,
                    Some(failure.to_string()),
                ))
            }
        }
    }

    /// Records an agent's end, retrying a store that is briefly unavailable (a busy database):
    /// an agent whose end is never recorded would keep its subscribers waiting forever.
    pub(crate) async fn finish_with_retries(
        &self,
        lease: &Lease,
        status: NotificationStatus,
        text: Option<String>,
        error: Option<String>,
    ) {
        let mut delay = Duration::from_millis(100);
        for attempt in 1..=FINISH_ATTEMPTS {
            match self
                .finish(lease, status, text.clone(), error.clone())
                .await
            {
                Ok(()) => return,
                // Already ended (by an earlier attempt that committed, or a kill), or taken over
                // by a newer run, which records its own end: nothing to do.
                Err(EngineError::Store(
                    StoreError::Conflict(_) | StoreError::Superseded { .. },
                )) => return,
                Err(e) if attempt < FINISH_ATTEMPTS => {
                    tracing::warn!(attempt, error = %e, "Could not record the agent's end; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                Err(e) => {
                    tracing::error!(error = %e, "Could not record the agent's end; it stays live in the store")
                }
            }
        }
    }

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
        let store = &self.inner.store;
        let batch = store
            .get_batch(batch_id)
            .await?
            .ok_or_else(|| EngineError::NotFound {
                kind: "batch",
                id: batch_id.to_string(),
            })?;
        let session = self.get_session(agent.session_id).await?;
        let history = store
            .session_messages(agent.session_id, Some(batch.fork_point))
            .await?
            .into_iter()
            .map(|m| m.message)
            .collect();
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

    /// Runs the agent's turns from wherever its transcript stands; returns its final text.
    async fn drive(
        &self,
        lease: &Lease,
        gate: &mut Option<WarmupGate>,
        cancel: &CancellationToken,
    ) -> Result<String, RunFailure> {
        let mut run = self.load_run(lease.agent_id).await?;
        let directive_pos = run.directive_pos();
        let max_turns = self.config().max_turns;
        // Turns already taken (a later run of the same agent continues the count).
        let mut turn = run.own.iter().filter(|m| m.role == Role::Assistant).count() as u32;
        loop {
            if let Some(last) = run.own.last().filter(|m| m.role == Role::Assistant)
                && last.tool_uses().next().is_none()
            {
                return Ok(last.text());
            }
            if self.draining() {
                return Err(RunFailure::Draining);
            }
            if let Some(last) = run.own.last().filter(|m| m.role == Role::Assistant) {
                // Answer the model's tool calls, including those a previous run left open.
                let conv = run.conversation();
                let tool_turn = ToolTurn {
                    agent: &run.agent,
                    lease,
                    session: &run.session,
                    permission_mode: run.permission_mode,
                    offered: run.params.tools.names(),
                    conversation: &conv.messages,
                    cancel: cancel.clone(),
                };
                let results = self.run_tools(&tool_turn, last).await?;
                self.append_own(lease, &results).await?;
                run.own.push(results);
            }
            if turn >= max_turns {
                return Err(RunFailure::TurnLimit(max_turns));
            }
            if self.draining() {
                return Err(RunFailure::Draining);
            }
            self.check_budgets(run.agent.session_id, run.agent.batch_id)
                .await?;
            let conv = run.conversation();
            let body = request::serialize(&run.params, &conv, true);
            let prefix_end = body.span(directive_pos).map_or(0, |s| s.start);
            let fingerprint = body.prefix_fingerprint(directive_pos).unwrap_or_default();
            let parts =
                crate::diagnose::prefix_parts(&body, run.params.tools.raw().len(), prefix_end);
            let body_bytes = body.body.len() as u64;
            let message_count = u32::try_from(conv.messages.len()).ok();
            let request_id = RequestId::new();
            let span =
                tracing::info_span!("model_request", request.id = %request_id, turn, body_bytes);
            let req = ModelRequest {
                model: run.params.model.clone(),
                body: body.body.into(),
            };
            let timed = self
                .request_with_retries(req, &mut |event| {
                    if matches!(event, StreamEvent::MessageStart { .. })
                        && let Some(g) = gate.as_mut()
                    {
                        g.open();
                    }
                })
                .instrument(span.clone())
                .await?;
            let completion = timed.completion;
            self.append_own(lease, &completion.message).await?;
            let record = self
                .record(
                    request_id,
                    &run.agent,
                    turn,
                    &run.params.model,
                    &completion,
                    (fingerprint, parts),
                    message_count,
                    body_bytes,
                    timed.first_token,
                )
                .instrument(span)
                .await?;
            crate::metrics::request(
                &run.params.model,
                run.agent.kind.as_str(),
                &record.usage,
                record.cost_usd,
                timed.took,
                timed.first_token,
            );
            if turn == 0
                && let Shape::Fork { ctx } = &run.shape
            {
                self.check_first_request(ctx, &record).await;
            }
            run.own.push(completion.message);
            turn += 1;
        }
    }

    /// A fork child's first request against its batch's first one: a different prefix is
    /// warned about and counted. The batch's first request is held in its context, so the store
    /// is asked once per batch (and again only after a restart).
    async fn check_first_request(&self, ctx: &BatchContext, record: &RequestRecord) {
        let held = ctx
            .first_request
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let first = match held {
            Some(first) => Some(first),
            None => self
                .first_sibling_request(ctx.batch.id, 0, record.agent_id)
                .await
                .unwrap_or_else(|e| {
                    tracing::debug!(error = %e, "Cannot read the batch's first request");
                    None
                }),
        };
        {
            let mut slot = ctx.first_request.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_none() {
                *slot = Some(first.clone().unwrap_or_else(|| record.clone()));
            }
        }
        if let Some(first) = first.filter(|f| f.agent_id != record.agent_id) {
            self.compare_prefix(&first, record);
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn record(
        &self,
        id: RequestId,
        agent: &Agent,
        turn: u32,
        model: &str,
        completion: &Completion,
        (prefix_fingerprint, prefix_parts): (String, Vec<forkd_store::PrefixPart>),
        message_count: Option<u32>,
        body_bytes: u64,
        first_token: Option<std::time::Duration>,
    ) -> Result<RequestRecord, RunFailure> {
        let cost_usd = pricing::model(model)
            .map(|m| completion.usage.cost_usd(m, CacheTtl::FiveMinutes))
            .unwrap_or(0.0);
        let record = RequestRecord {
            id,
            agent_id: agent.id,
            session_id: agent.session_id,
            batch_id: agent.batch_id,
            turn,
            model: model.to_owned(),
            usage: completion.usage,
            cost_usd,
            prefix_fingerprint,
            prefix_parts,
            message_count,
            body_bytes,
            first_token_ms: first_token.map(crate::millis),
            stop_reason: completion.stop_reason.clone(),
            created_at_ms: now_ms(),
        };
        self.inner.store.record_request(&record).await?;
        Ok(record)
    }

    /// Records the agent's end: its state, its notification (stored, appended to the parent's
    /// transcript, then pushed to subscribers, in that order).
    async fn finish(
        &self,
        lease: &Lease,
        status: NotificationStatus,
        final_text: Option<String>,
        error: Option<String>,
    ) -> Result<(), EngineError> {
        let store = &self.inner.store;
        let id = lease.agent_id;
        let agent = store
            .get_agent(id)
            .await?
            .ok_or_else(|| EngineError::NotFound {
                kind: "agent",
                id: id.to_string(),
            })?;
        let report = match (&final_text, &error) {
            (Some(text), _) => Report::parse(text),
            (None, Some(err)) => Report {
                scope: agent
                    .directive
                    .as_ref()
                    .map(|d| d.description.clone())
                    .unwrap_or_default(),
                result: match status {
                    NotificationStatus::Killed => format!("Killed: {err}"),
                    _ => format!("Failed: {err}"),
                },
                issues: err.clone(),
                ..Report::default()
            },
            (None, None) => Report::default(),
        };
        let summary = report.summary();
        let notification = NewNotification {
            session_id: agent.session_id,
            batch_id: agent.batch_id,
            agent_id: id,
            status,
            summary,
            report,
            usage: agent.usage,
            cost_usd: agent.cost_usd,
            created_at_ms: now_ms(),
        };
        let lock = self.session_lock(agent.session_id);
        let _session = lock.lock().await;
        // Commit and broadcast under one lock, so subscribers see notifications in seq order.
        let _order = self.inner.notify_order.lock().await;
        let committing = std::time::Instant::now();
        let stored = store
            .finish_agent(lease, &notification, error.as_deref())
            .await?;
        tracing::info!(
            status = status.as_str(),
            seq = stored.seq,
            cost_usd = stored.cost_usd,
            "Agent ended"
        );
        // No receiver is fine: subscribers replay from the store.
        let _ = self.inner.notifications.send(stored);
        crate::metrics::notification(status.as_str(), committing.elapsed());
        Ok(())
    }
}
