//! Parent turns: a user message in, the parent model's reply out, tools answered, until the
//! parent ends its turn. A reply that calls the `Agent` tool without `subagent_type` is a fork
//! batch, built through the same code path as a client's batch.

use forkd_core::request::Conversation;
use forkd_core::session::Session;
use std::sync::Arc;

use forkd_core::report::Report;
use forkd_core::store::{AgentFilter, Lease, NewNotification, StoreError};
use forkd_core::{
    Agent, AgentId, AgentKind, AgentState, Block, Message, NotificationStatus, Usage,
};
use forkd_provider::{Completion, StreamEvent};
use futures::stream::BoxStream;
use tokio::sync::{OwnedMutexGuard, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::batch::SubmittedBatch;
use crate::compact::too_long;
use crate::error::{EngineError, Result};
use crate::model::{ModelCall, PrefixEnd};
use crate::run::Raced;
use crate::{Engine, now_ms};
use message::Stored;

mod message;
mod tools;

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

/// Whether a turn was handed to the background before it ended: then no client sees its end,
/// and the turn ends with a notification of kind `turn` instead. Deciding both under one lock
/// means exactly one of the two happens: the client hears the turn's end, or it heard
/// `AsyncLaunched` and the notification stream hears the end.
#[derive(Debug, Default)]
pub(crate) struct Handoff(std::sync::Mutex<HandoffState>);

#[derive(Debug, Default)]
struct HandoffState {
    backgrounded: bool,
    ended: bool,
}

impl Handoff {
    /// A turn no client watches (one resumed after a restart) is in the background from the
    /// start.
    fn in_background() -> Self {
        Handoff(std::sync::Mutex::new(HandoffState {
            backgrounded: true,
            ended: false,
        }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HandoffState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands the turn to the background, unless it has ended already (false: its end is on its
    /// way to the client).
    pub(crate) fn background(&self) -> bool {
        let mut state = self.state();
        if !state.ended {
            state.backgrounded = true;
        }
        !state.ended
    }

    /// Whether the turn's handoff already happened.
    pub(crate) fn is_backgrounded(&self) -> bool {
        self.state().backgrounded
    }

    /// Ends the turn; true when it was in the background (its end is a notification).
    fn end(&self) -> bool {
        let mut state = self.state();
        state.ended = true;
        state.backgrounded
    }
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

impl Engine {
    /// Runs one parent turn on `text`. Turns of one session run one at a time.
    pub async fn send_message(
        &self,
        session_id: forkd_core::SessionId,
        text: String,
    ) -> Result<ParentEventStream> {
        let session = self.get_session(session_id).await?;
        self.send_message_in(session, text, None).await
    }

    /// [`Engine::send_message`] on a session already read. With an idempotency key the user's
    /// message is stored with the key, and a retry stores nothing: it continues the turn from
    /// where the transcript stands, or, when that turn has ended, answers with its reply.
    pub(crate) async fn send_message_in(
        &self,
        session: Session,
        text: String,
        idempotency_key: Option<String>,
    ) -> Result<ParentEventStream> {
        if text.trim().is_empty() {
            return Err(EngineError::InvalidRequest("the message is empty".into()));
        }
        let max = self.config().max_directive_bytes;
        if text.len() > max {
            return Err(EngineError::InvalidRequest(format!(
                "the message is {} bytes; the limit is {max}",
                text.len()
            )));
        }
        let turn_lock = self.turn_lock(session.id);
        let guard = turn_lock.try_lock_owned().map_err(|_| {
            EngineError::WrongState(format!(
                "session {} is already running a turn; wait for it to end",
                session.id
            ))
        })?;
        let parent = self.parent_agent(&session).await?;
        let parent_id = parent.id;
        let lease = self.claim_main_loop(&parent).await?;
        let backgrounds = self.inner.backgrounds.subscribe();
        let message = Message::user(vec![Block::text(&text)]);
        let stored = self
            .store_message(&session, &lease, message, idempotency_key)
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
        self.turn_starts().insert(session.id, start);
        let handoff = Arc::new(Handoff::default());
        let rx = self.spawn_turn(session, parent, lease, guard, handoff.clone(), None);
        Ok(self.foreground(parent_id, rx, backgrounds, handoff))
    }

    /// Claims a session's main loop for a turn (or a compaction): refused while a turn runs on
    /// another daemon, whose lease on the main loop has not expired.
    pub(crate) async fn claim_main_loop(&self, parent: &Agent) -> Result<Lease> {
        match self.inner.store.claim_agent(parent.id).await {
            Err(StoreError::Held { daemon, .. }) => Err(EngineError::WrongState(format!(
                "session {} is already running a turn (on daemon {daemon}); wait for it to end",
                parent.session_id
            ))),
            other => Ok(other?),
        }
    }

    /// Marks the parent idle again, with the turn's notification when it was handed to the
    /// background.
    async fn release_parent(&self, lease: &Lease, notification: Option<&NewNotification>) {
        // Commit and broadcast under one lock, so subscribers see notifications in seq order.
        let _order = match notification {
            Some(_) => Some(self.inner.notify_order.lock().await),
            None => None,
        };
        match self.inner.store.end_turn(lease, notification).await {
            Ok(Some(stored)) => {
                tracing::info!(
                    status = stored.status.as_str(),
                    seq = stored.seq,
                    "Turn ended in the background"
                );
                self.publish(stored);
            }
            Ok(None) | Err(StoreError::Superseded { .. }) => {}
            Err(e) => tracing::warn!(error = %e, "Cannot mark the parent idle"),
        }
    }

    /// Continues a parent turn that a previous daemon left running: the parent's transcript is
    /// a valid conversation at every commit (a reply is stored only with its tool results), so
    /// the turn re-requests from where it stands, with the same bytes, and reads the cache.
    pub(crate) async fn resume_turn(&self, parent: Agent) -> Result<()> {
        let session = self.get_session(parent.session_id).await?;
        let Ok(guard) = self.turn_lock(session.id).try_lock_owned() else {
            return Ok(());
        };
        let lease = self.inner.store.claim_agent(parent.id).await?;
        let messages = self.inner.store.session_messages(session.id, None).await?;
        let last = messages.last().map(|m| &m.message);
        if last.is_none_or(|m| m.role == forkd_core::Role::Assistant) {
            // The turn had ended; only its state was left behind.
            self.inner.store.end_turn(&lease, None).await?;
            return Ok(());
        }
        // The reply it was answering, if it had one: answered again as it was (same tool_use
        // ids), not asked for anew.
        let pending = self.inner.store.pending_reply(session.id).await?;
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
        self.turn_starts().insert(session.id, start);
        // Nobody listens to a resumed turn: its results land in the transcript, and its end in
        // a notification.
        let handoff = Arc::new(Handoff::in_background());
        drop(self.spawn_turn(session, parent, lease, guard, handoff, pending));
        Ok(())
    }

    /// Runs a parent turn in a task of its own (it goes on whether or not anyone reads its
    /// events), from where the stored transcript stands. `Kill` on the parent agent cancels it.
    fn spawn_turn(
        &self,
        session: Session,
        parent: Agent,
        lease: Lease,
        guard: OwnedMutexGuard<()>,
        handoff: Arc<Handoff>,
        pending: Option<Message>,
    ) -> mpsc::Receiver<Result<ParentEvent>> {
        let (tx, rx) = mpsc::channel(256);
        let engine = self.clone();
        let cancel = self.register_run(parent.id);
        let span =
            tracing::info_span!("parent_turn", session.id = %session.id, agent.id = %parent.id);
        let turn = Turn {
            session,
            parent,
            lease,
            waited: Waited::default(),
            handoff,
        };
        self.inner.tasks.spawn(tracing::Instrument::instrument(
            async move {
                let parent = turn.parent.id;
                let raced = engine
                    .race(
                        parent,
                        &cancel,
                        engine.parent_turn(&turn, &tx, &cancel, pending),
                    )
                    .await;
                engine.unregister_run(parent);
                engine.turn_starts().remove(&turn.session.id);
                engine.hand_back_reports(&turn).await;
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
                    tracing::warn!(error = %e, "Parent turn ended without a reply");
                }
                // The session is free before the client hears the turn ended: a client that
                // sends its next message (or retries) at once must not find it still busy.
                let notification = turn.handoff.end().then(|| turn_notification(&turn, &last));
                engine
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
    async fn hand_back_reports(&self, turn: &Turn) {
        // Those whose reports the turn stored already report to the transcript: no-ops.
        let waited = std::mem::take(&mut *turn.waited.lock().unwrap_or_else(|p| p.into_inner()));
        if waited.is_empty() {
            return;
        }
        let lock = self.session_lock(turn.session.id);
        let _guard = lock.lock().await;
        match self.inner.store.redirect_reports(&waited).await {
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
        &self,
        parent: AgentId,
        mut turn: mpsc::Receiver<Result<ParentEvent>>,
        mut backgrounds: tokio::sync::broadcast::Receiver<AgentId>,
        handoff: Arc<Handoff>,
    ) -> ParentEventStream {
        let (tx, rx) = mpsc::channel(256);
        let auto = self.config().auto_background;
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
    pub(crate) async fn parent_agent(&self, session: &Session) -> Result<Agent> {
        let store = &self.inner.store;
        let existing = store
            .list_agents(&AgentFilter {
                session_id: Some(session.id),
                include_ended: true,
                ..AgentFilter::default()
            })
            .await?
            .into_iter()
            .find(|a| a.kind == AgentKind::Parent);
        let agent = match existing {
            Some(agent) => agent,
            None => {
                let now = now_ms();
                let agent = Agent {
                    id: AgentId::new(),
                    session_id: session.id,
                    batch_id: None,
                    kind: AgentKind::Parent,
                    index: 0,
                    state: AgentState::Idle,
                    directive: None,
                    query_source: None,
                    report_to: forkd_core::ReportTo::Transcript,
                    usage: Usage::default(),
                    cost_usd: 0.0,
                    error: None,
                    created_at_ms: now,
                    updated_at_ms: now,
                    held_by: None,
                    throttled_since_ms: None,
                };
                store.insert_agent(&agent, None, None).await?;
                agent
            }
        };
        Ok(agent)
    }

    async fn parent_turn(
        &self,
        turn: &Turn,
        events: &Events,
        cancel: &CancellationToken,
        mut pending: Option<Message>,
    ) -> Result<ParentEvent> {
        let (session, parent) = (&turn.session, &turn.parent);
        let (mut usage, mut cost) = (Usage::default(), 0.0);
        for request in 0..self.config().max_turns {
            if self.draining() {
                return Err(EngineError::Draining);
            }
            let (reply, stop_reason) = match pending.take() {
                Some(reply) => (reply, None),
                None => {
                    self.check_budgets(session.id, None).await?;
                    let completion = self
                        .parent_request(session, parent, &turn.lease, request, events)
                        .await?;
                    usage += completion.usage;
                    cost += crate::model::cost(
                        &self.config().models,
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
                // An empty reply is not stored: the API refuses empty assistant content anywhere
                // but at the end, so it would break every later turn.
                if !reply.blocks.is_empty() {
                    self.append_to_session(turn, std::slice::from_ref(&reply), &[])
                        .await?;
                }
                return Ok(ParentEvent::TurnEnded {
                    stop_reason,
                    usage,
                    cost_usd: cost,
                    text: reply.text(),
                });
            }
            // Stored before any of its calls runs: a turn cut off from here on answers this same
            // reply when it resumes, so nothing it started is started twice.
            self.inner
                .store
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
        Err(EngineError::TurnLimit(self.config().max_turns))
    }

    /// One model request of the parent on its transcript (from its latest compaction boundary),
    /// streaming text to the client. A request that would pass the compaction threshold
    /// compacts the transcript first.
    async fn parent_request(
        &self,
        session: &Session,
        parent: &Agent,
        lease: &Lease,
        turn: u32,
        events: &Events,
    ) -> Result<Completion> {
        let mut view = self.parent_view(session).await?;
        // The main loop's request is the session's transcript: its counts are kept.
        let mut input_tokens = self.view_tokens(session, &view).await?;
        if self.needs_compaction(&session.params, input_tokens) {
            match self.compact(session, parent, lease, turn, None).await {
                Ok(_) => {
                    view = self.parent_view(session).await?;
                    input_tokens = self.view_tokens(session, &view).await?;
                }
                // Nothing to compact yet: the window check below decides.
                Err(EngineError::WrongState(why)) => {
                    tracing::warn!(%why, "The request passes the compaction threshold");
                }
                Err(e) => return Err(e),
            }
        }
        match self
            .parent_call(session, parent, turn, view.messages, input_tokens, events)
            .await
        {
            // The provider counts more tokens than forkd did: compact, and ask once more.
            Err(EngineError::Provider(e)) if e.is_prompt_too_long() => {
                tracing::warn!(error = %e, "The provider says the prompt is too long; compacting");
                match self.compact(session, parent, lease, turn, None).await {
                    Ok(_) => {}
                    Err(EngineError::WrongState(why)) => {
                        return Err(too_long(&e, &format!("and it cannot be compacted: {why}")));
                    }
                    Err(other) => return Err(other),
                }
                let view = self.parent_view(session).await?;
                let input_tokens = self.view_tokens(session, &view).await?;
                self.parent_call(session, parent, turn, view.messages, input_tokens, events)
                    .await
                    .map_err(|again| match again {
                        EngineError::Provider(e) if e.is_prompt_too_long() => {
                            too_long(&e, "even after the transcript was compacted")
                        }
                        other => other,
                    })
            }
            other => other,
        }
    }

    /// Sends one parent request on `messages`, streaming its text to the client.
    async fn parent_call(
        &self,
        session: &Session,
        parent: &Agent,
        turn: u32,
        messages: Vec<Message>,
        input_tokens: u64,
        events: &Events,
    ) -> Result<Completion> {
        let call = ModelCall {
            agent: parent,
            turn,
            params: &session.params,
            conversation: &Conversation::plain(messages),
            prefix: PrefixEnd::LastBlock,
            input_tokens: Some(input_tokens),
        };
        let tx = events.clone();
        let answer = self
            .call_model(call, &mut |event| {
                if let StreamEvent::TextDelta { text, .. } = event {
                    // A full queue means a slow reader: it misses a delta, never the turn.
                    let _ = tx.try_send(Ok(ParentEvent::TextDelta(text.clone())));
                }
            })
            .await?;
        Ok(answer.completion)
    }
}

async fn send(events: &Events, event: ParentEvent) {
    // The turn goes on when nobody listens: its results are in the transcript.
    let _ = events.send(Ok(event)).await;
}
