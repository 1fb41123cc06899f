//! Parent turns: a user message in, the parent model's reply out, tools answered, until the
//! parent ends its turn. A reply that calls the `Agent` tool without `subagent_type` is a fork
//! batch, built through the same code path as a client's batch.

use forkd_core::session::Session;
use std::sync::Arc;

use forkd_core::compaction::Compaction;
use forkd_core::report::Report;
use forkd_core::store::{Lease, NewNotification, Store, StoreError};
use forkd_core::{
    Agent, AgentId, AgentKind, AgentState, Message, NotificationStatus, SessionId, Usage,
};
use futures::stream::BoxStream;
use tokio::sync::{OwnedMutexGuard, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::attach::Attach;
use crate::batch::{Batches, SubmittedBatch, TurnStarts};
use crate::clock::now_ms;
use crate::compact::Compactor;
use crate::config::EngineConfig;
use crate::error::{EngineError, Result};
use crate::handoff::Handoff;
use crate::locks::LockMap;
use crate::model::ModelCalls;
use crate::notify::Notifications;
use crate::run::Runs;
use crate::session::Sessions;
use crate::supervisor::{Raced, Supervisor};
use crate::tenancy::Tenancy;
use message::Stored;

mod hooks;
mod merge;
mod message;
mod request;
mod tools;

pub use merge::Merged;

/// Parent turns: a session's main loop, one turn at a time, its handoff to the background, its
/// resumption after a restart, and a client-asked compaction of its transcript.
pub(crate) struct Turns {
    store: Arc<dyn Store>,
    config: Arc<EngineConfig>,
    calls: Arc<ModelCalls>,
    compaction: Arc<Compactor>,
    tenancy: Arc<Tenancy>,
    notifications: Arc<Notifications>,
    attach: Arc<Attach>,
    supervisor: Arc<Supervisor>,
    runs: Arc<Runs>,
    batches: Arc<Batches>,
    sessions: Arc<Sessions>,
    session_locks: Arc<LockMap<SessionId>>,
    /// One parent turn per session at a time (held for the whole turn, unlike the session lock).
    turn_locks: LockMap<SessionId>,
    turn_starts: Arc<TurnStarts>,
    /// Turns a database fault stopped.
    faults: Arc<crate::faults::Faults>,
    /// Cancelled when the drain is over: a client-asked compaction stops where it stands.
    shutdown: CancellationToken,
}

/// What turns are made of.
pub(crate) struct TurnParts {
    pub store: Arc<dyn Store>,
    pub config: Arc<EngineConfig>,
    pub calls: Arc<ModelCalls>,
    pub compaction: Arc<Compactor>,
    pub tenancy: Arc<Tenancy>,
    pub notifications: Arc<Notifications>,
    pub attach: Arc<Attach>,
    pub supervisor: Arc<Supervisor>,
    pub runs: Arc<Runs>,
    pub batches: Arc<Batches>,
    pub sessions: Arc<Sessions>,
    pub session_locks: Arc<LockMap<SessionId>>,
    pub turn_starts: Arc<TurnStarts>,
    pub faults: Arc<crate::faults::Faults>,
    pub shutdown: CancellationToken,
}

impl Turns {
    pub(crate) fn new(parts: TurnParts) -> Self {
        Self {
            store: parts.store,
            config: parts.config,
            calls: parts.calls,
            compaction: parts.compaction,
            tenancy: parts.tenancy,
            notifications: parts.notifications,
            attach: parts.attach,
            supervisor: parts.supervisor,
            runs: parts.runs,
            batches: parts.batches,
            sessions: parts.sessions,
            session_locks: parts.session_locks,
            turn_locks: LockMap::default(),
            turn_starts: parts.turn_starts,
            faults: parts.faults,
            shutdown: parts.shutdown,
        }
    }
}

/// One event of a parent turn, as it happens.
#[derive(Debug, Clone, PartialEq)]
pub enum ParentEvent {
    TextDelta(String),
    ToolCall {
        tool_use_id: String,
        name: String,
        input_json: String,
    },
    ToolResult {
        tool_use_id: String,
        content: String,
        is_error: bool,
    },
    ForkLaunched(SubmittedBatch),
    /// The turn was handed to the background; it goes on without this client. Carries the
    /// session's main-loop agent (what `Background` names).
    AsyncLaunched(AgentId),
    TurnEnded {
        stop_reason: Option<String>,
        usage: Usage,
        cost_usd: f64,
        text: String,
    },
}

/// The events of one parent turn; the turn runs on whether or not anyone reads them.
pub type ParentEventStream = BoxStream<'static, Result<ParentEvent>>;

type Events = mpsc::Sender<Result<ParentEvent>>;

/// Typed agents a turn started and waits on: their reports belong in the turn's tool results.
/// Whatever the turn does not deliver (it was cancelled, or failed) goes to the transcript.
type Waited = std::sync::Arc<std::sync::Mutex<Vec<AgentId>>>;

/// What a turn holds while it runs.
struct Turn {
    session: Session,
    parent: Agent,
    lease: Lease,
    waited: Waited,
    handoff: Arc<Handoff>,
}

/// The notification of a turn that ended in the background: its status, its reply's first line
/// as the summary, the reply as the report's result, its usage and cost.
fn turn_notification(turn: &Turn, outcome: &Result<ParentEvent>) -> NewNotification {
    let (status, text, usage, cost_usd) = match outcome {
        Ok(ParentEvent::TurnEnded {
            usage,
            cost_usd,
            text,
            ..
        }) => (
            NotificationStatus::Completed,
            text.clone(),
            *usage,
            *cost_usd,
        ),
        Ok(_) => (
            NotificationStatus::Completed,
            String::new(),
            Usage::default(),
            0.0,
        ),
        Err(EngineError::Cancelled(why)) => (
            NotificationStatus::Killed,
            format!("Killed: {why}"),
            Usage::default(),
            0.0,
        ),
        Err(e) => (
            NotificationStatus::Failed,
            format!("Failed: {e}"),
            Usage::default(),
            0.0,
        ),
    };
    let report = Report {
        scope: "parent turn".into(),
        result: text,
        ..Report::default()
    };
    NewNotification {
        session_id: turn.session.id,
        batch_id: None,
        agent_id: turn.parent.id,
        status,
        summary: report.summary(),
        report,
        usage,
        cost_usd,
        created_at_ms: now_ms(),
    }
}

impl Turns {
    /// Runs one parent turn on `text`. Turns of one session run one at a time.
    pub(crate) async fn send_message(
        self: &Arc<Self>,
        session_id: forkd_core::SessionId,
        text: String,
    ) -> Result<ParentEventStream> {
        let session = self.sessions.get(session_id).await?;
        self.send_message_in(session, text, None).await
    }

    /// [`Turns::send_message`] on a session already read. With an idempotency key the user's
    /// message is stored with the key, and a retry stores nothing: it continues the turn from
    /// where the transcript stands, or, when that turn has ended, answers with its reply.
    pub(crate) async fn send_message_in(
        self: &Arc<Self>,
        session: Session,
        text: String,
        idempotency_key: Option<String>,
    ) -> Result<ParentEventStream> {
        if text.trim().is_empty() {
            return Err(EngineError::InvalidRequest("the message is empty".into()));
        }
        let max = self.config.max_directive_bytes;
        if text.len() > max {
            return Err(EngineError::InvalidRequest(format!(
                "the message is {} bytes; the limit is {max}",
                text.len()
            )));
        }
        if !crate::workspaces::here(&self.config.workspaces, &*self.store, &session).await? {
            return Err(crate::workspaces::elsewhere(&session, "a parent turn"));
        }
        let turn_lock = self.turn_locks.get(session.id);
        let guard = turn_lock.try_lock_owned().map_err(|_| {
            EngineError::WrongState(format!(
                "session {} is already running a turn; wait for it to end",
                session.id
            ))
        })?;
        let parent = self.parent_agent(&session).await?;
        let parent_id = parent.id;
        let lease = self.claim_main_loop(&parent).await?;
        let backgrounds = self.attach.backgrounds();
        // Its UserPromptSubmit hooks run once, when the message is stored for the first time
        // (a retry under its key finds it stored).
        let prepared = || self.prompt_message(&session, &parent, &text);
        let stored = self
            .store_message(&session, &lease, &text, prepared, idempotency_key)
            .await;
        // Where this turn begins: its message, stored now or by an earlier call with its key.
        let start = match stored {
            Ok(Stored::New { seq } | Stored::Earlier { seq, reply: None }) => seq,
            // A retry of a turn that has ended: nothing runs, its reply answers.
            Ok(Stored::Earlier {
                reply: Some(text), ..
            }) => {
                self.release_parent(&lease, None).await;
                let event = ParentEvent::TurnEnded {
                    stop_reason: None,
                    usage: Usage::default(),
                    cost_usd: 0.0,
                    text,
                };
                return Ok(Box::pin(futures::stream::iter([Ok(event)])));
            }
            Err(e) => {
                self.release_parent(&lease, None).await;
                return Err(e);
            }
        };
        self.turn_starts.begin(session.id, start);
        let handoff = Arc::new(Handoff::default());
        let rx = self.spawn_turn(
            session,
            parent,
            lease,
            guard,
            handoff.clone(),
            Resumption::default(),
        );
        Ok(self.foreground(parent_id, rx, backgrounds, handoff))
    }

    /// Compacts a session now, at a client's request: refused while a turn runs.
    pub(crate) async fn compact_session(
        self: &Arc<Self>,
        session_id: SessionId,
        instructions: Option<String>,
    ) -> Result<Compaction> {
        let session = self.sessions.get(session_id).await?;
        let turn_lock = self.turn_locks.get(session.id);
        let _guard = turn_lock.try_lock_owned().map_err(|_| {
            EngineError::WrongState(format!(
                "session {session_id} is running a turn; compact it once the turn has ended"
            ))
        })?;
        let parent = self.parent_agent(&session).await?;
        let lease = self.claim_main_loop(&parent).await?;
        self.runs
            .pre_compact_hooks(
                &parent,
                &session,
                "manual",
                instructions.as_deref(),
                &self.shutdown.child_token(),
            )
            .await;
        // Like a run, it stops where it stands when the daemon stops: no boundary is stored
        // unless the summary came back whole.
        let shutdown = self.shutdown.clone();
        let outcome = tokio::select! {
            outcome = self.compaction.compact(&session, &parent, &lease, 0, instructions.as_deref()) => outcome,
            () = shutdown.cancelled() => return Err(EngineError::Draining),
        };
        if let Err(e) = self.store.end_turn(&lease, None).await {
            tracing::warn!(error = %e, "Cannot mark the parent idle after a compaction");
        }
        outcome
    }

    /// Claims a session's main loop for a turn (or a compaction): refused while a turn runs on
    /// another daemon, whose lease on the main loop has not expired.
    pub(crate) async fn claim_main_loop(self: &Arc<Self>, parent: &Agent) -> Result<Lease> {
        match self.store.claim_agent(parent.id).await {
            Err(StoreError::Held { daemon, .. }) => Err(EngineError::WrongState(format!(
                "session {} is already running a turn (on daemon {daemon}); wait for it to end",
                parent.session_id
            ))),
            other => Ok(other?),
        }
    }

    /// Marks the parent idle again, with the turn's notification when it was handed to the
    /// background.
    async fn release_parent(
        self: &Arc<Self>,
        lease: &Lease,
        notification: Option<&NewNotification>,
    ) {
        // Commit and broadcast under one lock, so subscribers see notifications in seq order.
        let _order = match notification {
            Some(_) => Some(self.notifications.ordered().await),
            None => None,
        };
        match self.store.end_turn(lease, notification).await {
            Ok(Some(stored)) => {
                tracing::info!(
                    status = stored.status.as_str(),
                    seq = stored.seq,
                    "Turn ended in the background"
                );
                self.notifications.publish(stored);
            }
            Ok(None) | Err(StoreError::Superseded { .. }) => {}
            Err(e) => tracing::warn!(error = %e, "Cannot mark the parent idle"),
        }
    }

    /// Continues a parent turn that a previous daemon left running: the parent's transcript is
    /// a valid conversation at every commit (a reply is stored only with its tool results), so
    /// the turn re-requests from where it stands, with the same bytes, and reads the cache.
    pub(crate) async fn resume_turn(self: &Arc<Self>, parent: Agent) -> Result<()> {
        let session = self.sessions.get(parent.session_id).await?;
        let Ok(guard) = self.turn_locks.get(session.id).try_lock_owned() else {
            return Ok(());
        };
        let lease = self.store.claim_agent(parent.id).await?;
        let messages = self.store.session_messages(session.id, None).await?;
        let last = messages.last().map(|m| &m.message);
        if last.is_none_or(|m| m.role == forkd_core::Role::Assistant) {
            // The turn had ended; only its state was left behind.
            self.store.end_turn(&lease, None).await?;
            return Ok(());
        }
        // The reply it was answering, if it had one: answered again as it was (same tool_use
        // ids), not asked for anew.
        let pending = self.store.pending_reply(session.id).await?;
        tracing::info!(
            session.id = %session.id,
            agent.id = %parent.id,
            pending_reply = pending.is_some(),
            "Resuming a parent turn"
        );
        // The turn began after the last finished one: its last reply without tool calls.
        let start = messages
            .iter()
            .rposition(|m| {
                m.message.role == forkd_core::Role::Assistant
                    && m.message.tool_uses().next().is_none()
            })
            .map_or(1, |i| i as u64 + 1)
            .min(messages.len() as u64);
        self.turn_starts.begin(session.id, start);
        // Nobody listens to a resumed turn: its results land in the transcript, and its end in
        // a notification.
        let handoff = Arc::new(Handoff::in_background());
        // The turn goes on in the trace it began in.
        let trace_parent = self.store.turn_trace(session.id).await.unwrap_or_else(|e| {
            tracing::debug!(error = %e, "Cannot read the turn's trace context");
            None
        });
        let resumed = Resumption {
            pending,
            trace_parent,
        };
        drop(self.spawn_turn(session, parent, lease, guard, handoff, resumed));
        Ok(())
    }

    /// Runs a parent turn in a task of its own (it goes on whether or not anyone reads its
    /// events), from where the stored transcript stands. `Kill` on the parent agent cancels it.
    fn spawn_turn(
        self: &Arc<Self>,
        session: Session,
        parent: Agent,
        lease: Lease,
        guard: OwnedMutexGuard<()>,
        handoff: Arc<Handoff>,
        resumed: Resumption,
    ) -> mpsc::Receiver<Result<ParentEvent>> {
        let (tx, rx) = mpsc::channel(256);
        let turns = Arc::clone(self);
        let cancel = self.supervisor.register(parent.id);
        let span = tracing::info_span!(
            "parent_turn",
            otel.name = "parent_turn",
            session.id = %session.id,
            agent.id = %parent.id,
            forkd.session.id = %session.id,
            forkd.tenant = %session.tenant.as_str(),
            forkd.resumed = resumed.trace_parent.is_some(),
        );
        let Resumption {
            pending,
            trace_parent,
        } = resumed;
        match &trace_parent {
            Some(parent_trace) => {
                crate::trace::adopt(&span, parent_trace);
            }
            // A new turn's trace context is kept, for a daemon that resumes it.
            None => {
                if let Some(context) = crate::trace::traceparent(&span) {
                    let store = Arc::clone(&self.store);
                    let session_id = session.id;
                    self.supervisor.spawn(async move {
                        if let Err(e) = store.set_turn_trace(session_id, &context).await {
                            tracing::debug!(error = %e, "Cannot keep the turn's trace context");
                        }
                    });
                }
            }
        }
        let turn = Turn {
            session,
            parent,
            lease,
            waited: Waited::default(),
            handoff,
        };
        self.supervisor.spawn(tracing::Instrument::instrument(
            async move {
                let parent = turn.parent.id;
                // A turn's wall time is bounded by its tenant's or the daemon's `timeout`.
                let limit = turns
                    .config
                    .limits_for(turn.session.tenant.as_str(), forkd_core::Limits::default())
                    .timeout();
                let work = turns.parent_turn(&turn, &tx, &cancel, pending);
                let limited = async {
                    match limit {
                        None => work.await,
                        Some(after) => tokio::time::timeout(after, work).await.unwrap_or(Err(
                            EngineError::TurnOverLimit(forkd_core::Limit::Timeout(after)),
                        )),
                    }
                };
                let raced = turns.supervisor.race(parent, &cancel, limited).await;
                turns.supervisor.unregister(parent);
                turns.turn_starts.end(turn.session.id);
                turns.hand_back_reports(&turn).await;
                let last = match raced {
                    Raced::Done(outcome) => outcome,
                    Raced::Killed => Err(EngineError::Cancelled(
                        "the turn was cancelled by a client".into(),
                    )),
                    // The turn stays `running` and resumes at the next start.
                    Raced::Shutdown => return,
                };
                if let Err(e) = &last {
                    if matches!(e, EngineError::Draining) {
                        return;
                    }
                    if let EngineError::Store(fault) = e
                        && fault.is_fault()
                    {
                        // Stopped as if the daemon had crashed here: the turn stays `running`
                        // and resumes from its transcript once the database takes writes
                        // again (its lock freed first, so that the resumption can take it).
                        // The client hears why.
                        let reason = fault.to_string();
                        drop(guard);
                        let _ = tx.send(last).await;
                        turns.faults.interrupted(parent, reason);
                        return;
                    }
                    tracing::warn!(error = %e, "Parent turn ended without a reply");
                }
                // The session is free before the client hears the turn ended: a client that
                // sends its next message (or retries) at once must not find it still busy.
                let notification = turn.handoff.end().then(|| turn_notification(&turn, &last));
                turns
                    .release_parent(&turn.lease, notification.as_ref())
                    .await;
                drop(guard);
                let _ = tx.send(last).await;
            },
            span,
        ));
        rx
    }

    /// Sends the reports of typed agents the turn waited on but never delivered (it was
    /// cancelled or failed before storing their results) to the transcript instead.
    async fn hand_back_reports(self: &Arc<Self>, turn: &Turn) {
        // Those whose reports the turn stored already report to the transcript: no-ops.
        let waited = std::mem::take(&mut *turn.waited.lock().unwrap_or_else(|p| p.into_inner()));
        if waited.is_empty() {
            return;
        }
        let lock = self.session_locks.get(turn.session.id);
        let _guard = lock.lock().await;
        match self.store.redirect_reports(&waited).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                reports = n,
                "Undelivered typed-agent reports appended to the transcript"
            ),
            Err(e) => {
                tracing::error!(error = %e, "Cannot hand typed-agent reports back to the transcript")
            }
        }
    }

    /// The client's view of a turn: its events until the turn ends, or until the turn is handed
    /// to the background (`Background` on the parent agent, or the auto-background delay) — then
    /// `AsyncLaunched`, and the turn goes on without the client.
    fn foreground(
        self: &Arc<Self>,
        parent: AgentId,
        mut turn: mpsc::Receiver<Result<ParentEvent>>,
        mut backgrounds: tokio::sync::broadcast::Receiver<AgentId>,
        handoff: Arc<Handoff>,
    ) -> ParentEventStream {
        let (tx, rx) = mpsc::channel(256);
        let auto = self.config.auto_background;
        tokio::spawn(async move {
            let deadline = crate::attach::after(auto);
            tokio::pin!(deadline);
            let mut timer_fired = false;
            // Hands the turn to the background unless it has just ended; then its last events
            // are on their way and the client gets them.
            let launched = |tx: &mpsc::Sender<_>| {
                let tx = tx.clone();
                let handed = handoff.background();
                async move {
                    if handed {
                        let _ = tx.send(Ok(ParentEvent::AsyncLaunched(parent))).await;
                    }
                    handed
                }
            };
            loop {
                tokio::select! {
                    event = turn.recv() => match event {
                        Some(event) => {
                            if tx.send(event).await.is_err() {
                                // The client went away: nobody will see the turn end.
                                handoff.background();
                                return;
                            }
                        }
                        None => return,
                    },
                    bg = backgrounds.recv() => {
                        if matches!(bg, Ok(id) if id == parent) && launched(&tx).await {
                            return;
                        }
                    }
                    () = &mut deadline, if !timer_fired => {
                        timer_fired = true;
                        if launched(&tx).await {
                            return;
                        }
                    }
                    () = tx.closed() => {
                        handoff.background();
                        return;
                    }
                }
            }
        });
        Box::pin(ReceiverStream::new(rx))
    }

    /// The session's own main-loop agent, created on its first turn. It carries the parent's
    /// requests and tool calls; it is `running` during a turn and `pending` between turns.
    pub(crate) async fn parent_agent(self: &Arc<Self>, session: &Session) -> Result<Agent> {
        let store = &self.store;
        let agent = match store.main_loop_agent(session.id).await? {
            Some(agent) => agent,
            None => {
                let agent = Agent::new(
                    AgentId::new(),
                    session.id,
                    AgentKind::Parent,
                    AgentState::Idle,
                    now_ms(),
                );
                store.insert_agent(&agent, None, None).await?;
                agent
            }
        };
        Ok(agent)
    }

    async fn parent_turn(
        self: &Arc<Self>,
        turn: &Turn,
        events: &Events,
        cancel: &CancellationToken,
        mut pending: Option<Message>,
    ) -> Result<ParentEvent> {
        let (session, parent) = (&turn.session, &turn.parent);
        let (mut usage, mut cost) = (Usage::default(), 0.0);
        // Whether the turn goes on because a Stop hook blocked its end.
        let mut stop_active = self.stop_hook_was_active(session).await?;
        for request in 0..self.config.parent_max_turns() {
            if self.supervisor.draining() {
                return Err(EngineError::Draining);
            }
            let (reply, stop_reason) = match pending.take() {
                Some(reply) => (reply, None),
                None => {
                    self.tenancy.check_budgets(session.id, None).await?;
                    let completion = self
                        .parent_request(session, parent, &turn.lease, request, events)
                        .await?;
                    usage += completion.usage;
                    cost += crate::model::cost(
                        &self.config.models,
                        &session.params.model,
                        &completion.usage,
                    );
                    (completion.message, completion.stop_reason)
                }
            };
            for (id, name, block) in reply.tool_uses() {
                let input_json = block
                    .tool_input()
                    .map(|i| i.to_string())
                    .unwrap_or_default();
                send(
                    events,
                    ParentEvent::ToolCall {
                        tool_use_id: id.to_owned(),
                        name: name.to_owned(),
                        input_json,
                    },
                )
                .await;
            }
            if reply.tool_uses().next().is_none() {
                let text = reply.text();
                // An empty reply is not stored: the API refuses empty assistant content anywhere
                // but at the end, so it would break every later turn.
                if !reply.blocks.is_empty() {
                    self.append_to_session(turn, std::slice::from_ref(&reply), &[])
                        .await?;
                    // Its Stop hooks (which read the reply in the transcript) may keep it going,
                    // their reasons its next message.
                    if let Some(reasons) = self.stop_hooks(turn, stop_active, cancel).await? {
                        let note = crate::run::hooks::stop_hook_note(&reasons);
                        self.append_to_session(turn, &[note], &[]).await?;
                        stop_active = true;
                        continue;
                    }
                }
                return Ok(ParentEvent::TurnEnded {
                    stop_reason,
                    usage,
                    cost_usd: cost,
                    text,
                });
            }
            // Stored before any of its calls runs: a turn cut off from here on answers this same
            // reply when it resumes, so nothing it started is started twice.
            self.store
                .set_pending_reply(&turn.lease, session.id, &reply)
                .await?;
            let results = self.parent_tools(turn, reply, events, cancel).await?;
            for block in &results.blocks {
                if let forkd_core::BlockKind::ToolResult {
                    tool_use_id,
                    is_error,
                } = block.kind()
                {
                    let content = block.tool_result_text().unwrap_or_default();
                    send(
                        events,
                        ParentEvent::ToolResult {
                            tool_use_id: tool_use_id.clone(),
                            content,
                            is_error: *is_error,
                        },
                    )
                    .await;
                }
            }
        }
        Err(EngineError::TurnLimit(self.config.parent_max_turns()))
    }
}

async fn send(events: &Events, event: ParentEvent) {
    // The turn goes on when nobody listens: its results are in the transcript.
    let _ = events.send(Ok(event)).await;
}

/// What a resumed turn brings: the reply it was answering (answered again as it was, same
/// tool_use ids), and the trace context its turn began in.
#[derive(Debug, Default)]
pub(crate) struct Resumption {
    pending: Option<Message>,
    trace_parent: Option<String>,
}
