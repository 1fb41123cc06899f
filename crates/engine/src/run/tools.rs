//! Tool calls of the agent loop: each call's intent is stored before it runs and its result
//! after, and the model sees exactly the stored results.
//!
//! Calls run one after another, in the order the model wrote them: a later call may depend on
//! an earlier one's effect (write, then run). A call whose intent was stored but whose result
//! was not (the daemon died, the run was handed over) is never blindly run again: a read-only
//! call is re-run, a mutating one gets an explicit "interrupted" error — after the process
//! group it started, recorded while it ran, is stopped if it still runs on this machine.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use forkd_core::hooks::{HookEvent, Permission};
use forkd_core::plan::{Calls, ForkLimits, Forker, plan};
use forkd_core::session::SandboxMode;
use forkd_core::session::{PermissionMode, PermissionRules, Session};
use forkd_core::store::{ProcessGroup, ToolCall};
use forkd_core::tools::{AGENT_TOOL, CAPACITY_TOOL};
use forkd_core::{Agent, AgentId, AgentKind, Block, Message, RawJson};
use forkd_tools::Wall;
use forkd_tools::{Decision, Policy, Rule, SandboxSpec, ToolContext, ToolOutput, Workspace};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::Runs;
use crate::clock::now_ms;
use crate::error::{EngineError, Result};
use crate::permissions::{PermissionAnswer, PermissionPrompt};
use crate::run::typed::{TypedCall, TypedOptions, TypedOutcome};

/// Bytes in a MiB, for messages.
const MIB: f64 = (1u64 << 20) as f64;

/// Outputs longer than this (in bytes) are stored whole but shown to the model shortened.
pub(crate) const REPLACEMENT_THRESHOLD: usize = 50_000;
/// How much of a replaced output the model still sees.
const REPLACEMENT_HEAD: usize = 4_000;

/// What the model is told about a mutating call that was cut off before its result was stored.
const INTERRUPTED: &str = "Interrupted: this call was started but its result was never recorded \
     (the agent was interrupted). It may or may not have taken effect — check the state before \
     retrying.";

/// How long a resumed run waits for a cut-off call's leftover process group to be gone.
const LEFTOVER_WAIT: Duration = Duration::from_secs(5);

/// The context of one turn's tool calls.
pub(crate) struct ToolTurn<'a> {
    pub agent: &'a Agent,
    /// The run's claim on the agent: every tool call it stores checks it.
    pub lease: &'a forkd_core::store::Lease,
    pub session: &'a Session,
    /// The agent's permission mode (a typed agent may have its own).
    pub permission_mode: PermissionMode,
    /// The tools the agent was offered; a call to any other is refused.
    pub offered: Vec<String>,
    /// The conversation so far, the assistant message included (for the recursion guard).
    pub conversation: &'a [Message],
    pub cancel: CancellationToken,
}

/// The agent's permission policy: its mode and its session's rules (checked when the session
/// was created, so none fails to parse here), with the MCP tools the operator marked read-only.
/// A tool call's span, as the GenAI conventions name it (docs/operations.md, "Tracing"): the
/// tool and the call's id, never its input or output.
pub(crate) fn tool_span(id: &str, name: &str, sandbox: SandboxMode) -> tracing::Span {
    tracing::info_span!(
        "tool_call",
        otel.name = %format!("execute_tool {name}"),
        otel.status_code = tracing::field::Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %name,
        gen_ai.tool.call.id = %id,
        forkd.sandbox = sandbox.as_str(),
    )
}

/// Marks a tool call's span failed when the model was told the call failed.
pub(crate) fn mark_error(span: &tracing::Span, result: &Block) {
    let failed = result
        .raw()
        .value()
        .get("is_error")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if failed {
        span.record("otel.status_code", "ERROR");
    }
}

fn policy(mode: PermissionMode, session: &Session) -> Policy {
    let rules: &PermissionRules = &session.rules;
    let parse = |rules: &[String]| rules.iter().filter_map(|r| Rule::parse(r).ok()).collect();
    Policy {
        mode,
        allow: parse(&rules.allow),
        deny: parse(&rules.deny),
        read_only: session.mcp.read_only_tools(),
    }
}

/// What a tool produced: a built-in's output, or an MCP tool's (which may hold images).
enum Ran {
    Builtin(ToolOutput),
    Mcp(forkd_mcp::CallOutput),
}

/// The model-facing form of an output: whole, or its head with a note when it is too long. The
/// decision is made once, when the call finishes, and stored with the result.
fn shown(tool_use_id: &str, output: &ToolOutput) -> (Block, Option<String>) {
    let (text, full) = shorten(&output.content);
    (
        Block::tool_result(tool_use_id, &text, output.is_error),
        full,
    )
}

/// An MCP call's result as the model sees it: its text shortened like a built-in's output, and
/// its images as image blocks.
fn shown_mcp(tool_use_id: &str, output: &forkd_mcp::CallOutput) -> (Block, Option<String>) {
    if output.images.is_empty() {
        let text = if output.is_error {
            ToolOutput::error(output.text.clone())
        } else {
            ToolOutput::ok(output.text.clone())
        };
        return shown(tool_use_id, &text);
    }
    let (text, full) = shorten(&output.text);
    (
        crate::mcp::result_with_images(tool_use_id, &text, output),
        full,
    )
}

/// A text whole, or its head with a note (and the whole text to store) when it is too long.
fn shorten(content: &str) -> (String, Option<String>) {
    if content.len() <= REPLACEMENT_THRESHOLD {
        return (content.to_owned(), None);
    }
    let cut = (0..=REPLACEMENT_HEAD)
        .rev()
        .find(|i| content.is_char_boundary(*i))
        .unwrap_or(0);
    let text = format!(
        "{}\n[… output truncated: {} bytes in all, of which the first {cut} are shown. The whole \
         output is stored with this call; narrow the request (Read's offset and limit, a more \
         specific Grep) to see more.]",
        &content[..cut],
        content.len()
    );
    (text, Some(content.to_owned()))
}

impl Runs {
    /// The context an agent's tools (and hooks) run in: its workspace (an isolated child's copy,
    /// a session's layer, or the pinned directory) behind its sandbox's wall. The sandbox's spec
    /// (every session's workspace, read from the store) is built when `sandboxed` asks for it,
    /// and for an isolated child always, whose file tools work in the layer its view mounts.
    pub(super) async fn tool_context(
        self: &Arc<Self>,
        agent: &Agent,
        session: &Session,
        cancel: &CancellationToken,
        sandboxed: bool,
    ) -> Result<ToolContext> {
        let snapshot = self.copies.snapshot_of(agent).await?;
        let isolated = snapshot.is_some();
        // A session made from an upload works in a layer only its views and its descriptor
        // reach: every turn's tools go through it (its view is needed only as any other's).
        let layered = crate::trees::is_layered(session);
        let spec = if isolated || sandboxed {
            self.sandbox_spec(session, isolated.then_some(agent.id))
                .await?
        } else {
            None
        };
        let workspace = match &snapshot {
            Some(snapshot) => {
                self.copies
                    .workspace(agent, snapshot, session, spec.as_ref())
                    .await?
            }
            None if layered => Workspace::layered(self.trees.layer(session).await?),
            None => Workspace::pinned(&session.workspace).map_err(EngineError::Workspace)?,
        };
        let workspace = match &spec {
            Some(spec) => workspace.walled(Wall::new(&spec.paths, &session.workspace)),
            None => workspace,
        };
        let mut ctx = ToolContext::new(workspace, cancel.clone());
        if let Some(spec) = spec {
            ctx = ctx.with_sandbox(spec);
        }
        Ok(ctx)
    }
}

/// A turn's tool results, and why a hook stopped the agent if one did (`continue: false`).
pub(crate) struct ToolResults {
    pub message: Message,
    pub stopped: Option<String>,
}

/// What a call after one whose hook stopped the agent is answered with.
const NOT_RUN_STOPPED: &str = "Not run: a hook stopped the agent before this call.";

/// What every call of a turn is answered with: its tools' context, the permission rules, the
/// session's hooks.
struct Means<'a> {
    ctx: &'a ToolContext,
    policy: &'a Policy,
    hooks: &'a forkd_core::hooks::HookSet,
}

impl Runs {
    /// Answers every tool_use of `assistant`, in order, with one tool_result each.
    pub(crate) async fn run_tools(
        self: &Arc<Self>,
        turn: &ToolTurn<'_>,
        assistant: &Message,
    ) -> Result<ToolResults> {
        let store = &self.store;
        let done: HashMap<String, ToolCall> = store
            .tool_calls(turn.agent.id)
            .await?
            .into_iter()
            .map(|c| (c.tool_use_id.clone(), c))
            .collect();
        // Bash runs in the sandbox, and the file tools behind its wall (what the view hides
        // they do not reach): the spec (every session's workspace, read from the store) is
        // built for the turns that call a built-in tool, and for an isolated child's every
        // turn, whose file tools work in the layer its view mounts.
        // Hooks run in the sandbox view too: a turn with a call they apply to builds it.
        let hooks = self.hooks_of(turn)?;
        let hooked = |name: &str| {
            !hooks.commands(HookEvent::PreToolUse, Some(name)).is_empty()
                || !hooks
                    .commands(HookEvent::PostToolUse, Some(name))
                    .is_empty()
        };
        let sandboxed = assistant
            .tool_uses()
            .any(|(_, name, _)| forkd_tools::touches_files(name) || hooked(name));
        let ctx = self
            .tool_context(turn.agent, turn.session, &turn.cancel, sandboxed)
            .await?;
        let means = Means {
            ctx: &ctx,
            policy: &policy(turn.permission_mode, turn.session),
            hooks: &hooks,
        };
        let (mut results, mut stopped) = (Vec::new(), None);
        for (id, name, block) in assistant.tool_uses() {
            if self.supervisor.draining() {
                // Shutting down: the calls not started yet run at the next start.
                return Err(EngineError::Draining);
            }
            let input = block.tool_input().unwrap_or(Value::Null);
            let result = match done.get(id) {
                Some(ToolCall {
                    result: Some(result),
                    ..
                }) => result.clone(),
                Some(call) if !call.read_only => {
                    if let Some(group) = &call.process {
                        stop_leftover(id, group).await;
                    }
                    let result = Block::tool_result(id, INTERRUPTED, true);
                    store
                        .finish_tool_call(turn.lease, id, &result, None, now_ms())
                        .await?;
                    result
                }
                // Once a hook stopped the agent, the calls after are not run.
                _ if stopped.is_some() => Block::tool_result(id, NOT_RUN_STOPPED, true),
                _ => {
                    let span = tool_span(id, name, turn.session.sandbox.mode);
                    let (result, stop) = self
                        .call(turn, id, name, &input, &means)
                        .instrument(span.clone())
                        .await?;
                    mark_error(&span, &result);
                    stopped = stopped.or(stop);
                    result
                }
            };
            results.push(result);
        }
        Ok(ToolResults {
            message: Message::user(results),
            stopped,
        })
    }

    /// Asks the call's PreToolUse hooks, stores the intent (with the input a hook gave it), runs
    /// the call as the hooks and the permission rules decide, asks its PostToolUse hooks, stores
    /// the result; returns what the model sees, and why a hook stops the agent if one does.
    async fn call(
        self: &Arc<Self>,
        turn: &ToolTurn<'_>,
        id: &str,
        name: &str,
        input: &Value,
        means: &Means<'_>,
    ) -> Result<(Block, Option<String>)> {
        let (ctx, policy) = (means.ctx, means.policy);
        let store = &self.store;
        let mcp = turn.session.mcp.tool(name);
        let verdict = self
            .pre_tool_hooks(means.hooks, turn, CallRef { id, name, input }, ctx)
            .await;
        let input = verdict.updated_input.as_ref().unwrap_or(input);
        store
            .begin_tool_call(
                turn.lease,
                &ToolCall {
                    agent_id: turn.agent.id,
                    tool_use_id: id.to_owned(),
                    name: name.to_owned(),
                    input_json: input.to_string(),
                    // An Agent call may be answered again: the agent it starts has an id derived
                    // from the call, so a second answer finds it instead of starting another.
                    // An MCP tool only when the operator's configuration says so.
                    read_only: forkd_tools::is_read_only(name)
                        || name == AGENT_TOOL
                        || name == CAPACITY_TOOL
                        || mcp.is_some_and(|t| t.read_only),
                    result: None,
                    full_output: None,
                    started_at_ms: now_ms(),
                    finished_at_ms: None,
                    process: None,
                },
            )
            .await?;
        // A call starting and finishing is progress for the idle timeout.
        crate::progress::touch();
        // What the call's PreToolUse hooks decided, for every tool: a denial, or a person's
        // answer to their question.
        let gate = self.hook_gate(turn, name, input, &verdict).await;
        let output = if !turn.offered.iter().any(|t| t == name) {
            Ran::Builtin(ToolOutput::error(format!(
                "Tool {name} is not available to this agent; its tools are: {}.",
                turn.offered.join(", ")
            )))
        } else if let Some(Err(refused)) = &gate {
            Ran::Builtin(ToolOutput::error(refused.clone()))
        } else if name == AGENT_TOOL {
            // Waiting on a typed agent, which has limits of its own, is not idling.
            let _waiting = crate::progress::waiting();
            Ran::Builtin(self.agent_call(turn, id, input).await)
        } else if name == CAPACITY_TOOL {
            // Read-only, and of the tenant's own: no permission asked.
            Ran::Builtin(self.capacity_tool(turn, input).await)
        } else {
            // A hook's allow (or a person's yes to a hook's question) skips the prompt, never a
            // deny rule nor plan mode: those still refuse, as in Claude Code.
            let decided = verdict.permission == Some(Permission::Allow) || gate.is_some();
            let allowed = if decided {
                match policy.refusal(name, input, &ctx.workspace) {
                    Some(reason) => Err(format!("Permission denied: {reason}")),
                    None => Ok(()),
                }
            } else {
                match policy.decide(name, input, &ctx.workspace) {
                    Decision::Deny(reason) => Err(format!("Permission denied: {reason}")),
                    Decision::Allow => Ok(()),
                    Decision::Ask(what) => self.ask_person(turn, name, input, what).await,
                }
            };
            match (allowed, mcp) {
                (Err(denied), _) => Ran::Builtin(ToolOutput::error(denied)),
                (Ok(()), Some(tool)) => {
                    Ran::Mcp(self.mcp.call(turn.session, tool, input, &turn.cancel).await)
                }
                (Ok(()), None) => match self.over_disk_cap(name, ctx).await {
                    Some(full) => Ran::Builtin(ToolOutput::error(full)),
                    None => Ran::Builtin(self.run_tool(turn, id, name, input, ctx).await?),
                },
            }
        };
        let mut output = output;
        let response = match &output {
            Ran::Builtin(o) => o.content.clone(),
            Ran::Mcp(o) => o.text.clone(),
        };
        // Their context follows the result of a call that was not denied (a denial carries it).
        let context = verdict.context.clone();
        use super::hooks::CallRef;
        let after = match verdict.stop {
            // Stopped before it ran: no PostToolUse either.
            Some(_) => super::hooks::AfterCall::default(),
            None => {
                let call = CallRef { id, name, input };
                self.post_tool_hooks(means.hooks, turn, call, &response, ctx)
                    .await
            }
        };
        if let Some(text) = [context, after.feedback]
            .into_iter()
            .flatten()
            .reduce(|a, b| a + "\n" + &b)
        {
            match &mut output {
                Ran::Builtin(o) => o.content = format!("{}\n\n{text}", o.content),
                Ran::Mcp(o) => o.text = format!("{}\n\n{text}", o.text),
            }
        }
        let (result, full) = match &output {
            Ran::Builtin(output) => shown(id, output),
            Ran::Mcp(output) => shown_mcp(id, output),
        };
        tracing::debug!(tool = name, "Tool call finished");
        crate::progress::touch();
        store
            .finish_tool_call(turn.lease, id, &result, full.as_deref(), now_ms())
            .await?;
        Ok((result, verdict.stop.or(after.stop)))
    }
}

impl Runs {
    /// Why a writing tool of an isolated child may not run: its copy is at its disk cap.
    async fn over_disk_cap(&self, name: &str, ctx: &ToolContext) -> Option<String> {
        let cap = self.config.isolation.disk_cap?;
        // An isolated child's copy; a session's own layer is its workspace, with no cap.
        let layer = ctx.workspace.layer().filter(|l| !l.is_shared())?;
        if forkd_tools::is_read_only(name) {
            return None;
        }
        let upper = layer.upper().to_path_buf();
        let used = tokio::task::spawn_blocking(move || forkd_tools::isolation::disk_usage(&upper))
            .await
            .unwrap_or(0);
        (used >= cap).then(|| {
            format!(
                "This agent's copy of the workspace holds {:.1} MiB, at its cap of {:.1} MiB \
                 ([isolation] disk_cap_mib): {name} did not run, and no tool that writes \
                 (Write, Edit, Bash) will. Finish and report what you did; your changes so far \
                 are kept.",
                used as f64 / MIB,
                cap as f64 / MIB
            )
        })
    }

    /// Runs a built-in tool, recording the process group it starts (Bash) while it runs, under
    /// the run's lease like the call's other writes. A failed write ends the call (dropping it
    /// kills its group), as a failed result write would.
    async fn run_tool(
        self: &Arc<Self>,
        turn: &ToolTurn<'_>,
        id: &str,
        name: &str,
        input: &Value,
        ctx: &ToolContext,
    ) -> Result<ToolOutput> {
        let (groups, started) = mpsc::unbounded_channel();
        let ctx = ctx.clone().with_process_groups(groups);
        let run = forkd_tools::run_tool(name, input, &ctx);
        tokio::pin!(run);
        let mut watch = GroupWatch {
            runs: self,
            agent: turn.agent.id,
            started,
            seen: Vec::new(),
            ended: false,
        };
        loop {
            tokio::select! {
                biased;
                Some(group) = watch.started.recv() => {
                    watch.seen.push(group.clone());
                    self.store
                        .record_tool_process(turn.lease, id, &group)
                        .await?;
                }
                output = &mut run => {
                    watch.ended = true;
                    return Ok(output);
                }
            }
        }
    }
}

/// The process groups a built-in tool call starts, while it runs. A call dropped before it ends
/// (a kill drops the run) hands them to the engine in its `Drop`, synchronously, the ones not
/// received yet included: a group may not be stored yet, and the kill must still wait for it
/// ([`Runs::stop_cut_off_groups`]).
struct GroupWatch<'a> {
    runs: &'a Arc<Runs>,
    agent: forkd_core::AgentId,
    started: mpsc::UnboundedReceiver<ProcessGroup>,
    seen: Vec<ProcessGroup>,
    ended: bool,
}

impl Drop for GroupWatch<'_> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        while let Ok(group) = self.started.try_recv() {
            self.seen.push(group);
        }
        if self.seen.is_empty() {
            return;
        }
        self.runs
            .cut_off_groups()
            .entry(self.agent)
            .or_default()
            .append(&mut self.seen);
    }
}

impl Runs {
    /// Waits until the process groups of the agent's cut-off tool calls (started, never
    /// answered) have ended, killing what is left: a run dropped by a kill sends its Bash group
    /// SIGKILL but cannot wait for it, and a killed notification must mean that nothing the
    /// agent started still runs.
    pub(crate) async fn stop_cut_off_groups(self: &Arc<Self>, agent: forkd_core::AgentId) {
        // Those this daemon saw start (stored or not), then any stored by an earlier run.
        let mut groups: Vec<(String, ProcessGroup)> = self
            .cut_off_groups()
            .remove(&agent)
            .unwrap_or_default()
            .into_iter()
            .map(|g| (String::new(), g))
            .collect();
        match self.store.tool_calls(agent).await {
            Ok(calls) => groups.extend(
                calls
                    .into_iter()
                    .filter(|c| c.result.is_none())
                    .filter_map(|c| Some((c.tool_use_id, c.process?))),
            ),
            Err(e) => tracing::warn!(error = %e, "Cannot read the killed agent's tool calls"),
        }
        let mut stopped = std::collections::HashSet::new();
        for (tool_use_id, group) in groups {
            if stopped.insert(group.pgid) {
                stop_leftover(&tool_use_id, &group).await;
            }
        }
    }

    /// Process groups of tool calls dropped before they ended, by agent, until a kill waits
    /// for them.
    fn cut_off_groups(
        self: &Arc<Self>,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<forkd_core::AgentId, Vec<ProcessGroup>>>
    {
        self.cut_off_groups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

/// Stops what is left of a cut-off call's process group (its daemon died and its sentinel did
/// not stop it) before the call is reported as interrupted, so nothing it started still runs
/// behind the model's back. Failing to look or to kill is logged, not fatal: the group may well
/// be gone already.
async fn stop_leftover(tool_use_id: &str, group: &ProcessGroup) {
    use forkd_tools::Leftover;
    match forkd_tools::process::stop_leftover(group, LEFTOVER_WAIT).await {
        Ok(Leftover::Stopped) => tracing::info!(
            tool_use.id = tool_use_id,
            pgid = group.pgid,
            "Stopped the process group of an interrupted tool call"
        ),
        Ok(Leftover::StillAlive) => tracing::warn!(
            tool_use.id = tool_use_id,
            pgid = group.pgid,
            "The process group of an interrupted tool call was killed but has not ended yet"
        ),
        Ok(found @ (Leftover::NotRunning | Leftover::Reused | Leftover::OtherBoot)) => {
            tracing::debug!(
                tool_use.id = tool_use_id,
                pgid = group.pgid,
                ?found,
                "An interrupted tool call's process group is not running"
            );
        }
        Err(err) => tracing::warn!(
            tool_use.id = tool_use_id,
            pgid = group.pgid,
            error = %err,
            "Could not stop the process group of an interrupted tool call"
        ),
    }
}

impl Runs {
    /// The sandbox of a session's Bash commands (`None` for `full-access`): see
    /// [`crate::workspaces::sandbox_spec`]. An isolated child (`child`) gets a temporary
    /// directory of its own.
    async fn sandbox_spec(
        self: &Arc<Self>,
        session: &Session,
        child: Option<AgentId>,
    ) -> Result<Option<SandboxSpec>> {
        let tmp = match child {
            Some(child) => crate::workspaces::child_tmp(&self.config, session.id, child),
            None => crate::workspaces::session_tmp(&self.config, session.id),
        };
        crate::workspaces::sandbox_spec(&self.config, self.store.as_ref(), session, tmp).await
    }

    /// A call that needs a person's approval: in an interactive session it is put to the
    /// session's clients and the agent waits; otherwise it is denied with a clear error.
    pub(super) async fn ask_person(
        self: &Arc<Self>,
        turn: &ToolTurn<'_>,
        name: &str,
        input: &Value,
        what: String,
    ) -> Result<(), String> {
        let session = turn.session;
        match self.permissions.always_allowed(session.id, name).await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => {
                return Err(format!(
                    "Permission could not be checked: {e}. Try again later."
                ));
            }
        }
        if !session.interactive {
            return Err(format!(
                "Permission denied: {what} needs a person's approval, and no client can answer \
                 permission prompts for this agent. Work without it and say so in your \
                 report's Issues."
            ));
        }
        let prompt = PermissionPrompt {
            id: forkd_core::PromptId::new(),
            session_id: session.id,
            agent_id: turn.agent.id,
            tool: name.to_owned(),
            input_json: input.to_string(),
            question: what,
        };
        // Its Notification hooks hear that a prompt waits, while it waits; an answer does not
        // wait for them (those still running then are stopped).
        let message = format!("forkd needs your permission to use {name}");
        let ask = self.permissions.ask(turn.lease, prompt, &turn.cancel);
        let notify = self.notification_hooks(turn, &message);
        tokio::pin!(ask, notify);
        let answer = tokio::select! {
            answer = &mut ask => answer,
            () = &mut notify => ask.await,
        };
        match answer {
            Ok(Some(PermissionAnswer::AllowOnce | PermissionAnswer::AllowAlways)) => Ok(()),
            Ok(Some(PermissionAnswer::Deny(reason))) => Err(format!(
                "Permission denied by the user{}. Do not retry this call; work without it.",
                reason.map(|r| format!(": {r}")).unwrap_or_default()
            )),
            Ok(None) => Err("Permission was not answered: the agent was stopped.".to_owned()),
            Err(e) => Err(format!("Permission could not be asked: {e}.")),
        }
    }
}

impl Runs {
    /// The `Agent` tool inside an agent run (a fork child's), planned like any other `Agent`
    /// call: a fork attempt is refused by the recursion guard (the child's query source, or the
    /// boilerplate in its conversation); a typed agent is started and waited for — with the same
    /// race against the background signal as a parent turn's wait — unless it would sit deeper
    /// below the session than `max_agent_depth`.
    async fn agent_call(
        self: &Arc<Self>,
        turn: &ToolTurn<'_>,
        id: &str,
        input: &Value,
    ) -> ToolOutput {
        let forker = Forker {
            coordinator: turn.session.coordinator,
            child: Some((turn.agent.query_source.as_deref(), turn.conversation)),
            limits: ForkLimits {
                max_children: usize::MAX,
                max_directive_bytes: usize::MAX,
            },
        };
        let Ok(block) = Block::tool_use(id, AGENT_TOOL, &RawJson::encode(input)) else {
            return ToolOutput::error("The Agent call's input is not a JSON object.");
        };
        let planned = plan(Calls::Reply(&Message::assistant(vec![block])), &forker);
        if let Some((_, refusal)) = planned.refused.into_iter().next() {
            tracing::info!(tool_use.id = id, %refusal, "Refused an Agent call");
            return ToolOutput::error(refusal.to_model());
        }
        let Some((_, subagent_type, directive)) = planned.typed.into_iter().next() else {
            // The guard refuses every fork from inside a run; nothing else is left.
            return ToolOutput::error("Forking is refused for this agent; do the work yourself.");
        };
        // A session's main loop is depth 0; its fork children 1; their typed agents 2.
        let depth = match turn.agent.kind {
            AgentKind::Parent => 1,
            AgentKind::Fork | AgentKind::Typed => 2,
        };
        let max = self.config.max_agent_depth;
        if depth > max {
            return ToolOutput::error(format!(
                "A {subagent_type} agent started here would be {depth} levels below the \
                 session; this daemon allows {max} (max_agent_depth). Do the work yourself."
            ));
        }
        let waited = std::sync::Mutex::new(Vec::new());
        let call = TypedCall {
            caller: turn.agent.id,
            session_id: turn.session.id,
            tool_use_id: id,
            subagent_type: &subagent_type,
            handoff: None,
            waited: &waited,
            // The plan refused bad values.
            options: TypedOptions {
                isolation: forkd_core::plan::isolation_of(input).unwrap_or_default(),
                output_schema: forkd_core::plan::output_schema_of(input).unwrap_or_default(),
                limits: forkd_core::plan::timeout_of(input).unwrap_or_default(),
            },
        };
        let (block, outcome) = self.typed_call(call, directive).await;
        // The report is in this call's result, or goes to the session's transcript.
        let settled = match outcome {
            Some(TypedOutcome::Delivered(agent)) => self.store.mark_delivered(&[agent]).await,
            Some(TypedOutcome::Backgrounded(agent)) => {
                let lock = self.session_locks.get(turn.session.id);
                let _guard = lock.lock().await;
                self.store.redirect_reports(&[agent]).await.map(drop)
            }
            None => Ok(()),
        };
        if let Err(e) = settled {
            tracing::warn!(error = %e, "Cannot settle where a typed agent's report goes; the next start hands it to the transcript");
        }
        let is_error = matches!(
            block.kind(),
            forkd_core::BlockKind::ToolResult { is_error: true, .. }
        );
        let content = block.tool_result_text().unwrap_or_default();
        if is_error {
            ToolOutput::error(content)
        } else {
            ToolOutput::ok(content)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_outputs_are_shown_shortened_and_kept_whole() {
        let short = ToolOutput::ok("fine".to_owned());
        let (block, full) = shown("t", &short);
        assert_eq!(block, Block::tool_result("t", "fine", false));
        assert!(full.is_none());

        let long = ToolOutput::ok("é".repeat(REPLACEMENT_THRESHOLD));
        let (block, full) = shown("t", &long);
        assert_eq!(full.as_deref(), Some(long.content.as_str()));
        let text = block.raw().as_str();
        assert!(text.len() < REPLACEMENT_HEAD + 400, "{}", text.len());
        assert!(text.contains("output truncated"));
        // The same output always gets the same form: siblings cloning it agree byte for byte.
        assert_eq!(shown("t", &long).0, block);
    }
}
