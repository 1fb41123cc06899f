//! Hooks: the policies and automations users wrote for Claude Code, in its format and with its
//! semantics (docs/contracts.md, "Hooks"). What is here is pure: the `hooks` block of a
//! `settings.json` parsed ([`HookSet`]), which commands an event runs ([`HookSet::commands`]),
//! what one command's run says ([`HookOutput::of`]: its exit code, stderr and JSON output) and
//! what several say together about one tool call ([`pre_tool_verdict`]: deny over ask over
//! allow; two different `updatedInput`s deny the call, naming both hooks). Running them is the
//! engine's.

pub mod runs;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

/// The events a hook may be registered for, by Claude Code's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HookEvent {
    PreToolUse,
    PostToolUse,
    UserPromptSubmit,
    Stop,
    SubagentStop,
    PreCompact,
    Notification,
    SessionStart,
}

impl HookEvent {
    pub const ALL: [HookEvent; 8] = [
        HookEvent::PreToolUse,
        HookEvent::PostToolUse,
        HookEvent::UserPromptSubmit,
        HookEvent::Stop,
        HookEvent::SubagentStop,
        HookEvent::PreCompact,
        HookEvent::Notification,
        HookEvent::SessionStart,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HookEvent::PreToolUse => "PreToolUse",
            HookEvent::PostToolUse => "PostToolUse",
            HookEvent::UserPromptSubmit => "UserPromptSubmit",
            HookEvent::Stop => "Stop",
            HookEvent::SubagentStop => "SubagentStop",
            HookEvent::PreCompact => "PreCompact",
            HookEvent::Notification => "Notification",
            HookEvent::SessionStart => "SessionStart",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == name)
    }

    /// Whether its matcher is read (against a tool's name; PreCompact's trigger, `manual` or
    /// `auto`; SessionStart's source, `startup`); for the others it is ignored.
    fn has_matcher(self) -> bool {
        matches!(
            self,
            HookEvent::PreToolUse
                | HookEvent::PostToolUse
                | HookEvent::PreCompact
                | HookEvent::SessionStart
        )
    }
}

/// How long a hook command may run unless it says (Claude Code's default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The longest `timeout` a hook may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);

/// The most matcher groups, and commands, one event may have in one settings file: a hook set is
/// parsed on every daemon that runs the session, and each command starts a sandboxed process.
pub const MAX_GROUPS: usize = 32;
pub const MAX_COMMANDS: usize = 32;

/// The longest matcher, and what its regular expression may compile to.
const MAX_MATCHER_CHARS: usize = 256;
const MATCHER_SIZE_LIMIT: usize = 64 * 1024;

/// One hook command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookCommand {
    /// Run by `bash -c`.
    pub command: String,
    pub timeout: Duration,
    /// Run in the session's sandbox view, as its Bash commands are. Only the operator's hooks may
    /// run outside it (`"sandbox": false`).
    pub sandboxed: bool,
    /// The operator's (`hooks.json`), not a session's own.
    pub operator: bool,
    /// Its place among its settings file's commands for its event, from 1: how it is named
    /// where its command must not be shown (it may hold a secret).
    pub position: usize,
}

impl HookCommand {
    /// How the hook is named to a session: by where it comes from and its place, never by its
    /// command.
    pub fn label(&self) -> String {
        let whose = if self.operator {
            "the operator's"
        } else {
            "the session's"
        };
        format!("{whose} hook #{}", self.position)
    }
}

/// A matcher: a regular expression over a tool's name (`Bash|Write`, `mcp__github__.*`), anchored
/// at both ends as Claude Code's are; empty or `*` matches every tool.
#[derive(Debug, Clone)]
struct Matcher {
    regex: Option<regex::Regex>,
}

impl Matcher {
    fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() || text == "*" {
            return Ok(Self { regex: None });
        }
        if text.chars().count() > MAX_MATCHER_CHARS {
            return Err(format!(
                "a matcher is at most {MAX_MATCHER_CHARS} characters"
            ));
        }
        regex::RegexBuilder::new(&format!("^(?:{text})$"))
            .size_limit(MATCHER_SIZE_LIMIT)
            .dfa_size_limit(4 * MATCHER_SIZE_LIMIT)
            .build()
            .map(|regex| Self { regex: Some(regex) })
            .map_err(|e| format!("matcher {text:?} is not a regular expression: {e}"))
    }

    fn matches(&self, tool: &str) -> bool {
        self.regex.as_ref().is_none_or(|r| r.is_match(tool))
    }
}

/// The hooks of one `settings.json`'s `hooks` block, by event.
#[derive(Debug, Clone, Default)]
pub struct HookSet {
    events: BTreeMap<HookEvent, Vec<(Matcher, Vec<HookCommand>)>>,
}

impl HookSet {
    /// Parses `{"hooks": {EVENT: [{"matcher": "…", "hooks": [{"type": "command", "command": "…",
    /// "timeout": 60}]}]}}` (a whole `settings.json`: other keys are ignored). `operator`: the
    /// daemon's own hooks, which may set `"sandbox": false`.
    pub fn parse(text: &str, operator: bool) -> Result<Self, String> {
        let settings: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let Some(hooks) = settings.get("hooks") else {
            return Ok(Self::default());
        };
        let hooks = hooks.as_object().ok_or("`hooks` is an object of events")?;
        let mut set = Self::default();
        for (name, groups) in hooks {
            let event = HookEvent::parse(name).ok_or_else(|| {
                format!(
                    "{name:?} is not a hook event ({})",
                    HookEvent::ALL.map(HookEvent::as_str).join(", ")
                )
            })?;
            let groups = groups
                .as_array()
                .ok_or_else(|| format!("{name}: a list of matchers and their hooks"))?;
            if groups.len() > MAX_GROUPS {
                return Err(format!("{name}: at most {MAX_GROUPS} matchers"));
            }
            let mut position = 0;
            for group in groups {
                let matcher = match group.get("matcher") {
                    None => Matcher::parse("")?,
                    Some(Value::String(m)) => Matcher::parse(m)?,
                    Some(_) => return Err(format!("{name}: `matcher` is a string")),
                };
                let commands = group
                    .get("hooks")
                    .and_then(Value::as_array)
                    .ok_or_else(|| format!("{name}: each matcher has a list of `hooks`"))?
                    .iter()
                    .map(|h| {
                        position += 1;
                        command(name, h, operator, position)
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if position > MAX_COMMANDS {
                    return Err(format!("{name}: at most {MAX_COMMANDS} hook commands"));
                }
                set.events
                    .entry(event)
                    .or_default()
                    .push((matcher, commands));
            }
        }
        Ok(set)
    }

    /// Another set's hooks after this one's (the operator's, then the session's).
    pub fn merged(mut self, other: &HookSet) -> HookSet {
        for (event, groups) in &other.events {
            self.events
                .entry(*event)
                .or_default()
                .extend(groups.iter().cloned());
        }
        self
    }

    pub fn is_empty(&self) -> bool {
        self.events.values().all(Vec::is_empty)
    }

    /// The events that have at least one command, in [`HookEvent::ALL`]'s order.
    pub fn events(&self) -> Vec<HookEvent> {
        self.events
            .iter()
            .filter(|(_, groups)| groups.iter().any(|(_, commands)| !commands.is_empty()))
            .map(|(event, _)| *event)
            .collect()
    }

    /// The commands `event` runs, for `tool` where the event is about one: every matching group's,
    /// in order, each command once.
    pub fn commands(&self, event: HookEvent, tool: Option<&str>) -> Vec<&HookCommand> {
        let mut out: Vec<&HookCommand> = Vec::new();
        for (matcher, commands) in self.events.get(&event).into_iter().flatten() {
            let applies = !event.has_matcher() || tool.is_some_and(|t| matcher.matches(t));
            if applies {
                for c in commands {
                    // A command set twice runs once (as in Claude Code).
                    if !out
                        .iter()
                        .any(|o| o.command == c.command && o.operator == c.operator)
                    {
                        out.push(c);
                    }
                }
            }
        }
        out
    }
}

fn command(
    event: &str,
    hook: &Value,
    operator: bool,
    position: usize,
) -> Result<HookCommand, String> {
    match hook.get("type").and_then(Value::as_str) {
        Some("command") => {}
        other => {
            return Err(format!(
                "{event}: hook type {other:?} is not supported (only \"command\")"
            ));
        }
    }
    let command = hook
        .get("command")
        .and_then(Value::as_str)
        .filter(|c| !c.trim().is_empty())
        .ok_or_else(|| format!("{event}: a command hook has a `command`"))?;
    let timeout = match hook.get("timeout") {
        None => DEFAULT_TIMEOUT,
        Some(t) => t
            .as_f64()
            .filter(|t| *t > 0.0)
            .and_then(|t| Duration::try_from_secs_f64(t).ok())
            .filter(|t| *t <= MAX_TIMEOUT)
            .ok_or_else(|| {
                format!(
                    "{event}: `timeout` is a positive number of seconds, at most {}",
                    MAX_TIMEOUT.as_secs()
                )
            })?,
    };
    let sandboxed = match hook.get("sandbox") {
        None => true,
        Some(Value::Bool(false)) if operator => false,
        Some(Value::Bool(false)) => {
            return Err(format!(
                "{event}: only the operator's hooks may run outside the sandbox"
            ));
        }
        Some(Value::Bool(true)) => true,
        Some(_) => return Err(format!("{event}: `sandbox` is true or false")),
    };
    Ok(HookCommand {
        command: command.to_owned(),
        timeout,
        sandboxed,
        operator,
        position,
    })
}

/// How one hook command's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookRun {
    /// Its exit code; `None` when it was killed (its timeout) or never ran.
    pub exit: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Whether its stdout passed the output cap (its middle was dropped): a JSON answer that
    /// long cannot be read.
    pub stdout_cut: bool,
    /// Why it did not finish, when it did not (a timeout, a sandbox that refused it).
    pub failure: Option<String>,
    /// Whether it started at all.
    pub started: bool,
}

/// A tool call's permission, as a PreToolUse hook decides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Permission {
    Allow,
    Ask,
    Deny,
}

/// What one hook's run says, Claude Code's way: exit 0 (its JSON output, if stdout is JSON),
/// exit 2 (block: stderr goes to the model), any other (a non-blocking error, told to the user).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HookOutput {
    /// `continue: false`: the agent stops after this hook (with `stop_reason`).
    pub stop: Option<String>,
    pub suppress_output: bool,
    /// Shown to the user (the log, the web view), never to the model.
    pub system_message: Option<String>,
    /// Blocks what the event is about (exit 2, `decision: "block"`, PreToolUse's `deny`), with
    /// the reason the model reads.
    pub block: Option<String>,
    /// PreToolUse's `permissionDecision`.
    pub permission: Option<Permission>,
    pub permission_reason: Option<String>,
    /// PreToolUse's replacement input.
    pub updated_input: Option<Value>,
    /// Context for the model (PostToolUse, UserPromptSubmit, SessionStart).
    pub additional_context: Option<String>,
    /// A non-blocking error (another exit code, a timeout): told to the user.
    pub error: Option<String>,
}

impl HookOutput {
    /// Reads a run of `hook` for `event`: as [`HookOutput::of`], except that an operator's
    /// PreToolUse hook that did not answer (another exit code, a timeout, a kill) denies its call.
    /// The session's own commands share its sandbox's limits and could make it fail: the
    /// operator's policy fails closed.
    pub fn of_command(hook: &HookCommand, event: HookEvent, run: &HookRun) -> HookOutput {
        let mut out = HookOutput::of(event, run);
        if hook.operator
            && event == HookEvent::PreToolUse
            && out.permission.is_none()
            && out.error.is_some()
        {
            // Its stderr stays the operator's: the session reads only that it did not answer.
            let how = match run.exit {
                Some(code) => format!("exit code {code}"),
                None => "it timed out or could not run".to_owned(),
            };
            out.permission = Some(Permission::Deny);
            out.block = Some(format!("{} did not answer ({how})", hook.label()));
        }
        out
    }

    /// Reads a run of a hook for `event`.
    pub fn of(event: HookEvent, run: &HookRun) -> HookOutput {
        if let Some(failure) = &run.failure {
            // A PreToolUse hook that could not even start fails closed: the call it guards does
            // not run unchecked (one that ran and timed out is a non-blocking error, as in Claude
            // Code).
            if !run.started && event == HookEvent::PreToolUse {
                return HookOutput {
                    block: Some(failure.clone()),
                    permission: Some(Permission::Deny),
                    error: Some(failure.clone()),
                    ..HookOutput::default()
                };
            }
            return HookOutput {
                error: Some(failure.clone()),
                ..HookOutput::default()
            };
        }
        match run.exit {
            Some(0) => {}
            Some(2) => {
                return HookOutput {
                    block: Some(run.stderr.trim().to_owned()),
                    permission: (event == HookEvent::PreToolUse).then_some(Permission::Deny),
                    ..HookOutput::default()
                };
            }
            code => {
                let code = code.map_or("no exit code".to_owned(), |c| format!("exit code {c}"));
                return HookOutput {
                    error: Some(format!("{code}: {}", run.stderr.trim())),
                    ..HookOutput::default()
                };
            }
        }
        if run.stdout_cut && run.stdout.trim_start().starts_with('{') {
            // An answer forkd could not read whole: a PreToolUse hook's guard fails closed (its
            // `deny` may be what was lost), any other's is a non-blocking error.
            let why = "its JSON answer passed the output cap and could not be read".to_owned();
            return HookOutput {
                block: (event == HookEvent::PreToolUse).then(|| why.clone()),
                permission: (event == HookEvent::PreToolUse).then_some(Permission::Deny),
                error: Some(why),
                ..HookOutput::default()
            };
        }
        let Ok(Value::Object(json)) = serde_json::from_str::<Value>(run.stdout.trim()) else {
            // Plain stdout: context for the events whose stdout Claude Code hands the model.
            let context = matches!(event, HookEvent::UserPromptSubmit | HookEvent::SessionStart)
                .then(|| run.stdout.trim().to_owned())
                .filter(|s| !s.is_empty());
            return HookOutput {
                additional_context: context,
                ..HookOutput::default()
            };
        };
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
        let specific = json.get("hookSpecificOutput").and_then(Value::as_object);
        let from_specific = |key: &str| specific.and_then(|s| s.get(key));
        let mut out = HookOutput {
            stop: (json.get("continue") == Some(&Value::Bool(false))).then(|| {
                text(json.get("stopReason")).unwrap_or_else(|| "a hook stopped the agent".into())
            }),
            suppress_output: json.get("suppressOutput") == Some(&Value::Bool(true)),
            system_message: text(json.get("systemMessage")),
            additional_context: text(from_specific("additionalContext")),
            updated_input: from_specific("updatedInput").cloned(),
            permission_reason: text(from_specific("permissionDecisionReason")),
            ..HookOutput::default()
        };
        out.permission = match text(from_specific("permissionDecision")).as_deref() {
            Some("allow") => Some(Permission::Allow),
            Some("ask") => Some(Permission::Ask),
            Some("deny") => Some(Permission::Deny),
            _ => None,
        };
        let reason = text(json.get("reason"));
        match text(json.get("decision")).as_deref() {
            Some("block") => {
                out.block = Some(reason.unwrap_or_else(|| "blocked by a hook".into()));
                if event == HookEvent::PreToolUse && out.permission.is_none() {
                    out.permission = Some(Permission::Deny);
                }
            }
            // The older spelling of PreToolUse's allow.
            Some("approve") if event == HookEvent::PreToolUse && out.permission.is_none() => {
                out.permission = Some(Permission::Allow);
            }
            _ => {}
        }
        if out.permission == Some(Permission::Deny) && out.block.is_none() {
            out.block = Some(
                out.permission_reason
                    .clone()
                    .unwrap_or_else(|| "denied by a hook".into()),
            );
        }
        out
    }
}

/// What a tool call's PreToolUse hooks decide together.
#[derive(Debug, Clone, PartialEq)]
pub struct PreToolVerdict {
    /// `None`: no hook decided; the permission rules decide as without hooks.
    pub permission: Option<Permission>,
    /// Why (the model reads a denial's).
    pub reason: Option<String>,
    /// The input the call runs with, when a hook replaced it.
    pub updated_input: Option<Value>,
    /// `continue: false`: the call does not run and the agent stops, for this reason.
    pub stop: Option<String>,
    /// The hooks' `additionalContext`, for the model: after the call's result when it runs,
    /// with the reason when it is denied.
    pub context: Option<String>,
}

/// Combines the PreToolUse outputs of one call (each with its hook's command, to name it): deny
/// over ask over allow; two different `updatedInput`s deny the call, naming both hooks.
pub fn pre_tool_verdict(outputs: &[(&HookCommand, HookOutput)]) -> PreToolVerdict {
    let mut updated: Option<(String, &Value)> = None;
    for (hook, out) in outputs {
        if let Some(input) = &out.updated_input {
            match updated {
                Some((other, earlier)) if earlier != input => {
                    return PreToolVerdict {
                        permission: Some(Permission::Deny),
                        reason: Some(format!(
                            "two hooks changed this call's input differently ({other} and {}); \
                             it does not run",
                            hook.label()
                        )),
                        updated_input: None,
                        stop: stopped(outputs),
                        context: None,
                    };
                }
                Some(_) => {}
                None => updated = Some((hook.label(), input)),
            }
        }
    }
    let strongest = outputs
        .iter()
        .filter_map(|(_, out)| out.permission.map(|p| (p, out)))
        .max_by_key(|(p, _)| *p);
    let reason = strongest.and_then(|(p, out)| match p {
        Permission::Deny => out.block.clone(),
        _ => out.permission_reason.clone(),
    });
    if let Some(stop) = stopped(outputs) {
        // `continue: false` comes before any decision: the call does not run.
        return PreToolVerdict {
            permission: Some(Permission::Deny),
            reason: Some(stop.clone()),
            updated_input: None,
            stop: Some(stop),
            context: None,
        };
    }
    PreToolVerdict {
        permission: strongest.map(|(p, _)| p),
        reason,
        updated_input: updated.map(|(_, input)| input.clone()),
        stop: None,
        context: None,
    }
}

/// Why an event's hooks block what it is about (exit 2, `decision: "block"`): their reasons,
/// one per line; `None` when none blocks.
pub fn blocked(outputs: &[(&HookCommand, HookOutput)]) -> Option<String> {
    said(outputs, |out| out.block.as_deref(), "(no reason given)")
}

/// Why an event's hooks stop the agent (`continue: false`, whose `stopReason` the user reads);
/// `None` when none does.
pub fn stopped(outputs: &[(&HookCommand, HookOutput)]) -> Option<String> {
    said(
        outputs,
        |out| out.stop.as_deref(),
        "a hook stopped the agent",
    )
}

/// What an event's hooks add for the model (`additionalContext`, and the plain stdout of the
/// events whose stdout is context), one per line.
pub fn context(outputs: &[(&HookCommand, HookOutput)]) -> Option<String> {
    let lines: Vec<&str> = outputs
        .iter()
        .filter_map(|(_, out)| out.additional_context.as_deref())
        .filter(|c| !c.trim().is_empty())
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

fn said(
    outputs: &[(&HookCommand, HookOutput)],
    what: impl Fn(&HookOutput) -> Option<&str>,
    otherwise: &str,
) -> Option<String> {
    let all: Vec<&str> = outputs.iter().filter_map(|(_, out)| what(out)).collect();
    if all.is_empty() {
        return None;
    }
    let reasons: Vec<&str> = all.into_iter().filter(|r| !r.trim().is_empty()).collect();
    Some(if reasons.is_empty() {
        otherwise.to_owned()
    } else {
        reasons.join("\n")
    })
}

#[cfg(test)]
mod tests;
