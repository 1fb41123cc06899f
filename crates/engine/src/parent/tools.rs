//! A parent reply's tool calls: the fork plan decides which `Agent` calls fork, start typed
//! agents (the turn waits for their reports) or are refused; the other tools run; the reply is
//! stored only together with all its results.

use super::Turns;
use forkd_core::agent::Directive;
use forkd_core::plan::{self, Forker};
use forkd_core::session::Session;
use forkd_core::store::NotificationFilter;
use forkd_core::tools::AGENT_TOOL;
use forkd_core::{AgentId, BatchId, Block, Message};
use futures::StreamExt;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

use super::{Events, ParentEvent, Turn, send};
use crate::batch::{BatchStart, SubmittedBatch};
use crate::clock::now_ms;
use crate::error::{EngineError, Result};
use crate::run::tools::ToolTurn;
use crate::run::typed::{TypedCall, TypedOptions, TypedOutcome};

/// What the parent's reply forks: valid fork calls become children; the reply's other tool calls
/// (a typed agent, an invalid fork call, any other tool) get results of their own.
struct ForkPlan {
    forks: Vec<(String, Directive)>,
    /// Whether each fork's call asked for a copy of the workspace (`isolation: copy`).
    isolated: Vec<bool>,
    /// The limits each fork's call asked for (its `timeout`), over its tenant's and the
    /// daemon's.
    limits: Vec<forkd_core::Limits>,
    /// Typed agent calls: tool_use id, type, directive. Run before the reply's other tools.
    typed: Vec<(String, String, Directive)>,
    /// Calls answered without running a tool: typed agents' reports and refusals.
    answered: Vec<(String, Block)>,
}

impl ForkPlan {
    /// The plan with `refused` (calls hooks refused, each with its result) answered instead.
    fn refusing(mut self, refused: Vec<(String, Block)>) -> Self {
        for (id, _) in &refused {
            if let Some(i) = self.forks.iter().position(|(f, _)| f == id) {
                self.forks.remove(i);
                self.isolated.remove(i);
                self.limits.remove(i);
            }
            self.typed.retain(|(t, _, _)| t != id);
        }
        self.answered.extend(refused);
        self
    }
}

impl Turns {
    /// Appends the turn's messages to the transcript in one transaction, with nothing in
    /// between (a reply and its tool results must be adjacent); `delivered` are the typed agents
    /// whose reports those messages carry.
    pub(super) async fn append_to_session(
        self: &Arc<Self>,
        turn: &Turn,
        messages: &[Message],
        delivered: &[AgentId],
    ) -> Result<u64> {
        let lock = self.session_locks.get(turn.session.id);
        let _guard = lock.lock().await;
        Ok(self
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
    async fn wait_for_children(self: &Arc<Self>, batch: &SubmittedBatch) -> Result<()> {
        let filter = NotificationFilter {
            batch_id: Some(batch.batch_id),
            ..NotificationFilter::default()
        };
        let mut ended = self.notifications.subscribe(0, filter, true);
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

    /// Hands the reports of typed agents whose waits went to the background to the transcript,
    /// once the reply that started them is stored: an agent that already ended has its
    /// notification appended now, one still running will append it when it ends.
    async fn report_later(self: &Arc<Self>, turn: &Turn, agents: &[AgentId]) -> Result<()> {
        if agents.is_empty() {
            return Ok(());
        }
        let lock = self.session_locks.get(turn.session.id);
        let _guard = lock.lock().await;
        self.store.redirect_reports(agents).await?;
        turn.waited
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id| !agents.contains(id));
        Ok(())
    }

    /// Answers the tool calls of a parent reply. A reply that forks is stored as a fork batch
    /// (which appends it and the parent's results to the transcript); any other reply is
    /// appended, its tools run, and their results appended.
    pub(super) async fn parent_tools(
        self: &Arc<Self>,
        turn: &Turn,
        reply: Message,
        events: &Events,
        cancel: &CancellationToken,
    ) -> Result<Message> {
        let session = &turn.session;
        // The Agent calls' PreToolUse hooks first: a call they refuse forks nothing.
        let (mut refused, stopped_early) = self.gate_agent_calls(turn, &reply, cancel).await?;
        if stopped_early.is_some() {
            // A hook stopped the turn: none of the reply's other calls runs.
            for (id, _, _) in reply.tool_uses() {
                if !refused.iter().any(|(r, _)| r == id) {
                    let text = "Not run: a hook stopped the agent before this call.";
                    refused.push((id.to_owned(), Block::tool_result(id, text, true)));
                }
            }
        }
        let mut plan = self.fork_plan(session, &reply).refusing(refused);
        // Typed agents whose reports these results carry, and those whose reports will follow.
        let (mut delivered, mut later) = (Vec::new(), Vec::new());
        for (id, ty, directive) in std::mem::take(&mut plan.typed) {
            let call = TypedCall {
                caller: turn.parent.id,
                session_id: session.id,
                tool_use_id: &id,
                subagent_type: &ty,
                handoff: Some(&turn.handoff),
                waited: &turn.waited,
                options: asks(&reply, &id),
            };
            let (result, outcome) = self.runs.typed_call(call, directive).await;
            match outcome {
                Some(TypedOutcome::Delivered(agent)) => delivered.push(agent),
                Some(TypedOutcome::Backgrounded(agent)) => later.push(agent),
                None => {}
            }
            plan.answered.push((id, result));
        }
        if plan.forks.is_empty() {
            // The reply is stored only with its results, in one step under the session lock: a
            // notification landing between a tool_use and its tool_result (or a reply left
            // without results by a crash) would make every later request invalid.
            let (results, stopped) = self
                .run_parent_tools(turn, &reply, &plan.answered, cancel)
                .await?;
            let stopped = stopped_early.or(stopped);
            self.append_to_session(turn, &[reply, results.clone()], &delivered)
                .await?;
            self.report_later(turn, &later).await?;
            return match stopped {
                // A hook's `continue: false`: the turn ends here, its calls answered.
                Some(reason) => Err(EngineError::HookStopped(reason)),
                None => Ok(results),
            };
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
        let (ran, stopped) = self.run_parent_tools(turn, &non_agent, &[], cancel).await?;
        let stopped = stopped_early.or(stopped);
        for block in ran.blocks {
            if let forkd_core::BlockKind::ToolResult { tool_use_id, .. } = block.kind() {
                others.push((tool_use_id.clone(), block.clone()));
            }
        }
        let isolated = std::mem::take(&mut plan.isolated);
        let batch_id = BatchId::new();
        let submitted = self
            .batches
            .commit_and_start(BatchStart {
                session_id: session.id,
                batch_id,
                assistant: Some(reply),
                forks: plan.forks,
                others,
                gating: self.config.warmup_gating,
                idempotency: None,
                budget: forkd_core::store::Budget::default(),
                turn: Some((turn.lease, delivered)),
                limits: std::mem::take(&mut plan.limits),
                isolated,
                fork_point: None,
                output_schema: None,
                // A parent turn runs only where its session's files are.
                start_here: true,
                webhook: None,
                schedule: None,
            })
            .await?;
        send(events, ParentEvent::ForkLaunched(submitted.clone())).await;
        self.report_later(turn, &later).await?;
        if let Some(reason) = stopped {
            // The fork is stored with the reply; the turn ends without waiting for it.
            return Err(EngineError::HookStopped(reason));
        }
        if !self.config.fork_always_async {
            // The children's notifications reach the transcript whether or not the wait is
            // handed to the background; the turn just goes on sooner when it is.
            let wait = self.wait_for_children(&submitted);
            self.runs
                .race_background(
                    turn.parent.id,
                    Some(&turn.handoff),
                    &submitted.agent_ids,
                    wait,
                )
                .await?;
        }
        // The parent's results sit right after the fork message.
        let fork_point = crate::lookup::batch(&*self.store, submitted.batch_id)
            .await?
            .fork_point;
        let messages = self
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
        self: &Arc<Self>,
        turn: &Turn,
        reply: &Message,
        refused: &[(String, Block)],
        cancel: &CancellationToken,
    ) -> Result<(Message, Option<String>)> {
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
        let ran = self.runs.run_tools(&turn, &runnable).await?;
        let blocks = reply
            .tool_uses()
            .filter_map(|(id, _, _)| {
                refused
                    .iter()
                    .find(|(r, _)| r == id)
                    .map(|(_, b)| b.clone())
                    .or_else(|| {
                        ran.message.blocks.iter().find(|b| {
                            matches!(b.kind(), forkd_core::BlockKind::ToolResult { tool_use_id, .. } if tool_use_id == id)
                        }).cloned()
                    })
            })
            .collect();
        Ok((Message::user(blocks), ran.stopped))
    }

    /// What the parent's reply forks, by the one fork plan: a session's own turn is never a
    /// fork child's, so only the coordinator rule and the limits apply.
    fn fork_plan(self: &Arc<Self>, session: &Session, reply: &Message) -> ForkPlan {
        let forker = Forker {
            coordinator: session.coordinator,
            child: None,
            limits: self.batches.fork_limits(),
        };
        let plan = plan::plan(plan::Calls::Reply(reply), &forker);
        let mut answered: Vec<(String, Block)> = plan
            .refused
            .into_iter()
            .map(|(id, refusal)| {
                let result = Block::tool_result(&id, &refusal.to_model(), true);
                (id, result)
            })
            .collect();
        // Each fork call says whether its child works in a copy (the plan refused bad values);
        // a session whose commands run unconfined has no copy to give.

        let (mut forks, mut isolated, mut limits) = (Vec::new(), Vec::new(), Vec::new());
        for (id, directive) in plan.forks {
            let asked = asks(reply, &id);
            let copy = asked.isolation == forkd_core::isolation::Isolation::Copy;
            if copy && let Err(refused) = crate::copies::Copies::check(session) {
                let text =
                    format!("This fork call was refused: {refused}. Fork it without isolation.");
                answered.push((id.clone(), Block::tool_result(&id, &text, true)));
                continue;
            }
            forks.push((id, directive));
            isolated.push(copy);
            limits.push(asked.limits);
        }
        ForkPlan {
            forks,
            isolated,
            limits,
            typed: plan.typed,
            answered,
        }
    }
}

/// What the `Agent` call `id` of `reply` asks for its agent's workspace and output (the plan
/// refused bad values).
fn asks(reply: &Message, id: &str) -> TypedOptions {
    let input = reply
        .tool_uses()
        .find(|(use_id, _, _)| *use_id == id)
        .and_then(|(_, _, block)| block.tool_input());
    input.map_or_else(TypedOptions::default, |input| TypedOptions {
        isolation: plan::isolation_of(&input).unwrap_or_default(),
        output_schema: plan::output_schema_of(&input).unwrap_or_default(),
        limits: plan::timeout_of(&input).unwrap_or_default(),
    })
}
