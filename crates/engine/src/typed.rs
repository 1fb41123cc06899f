//! Typed agents: an agent of a named type (`general-purpose`, `Explore`, `Plan`, or a custom
//! type from a Markdown file) with its own system prompt and a filtered tool set. By design they
//! share no cache with their session: their params are rendered once, when the agent is created,
//! and stored with it.

use std::path::Path;
use std::time::Duration;

use forkd_core::session::{CacheSafeParams, RenderedSystem, ToolsJson};
use forkd_core::store::{AgentParams, NotificationFilter};
use forkd_core::{
    Agent, AgentId, AgentKind, AgentState, Block, Directive, Notification, ReportTo, SessionId,
    Usage,
};
use futures::StreamExt;

use crate::agent_types::{self, AgentType};
use crate::error::{EngineError, Result};
use crate::session::{clip, today};
use crate::{Engine, now_ms};

/// How long a parent's synchronous `Agent` call waits for its typed agent.
const TYPED_CALL_LIMIT: Duration = Duration::from_secs(3600);

impl Engine {
    /// The agent types a session can use: built-ins, `$FORKD_HOME/agents`, then
    /// `<workspace>/.forkd/agents` (later definitions of a custom name win).
    pub fn agent_types(&self, workspace: &Path) -> Vec<AgentType> {
        let local = workspace.join(".forkd").join("agents");
        let mut dirs: Vec<&Path> = self
            .config()
            .agent_dirs
            .iter()
            .map(|d| d.as_path())
            .collect();
        dirs.push(&local);
        // The session's whole pool (built-ins and external tools) is what a type may name.
        let known: Vec<String> = forkd_core::tools::builtin_definitions()
            .into_iter()
            .map(|t| t.name)
            .collect();
        let (types, errors) = agent_types::load_types(&dirs, &known);
        for e in errors {
            tracing::warn!(error = %e, "Skipping an agent type definition");
        }
        types
    }

    /// Creates a typed agent in `session_id` and starts it; it reports through a notification.
    pub async fn spawn_typed(
        &self,
        session_id: SessionId,
        subagent_type: &str,
        directive: Directive,
    ) -> Result<AgentId> {
        self.create_typed(session_id, subagent_type, directive, ReportTo::Transcript)
            .await
    }

    async fn create_typed(
        &self,
        session_id: SessionId,
        subagent_type: &str,
        directive: Directive,
        report_to: ReportTo,
    ) -> Result<AgentId> {
        if directive.prompt.trim().is_empty() {
            return Err(EngineError::InvalidRequest(
                "the agent's prompt is empty".into(),
            ));
        }
        let max = self.config().max_directive_bytes;
        if directive.prompt.len() + directive.description.len() > max {
            return Err(EngineError::InvalidRequest(format!(
                "the agent's prompt and description exceed the limit of {max} bytes"
            )));
        }
        let session = self.get_session(session_id).await?;
        let types = self.agent_types(&session.workspace);
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
        if self.config().models.get(&model).is_none() {
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
            permission_mode: ty.permission_mode.unwrap_or(session.permission_mode),
        };
        let now = now_ms();
        let agent = Agent {
            id: AgentId::new(),
            session_id,
            batch_id: None,
            kind: AgentKind::Typed,
            index: 0,
            state: AgentState::Pending,
            query_source: Some(format!("agent:{}", ty.name)),
            report_to,
            directive: Some(directive.clone()),
            usage: Usage::default(),
            cost_usd: 0.0,
            error: None,
            created_at_ms: now,
            updated_at_ms: now,
        };
        let block = Block::text(&directive.prompt);
        self.inner
            .store
            .insert_agent(&agent, Some(&block), Some(&own))
            .await?;
        tracing::info!(agent.id = %agent.id, agent.type = %ty.name, "Typed agent spawned");
        self.start_agent(agent.id);
        Ok(agent.id)
    }

    /// Runs a typed agent for a parent's `Agent` call and waits for it: the call's result is
    /// the agent's report, so the transcript does not get it a second time. The agent is added
    /// to `waited` before it starts: should the turn not deliver its report, the turn's end
    /// hands it back to the transcript.
    pub(crate) async fn run_typed(
        &self,
        session_id: SessionId,
        subagent_type: &str,
        directive: Directive,
        waited: &std::sync::Mutex<Vec<AgentId>>,
    ) -> Result<Notification> {
        let id = self
            .create_typed(session_id, subagent_type, directive, ReportTo::Caller)
            .await?;
        waited.lock().unwrap_or_else(|p| p.into_inner()).push(id);
        let filter = NotificationFilter {
            agent_id: Some(id),
            ..NotificationFilter::default()
        };
        let mut ended = self.subscribe(0, filter, true).await?;
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
