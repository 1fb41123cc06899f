//! A parent turn's hooks (docs/contracts.md, "Hooks"): `UserPromptSubmit` before the user's
//! message is stored — it may block the message (the client is told why, nothing is stored) or
//! add context to it, inside the user message being submitted — and `Stop` as the parent ends
//! its turn, which may keep it going with the hooks' reasons as its next message.

use std::sync::Arc;

use forkd_core::hooks::HookEvent;
use forkd_core::session::Session;
use forkd_core::tools::AGENT_TOOL;
use forkd_core::{Agent, Block, Message};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{Turn, Turns};
use crate::error::{EngineError, Result};
use crate::run::tools::ToolTurn;

/// The tag around what UserPromptSubmit hooks add to a message (as Claude Code tags it).
const PROMPT_HOOK_TAG: &str = "user-prompt-submit-hook";

impl Turns {
    /// The turn's user message: `text`, and what its UserPromptSubmit hooks add. A hook that
    /// blocks it (exit 2, `decision: "block"`, `continue: false`) refuses the message.
    pub(super) async fn prompt_message(
        self: &Arc<Self>,
        session: &Session,
        parent: &Agent,
        text: &str,
    ) -> Result<Message> {
        let fields = json!({ "prompt": text });
        // Not yet a turn a client could cancel: the hooks' own timeouts bound them.
        let cancel = self.shutdown.child_token();
        let said = self
            .runs
            .event_hooks(
                parent,
                session,
                HookEvent::UserPromptSubmit,
                fields,
                &cancel,
            )
            .await?;
        if let Some(reason) = said.stopped.or(said.blocked) {
            return Err(EngineError::HookBlocked(reason));
        }
        let mut blocks = vec![Block::text(text)];
        if let Some(context) = said.context {
            blocks.push(Block::text(&format!(
                "<{PROMPT_HOOK_TAG}>\n{context}\n</{PROMPT_HOOK_TAG}>"
            )));
        }
        Ok(Message::user(blocks))
    }

    /// The PreToolUse hooks of the reply's `Agent` calls: the calls they refuse, each with its
    /// result, and why they stop the turn if one does.
    pub(super) async fn gate_agent_calls(
        self: &Arc<Self>,
        turn: &Turn,
        reply: &Message,
        cancel: &CancellationToken,
    ) -> Result<(Vec<(String, Block)>, Option<String>)> {
        let conversation = [reply.clone()];
        let tool_turn = ToolTurn {
            agent: &turn.parent,
            lease: &turn.lease,
            session: &turn.session,
            permission_mode: turn.session.permission_mode,
            offered: turn.session.params.tools.names(),
            conversation: &conversation,
            cancel: cancel.clone(),
        };
        let (mut refused, mut stopped) = (Vec::new(), None);
        for (id, name, block) in reply.tool_uses() {
            if name != AGENT_TOOL {
                continue;
            }
            let input = block.tool_input().unwrap_or(serde_json::Value::Null);
            let (refusal, stop) = self.runs.agent_call_hooks(&tool_turn, id, &input).await?;
            if let Some(refusal) = refusal {
                refused.push((id.to_owned(), Block::tool_result(id, &refusal, true)));
            }
            stopped = stopped.or(stop);
        }
        Ok((refused, stopped))
    }

    /// Whether the turn goes on because a Stop hook blocked its end already: the session's last
    /// message is a stop hook's note (a turn resumed after a restart reads it there).
    pub(super) async fn stop_hook_was_active(&self, session: &Session) -> Result<bool> {
        let hooks = self.sessions.hooks().for_session(session)?;
        if hooks.commands(HookEvent::Stop, None).is_empty() {
            return Ok(false);
        }
        let count = self.store.session_message_count(session.id).await?;
        let Some(last) = count.checked_sub(1) else {
            return Ok(false);
        };
        let tail = self
            .store
            .session_messages_from(session.id, last, None)
            .await?;
        Ok(tail
            .last()
            .is_some_and(|m| crate::run::hooks::is_stop_hook_note(&m.message)))
    }

    /// The parent's Stop hooks as it ends its turn: the reasons to go on when one blocks,
    /// `None` when the turn may end (`continue: false` ends it whatever blocks). `active`: it
    /// goes on already because of one.
    pub(super) async fn stop_hooks(
        self: &Arc<Self>,
        turn: &Turn,
        active: bool,
        cancel: &CancellationToken,
    ) -> Result<Option<String>> {
        let fields = json!({ "stop_hook_active": active });
        let said = self
            .runs
            .event_hooks(&turn.parent, &turn.session, HookEvent::Stop, fields, cancel)
            .await?;
        Ok(said.blocked.filter(|_| said.stopped.is_none()))
    }
}
