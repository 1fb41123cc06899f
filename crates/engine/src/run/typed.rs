//! Typed agents: an agent of a named type (`general-purpose`, `Explore`, `Plan`, or a custom
//! type from a Markdown file) with its own system prompt and a filtered tool set. By design they
//! share no cache with their session: their params are rendered once, when the agent is created,
//! and stored with it.

use std::sync::Arc;
use std::time::Duration;

use forkd_core::isolation::Isolation;
use forkd_core::output::OutputSchema;
use forkd_core::session::{CacheSafeParams, RenderedSystem, ToolsJson};
use forkd_core::store::{AgentParams, NotificationFilter};
use forkd_core::{
    Agent, AgentId, AgentKind, AgentState, Block, Directive, Notification, ReportTo, SessionId,
};
use futures::StreamExt;

use super::Runs;
use crate::agent_types;
use crate::clock::now_ms;
use crate::clock::today;
use crate::error::clip;
use crate::error::{EngineError, Result};
use crate::handoff::Handoff;

/// How long a parent's synchronous `Agent` call waits for its typed agent.
const TYPED_CALL_LIMIT: Duration = Duration::from_secs(3600);

/// What a typed agent is asked for besides its type and directive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypedOptions {
    /// Its own copy of the workspace (`copy`), or the session's (`none`).
    pub isolation: Isolation,
    /// The JSON Schema its final reply must match (docs/contracts.md, "Output schemas").
    pub output_schema: Option<OutputSchema>,
    /// Its limits, over its tenant's and the daemon's (docs/contracts.md, "Limits").
    pub limits: forkd_core::Limits,
}

impl Runs {
    /// Creates a typed agent in `session_id` and starts it; it reports through a notification.
    pub(crate) async fn spawn_typed(
        self: &Arc<Self>,
        session_id: SessionId,
        (subagent_type, options): (&str, &TypedOptions),
        directive: Directive,
    ) -> Result<AgentId> {
        let id = AgentId::new();
        self.create_typed(
            id,
            session_id,
            (subagent_type, options),
            directive,
            ReportTo::Transcript,
        )
        .await
    }

    /// Creates the typed agent `id` and starts it. An agent of that id that exists already (the
    /// same tool call answered again after a restart) is not created twice: it is started if
    /// no run has it, and its id returned.
    async fn create_typed(
        self: &Arc<Self>,
        id: AgentId,
        session_id: SessionId,
        (subagent_type, options): (&str, &TypedOptions),
        directive: Directive,
        report_to: ReportTo,
    ) -> Result<AgentId> {
        if let Some(existing) = self.store.get_agent(id).await? {
            if existing.session_id != session_id || existing.kind != AgentKind::Typed {
                return Err(EngineError::Invariant(format!(
                    "agent {id} exists, but not as a typed agent of session {session_id}"
                )));
            }
            if !existing.state.is_terminal() {
                tracing::info!(agent.id = %id, "The call's typed agent exists already; not starting a second");
                let tenant = self.tenancy.session_owner(session_id).await?;
                self.start_run(id, &tenant);
            }
            return Ok(id);
        }
        if directive.prompt.trim().is_empty() {
            return Err(EngineError::InvalidRequest(
                "the agent's prompt is empty".into(),
            ));
        }
        let max = self.config.max_directive_bytes;
        if directive.prompt.len() + directive.description.len() > max {
            return Err(EngineError::InvalidRequest(format!(
                "the agent's prompt and description exceed the limit of {max} bytes"
            )));
        }
        let session = self.sessions.get(session_id).await?;
        let types = match self.trees.files(&session).await?.layer {
            Some(layer) => agent_types::for_layer(&self.config.agent_dirs, layer),
            None => agent_types::for_workspace(&self.config.agent_dirs, &session.workspace),
        };
        let ty = agent_types::find_type(&types, subagent_type).ok_or_else(|| {
            let names: Vec<&str> = types.iter().map(|t| t.name.as_str()).collect();
            EngineError::InvalidRequest(format!(
                "unknown subagent_type {:?}; available: {}",
                clip(subagent_type, 64),
                names.join(", ")
            ))
        })?;
        let model = ty
            .model
            .clone()
            .filter(|m| m != "inherit")
            .unwrap_or_else(|| session.params.model.clone());
        if self.config.models.get(&model).is_none() {
            return Err(EngineError::InvalidRequest(format!(
                "agent type {} names unknown model {model:?}",
                ty.name
            )));
        }
        let own = AgentParams {
            params: CacheSafeParams {
                system: RenderedSystem::from_stored(&ty.render_system(
                    &session.workspace,
                    &model,
                    &today(),
                )),
                tools: ToolsJson::assemble(ty.tool_defs(&session.params.tools.defs()), Vec::new()),
                model,
                thinking: session.params.thinking,
                max_tokens: session.params.max_tokens,
            },
            // A type file may narrow the session's mode, never widen it: anyone who can write
            // in the workspace can write one.
            permission_mode: ty.permission_mode.map_or(session.permission_mode, |m| {
                m.within(session.permission_mode)
            }),
            output_schema: options.output_schema.clone(),
        };
        options
            .limits
            .check()
            .map_err(|e| EngineError::InvalidRequest(format!("the agent's limits: {e}")))?;
        let agent = Agent {
            limits: Some(
                self.config
                    .limits_for(session.tenant.as_str(), options.limits),
            ),
            query_source: Some(format!("agent:{}", ty.name)),
            report_to,
            directive: Some(directive.clone()),
            ..Agent::new(
                id,
                session_id,
                AgentKind::Typed,
                AgentState::Pending,
                now_ms(),
            )
        };
        // Its own copy of the workspace, as it is now, before the agent exists.
        if options.isolation == Isolation::Copy {
            crate::copies::Copies::check(&session)?;
            self.copies.snapshot_typed(&session, id).await?;
        }
        let block = Block::text(&directive.prompt);
        self.store
            .insert_agent(&agent, Some(&block), Some(&own))
            .await?;
        tracing::info!(agent.id = %agent.id, agent.type = %ty.name, "Typed agent spawned");
        self.start_run(agent.id, &session.tenant.as_str().into());
        Ok(agent.id)
    }

    /// Starts a typed agent for an `Agent` call whose caller waits for its report: the call's
    /// result carries it, so the transcript does not get it a second time. The agent is added
    /// to `waited` before it is even created: should the turn not deliver its report, the turn's end
    /// hands it back to the transcript.
    ///
    /// The agent's id is derived from the caller and the call ([`AgentId::for_call`]): a call
    /// answered again after a restart finds the agent it started. Returns its id, and whether
    /// its report still waits for the caller (false: a restart handed it to the transcript).
    pub(crate) async fn start_typed_for_caller(
        self: &Arc<Self>,
        caller: AgentId,
        tool_use_id: &str,
        session_id: SessionId,
        (subagent_type, options): (&str, &TypedOptions),
        directive: Directive,
        waited: &std::sync::Mutex<Vec<AgentId>>,
    ) -> Result<(AgentId, bool)> {
        let id = AgentId::for_call(caller, tool_use_id);
        // Waited on before it exists: a turn cut off from here on (a kill landing while the
        // agent is created and started) hands its report back rather than leaving it with a
        // caller that will never deliver it. For an agent that reports to the transcript
        // already, or one never created, handing back changes nothing.
        {
            let mut waited = waited.lock().unwrap_or_else(|p| p.into_inner());
            if !waited.contains(&id) {
                waited.push(id);
            }
        }
        let id = self
            .create_typed(
                id,
                session_id,
                (subagent_type, options),
                directive,
                ReportTo::Caller,
            )
            .await?;
        let agent = crate::lookup::agent(&*self.store, id).await?;
        Ok((id, agent.report_to == ReportTo::Caller))
    }

    /// Waits (at most an hour) for a typed agent's notification.
    pub(crate) async fn typed_report(self: &Arc<Self>, id: AgentId) -> Result<Notification> {
        let filter = NotificationFilter {
            agent_id: Some(id),
            ..NotificationFilter::default()
        };
        let mut ended = self.notifications.subscribe(0, filter, true);
        match tokio::time::timeout(TYPED_CALL_LIMIT, ended.next()).await {
            Ok(Some(note)) => note,
            Ok(None) => Err(EngineError::Draining),
            Err(_) => Err(EngineError::TimedOut {
                what: format!("typed agent {id}"),
                after: TYPED_CALL_LIMIT,
            }),
        }
    }
}

/// Where a typed agent's report went.
pub(crate) enum TypedOutcome {
    /// In the call's tool_result.
    Delivered(AgentId),
    /// The wait went to the background: the report follows as a `<task-notification>` in the
    /// session's transcript.
    Backgrounded(AgentId),
}

/// An `Agent` call with a `subagent_type`, from a parent turn or a fork child.
pub(crate) struct TypedCall<'a> {
    /// The agent whose model made the call (the session's main loop, or a fork child).
    pub caller: AgentId,
    pub session_id: SessionId,
    pub tool_use_id: &'a str,
    pub subagent_type: &'a str,
    /// The parent turn's handoff; `None` for a fork child.
    pub handoff: Option<&'a Handoff>,
    /// The agents whose reports the caller still owes the transcript, should it not deliver
    /// them (see `start_typed_for_caller`).
    pub waited: &'a std::sync::Mutex<Vec<AgentId>>,
    /// Its workspace and output schema, as the call asked.
    pub options: TypedOptions,
}

impl Runs {
    /// The seed's race, for an agent model's own waits: `wait` against the background signal —
    /// `Background` on one of `waited_on` or on the waiting agent (`caller`: the session's main
    /// loop, or a fork child), or the auto-background delay counted from now. A parent turn
    /// already in the background does not wait. `None` when the signal won: the waited-on agents
    /// go on under their own ids.
    pub(crate) async fn race_background<T>(
        self: &Arc<Self>,
        caller: AgentId,
        handoff: Option<&Handoff>,
        waited_on: &[AgentId],
        wait: impl std::future::Future<Output = Result<T>>,
    ) -> Result<Option<T>> {
        // Subscribed before the check, so a signal sent in between is not missed.
        let mut backgrounds = self.attach.backgrounds();
        if handoff.is_some_and(Handoff::is_backgrounded) {
            return Ok(None);
        }
        let deadline = crate::attach::after(self.config.auto_background);
        tokio::pin!(wait, deadline);
        loop {
            tokio::select! {
                done = &mut wait => return done.map(Some),
                signal = backgrounds.recv() => match signal {
                    Ok(id) if id == caller || waited_on.contains(&id) => {
                        tracing::info!(agent.id = %id, "A wait was handed to the background");
                        return Ok(None);
                    }
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        return Err(EngineError::Draining);
                    }
                },
                () = &mut deadline => {
                    tracing::info!("A wait was handed to the background after the auto-background delay");
                    return Ok(None);
                }
            }
        }
    }

    /// Runs a typed agent for an `Agent` call and waits for its report, racing the wait against
    /// the background signal. Returns the call's tool_result, and where the report went (`None`
    /// when the agent could not be started).
    pub(crate) async fn typed_call(
        self: &Arc<Self>,
        call: TypedCall<'_>,
        directive: Directive,
    ) -> (Block, Option<TypedOutcome>) {
        let TypedCall {
            caller,
            session_id,
            tool_use_id,
            subagent_type,
            handoff,
            waited,
            options,
        } = call;
        let failed = |e: EngineError| {
            Block::tool_result(
                tool_use_id,
                &format!("The {subagent_type} agent could not run: {e}"),
                true,
            )
        };
        let started = self
            .start_typed_for_caller(
                caller,
                tool_use_id,
                session_id,
                (subagent_type, &options),
                directive,
                waited,
            )
            .await;
        let (agent, awaitable) = match started {
            Ok(started) => started,
            Err(e) => return (failed(e), None),
        };
        let raced = if awaitable {
            self.race_background(caller, handoff, &[agent], self.typed_report(agent))
                .await
        } else {
            // Its report was handed to the transcript already (a restart came between).
            Ok(None)
        };
        match raced {
            Ok(Some(note)) => {
                let block = Block::tool_result(
                    tool_use_id,
                    &format!(
                        "Agent {agent} ({subagent_type}) {}:\n{}",
                        note.status.as_str(),
                        note.report.to_text()
                    ),
                    note.status != forkd_core::NotificationStatus::Completed,
                );
                (block, Some(TypedOutcome::Delivered(agent)))
            }
            Ok(None) => {
                let block = Block::tool_result(
                    tool_use_id,
                    &format!(
                        "async_launched: agent {agent} ({subagent_type}) is working in the \
                         background; its report will arrive in the session's transcript as a \
                         <task-notification> when it ends. Go on with other work; do not wait \
                         or poll for it."
                    ),
                    false,
                );
                (block, Some(TypedOutcome::Backgrounded(agent)))
            }
            Err(e) => (failed(e), None),
        }
    }
}
