//! Parent turns: a user message in, the parent model's reply out, tools answered, until the
//! parent ends its turn. A reply that calls the `Agent` tool without `subagent_type` is a fork
//! batch, built through the same code path as a client's batch.

use forkd_core::agent::Directive;
use forkd_core::plan::{self, Forker};
use forkd_core::pricing::{self, CacheTtl};
use forkd_core::request::{self, Conversation, SerializedRequest, fingerprint};
use forkd_core::session::{CacheSafeParams, Session};
use forkd_core::tools::AGENT_TOOL;
use forkd_core::{
    Agent, AgentId, AgentKind, AgentState, BatchId, Block, Message, RequestId, Usage,
};
use forkd_provider::{Completion, ModelRequest, StreamEvent};
use forkd_store::{
    AgentFilter, IdempotencyRecord, IdempotentCall, Lease, NotificationFilter, RequestRecord,
    StoreError,
};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::{OwnedMutexGuard, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::batch::{BatchStart, SubmittedBatch};
use crate::error::{EngineError, Result};
use crate::tenancy::Idempotent;
use crate::tools::ToolTurn;
use crate::{Engine, now_ms};

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

/// A main-loop request's body on `history` (the session's transcript as it stands), and where
/// its recorded prefix ends: at its last block, the one the turn's new message (or tool results)
/// put there. Cache diagnostics rebuild recorded requests with this same function.
pub(crate) fn main_loop_body(
    params: &CacheSafeParams,
    history: Vec<Message>,
) -> (SerializedRequest, usize) {
    let body = request::serialize(params, &Conversation::plain(history), true);
    let prefix = body.spans.last().map_or(body.body.len(), |s| s.start);
    (body, prefix)
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
}

/// What the parent's reply forks: valid fork calls become children; the reply's other tool calls
/// (a typed agent, an invalid fork call, any other tool) get results of their own.
struct ForkPlan {
    forks: Vec<(String, Directive)>,
    /// Typed agent calls: tool_use id, type, directive. Run before the reply's other tools.
    typed: Vec<(String, String, Directive)>,
    /// Calls answered without running a tool: typed agents' reports and refusals.
    answered: Vec<(String, Block)>,
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
        let lease = self.inner.store.claim_agent(parent.id).await?;
        let backgrounds = self.inner.backgrounds.subscribe();
        let message = Message::user(vec![Block::text(&text)]);
        let stored = match idempotency_key.filter(|k| !k.is_empty()) {
            None => self
                .append_user(&session, &lease, &message, None)
                .await
                .map(|()| None),
            Some(key) => self.append_keyed(&session, &lease, message, &key).await,
        };
        let ended = match stored {
            Ok(None) => None,
            Ok(Some(reply)) => Some(Ok(reply)),
            Err(e) => Some(Err(e)),
        };
        if let Some(ended) = ended {
            // Nothing to run: the parent goes back to idle at once.
            self.release_parent(&lease).await;
            let reply = ended?;
            let event = ParentEvent::TurnEnded {
                stop_reason: None,
                usage: Usage::default(),
                cost_usd: 0.0,
                text: reply,
            };
            return Ok(Box::pin(futures::stream::iter([Ok(event)])));
        }
        let rx = self.spawn_turn(session, parent, lease, guard);
        Ok(self.foreground(parent_id, rx, backgrounds))
    }

    /// Appends the user's message to the transcript (with its idempotency key, if any).
    async fn append_user(
        &self,
        session: &Session,
        lease: &Lease,
        message: &Message,
        idempotency: Option<&mut IdempotencyRecord>,
    ) -> Result<()> {
        let lock = self.session_lock(session.id);
        let _guard = lock.lock().await;
        let store = &self.inner.store;
        let record = match idempotency {
            Some(record) => {
                // The key names the message it stored, by its position: read under the session
                // lock, so no notification can take that position first.
                let seq = store.session_message_count(session.id).await?;
                record.resource_id = format!("{}/{seq}", session.id);
                Some(&*record)
            }
            None => None,
        };
        store
            .append_turn(
                lease,
                session.id,
                std::slice::from_ref(message),
                &[],
                record,
                now_ms(),
            )
            .await?;
        Ok(())
    }

    /// Stores the user's message under its idempotency key. `Some(reply)`: a retry whose turn
    /// has ended already; `None`: run the turn on from the transcript.
    async fn append_keyed(
        &self,
        session: &Session,
        lease: &Lease,
        message: Message,
        key: &str,
    ) -> Result<Option<String>> {
        let canonical = serde_json::json!([session.id.to_string(), message.content_json()]);
        let digest = fingerprint(canonical.to_string().as_bytes());
        let outcome = self
            .idempotent(
                &session.tenant,
                key,
                IdempotentCall::SendMessage,
                digest,
                String::new(),
                |mut record| async move {
                    self.append_user(session, lease, &message, Some(&mut record))
                        .await
                },
            )
            .await?;
        match outcome {
            Idempotent::Created(()) => Ok(None),
            Idempotent::Earlier(resource) => self.turn_reply(session.id, &resource).await,
        }
    }

    /// The reply that ended the turn of a stored user message (`SESSION_ID/SEQ`), if that turn
    /// has ended.
    async fn turn_reply(
        &self,
        session: forkd_core::SessionId,
        resource: &str,
    ) -> Result<Option<String>> {
        let seq = resource
            .rsplit_once('/')
            .and_then(|(_, seq)| seq.parse::<u64>().ok())
            .ok_or_else(|| {
                EngineError::Invariant(format!("stored message key {resource:?} does not parse"))
            })?;
        let messages = self.inner.store.session_messages(session, None).await?;
        let reply = messages
            .iter()
            .filter(|m| m.seq > seq)
            .map(|m| &m.message)
            .find(|m| m.role == forkd_core::Role::Assistant && m.tool_uses().next().is_none());
        if let Some(reply) = reply {
            return Ok(Some(reply.text()));
        }
        // A turn whose last reply was empty (and so not stored) ended too.
        let ended = messages
            .last()
            .is_some_and(|m| m.message.role == forkd_core::Role::Assistant);
        Ok(ended.then(String::new))
    }

    /// Marks the parent idle again.
    async fn release_parent(&self, lease: &Lease) {
        match self
            .inner
            .store
            .release_agent(lease, AgentState::Pending)
            .await
        {
            Ok(()) | Err(StoreError::Superseded { .. }) => {}
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
        let last = self
            .inner
            .store
            .session_messages(session.id, None)
            .await?
            .pop()
            .map(|m| m.message);
        if last.is_none_or(|m| m.role == forkd_core::Role::Assistant) {
            // The turn had ended; only its state was left behind.
            self.inner
                .store
                .release_agent(&lease, AgentState::Pending)
                .await?;
            return Ok(());
        }
        tracing::info!(session.id = %session.id, agent.id = %parent.id, "Resuming a parent turn");
        // Nobody listens to a resumed turn; its results land in the transcript.
        drop(self.spawn_turn(session, parent, lease, guard));
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
    ) -> mpsc::Receiver<Result<ParentEvent>> {
        let (tx, rx) = mpsc::channel(256);
        let engine = self.clone();
        let cancel = self.inner.shutdown.child_token();
        self.runs().insert(parent.id, cancel.clone());
        let span =
            tracing::info_span!("parent_turn", session.id = %session.id, agent.id = %parent.id);
        let turn = Turn {
            session,
            parent,
            lease,
            waited: Waited::default(),
        };
        self.inner.tasks.spawn(tracing::Instrument::instrument(
            async move {
                let outcome = tokio::select! {
                    biased;
                    () = cancel.cancelled() => None,
                    outcome = engine.parent_turn(&turn, &tx, &cancel) => Some(outcome),
                };
                let parent = turn.parent.id;
                let killed = engine.take_killed(parent);
                engine.runs().remove(&parent);
                engine.hand_back_reports(&turn).await;
                let last = match outcome {
                    Some(outcome) => outcome,
                    None if killed => Err(EngineError::Cancelled(
                        "the turn was cancelled by a client".into(),
                    )),
                    // Shutdown: the turn stays `running` and resumes at the next start.
                    None => return,
                };
                if let Err(e) = &last {
                    if matches!(e, EngineError::Draining) {
                        return;
                    }
                    tracing::warn!(error = %e, "Parent turn ended without a reply");
                }
                // The session is free before the client hears the turn ended: a client that
                // sends its next message (or retries) at once must not find it still busy.
                engine.release_parent(&turn.lease).await;
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
    ) -> ParentEventStream {
        let (tx, rx) = mpsc::channel(256);
        let auto = self.config().auto_background;
        tokio::spawn(async move {
            let deadline = crate::attach::after(auto);
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    event = turn.recv() => match event {
                        Some(event) => {
                            if tx.send(event).await.is_err() {
                                return;
                            }
                        }
                        None => return,
                    },
                    bg = backgrounds.recv() => {
                        if matches!(bg, Ok(id) if id == parent) {
                            let _ = tx.send(Ok(ParentEvent::AsyncLaunched(parent))).await;
                            return;
                        }
                    }
                    () = &mut deadline => {
                        let _ = tx.send(Ok(ParentEvent::AsyncLaunched(parent))).await;
                        return;
                    }
                    () = tx.closed() => return,
                }
            }
        });
        Box::pin(ReceiverStream::new(rx))
    }

    /// The session's own main-loop agent, created on its first turn. It carries the parent's
    /// requests and tool calls; it is `running` during a turn and `pending` between turns.
    async fn parent_agent(&self, session: &Session) -> Result<Agent> {
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
                    state: AgentState::Pending,
                    directive: None,
                    query_source: None,
                    report_to: forkd_core::ReportTo::Transcript,
                    usage: Usage::default(),
                    cost_usd: 0.0,
                    error: None,
                    created_at_ms: now,
                    updated_at_ms: now,
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
    ) -> Result<ParentEvent> {
        let (session, parent) = (&turn.session, &turn.parent);
        let (mut usage, mut cost) = (Usage::default(), 0.0);
        for request in 0..self.config().max_turns {
            if self.draining() {
                return Err(EngineError::Draining);
            }
            self.check_budgets(session.id, None).await?;
            let completion = self
                .parent_request(session, parent, request, events)
                .await?;
            usage += completion.usage;
            cost += self.cost(session, &completion.usage);
            let reply = completion.message;
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
                    stop_reason: completion.stop_reason,
                    usage,
                    cost_usd: cost,
                    text: reply.text(),
                });
            }
            let results = self.parent_tools(turn, reply, events, cancel).await?;
            for block in &results.blocks {
                if let forkd_core::BlockKind::ToolResult {
                    tool_use_id,
                    is_error,
                } = block.kind()
                {
                    let content = block
                        .raw()
                        .value()
                        .get("content")
                        .and_then(|c| c.as_str())
                        .unwrap_or("")
                        .to_owned();
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

    /// One model request of the parent on its whole transcript, streaming text to the client.
    async fn parent_request(
        &self,
        session: &Session,
        parent: &Agent,
        turn: u32,
        events: &Events,
    ) -> Result<Completion> {
        let history: Vec<Message> = self
            .inner
            .store
            .session_messages(session.id, None)
            .await?
            .into_iter()
            .map(|m| m.message)
            .collect();
        let message_count = u32::try_from(history.len()).ok();
        let (body, prefix) = main_loop_body(&session.params, history);
        let record_fingerprint = fingerprint(&body.body.as_bytes()[..prefix]);
        let prefix_parts =
            crate::diagnose::prefix_parts(&body, session.params.tools.raw().len(), prefix);
        let body_bytes = body.body.len() as u64;
        let request_id = RequestId::new();
        let span = tracing::info_span!("model_request", request.id = %request_id, turn, body_bytes);
        let req = ModelRequest {
            model: session.params.model.clone(),
            body: body.body.into(),
        };
        let tx = events.clone();
        let timed = self
            .request_with_retries(req, &mut |event| {
                if let StreamEvent::TextDelta { text, .. } = event {
                    // A full queue means a slow reader: it misses a delta, never the turn.
                    let _ = tx.try_send(Ok(ParentEvent::TextDelta(text.clone())));
                }
            })
            .instrument(span)
            .await?;
        let completion = timed.completion;
        let cost_usd = self.cost(session, &completion.usage);
        self.inner
            .store
            .record_request(&RequestRecord {
                id: request_id,
                agent_id: parent.id,
                session_id: session.id,
                batch_id: None,
                turn,
                model: session.params.model.clone(),
                usage: completion.usage,
                cost_usd,
                prefix_fingerprint: record_fingerprint,
                prefix_parts,
                message_count,
                body_bytes,
                first_token_ms: timed.first_token.map(crate::millis),
                stop_reason: completion.stop_reason.clone(),
                created_at_ms: now_ms(),
            })
            .await?;
        crate::metrics::request(
            &session.params.model,
            parent.kind.as_str(),
            &completion.usage,
            cost_usd,
            timed.took,
            timed.first_token,
        );
        Ok(completion)
    }

    fn cost(&self, session: &Session, usage: &Usage) -> f64 {
        pricing::model(&session.params.model)
            .map(|m| usage.cost_usd(m, CacheTtl::FiveMinutes))
            .unwrap_or(0.0)
    }

    /// Appends the turn's messages to the transcript in one transaction, with nothing in
    /// between (a reply and its tool results must be adjacent); `delivered` are the typed agents
    /// whose reports those messages carry.
    async fn append_to_session(
        &self,
        turn: &Turn,
        messages: &[Message],
        delivered: &[AgentId],
    ) -> Result<u64> {
        let lock = self.session_lock(turn.session.id);
        let _guard = lock.lock().await;
        Ok(self
            .inner
            .store
            .append_turn(
                &turn.lease,
                turn.session.id,
                messages,
                delivered,
                None,
                now_ms(),
            )
            .await?)
    }

    /// Waits until every child of a batch the parent forked has ended (their notifications are
    /// then in the transcript): forks that are not always asynchronous.
    async fn wait_for_children(&self, batch: &SubmittedBatch) -> Result<()> {
        let filter = NotificationFilter {
            batch_id: Some(batch.batch_id),
            ..NotificationFilter::default()
        };
        let mut ended = self.subscribe(0, filter, true).await?;
        let mut left = batch.agent_ids.len();
        while left > 0 {
            match ended.next().await {
                Some(Ok(_)) => left -= 1,
                Some(Err(e)) => return Err(e),
                None => return Err(EngineError::Draining),
            }
        }
        Ok(())
    }

    /// Answers the tool calls of a parent reply. A reply that forks is stored as a fork batch
    /// (which appends it and the parent's results to the transcript); any other reply is
    /// appended, its tools run, and their results appended.
    async fn parent_tools(
        &self,
        turn: &Turn,
        reply: Message,
        events: &Events,
        cancel: &CancellationToken,
    ) -> Result<Message> {
        let session = &turn.session;
        let mut plan = self.fork_plan(session, &reply);
        // Typed agents whose reports these results carry.
        let mut delivered = Vec::new();
        for (id, ty, directive) in std::mem::take(&mut plan.typed) {
            let result = match self
                .run_typed(session.id, &ty, directive, &turn.waited)
                .await
            {
                Ok(note) => {
                    delivered.push(note.agent_id);
                    Block::tool_result(
                        &id,
                        &format!(
                            "Agent {} ({ty}) {}:\n{}",
                            note.agent_id,
                            note.status.as_str(),
                            note.report.to_text()
                        ),
                        note.status != forkd_core::NotificationStatus::Completed,
                    )
                }
                Err(e) => {
                    Block::tool_result(&id, &format!("The {ty} agent could not run: {e}"), true)
                }
            };
            plan.answered.push((id, result));
        }
        if plan.forks.is_empty() {
            // The reply is stored only with its results, in one step under the session lock: a
            // notification landing between a tool_use and its tool_result (or a reply left
            // without results by a crash) would make every later request invalid.
            let results = self
                .run_parent_tools(turn, &reply, &plan.answered, cancel)
                .await?;
            self.append_to_session(turn, &[reply, results.clone()], &delivered)
                .await?;
            return Ok(results);
        }
        let mut others = plan.answered;
        let non_agent = Message::assistant(
            reply
                .blocks
                .iter()
                .filter(|b| matches!(b.kind(), forkd_core::BlockKind::ToolUse { name, .. } if name != AGENT_TOOL))
                .cloned()
                .collect(),
        );
        let ran = self.run_parent_tools(turn, &non_agent, &[], cancel).await?;
        for block in ran.blocks {
            if let forkd_core::BlockKind::ToolResult { tool_use_id, .. } = block.kind() {
                others.push((tool_use_id.clone(), block.clone()));
            }
        }
        let batch_id = BatchId::new();
        let submitted = self
            .commit_and_start(BatchStart {
                session_id: session.id,
                batch_id,
                assistant: reply,
                forks: plan.forks,
                others,
                gating: self.config().warmup_gating,
                idempotency: None,
                budget: forkd_store::Budget::default(),
                turn: Some((turn.lease, delivered)),
            })
            .await?;
        send(events, ParentEvent::ForkLaunched(submitted.clone())).await;
        if !self.config().fork_always_async {
            self.wait_for_children(&submitted).await?;
        }
        // The parent's results sit right after the fork message.
        let fork_point = self.get_batch(submitted.batch_id).await?.fork_point;
        let messages = self
            .inner
            .store
            .session_messages(session.id, Some(fork_point + 2))
            .await?;
        Ok(messages
            .into_iter()
            .next_back()
            .filter(|m| m.seq == fork_point + 1)
            .map(|m| m.message)
            .unwrap_or_else(|| Message::user(Vec::new())))
    }

    /// Runs the parent's non-fork tool calls; the calls in `refused` are already answered.
    async fn run_parent_tools(
        &self,
        turn: &Turn,
        reply: &Message,
        refused: &[(String, Block)],
        cancel: &CancellationToken,
    ) -> Result<Message> {
        let runnable = Message::assistant(
            reply
                .blocks
                .iter()
                .filter(|b| match b.kind() {
                    forkd_core::BlockKind::ToolUse { id, .. } => {
                        !refused.iter().any(|(r, _)| r == id)
                    }
                    _ => false,
                })
                .cloned()
                .collect(),
        );
        let conversation = [reply.clone()];
        let (session, parent) = (&turn.session, &turn.parent);
        let turn = ToolTurn {
            agent: parent,
            lease: &turn.lease,
            session,
            permission_mode: session.permission_mode,
            offered: session.params.tools.names(),
            conversation: &conversation,
            cancel: cancel.clone(),
        };
        let ran = self.run_tools(&turn, &runnable).await?;
        let blocks = reply
            .tool_uses()
            .filter_map(|(id, _, _)| {
                refused
                    .iter()
                    .find(|(r, _)| r == id)
                    .map(|(_, b)| b.clone())
                    .or_else(|| {
                        ran.blocks.iter().find(|b| {
                            matches!(b.kind(), forkd_core::BlockKind::ToolResult { tool_use_id, .. } if tool_use_id == id)
                        }).cloned()
                    })
            })
            .collect();
        Ok(Message::user(blocks))
    }

    /// What the parent's reply forks, by the one fork plan: a session's own turn is never a
    /// fork child's, so only the coordinator rule and the limits apply.
    fn fork_plan(&self, session: &Session, reply: &Message) -> ForkPlan {
        let forker = Forker {
            coordinator: session.coordinator,
            child: None,
            limits: self.fork_limits(),
        };
        let plan = plan::plan(reply, &forker);
        ForkPlan {
            forks: plan.forks,
            typed: plan.typed,
            answered: plan
                .refused
                .into_iter()
                .map(|(id, refusal)| {
                    let result = Block::tool_result(&id, &refusal.to_model(), true);
                    (id, result)
                })
                .collect(),
        }
    }
}

async fn send(events: &Events, event: ParentEvent) {
    // The turn goes on when nobody listens: its results are in the transcript.
    let _ = events.send(Ok(event)).await;
}
