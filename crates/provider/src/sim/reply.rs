//! What the simulated model answers: find the script in the conversation, work out which step it
//! is at, and produce that step's tool turn or the final structured report.

use forkd_core::Role;
use forkd_core::fork::BOILERPLATE_TAG;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::request::SimMessage;
use super::script::{self, Mods, Script};

/// One content block of the reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OutBlock {
    Thinking(String),
    Text(String),
    ToolUse {
        id: String,
        name: String,
        input: String,
    },
}

/// The reply to one request, before it is streamed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    pub blocks: Vec<OutBlock>,
    pub stop_reason: &'static str,
    pub mods: Mods,
    /// SHA-256 of the script text: with a fail line's index, the key of its consumed count.
    pub script_key: [u8; 32],
}

/// The thinking a reply opens with when thinking is enabled and its script says nothing else.
pub(crate) const DEFAULT_THOUGHT: &str = "Let me work out what is asked.";

/// The signature the sim puts on its thinking blocks.
pub(crate) const SIGNATURE: &str = "sim";

fn text_blocks(message: &SimMessage) -> impl DoubleEndedIterator<Item = &str> {
    message.blocks.iter().filter_map(|b| {
        (b.get("type").and_then(Value::as_str) == Some("text"))
            .then(|| b.get("text").and_then(Value::as_str))
            .flatten()
    })
}

/// Where the script is.
struct Located<'a> {
    /// The user message S that holds it; steps are counted from there.
    message: Option<usize>,
    /// The text block holding the script: the directive.
    directive: &'a str,
    /// Whether the directive holds `@sim` lines.
    scripted: bool,
}

/// The latest user text block with an `@sim` line holds the script; a fork child never reads past
/// its own boilerplate into its parent's messages. Without a script, the latest user text is the
/// directive.
fn locate(messages: &[SimMessage]) -> Located<'_> {
    let boilerplate = format!("<{BOILERPLATE_TAG}>");
    let users = || {
        messages
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, m)| m.role == Role::User)
    };
    for (i, message) in users() {
        if let Some(text) = text_blocks(message).rev().find(|t| script::has_script(t)) {
            return Located {
                message: Some(i),
                directive: text,
                scripted: true,
            };
        }
        if text_blocks(message).any(|t| t.trim_start().starts_with(&boilerplate)) {
            break;
        }
    }
    let latest = users().find_map(|(i, m)| Some((i, text_blocks(m).next_back()?)));
    Located {
        message: latest.map(|(i, _)| i),
        directive: latest.map_or("", |(_, t)| t),
        scripted: false,
    }
}

/// A tool_use id that depends only on the script, the step and the call's place in the turn, so
/// replaying a request reproduces it.
fn tool_id(script_text: &str, step: usize, index: usize) -> String {
    let mut h = Sha256::new();
    h.update(script_text.as_bytes());
    h.update((step as u64).to_le_bytes());
    h.update((index as u64).to_le_bytes());
    format!("toolu_sim_{}", hex::encode(&h.finalize()[..12]))
}

/// The opening of forkd's compaction instruction (`forkd_core::compaction::INSTRUCTION`).
const COMPACTION_REQUEST: &str = "<compaction-request>";

/// A compaction request — the last user message ends with the instruction — gets what a model
/// asked for a summary writes: one line per user request of the conversation, oldest first, so
/// a summary of a summary keeps what came before.
fn summary(messages: &[SimMessage]) -> Option<Reply> {
    let last = messages.last().filter(|m| m.role == Role::User)?;
    if !text_blocks(last)
        .next_back()
        .is_some_and(|t| t.trim_start().starts_with(COMPACTION_REQUEST))
    {
        return None;
    }
    let mut lines = Vec::new();
    for m in messages.iter().filter(|m| m.role == Role::User) {
        for text in text_blocks(m) {
            let text = text.trim_start();
            if text.starts_with(COMPACTION_REQUEST) {
                continue;
            }
            if text.starts_with("<compaction-summary>") {
                // The earlier summary's lines, kept as they are.
                lines.extend(
                    text.lines()
                        .filter(|l| l.starts_with("- "))
                        .map(str::to_owned),
                );
            } else if let Some(first) = text.lines().map(str::trim).find(|l| !l.is_empty()) {
                lines.push(format!("- {}", first.chars().take(120).collect::<String>()));
            }
        }
    }
    let mut text = format!("The user asked, in order:\n{}", lines.join("\n"));
    // What is in progress, verbatim: the latest script, so the sim carries on with it as a model
    // carries on with the task its summary describes.
    let latest = locate(messages);
    if latest.scripted {
        text.push_str("\n\nIn progress, the latest request as the user wrote it:\n");
        text.push_str(latest.directive);
    }
    Some(Reply {
        blocks: vec![OutBlock::Text(text)],
        stop_reason: "end_turn",
        mods: Mods::default(),
        script_key: Sha256::digest(b"compaction").into(),
    })
}

/// The reply to a conversation.
pub(crate) fn reply(messages: &[SimMessage]) -> Reply {
    if let Some(summary) = summary(messages) {
        return summary;
    }
    let Located {
        message,
        directive,
        scripted,
    } = locate(messages);
    // The messages after S: their assistant turns are the steps taken, their tool calls the
    // files the report lists.
    let after = message.map_or(&messages[messages.len()..], |s| &messages[s + 1..]);
    let step = after.iter().filter(|m| m.role == Role::Assistant).count();
    let script_key: [u8; 32] = Sha256::digest(directive.as_bytes()).into();
    let parsed = if scripted {
        script::parse(directive)
    } else {
        Ok(Script::default())
    };
    let (content, stop_reason, mods) = match parsed {
        Ok(mut script) if step < script.turns.len() => {
            let turn = script.turns.swap_remove(step);
            let calls = turn
                .calls
                .into_iter()
                .enumerate()
                .map(|(i, c)| OutBlock::ToolUse {
                    id: tool_id(directive, step, i),
                    name: c.name,
                    input: c.input,
                });
            (calls.collect(), "tool_use", turn.mods)
        }
        Ok(script) => {
            let result = if script.say.is_empty() {
                format!("Done: {}", scope(directive))
            } else {
                script.say.join("\n")
            };
            let text = report(directive, &result, after, "none");
            (vec![OutBlock::Text(text)], "end_turn", script.final_mods)
        }
        Err(e) => {
            let issues = format!("the @sim script could not run ({e})");
            let text = report(directive, &format!("sim script error: {e}"), after, &issues);
            (vec![OutBlock::Text(text)], "end_turn", Mods::default())
        }
    };
    let blocks = mods
        .think
        .iter()
        .cloned()
        .map(OutBlock::Thinking)
        .chain(content)
        .collect();
    Reply {
        blocks,
        stop_reason,
        mods,
        script_key,
    }
}

/// The directive's first prose line, trimmed and capped at 120 characters.
fn scope(directive: &str) -> String {
    directive
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("@sim"))
        .map_or_else(
            || "the directive".to_owned(),
            |l| l.chars().take(120).collect(),
        )
}

/// The structured report (docs/contracts.md): scope, result, files read and changed since the script's
/// message, issues.
fn report(directive: &str, result: &str, after: &[SimMessage], issues: &str) -> String {
    let mut read: Vec<String> = Vec::new();
    let mut changed: Vec<String> = Vec::new();
    let tool_uses = after
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .flat_map(|m| &m.blocks)
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"));
    for block in tool_uses {
        let input = block.get("input");
        let field = |k: &str| input.and_then(|i| i.get(k)).and_then(Value::as_str);
        let (list, path) = match block.get("name").and_then(Value::as_str) {
            Some("Read" | "Glob" | "Grep") => (&mut read, field("file_path").or(field("path"))),
            Some("Write" | "Edit") => (&mut changed, field("file_path")),
            _ => continue,
        };
        if let Some(p) = path
            && !list.iter().any(|x| x == p)
        {
            list.push(p.to_owned());
        }
    }
    let list = |l: &[String]| {
        if l.is_empty() {
            "none".to_owned()
        } else {
            l.join(", ")
        }
    };
    format!(
        "Scope: {}\nResult: {result}\nKey files: {}\nFiles changed: {}\nIssues: {issues}",
        scope(directive),
        list(&read),
        list(&changed),
    )
}
