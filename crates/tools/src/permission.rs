//! Permission decisions: whether a tool call may run, must be refused, or needs someone's yes.
//!
//! Order of precedence:
//! 1. a matching **deny** rule refuses the call;
//! 2. **plan** mode refuses every mutating tool. This comes before allow rules on purpose:
//!    rules are usually written for normal work, and an `allow: Write(src/**)` must not quietly
//!    break plan mode's promise that nothing changes;
//! 3. a matching **allow** rule allows it;
//! 4. the **mode** decides: `bypassPermissions` allows everything; read-only tools (and the
//!    Agent tool, whose children carry their own mode) are always allowed; `acceptEdits` allows
//!    Write/Edit inside the workspace and asks for Bash; `default` and `bubble` ask for every
//!    mutating tool (the engine routes a `bubble` ask to the parent's client); `dontAsk` turns
//!    each ask into a refusal.
//!
//! A Write or Edit whose path does not resolve inside the workspace is refused with the
//! confinement error instead of being asked about: no answer could make it succeed.

use forkd_core::session::PermissionMode;
use forkd_core::tools::AGENT_TOOL;
use serde_json::Value;

use crate::rule::{Purpose, Rule, Subject, normalize};
use crate::workspace::{Access, Workspace};

/// The outcome of a permission check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Refused, with the reason the model is told.
    Deny(String),
    /// Needs approval; the text says what is being asked.
    Ask(String),
}

/// A session's permission mode and rules.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub mode: PermissionMode,
    pub allow: Vec<Rule>,
    pub deny: Vec<Rule>,
    /// Further tools that only look (the MCP tools the operator marked read-only): allowed in
    /// every mode, like Read.
    pub read_only: Vec<String>,
}

impl Policy {
    /// A policy with a mode and no rules.
    pub fn new(mode: PermissionMode) -> Policy {
        Policy {
            mode,
            ..Policy::default()
        }
    }

    /// Decides whether the call `tool(input)` may run in `workspace`.
    pub fn decide(&self, tool: &str, input: &Value, workspace: &Workspace) -> Decision {
        let subject = subject(tool, input, workspace);
        if let Some(rule) = self
            .deny
            .iter()
            .find(|rule| rule.matches(tool, &subject, Purpose::Deny))
        {
            return Decision::Deny(format!("{tool} is denied by the permission rule `{rule}`"));
        }
        if self.mode == PermissionMode::Plan && !self.never_asks(tool) {
            return Decision::Deny(format!(
                "plan mode is read-only: {tool} is not allowed until the plan is approved"
            ));
        }
        if self
            .allow
            .iter()
            .any(|rule| rule.matches(tool, &subject, Purpose::Allow))
        {
            return Decision::Allow;
        }
        self.by_mode(tool, &subject)
    }

    /// Why the call is refused whatever a hook or a person allows: a deny rule, plan mode, or a
    /// path the call may not name. A hook's `allow` skips the question, never these.
    pub fn refusal(&self, tool: &str, input: &Value, workspace: &Workspace) -> Option<String> {
        match self.decide(tool, input, workspace) {
            Decision::Deny(reason) => {
                let subject = subject(tool, input, workspace);
                let by_rule = self
                    .deny
                    .iter()
                    .any(|rule| rule.matches(tool, &subject, Purpose::Deny));
                let by_plan = self.mode == PermissionMode::Plan && !self.never_asks(tool);
                let by_path = matches!(subject, Subject::Path(Err(_)));
                (by_rule || by_plan || by_path).then_some(reason)
            }
            Decision::Allow | Decision::Ask(_) => None,
        }
    }

    /// Tools every mode allows: the read-only ones, and Agent (a child runs under its own mode).
    fn never_asks(&self, tool: &str) -> bool {
        crate::is_read_only(tool) || tool == AGENT_TOOL || self.read_only.iter().any(|t| t == tool)
    }

    fn by_mode(&self, tool: &str, subject: &Subject) -> Decision {
        if self.mode == PermissionMode::BypassPermissions || self.never_asks(tool) {
            return Decision::Allow;
        }
        if let Subject::Path(Err(reason)) = subject {
            return Decision::Deny(reason.clone());
        }
        let edits = matches!(tool, "Write" | "Edit");
        match self.mode {
            PermissionMode::AcceptEdits if edits => Decision::Allow,
            PermissionMode::DontAsk => Decision::Deny(format!(
                "{tool} would need permission; this session never asks"
            )),
            _ => Decision::Ask(question(tool, subject)),
        }
    }
}

/// What rules match a call against: Bash's command, or a path tool's resolved target.
fn subject(tool: &str, input: &Value, workspace: &Workspace) -> Subject {
    let field = match tool {
        "Bash" => {
            return match input.get("command").and_then(Value::as_str) {
                Some(command) => Subject::Command(normalize(command)),
                None => Subject::Nothing,
            };
        }
        "Read" | "Write" | "Edit" => "file_path",
        "Glob" | "Grep" => "path",
        _ => return Subject::Nothing,
    };
    let path = match input.get(field) {
        None | Some(Value::Null) if field == "path" => ".",
        other => match other.and_then(Value::as_str) {
            Some(path) => path,
            None => return Subject::Nothing,
        },
    };
    // Write access because it does not require the path to exist yet; the confinement checks
    // (symlinks, `..`, prefixes) are the same, and the target's real location is what matters.
    Subject::Path(
        workspace
            .resolve(path, Access::Write)
            .map(|resolved| workspace.relative(&resolved))
            .map_err(|e| e.to_string()),
    )
}

fn question(tool: &str, subject: &Subject) -> String {
    match (tool, subject) {
        ("Bash", Subject::Command(command)) => format!("Allow Bash to run `{command}`?"),
        ("Write", Subject::Path(Ok(path))) => format!("Allow Write to {path}?"),
        ("Edit", Subject::Path(Ok(path))) => format!("Allow Edit of {path}?"),
        _ => format!("Allow {tool}?"),
    }
}
