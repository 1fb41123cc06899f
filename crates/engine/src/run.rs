//! One agent run: model ↔ tools until the model ends its turn, then a task notification.
//!
//! A fork child's state is its transcript: the run rebuilds the conversation from the store (the
//! parent's history up to the fork point, the batch's shared blocks, the child's directive and its
//! own messages), so any later run of the same agent id continues where the last one stopped.

mod capacity;
mod compact;
mod gate;
pub(crate) mod hooks;
mod lifecycle;
mod limits;
mod load;
pub(crate) mod tools;
mod transcript_file;
pub(crate) mod typed;

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};

use forkd_core::output;
use forkd_core::store::{Lease, ProcessGroup, RequestRecord, Store, StoreError};
use forkd_core::{AgentId, Limit, Limits, NotificationStatus, Role, SessionId};
use forkd_provider::StreamEvent;
use tokio_util::sync::CancellationToken;

pub(crate) use gate::WarmupGate;
pub(crate) use lifecycle::{Ending, resumed_span};
pub(crate) use load::{AgentRun, BatchCache, BatchContext, Shape, SharedBatch};

use crate::attach::Attach;
use crate::compact::{Compacting, Compactor};
use crate::config::EngineConfig;
use crate::copies::Copies;
use crate::divergence::Divergences;
use crate::error::EngineError;
use crate::locks::LockMap;
use crate::mcp::McpServers;
use crate::model::ModelCalls;
use crate::model::{Answer, ModelCall, PrefixEnd};
use crate::notify::Notifications;
use crate::permissions::Permissions;
use crate::run::tools::ToolTurn;
use crate::session::Sessions;
use crate::supervisor::Supervisor;
use crate::tenancy::Tenancy;
use crate::window::Window;

/// Runs of fork children and typed agents: loading them from the store, their turns (model,
/// tools, again), their compaction, their end; typed agents' calls and waits.
pub(crate) struct Runs {
    store: Arc<dyn Store>,
    config: Arc<EngineConfig>,
    calls: Arc<ModelCalls>,
    compaction: Arc<Compactor>,
    window: Arc<Window>,
    tenancy: Arc<Tenancy>,
    notifications: Arc<Notifications>,
    attach: Arc<Attach>,
    permissions: Arc<Permissions>,
    mcp: Arc<McpServers>,
    sessions: Arc<Sessions>,
    supervisor: Arc<Supervisor>,
    divergences: Arc<Divergences>,
    /// Isolated children's copies: their layers, their changes.
    copies: Arc<Copies>,
    /// Layered sessions' layers over their kept trees.
    trees: Arc<crate::trees::Trees>,
    /// Appends to a session's transcript (an agent's end, its report) one at a time.
    session_locks: Arc<LockMap<SessionId>>,
    /// Batch prefixes shared by the running children of each batch.
    batches: BatchCache,
    /// Agents a database fault stopped.
    faults: Arc<crate::faults::Faults>,
    /// Process groups of tool calls that a kill cut off, by agent, until the kill has waited
    /// for them (see `tools::GroupWatch`).
    cut_off_groups: StdMutex<HashMap<AgentId, Vec<ProcessGroup>>>,
}

/// The services runs are made of.
pub(crate) struct RunParts {
    pub store: Arc<dyn Store>,
    pub config: Arc<EngineConfig>,
    pub calls: Arc<ModelCalls>,
    pub compaction: Arc<Compactor>,
    pub window: Arc<Window>,
    pub tenancy: Arc<Tenancy>,
    pub notifications: Arc<Notifications>,
    pub attach: Arc<Attach>,
    pub permissions: Arc<Permissions>,
    pub mcp: Arc<McpServers>,
    pub sessions: Arc<Sessions>,
    pub supervisor: Arc<Supervisor>,
    pub divergences: Arc<Divergences>,
    pub copies: Arc<Copies>,
    pub trees: Arc<crate::trees::Trees>,
    pub session_locks: Arc<LockMap<SessionId>>,
    pub faults: Arc<crate::faults::Faults>,
}

impl Runs {
    pub(crate) fn new(parts: RunParts) -> Self {
        Self {
            store: parts.store,
            config: parts.config,
            calls: parts.calls,
            compaction: parts.compaction,
            window: parts.window,
            tenancy: parts.tenancy,
            notifications: parts.notifications,
            attach: parts.attach,
            permissions: parts.permissions,
            mcp: parts.mcp,
            sessions: parts.sessions,
            supervisor: parts.supervisor,
            divergences: parts.divergences,
            copies: parts.copies,
            trees: parts.trees,
            session_locks: parts.session_locks,
            batches: BatchCache::default(),
            faults: parts.faults,
            cut_off_groups: StdMutex::default(),
        }
    }
}

/// Why a run ended without completing.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunFailure {
    /// Past one of its limits: it ends `timed_out`.
    #[error("{0}")]
    Limit(Limit),
    #[error("{0}")]
    Error(EngineError),
    /// The daemon is shutting down: the run stopped between calls, and the agent stays
    /// `running` for the next start to resume.
    #[error("stopped for shutdown")]
    Draining,
    /// A newer run claimed the agent: this one stops without a word, the newer one goes on.
    #[error("superseded by a newer run of the agent")]
    Superseded,
    /// The database refused a write for its own sake (a full disk, a server out of reach): the
    /// run stops where it stands, the agent stays `running`, and it resumes once writes succeed
    /// again (see `faults`).
    #[error("{0}")]
    Interrupted(String),
    /// Its final reply did not match its output schema, after the one follow-up.
    #[error(
        "the final reply did not match the output schema after one follow-up:\n{}",
        output::list_violations(.0)
    )]
    Schema(Vec<String>),
}

impl From<EngineError> for RunFailure {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Draining => RunFailure::Draining,
            EngineError::Store(StoreError::Superseded { .. }) => RunFailure::Superseded,
            EngineError::Store(e) if e.is_fault() => RunFailure::Interrupted(e.to_string()),
            other => RunFailure::Error(other),
        }
    }
}

impl From<StoreError> for RunFailure {
    fn from(e: StoreError) -> Self {
        EngineError::from(e).into()
    }
}

/// How a run ended.
pub(crate) enum RunOutcome {
    /// The agent ended: its end to record.
    Ended(Lease, Ending),
    /// Nothing to record: paused for shutdown, superseded, never claimed.
    Stopped,
    /// The database refused a write (the reason): the agent waits for it to take writes again.
    Interrupted(String),
}

impl Runs {
    async fn run_agent(
        self: &Arc<Self>,
        id: AgentId,
        launch: gate::Launch,
        cancel: &CancellationToken,
    ) -> RunOutcome {
        let gate::Launch {
            mut gate,
            wait,
            batch,
        } = launch;
        if let Some(mut rx) = wait {
            let waited = std::time::Instant::now();
            // A closed gate (its sender dropped) releases the sibling too.
            let _ = rx.wait_for(|open| *open).await;
            // The warm-up gate's wait, on the agent's span (docs/operations.md, "Tracing").
            tracing::Span::current().record(
                "forkd.gate_wait_ms",
                crate::trace::int(crate::clock::millis(waited.elapsed())),
            );
        }
        // Claimed before the transcript is read: from here on an older run cannot write, so
        // what this run loads is final.
        // A run that does not go on drops its gate, which releases the siblings.
        let lease = match self.store.claim_agent(id).await {
            Ok(lease) => lease,
            Err(StoreError::Conflict(reason)) => {
                tracing::debug!(%reason, "Agent not run");
                return RunOutcome::Stopped;
            }
            Err(e) if e.is_fault() => return RunOutcome::Interrupted(e.to_string()),
            Err(e) => {
                tracing::error!(error = %e, "Cannot claim the agent; it stays live for the next start");
                return RunOutcome::Stopped;
            }
        };
        if self.kill_was_requested(id).await {
            // Killed through a daemon that did not run it while no daemon did: it ends here,
            // without another request.
            let partial = self.partial_text(id).await;
            return RunOutcome::Ended(lease, Ending::killed(partial));
        }
        let outcome = self
            .limited(&lease, &mut gate, batch.as_deref(), cancel)
            .await;
        if let Some(g) = gate.as_mut() {
            g.open();
        }
        match outcome {
            Ok(Final { text, structured }) => RunOutcome::Ended(
                lease,
                Ending {
                    status: NotificationStatus::Completed,
                    text: Some(text),
                    structured,
                    error: None,
                },
            ),
            Err(RunFailure::Draining) => {
                tracing::info!("Agent run paused for shutdown; it resumes at the next start");
                RunOutcome::Stopped
            }
            Err(RunFailure::Superseded) => {
                tracing::info!("A newer run of the agent took over; this one stops");
                RunOutcome::Stopped
            }
            Err(RunFailure::Interrupted(reason)) => RunOutcome::Interrupted(reason),
            Err(RunFailure::Limit(limit)) => {
                tracing::info!(limit = limit.name(), "Agent timed out");
                let partial = self.partial_text(id).await;
                RunOutcome::Ended(lease, Ending::timed_out(partial, limit))
            }
            Err(failure) => {
                tracing::warn!(error = %failure, "Agent failed");
                RunOutcome::Ended(lease, Ending::failed(failure.to_string()))
            }
        }
    }

    /// Runs the agent's turns under its limits: past its wall time or idle timeout the run is
    /// dropped (the tool calls in flight with it, their processes killed and waited for) and
    /// the agent times out.
    async fn limited(
        self: &Arc<Self>,
        lease: &Lease,
        gate: &mut Option<WarmupGate>,
        batch: Option<&SharedBatch>,
        cancel: &CancellationToken,
    ) -> Result<Final, RunFailure> {
        let run = self.load_run(lease.agent_id, batch).await?;
        // An agent stored before limits were runs under the daemon's.
        let limits = run.agent.limits.unwrap_or(self.config.agent_limits);
        let progress = crate::progress::Progress::new();
        let watchdog = limits::Watchdog::new(&run.agent, limits, Arc::clone(&progress));
        let drive = crate::progress::scope(progress, self.drive(run, &limits, lease, gate, cancel));
        if watchdog.is_idle() {
            return drive.await;
        }
        tokio::select! {
            // The watchdog first: a run resumed past its timeout (after a restart) ends before
            // it starts anything.
            biased;
            limit = watchdog.expired() => {
                self.stop_cut_off_groups(lease.agent_id).await;
                Err(RunFailure::Limit(limit))
            }
            outcome = drive => outcome,
        }
    }

    /// Runs the agent's turns from wherever its transcript stands; returns its final reply.
    async fn drive(
        self: &Arc<Self>,
        mut run: AgentRun,
        limits: &Limits,
        lease: &Lease,
        gate: &mut Option<WarmupGate>,
        cancel: &CancellationToken,
    ) -> Result<Final, RunFailure> {
        // Turns already taken (a later run of the same agent continues the count), and output
        // tokens written: its counted usage so far.
        let mut turn = run.own.iter().filter(|m| m.role == Role::Assistant).count() as u32;
        let mut output_tokens = run.agent.usage.output_tokens;
        loop {
            if let Some(last) = run.own.last().filter(|m| m.role == Role::Assistant)
                && last.tool_uses().next().is_none()
            {
                let text = last.text();
                match run.output_schema().map(|schema| schema.check(&text)) {
                    // Checked again on every start from the stored transcript, so a restart
                    // decides as this run did: one follow-up, then failed.
                    Some(Err(violations)) if run.own.iter().any(output::is_follow_up) => {
                        crate::metrics::schema_mismatch("failed");
                        return Err(RunFailure::Schema(violations));
                    }
                    Some(Err(violations)) => {
                        tracing::info!(
                            violations = violations.len(),
                            "The final reply does not match the output schema; asking once more"
                        );
                        crate::metrics::schema_mismatch("follow_up");
                        let follow_up = output::follow_up(&violations);
                        self.attach.append_own(lease, &follow_up).await?;
                        run.own.push(follow_up);
                    }
                    checked => {
                        let structured = checked.and_then(Result::ok);
                        // Its SubagentStop hooks may keep it going (their reasons its next
                        // message); a restart sees the note and knows a stop hook is active.
                        let active = run
                            .own
                            .iter()
                            .rev()
                            .find(|m| m.role == Role::User)
                            .is_some_and(hooks::is_stop_hook_note);
                        let blocked = self
                            .subagent_stop_hooks(
                                &run.agent,
                                &run.session,
                                run.permission_mode,
                                active,
                                cancel,
                            )
                            .await?;
                        let Some(reasons) = blocked else {
                            return Ok(Final { text, structured });
                        };
                        let note = hooks::stop_hook_note(&reasons);
                        self.attach.append_own(lease, &note).await?;
                        run.own.push(note);
                    }
                }
            }
            if self.supervisor.draining() {
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
                self.attach.append_own(lease, &results.message).await?;
                run.own.push(results.message);
                if let Some(reason) = results.stopped {
                    // A hook's `continue: false`: the agent ends here, its calls answered.
                    return Err(RunFailure::Error(EngineError::HookStopped(reason)));
                }
            }
            if let Some(limit) = limits::before_request(limits, turn, output_tokens) {
                return Err(RunFailure::Limit(limit));
            }
            if self.supervisor.draining() {
                return Err(RunFailure::Draining);
            }
            self.tenancy
                .check_budgets(run.agent.session_id, run.agent.batch_id)
                .await?;
            let answer = self.next_request(&mut run, lease, turn, gate).await?;
            self.attach
                .append_own(lease, &answer.completion.message)
                .await?;
            if turn == 0
                && let Shape::Fork { ctx } = &run.shape
            {
                self.check_first_request(ctx, &answer.record).await;
            }
            output_tokens += answer.completion.usage.output_tokens;
            run.own.push(answer.completion.message);
            turn += 1;
        }
    }

    /// The agent's next model request, compacting its own part first when it must.
    async fn next_request(
        self: &Arc<Self>,
        run: &mut AgentRun,
        lease: &Lease,
        turn: u32,
        gate: &mut Option<WarmupGate>,
    ) -> Result<Answer, EngineError> {
        let mut own = OwnTranscript {
            runs: self,
            run,
            lease,
            turn,
            gate,
        };
        self.compaction.request_compacting(&mut own).await
    }

    /// One model request of an agent on its conversation from its latest boundary; `counted`
    /// is its input tokens from the counts kept (a typed agent's body is counted instead).
    async fn agent_request(
        self: &Arc<Self>,
        run: &AgentRun,
        turn: u32,
        counted: u64,
        gate: &mut Option<WarmupGate>,
    ) -> Result<Answer, EngineError> {
        let conversation = run.conversation();
        let call = ModelCall {
            agent: &run.agent,
            turn,
            params: &run.params,
            conversation: &conversation,
            prefix: PrefixEnd::Before(run.directive_pos()),
            input_tokens: match run.shape {
                Shape::Fork { .. } => Some(counted),
                Shape::Typed => None,
            },
            prefix_writer: match &run.shape {
                Shape::Fork { ctx } if turn == 0 => Some(&ctx.first_span),
                _ => None,
            },
        };
        self.calls.call(call, &mut opens(gate)).await
    }

    /// A fork child's first request against its batch's first one: a different prefix is
    /// warned about and counted. The batch's first request is held in its context, so the store
    /// is asked once per batch (and again only after a restart).
    async fn check_first_request(self: &Arc<Self>, ctx: &BatchContext, record: &RequestRecord) {
        let held = ctx
            .first_request
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let first = match held {
            Some(first) => Some(first),
            None => self
                .divergences
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
            self.divergences.compare(&first, record);
        }
    }
}

/// A run's final reply: its text, and the object it holds when the agent has an output schema.
pub(crate) struct Final {
    text: String,
    structured: Option<serde_json::Value>,
}

/// A fork child's or typed agent's request, as [`Compactor::request_compacting`](crate::compact::Compactor::request_compacting) makes it.
struct OwnTranscript<'a> {
    runs: &'a Arc<Runs>,
    run: &'a mut AgentRun,
    lease: &'a Lease,
    turn: u32,
    gate: &'a mut Option<WarmupGate>,
}

impl Compacting for OwnTranscript<'_> {
    type Answer = Answer;
    const WHAT: &'static str = "the agent's transcript";

    fn params(&self) -> &forkd_core::session::CacheSafeParams {
        &self.run.params
    }

    async fn tokens(&mut self) -> Result<u64, EngineError> {
        self.runs.agent_tokens(self.run).await
    }

    async fn compact(&mut self) -> Result<(), EngineError> {
        let (agent, session) = (&self.run.agent, &self.run.session);
        let cancel = tokio_util::sync::CancellationToken::new();
        self.runs
            .pre_compact_hooks(agent, session, "auto", None, &cancel)
            .await;
        let mut on_event = opens(self.gate);
        self.runs
            .compact_agent(self.run, self.lease, self.turn, &mut on_event)
            .await
            .map(drop)
    }

    async fn request(&mut self, counted: u64) -> Result<Answer, EngineError> {
        self.runs
            .agent_request(self.run, self.turn, counted, self.gate)
            .await
    }
}

/// What an agent's requests stream to: its warm-up gate, if it holds one, opens at the first
/// `MessageStart` (a compaction's request warms the shared prefix as well as a turn's).
fn opens(gate: &mut Option<WarmupGate>) -> impl FnMut(&StreamEvent) + Send + '_ {
    move |event| {
        if matches!(event, StreamEvent::MessageStart { .. })
            && let Some(g) = gate.as_mut()
        {
            g.open();
        }
    }
}
