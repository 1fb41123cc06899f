//! Parent turns: a user message in, the parent model's reply out, tools answered, until the
//! parent ends its turn. A reply that calls the `Agent` tool without `subagent_type` is a fork
//! batch, built through the same code path as a client's batch.

use forkd_core::agent::Directive;
use forkd_core::fork::{self, fork_refusal};
use forkd_core::pricing::{self, CacheTtl};
use forkd_core::request::{self, Conversation, fingerprint};
use forkd_core::session::Session;
use forkd_core::tools::AGENT_TOOL;
use forkd_core::{
    Agent, AgentId, AgentKind, AgentState, BatchId, Block, Message, RequestId, Usage,
};
use forkd_provider::{Completion, ModelRequest, StreamEvent};
use forkd_store::{AgentFilter, RequestRecord};
use futures::stream::BoxStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::batch::{BatchStart, SubmittedBatch};
use crate::error::{EngineError, Result};
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

/// The events of one parent turn; the turn runs on whether or not anyone reads them.
pub type ParentEventStream = BoxStream<'static, Result<ParentEvent>>;

type Events = mpsc::Sender<Result<ParentEvent>>;

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
        if text.trim().is_empty() {
            return Err(EngineError::InvalidArgument("the message is empty".into()));
        }
        let max = self.config().max_directive_bytes;
        if text.len() > max {
            return Err(EngineError::InvalidArgument(format!(
                "the message is {} bytes; the limit is {max}",
                text.len()
            )));
        }
        let session = self.get_session(session_id).await?;
        let turn_lock = self.turn_lock(session_id);
        let guard = turn_lock.try_lock_owned().map_err(|_| {
            EngineError::FailedPrecondition(format!(
                "session {session_id} is already running a turn; wait for it to end"
            ))
        })?;
        let parent = self.parent_agent(&session).await?;
        let parent_id = parent.id;
        let (tx, rx) = mpsc::channel(256);
        let backgrounds = self.inner.backgrounds.subscribe();
        let engine = self.clone();
        let cancel = self.inner.shutdown.child_token();
        let span =
            tracing::info_span!("parent_turn", session.id = %session_id, agent.id = %parent.id);
        self.inner.tasks.spawn(tracing::Instrument::instrument(
            async move {
                let _turn = guard;
                let outcome = tokio::select! {
                    biased;
                    () = cancel.cancelled() => return,
                    outcome = engine.parent_turn(&session, &parent, text, &tx, &cancel) => outcome,
                };
                if let Err(e) = outcome {
                    tracing::warn!(error = %e, "Parent turn failed");
                    let _ = tx.send(Err(e)).await;
                }
                let _ = engine
                    .inner
                    .store
                    .set_agent_state(parent.id, AgentState::Pending, None)
                    .await;
            },
            span,
        ));
        Ok(self.foreground(parent_id, rx, backgrounds))
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
        store
            .set_agent_state(agent.id, AgentState::Running, None)
            .await?;
        Ok(agent)
    }

    async fn parent_turn(
        &self,
        session: &Session,
        parent: &Agent,
        text: String,
        events: &Events,
        cancel: &CancellationToken,
    ) -> Result<()> {
        self.append_to_session(session, &Message::user(vec![Block::text(&text)]))
            .await?;
        let (mut usage, mut cost) = (Usage::default(), 0.0);
        for turn in 0..self.config().max_turns {
            if self.draining() {
                return Err(EngineError::Draining);
            }
            let completion = self.parent_request(session, parent, turn, events).await?;
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
                    self.append_to_session(session, &reply).await?;
                }
                send(
                    events,
                    ParentEvent::TurnEnded {
                        stop_reason: completion.stop_reason,
                        usage,
                        cost_usd: cost,
                        text: reply.text(),
                    },
                )
                .await;
                return Ok(());
            }
            let results = self
                .parent_tools(session, parent, reply, events, cancel)
                .await?;
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
        Err(EngineError::FailedPrecondition(format!(
            "the parent did not end its turn within {} requests",
            self.config().max_turns
        )))
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
        let body = request::serialize(&session.params, &Conversation::plain(history), true);
        let prefix = body.spans.last().map_or(body.body.len(), |s| s.start);
        let record_fingerprint = fingerprint(&body.body.as_bytes()[..prefix]);
        let body_bytes = body.body.len() as u64;
        let req = ModelRequest {
            model: session.params.model.clone(),
            body: body.body.into(),
        };
        let tx = events.clone();
        let completion = self
            .request_with_retries(req, &mut |event| {
                if let StreamEvent::TextDelta { text, .. } = event {
                    // A full queue means a slow reader: it misses a delta, never the turn.
                    let _ = tx.try_send(Ok(ParentEvent::TextDelta(text.clone())));
                }
            })
            .await
            .map_err(|e| EngineError::FailedPrecondition(format!("model request failed: {e}")))?;
        self.inner
            .store
            .record_request(&RequestRecord {
                id: RequestId::new(),
                agent_id: parent.id,
                session_id: session.id,
                batch_id: None,
                turn,
                model: session.params.model.clone(),
                usage: completion.usage,
                cost_usd: self.cost(session, &completion.usage),
                prefix_fingerprint: record_fingerprint,
                body_bytes,
                stop_reason: completion.stop_reason.clone(),
                created_at_ms: now_ms(),
            })
            .await?;
        Ok(completion)
    }

    fn cost(&self, session: &Session, usage: &Usage) -> f64 {
        pricing::model(&session.params.model)
            .map(|m| usage.cost_usd(m, CacheTtl::FiveMinutes))
            .unwrap_or(0.0)
    }

    async fn append_to_session(&self, session: &Session, message: &Message) -> Result<u64> {
        let lock = self.session_lock(session.id);
        let _guard = lock.lock().await;
        Ok(self
            .inner
            .store
            .append_session_message(session.id, message, now_ms())
            .await?)
    }

    /// Appends a reply and its tool results with nothing in between.
    async fn append_pair_to_session(
        &self,
        session: &Session,
        reply: &Message,
        results: &Message,
    ) -> Result<()> {
        let lock = self.session_lock(session.id);
        let _guard = lock.lock().await;
        let store = &self.inner.store;
        store
            .append_session_message(session.id, reply, now_ms())
            .await?;
        store
            .append_session_message(session.id, results, now_ms())
            .await?;
        Ok(())
    }

    /// Answers the tool calls of a parent reply. A reply that forks is stored as a fork batch
    /// (which appends it and the parent's results to the transcript); any other reply is
    /// appended, its tools run, and their results appended.
    async fn parent_tools(
        &self,
        session: &Session,
        parent: &Agent,
        reply: Message,
        events: &Events,
        cancel: &CancellationToken,
    ) -> Result<Message> {
        let mut plan = self.fork_plan(session, &reply);
        for (id, ty, directive) in std::mem::take(&mut plan.typed) {
            let result = match self.run_typed(session.id, &ty, directive).await {
                Ok(note) => Block::tool_result(
                    &id,
                    &format!(
                        "Agent {} ({ty}) {}:\n{}",
                        note.agent_id,
                        note.status.as_str(),
                        note.report.to_text()
                    ),
                    note.status != forkd_core::NotificationStatus::Completed,
                ),
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
                .run_parent_tools(session, parent, &reply, &plan.answered, cancel)
                .await?;
            self.append_pair_to_session(session, &reply, &results)
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
        let ran = self
            .run_parent_tools(session, parent, &non_agent, &[], cancel)
            .await?;
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
            })
            .await?;
        send(events, ParentEvent::ForkLaunched(submitted)).await;
        let messages = self.inner.store.session_messages(session.id, None).await?;
        Ok(messages
            .into_iter()
            .rev()
            .find(|m| m.message.role == forkd_core::Role::User)
            .map(|m| m.message)
            .unwrap_or_else(|| Message::user(Vec::new())))
    }

    /// Runs the parent's non-fork tool calls; the calls in `refused` are already answered.
    async fn run_parent_tools(
        &self,
        session: &Session,
        parent: &Agent,
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
        let turn = ToolTurn {
            agent: parent,
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

    /// Which of a parent reply's `Agent` calls fork, and which are refused with what error.
    fn fork_plan(&self, session: &Session, reply: &Message) -> ForkPlan {
        let max = self.config().max_directive_bytes;
        let mut plan = ForkPlan {
            forks: Vec::new(),
            typed: Vec::new(),
            answered: Vec::new(),
        };
        for (id, name, block) in reply.tool_uses() {
            if name != AGENT_TOOL {
                continue;
            }
            let input = block.tool_input().unwrap_or_default();
            let directive = Directive::from_agent_input(&input);
            if let Some(ty) = input.get("subagent_type").and_then(|t| t.as_str()) {
                plan.typed.push((id.to_owned(), ty.to_owned(), directive));
                continue;
            }
            let error = if session.coordinator {
                Some("A coordinator never forks: delegate with subagent_type instead.".to_owned())
            } else if let Some(refusal) = fork_refusal(None, std::slice::from_ref(reply)) {
                Some(refusal.message().to_owned())
            } else {
                match fork::validate_directives(std::slice::from_ref(&directive), max) {
                    Ok(()) => {
                        plan.forks.push((id.to_owned(), directive));
                        None
                    }
                    Err(e) => Some(format!(
                        "This fork call was refused: {e}; give it a prompt."
                    )),
                }
            };
            if let Some(error) = error {
                plan.answered
                    .push((id.to_owned(), Block::tool_result(id, &error, true)));
            }
        }
        // The same cap as a client's batch: the calls beyond it are refused, not dropped.
        let cap = self.config().max_children_per_batch;
        if plan.forks.len() > cap {
            for (id, _) in plan.forks.split_off(cap) {
                let error =
                    format!("This fork call was refused: a batch may fork at most {cap} children.");
                plan.answered
                    .push((id.clone(), Block::tool_result(&id, &error, true)));
            }
        }
        plan
    }
}

async fn send(events: &Events, event: ParentEvent) {
    // The turn goes on when nobody listens: its results are in the transcript.
    let _ = events.send(Ok(event)).await;
}
