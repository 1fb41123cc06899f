//! Hooks' runs as they are kept (docs/contracts.md, "Hooks"): what each hook command decided
//! and said, for `forkctl logs` and the web view, and the store's part of them.

use async_trait::async_trait;

use super::{HookEvent, HookOutput, Permission};
use crate::AgentId;
use crate::store::Result;

/// The most bytes of what one run said that are kept.
pub const OUTPUT_BYTES: usize = 2_000;

/// One hook command's run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookRunRecord {
    /// The agent it ran for (a parent turn's hooks: the session's main loop).
    pub agent_id: AgentId,
    pub event: HookEvent,
    /// The tool call it was about (PreToolUse, PostToolUse, a Notification for its prompt).
    pub tool_use_id: Option<String>,
    pub tool_name: Option<String>,
    /// The command's first word: a session's own command may hold a secret.
    pub program: String,
    /// `None` when it was killed (its timeout) or never started.
    pub exit_code: Option<i32>,
    /// What it decided.
    pub decision: HookDecision,
    /// What it said: a reason, its context, its `systemMessage`, an error (clipped).
    pub output: String,
    pub started_at_ms: i64,
    pub finished_at_ms: i64,
}

/// What one run decided, strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookDecision {
    /// `continue: false`.
    Stop,
    Deny,
    /// Exit 2 or `decision: "block"` (an event other than PreToolUse).
    Block,
    Ask,
    Allow,
    /// A non-blocking error: another exit code, a timeout.
    Error,
    /// It ran and decided nothing.
    None,
}

impl HookDecision {
    pub const ALL: [HookDecision; 7] = [
        HookDecision::Stop,
        HookDecision::Deny,
        HookDecision::Block,
        HookDecision::Ask,
        HookDecision::Allow,
        HookDecision::Error,
        HookDecision::None,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HookDecision::Stop => "stop",
            HookDecision::Deny => "deny",
            HookDecision::Block => "block",
            HookDecision::Ask => "ask",
            HookDecision::Allow => "allow",
            HookDecision::Error => "error",
            HookDecision::None => "none",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.as_str() == text)
    }

    /// What `output` decided.
    pub fn of(output: &HookOutput) -> Self {
        match (
            &output.stop,
            output.permission,
            &output.block,
            &output.error,
        ) {
            (Some(_), ..) => HookDecision::Stop,
            (_, Some(Permission::Deny), ..) => HookDecision::Deny,
            (_, _, Some(_), _) => HookDecision::Block,
            (_, Some(Permission::Ask), ..) => HookDecision::Ask,
            (_, Some(Permission::Allow), ..) => HookDecision::Allow,
            (.., Some(_)) => HookDecision::Error,
            _ => HookDecision::None,
        }
    }
}

/// What `output` said, one part per line (its reason, context, message, error), clipped to
/// [`OUTPUT_BYTES`] on a character boundary.
pub fn said(output: &HookOutput) -> String {
    let parts = [
        output.stop.as_deref(),
        output.block.as_deref(),
        output.permission_reason.as_deref(),
        output.additional_context.as_deref(),
        output.system_message.as_deref(),
        output.error.as_deref(),
    ];
    let mut text = String::new();
    for part in parts.into_iter().flatten().filter(|p| !p.trim().is_empty()) {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(part.trim());
    }
    if text.len() > OUTPUT_BYTES {
        let mut end = OUTPUT_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// What an operator's hook said that its session may see: only what its model is told (a
/// stop's or block's reason, its context) — never its errors or `systemMessage`, which may name
/// the operator's machine.
pub fn said_to_session(output: &HookOutput) -> String {
    said(&HookOutput {
        stop: output.stop.clone(),
        block: output.block.clone(),
        additional_context: output.additional_context.clone(),
        ..HookOutput::default()
    })
}

/// The store's part of hooks' runs.
#[async_trait]
pub trait HookRunStore: Send + Sync {
    /// Keeps runs of one event (not fenced by a lease: a run that happened is kept).
    async fn record_hook_runs(&self, runs: &[HookRunRecord]) -> Result<()>;
    /// An agent's hooks' runs, in the order they were kept.
    async fn hook_runs(&self, agent: AgentId) -> Result<Vec<HookRunRecord>>;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn decisions_read_strongest_first_and_name_themselves() {
        let deny = HookOutput {
            permission: Some(Permission::Deny),
            block: Some("no".into()),
            ..HookOutput::default()
        };
        assert_eq!(HookDecision::of(&deny), HookDecision::Deny);
        let stop = HookOutput {
            stop: Some("enough".into()),
            ..deny.clone()
        };
        assert_eq!(HookDecision::of(&stop), HookDecision::Stop);
        let block = HookOutput {
            block: Some("tests fail".into()),
            ..HookOutput::default()
        };
        assert_eq!(HookDecision::of(&block), HookDecision::Block);
        assert_eq!(HookDecision::of(&HookOutput::default()), HookDecision::None);
        for d in HookDecision::ALL {
            assert_eq!(HookDecision::parse(d.as_str()), Some(d));
        }
    }

    #[test]
    fn what_a_run_said_is_clipped_on_a_character_boundary() {
        let out = HookOutput {
            additional_context: Some("é".repeat(OUTPUT_BYTES)),
            system_message: Some("shown".into()),
            ..HookOutput::default()
        };
        let text = said(&out);
        assert!(text.len() <= OUTPUT_BYTES + '…'.len_utf8());
        assert!(text.ends_with('…'));
        let short = HookOutput {
            block: Some(" why ".into()),
            system_message: Some("told".into()),
            ..HookOutput::default()
        };
        assert_eq!(said(&short), "why\ntold");
    }
}
