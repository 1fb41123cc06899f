//! Hooks around a tool call (docs/contracts.md, "Hooks"): the session's tenant's PreToolUse
//! hooks before the call is decided — they may deny it, ask a person, allow it past the
//! permission rules, or change its input (what runs and what is recorded, never the stored
//! assistant message) — and its PostToolUse hooks once it ran, whose feedback joins its result.
//! Hooks of one event run in parallel, each in the session's sandbox view as its Bash commands
//! run, with Claude Code's JSON on stdin.

use forkd_core::hooks::{
    HookCommand, HookEvent, HookOutput, HookSet, Permission, PreToolVerdict, pre_tool_verdict,
};
use forkd_tools::ToolContext;
use forkd_tools::hook::HookCall;
use serde_json::{Value, json};

use super::Runs;
use super::tools::ToolTurn;

impl Runs {
    /// The hooks that run for `turn`'s session: the operator's for every tenant, then its
    /// tenant's.
    pub(super) fn hooks_of(&self, turn: &ToolTurn<'_>) -> HookSet {
        self.config.hooks.for_tenant(&turn.session.tenant)
    }

    /// What the call's PreToolUse hooks decide; `updated_input` is refused for an `Agent` call,
    /// whose input starts an agent the call's id names.
    pub(super) async fn pre_tool_hooks(
        &self,
        hooks: &HookSet,
        turn: &ToolTurn<'_>,
        name: &str,
        input: &Value,
        ctx: &ToolContext,
    ) -> PreToolVerdict {
        let commands = hooks.commands(HookEvent::PreToolUse, Some(name));
        if commands.is_empty() {
            return PreToolVerdict {
                permission: None,
                reason: None,
                updated_input: None,
            };
        }
        let payload = event(turn, HookEvent::PreToolUse, name, input, None);
        let workspace = turn.session.workspace.display().to_string();
        let outputs = run_all(&commands, HookEvent::PreToolUse, &payload, &workspace, ctx).await;
        let mut verdict = pre_tool_verdict(&outputs);
        if verdict.updated_input.is_some() && name == forkd_core::tools::AGENT_TOOL {
            verdict = PreToolVerdict {
                permission: Some(Permission::Deny),
                reason: Some("a hook may not change an Agent call's input".into()),
                updated_input: None,
            };
        }
        let context = feedback(&outputs, false);
        if let Some(context) = context {
            verdict.reason = Some(match verdict.reason {
                Some(reason) if verdict.permission == Some(Permission::Deny) => {
                    format!("{reason}\n{context}")
                }
                _ => context,
            });
        }
        verdict
    }

    /// The call's PostToolUse hooks' feedback for the model (a block's reason, exit 2's stderr,
    /// additional context), to follow its result; `None` when they had nothing to say.
    pub(super) async fn post_tool_hooks(
        &self,
        hooks: &HookSet,
        turn: &ToolTurn<'_>,
        name: &str,
        input: &Value,
        response: &str,
        ctx: &ToolContext,
    ) -> Option<String> {
        let commands = hooks.commands(HookEvent::PostToolUse, Some(name));
        if commands.is_empty() {
            return None;
        }
        let payload = event(turn, HookEvent::PostToolUse, name, input, Some(response));
        let workspace = turn.session.workspace.display().to_string();
        let outputs = run_all(&commands, HookEvent::PostToolUse, &payload, &workspace, ctx).await;
        feedback(&outputs, true)
    }
}

/// The tag of the message a blocking SubagentStop hook adds: what the agent goes on with, and
/// how a later run (a restart) knows that a stop hook is active.
const STOP_HOOK_TAG: &str = "forkd-stop-hook";

/// Whether `message` is the note a blocking stop hook added.
pub(super) fn is_stop_hook_note(message: &forkd_core::Message) -> bool {
    message.role == forkd_core::Role::User
        && message.text().starts_with(&format!("<{STOP_HOOK_TAG}>"))
}

/// The note the agent goes on with when its stop hooks block: their reasons.
pub(super) fn stop_hook_note(reasons: &str) -> forkd_core::Message {
    forkd_core::Message::user(vec![forkd_core::Block::text(&format!(
        "<{STOP_HOOK_TAG}>\nA hook kept you from ending here:\n{reasons}\n</{STOP_HOOK_TAG}>"
    ))])
}

impl Runs {
    /// A child's or typed agent's SubagentStop hooks, as it ends its last turn: the reasons to
    /// go on when one blocks (exit 2, `decision: "block"`), `None` when it may end.
    /// `stop_hook_active` says whether it goes on already because of one.
    pub(super) async fn subagent_stop_hooks(
        self: &std::sync::Arc<Self>,
        agent: &forkd_core::Agent,
        session: &forkd_core::session::Session,
        permission_mode: forkd_core::session::PermissionMode,
        active: bool,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> crate::error::Result<Option<String>> {
        let hooks = self.config.hooks.for_tenant(&session.tenant);
        let commands = hooks.commands(HookEvent::SubagentStop, None);
        if commands.is_empty() {
            return Ok(None);
        }
        let ctx = self.tool_context(agent, session, cancel, true).await?;
        let payload = json!({
            "session_id": session.id.to_string(),
            "transcript_path": Value::Null,
            "cwd": session.workspace.display().to_string(),
            "hook_event_name": HookEvent::SubagentStop.as_str(),
            "permission_mode": permission_mode.as_str(),
            "stop_hook_active": active,
            "agent_id": agent.id.to_string(),
            "batch_id": agent.batch_id.map(|b| b.to_string()),
        });
        let workspace = session.workspace.display().to_string();
        let outputs = run_all(
            &commands,
            HookEvent::SubagentStop,
            &payload,
            &workspace,
            &ctx,
        )
        .await;
        let reasons: Vec<String> = outputs
            .iter()
            .filter_map(|(_, out)| out.block.clone())
            .filter(|r| !r.trim().is_empty())
            .collect();
        let blocked = outputs.iter().any(|(_, out)| out.block.is_some());
        Ok(blocked.then(|| {
            if reasons.is_empty() {
                "(no reason given)".to_owned()
            } else {
                reasons.join("\n")
            }
        }))
    }
}

/// Claude Code's hook input, with forkd's ids beside it.
fn event(
    turn: &ToolTurn<'_>,
    event: HookEvent,
    name: &str,
    input: &Value,
    response: Option<&str>,
) -> Value {
    let mut payload = json!({
        "session_id": turn.session.id.to_string(),
        "transcript_path": Value::Null,
        // The workspace as the session names it (and its sandbox view shows it).
        "cwd": turn.session.workspace.display().to_string(),
        "hook_event_name": event.as_str(),
        "permission_mode": turn.permission_mode.as_str(),
        "tool_name": name,
        "tool_input": input,
        "agent_id": turn.agent.id.to_string(),
        "batch_id": turn.agent.batch_id.map(|b| b.to_string()),
    });
    if let (Some(response), Some(map)) = (response, payload.as_object_mut()) {
        map.insert("tool_response".into(), json!(response));
    }
    payload
}

/// Runs every command of one event at once; their outputs in the commands' order.
async fn run_all<'h>(
    commands: &[&'h HookCommand],
    event: HookEvent,
    payload: &Value,
    workspace: &str,
    ctx: &ToolContext,
) -> Vec<(&'h HookCommand, HookOutput)> {
    let workspace = workspace.to_owned();
    let input = payload.to_string().into_bytes();
    let runs = commands.iter().map(|hook| {
        let call = HookCall {
            command: hook.command.clone(),
            input: input.clone(),
            env: vec![
                ("CLAUDE_PROJECT_DIR".into(), workspace.clone()),
                ("FORKD_WORKSPACE".into(), workspace.clone()),
            ],
            timeout: hook.timeout,
            sandboxed: hook.sandboxed,
        };
        async move {
            let run = forkd_tools::hook::run(call, ctx).await;
            let output = HookOutput::of(event, &run);
            tracing::info!(
                hook.event = event.as_str(),
                hook.command = %hook.command,
                hook.exit = ?run.exit,
                hook.blocked = output.block.is_some(),
                hook.error = output.error.as_deref().unwrap_or(""),
                hook.message = output.system_message.as_deref().unwrap_or(""),
                "Hook ran"
            );
            (*hook, output)
        }
    });
    futures::future::join_all(runs).await
}

/// What the model reads of hooks' outputs: a block's reason (when `blocks` count, as after a
/// call that ran) and any additional context, one line per hook that said something.
fn feedback(outputs: &[(&HookCommand, HookOutput)], blocks: bool) -> Option<String> {
    let lines: Vec<String> = outputs
        .iter()
        .flat_map(|(hook, out)| {
            let block = out
                .block
                .as_ref()
                .filter(|_| blocks)
                .map(|b| format!("{} hook ({}) says: {b}", "PostToolUse", hook.command));
            let context = out.additional_context.clone();
            block.into_iter().chain(context)
        })
        .filter(|l| !l.trim().is_empty())
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}
