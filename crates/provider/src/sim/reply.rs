//! What the simulated model answers: find the script in the conversation, work out which step it
//! is at, and produce that step's tool turn or the final answer: the structured report, or the
//! JSON object a `json` line or the request's output schema calls for.

use forkd_core::Role;
use forkd_core::fork::BOILERPLATE_TAG;
use forkd_core::output::{SCHEMA_TAG, schema_in_block};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::request::SimMessage;
use super::schema;
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
    /// The text block holding the script: the directive (a compaction summary's copy of it).
    directive: &'a str,
    /// Whether the directive holds `@sim` lines.
    scripted: bool,
    /// Steps of the script taken before S: those a compaction summary stands for (0 for a
    /// script the user wrote).
    steps_before: usize,
}

/// The header before the script in progress in a summary: the script follows it verbatim.
const IN_PROGRESS: &str = "In progress, the latest request as the user wrote it";

/// The script in progress that a summary text carries, and how many of its steps the messages
/// it replaced had taken: `(steps, script)`. `None` for a text that is not a summary with one.
fn summarized_script(text: &str) -> Option<(usize, &str)> {
    let text = text.trim_start();
    if !text.starts_with(SUMMARY_OPEN) {
        return None;
    }
    let at = text.find(IN_PROGRESS)?;
    let rest = &text[at + IN_PROGRESS.len()..];
    let (header, script) = rest.split_once('\n')?;
    // ", N of its steps taken:" (a summary written before steps were kept says ":" alone).
    let steps = header
        .trim_start_matches(',')
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let script = script
        .trim_end()
        .strip_suffix(SUMMARY_CLOSE)
        .unwrap_or(script)
        .trim_end();
    Some((steps, script))
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
            // A compaction summary carries the script in progress and the steps it had taken,
            // so the script goes on where it was, not from its start.
            let (steps_before, directive) = summarized_script(text).unwrap_or((0, text));
            return Located {
                message: Some(i),
                directive,
                scripted: true,
                steps_before,
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
        steps_before: 0,
    }
}

/// The output schema the request carries: the latest user text block that is a schema block
/// (docs/contracts.md, "Output schemas"), parsed. As with the script, a fork child never reads past
/// its own boilerplate into its parent's messages. `None` without one, or when the block's schema
/// does not parse (the sim then answers with its report).
fn requested(messages: &[SimMessage]) -> Option<Value> {
    let boilerplate = format!("<{BOILERPLATE_TAG}>");
    let open = format!("<{SCHEMA_TAG}>");
    for message in messages.iter().rev().filter(|m| m.role == Role::User) {
        if let Some(block) = text_blocks(message)
            .rev()
            .find(|t| t.trim_start().starts_with(&open))
        {
            return serde_json::from_str(schema_in_block(block)?).ok();
        }
        if text_blocks(message).any(|t| t.trim_start().starts_with(&boilerplate)) {
            break;
        }
    }
    None
}

/// The steps of the located script taken so far: those before S and the replies after it.
fn steps_taken(messages: &[SimMessage], located: &Located<'_>) -> usize {
    let after = located
        .message
        .map_or(&messages[messages.len()..], |s| &messages[s + 1..]);
    located.steps_before + after.iter().filter(|m| m.role == Role::Assistant).count()
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

/// The opening and the end of forkd's summary message (`forkd_core::compaction::SUMMARY_TAG`).
const SUMMARY_OPEN: &str = "<compaction-summary>";
const SUMMARY_CLOSE: &str = "</compaction-summary>";

/// A compaction request — the last user message ends with the instruction — gets what a model
/// asked for a summary writes: one line per user request of the conversation, oldest first, so
/// a summary of a summary keeps what came before; then the script in progress, verbatim, with
/// the number of its steps taken (a model's summary says how far the task has got).
fn summary(messages: &[SimMessage]) -> Option<Reply> {
    let last = messages.last().filter(|m| m.role == Role::User)?;
    if !text_blocks(last)
        .next_back()
        .is_some_and(|t| t.trim_start().starts_with(COMPACTION_REQUEST))
    {
        return None;
    }
    let boilerplate = format!("<{BOILERPLATE_TAG}>");
    let mut lines = Vec::new();
    for m in messages.iter().filter(|m| m.role == Role::User) {
        for text in text_blocks(m) {
            let text = text.trim_start();
            if text.starts_with(COMPACTION_REQUEST) || text.starts_with(&boilerplate) {
                continue;
            }
            if text.starts_with(SUMMARY_OPEN) {
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
        let steps = steps_taken(messages, &latest);
        text.push_str(&format!("\n\n{IN_PROGRESS}, {steps} of its steps taken:\n"));
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
    let located = locate(messages);
    // The messages after S: their assistant turns are the steps taken (after those a summary
    // stands for), their tool calls the files the report lists.
    let step = steps_taken(messages, &located);
    let Located {
        message,
        directive,
        scripted,
        ..
    } = located;
    let after = message.map_or(&messages[messages.len()..], |s| &messages[s + 1..]);
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
            // The k-th final answer of the script: 0 after its tool turns, 1 after a follow-up.
            let k = step.saturating_sub(script.turns.len());
            let text = match (
                script.json.get(k).or(script.json.last()),
                requested(messages),
            ) {
                (Some(object), _) if script.say.is_empty() => object.clone(),
                (Some(object), _) => format!("{}\n\n```json\n{object}\n```", script.say.join("\n")),
                (None, Some(schema)) => schema::minimal(&schema).to_string(),
                (None, None) => {
                    let result = if script.say.is_empty() {
                        format!("Done: {}", scope(directive))
                    } else {
                        script.say.join("\n")
                    };
                    report(directive, &result, after, "none")
                }
            };
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use forkd_core::compaction::{INSTRUCTION, SUMMARY_TAG, summary_message};
    use forkd_core::output::{OutputSchema, follow_up};
    use serde_json::json;

    use super::*;

    const SCRIPT: &str = "Read three files.\n@sim tool Read {\"file_path\":\"a\"}\n\
        @sim think next\n@sim tool Read {\"file_path\":\"b\"}\n@sim think last\n\
        @sim tool Read {\"file_path\":\"c\"}\n@sim say read";

    fn text(t: &str) -> Arc<Value> {
        Arc::new(json!({"type": "text", "text": t}))
    }

    fn user(blocks: Vec<Arc<Value>>) -> SimMessage {
        SimMessage {
            role: Role::User,
            blocks,
        }
    }

    fn reply_message(reply: &Reply) -> SimMessage {
        let blocks = reply
            .blocks
            .iter()
            .map(|b| match b {
                OutBlock::ToolUse { id, name, input } => Arc::new(json!({
                    "type": "tool_use", "id": id, "name": name,
                    "input": serde_json::from_str::<Value>(input).unwrap(),
                })),
                OutBlock::Text(t) => text(t),
                OutBlock::Thinking(t) => Arc::new(json!({"type": "thinking", "thinking": t})),
            })
            .collect();
        SimMessage {
            role: Role::Assistant,
            blocks,
        }
    }

    fn result(id: &str) -> SimMessage {
        user(vec![Arc::new(
            json!({"type": "tool_result", "tool_use_id": id, "content": "x"}),
        )])
    }

    fn first_tool(reply: &Reply) -> (String, String) {
        reply
            .blocks
            .iter()
            .find_map(|b| match b {
                OutBlock::ToolUse { id, input, .. } => Some((id.clone(), input.clone())),
                _ => None,
            })
            .unwrap_or_else(|| panic!("not a tool call: {reply:?}"))
    }

    #[test]
    fn the_summary_tags_are_cores() {
        assert_eq!(SUMMARY_OPEN, format!("<{SUMMARY_TAG}>"));
        assert_eq!(SUMMARY_CLOSE, format!("</{SUMMARY_TAG}>"));
        assert!(INSTRUCTION.starts_with(COMPACTION_REQUEST));
    }

    /// A script cut by a compaction goes on at the step it had reached: the summary says how
    /// many steps were taken, and the steps after it add to those.
    #[test]
    fn a_compacted_script_goes_on_where_it_was() {
        // Two steps taken: [script, A0, R0, A1, R1].
        let mut convo = vec![user(vec![text(SCRIPT)])];
        for _ in 0..2 {
            let r = reply(&convo);
            let (id, _) = first_tool(&r);
            convo.push(reply_message(&r));
            convo.push(result(&id));
        }
        let whole = reply(&convo);
        assert_eq!(first_tool(&whole).1, r#"{"file_path":"c"}"#);

        // The boundary goes before A1: the summary request is [script, A0, R0 + instruction].
        let mut request = convo[..3].to_vec();
        request[2].blocks.push(text(INSTRUCTION));
        let summary = reply(&request);
        let OutBlock::Text(written) = &summary.blocks[0] else {
            panic!("{summary:?}")
        };
        assert!(written.contains("1 of its steps taken"), "{written}");
        assert!(written.contains(SCRIPT), "{written}");

        // After it, the agent's first message keeps its blocks and the summary's follow them.
        let stored = summary_message(written);
        let summary_text = stored.blocks[0].as_text().unwrap().to_owned();
        let mut compacted = vec![user(vec![text(SCRIPT), text(&summary_text)])];
        compacted.extend_from_slice(&convo[3..]);
        let after = reply(&compacted);
        assert_eq!(
            first_tool(&after),
            first_tool(&whole),
            "the same third step, with the same id"
        );

        // And a summary of that summary still counts from the start.
        let mut again = compacted.clone();
        again.push(reply_message(&after));
        let (id, _) = first_tool(&after);
        again.push(result(&id));
        let mut request = again[..3].to_vec();
        request[2].blocks.push(text(INSTRUCTION));
        let OutBlock::Text(second) = &reply(&request).blocks[0] else {
            panic!()
        };
        assert!(second.contains("2 of its steps taken"), "{second}");
        let second = summary_message(second).blocks[0]
            .as_text()
            .unwrap()
            .to_owned();
        let mut last = vec![user(vec![text(SCRIPT), text(&second)])];
        last.extend_from_slice(&again[3..]);
        let done = reply(&last);
        assert_eq!(
            done.stop_reason, "end_turn",
            "all three steps taken: {done:?}"
        );
    }

    fn final_text(reply: &Reply) -> &str {
        assert_eq!(reply.stop_reason, "end_turn", "{reply:?}");
        reply
            .blocks
            .iter()
            .find_map(|b| match b {
                OutBlock::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no text: {reply:?}"))
    }

    fn mismatch() -> SimMessage {
        user(vec![text(&follow_up(&["at /: bad".to_owned()]).text())])
    }

    /// The first final answer takes the first `json` line; the answer to forkd's follow-up, the
    /// second; any later one, the last.
    #[test]
    fn json_lines_answer_in_order_and_a_follow_up_gets_the_next() {
        let script = "Judge it.\n@sim tool Read {\"file_path\":\"a\"}\n\
                      @sim json {\"verdict\": \"maybe\"}\n@sim json {\"verdict\": \"pass\"}";
        let mut convo = vec![user(vec![text(script)])];
        let r = reply(&convo);
        let (id, _) = first_tool(&r);
        convo.push(reply_message(&r));
        convo.push(result(&id));
        let first = reply(&convo);
        assert_eq!(final_text(&first), r#"{"verdict":"maybe"}"#);
        convo.push(reply_message(&first));
        convo.push(mismatch());
        let second = reply(&convo);
        assert_eq!(final_text(&second), r#"{"verdict":"pass"}"#);
        convo.push(reply_message(&second));
        convo.push(mismatch());
        assert_eq!(final_text(&reply(&convo)), r#"{"verdict":"pass"}"#);
    }

    #[test]
    fn a_follow_up_to_a_directive_with_two_json_lines_gets_the_second() {
        let script = "Judge it.\n@sim json {\"n\": 1}\n@sim json {\"n\": 2}";
        let mut convo = vec![user(vec![text(script)])];
        let first = reply(&convo);
        assert_eq!(final_text(&first), r#"{"n":1}"#);
        convo.push(reply_message(&first));
        convo.push(user(vec![text("That does not match; try again.")]));
        assert_eq!(final_text(&reply(&convo)), r#"{"n":2}"#);
    }

    #[test]
    fn say_lines_come_before_a_fenced_object() {
        let script =
            "Judge it.\n@sim say Looked at it.\n@sim say All fine.\n@sim json {\"ok\": true}";
        let answer = reply(&[user(vec![text(script)])]);
        let text = final_text(&answer);
        assert_eq!(
            text,
            "Looked at it.\nAll fine.\n\n```json\n{\"ok\":true}\n```"
        );
        let schema = OutputSchema::from_value(&json!({"required": ["ok"]})).unwrap();
        assert_eq!(schema.check(text), Ok(json!({"ok": true})));
    }

    fn verdict_schema() -> OutputSchema {
        OutputSchema::from_value(&json!({
            "type": "object",
            "required": ["verdict", "findings"],
            "properties": {
                "verdict": {"enum": ["pass", "fail"]},
                "findings": {"type": "array", "items": {"type": "string"}, "minItems": 1}
            },
            "additionalProperties": false
        }))
        .unwrap()
    }

    /// Without a `json` line, a request carrying a schema block gets a minimal valid object:
    /// unscripted, at the end of a script, and after a follow-up.
    #[test]
    fn a_schema_block_without_a_json_line_gets_a_minimal_object() {
        let schema = verdict_schema();
        let expected = json!({"verdict": "pass", "findings": [""]});

        let unscripted = vec![user(vec![
            text("Review the diff."),
            text(&schema.block_text()),
        ])];
        let answer = reply(&unscripted);
        assert_eq!(final_text(&answer), expected.to_string());
        assert_eq!(schema.check(final_text(&answer)), Ok(expected.clone()));

        let script = "Review the diff.\n@sim tool Read {\"file_path\":\"a\"}\n@sim say looked";
        let mut convo = vec![user(vec![text(script), text(&schema.block_text())])];
        let r = reply(&convo);
        let (id, _) = first_tool(&r);
        convo.push(reply_message(&r));
        convo.push(result(&id));
        let answer = reply(&convo);
        assert_eq!(final_text(&answer), expected.to_string());
        convo.push(reply_message(&answer));
        convo.push(mismatch());
        assert_eq!(final_text(&reply(&convo)), expected.to_string());
    }

    #[test]
    fn a_schema_that_does_not_parse_gets_the_report() {
        let broken = format!("<{SCHEMA_TAG}>\nEnd with:\n```json\n{{nope\n```\n</{SCHEMA_TAG}>");
        let answer = reply(&[user(vec![text("Review the diff."), text(&broken)])]);
        assert!(final_text(&answer).starts_with("Scope: "), "{answer:?}");
    }

    /// A fork child reads no schema from its parent's messages: the block must be in its own.
    #[test]
    fn a_child_does_not_take_its_parents_schema() {
        let schema = verdict_schema();
        let parent = user(vec![text("Typed parent."), text(&schema.block_text())]);
        let child = user(vec![
            text(&format!(
                "<{BOILERPLATE_TAG}>\nYou are a fork.\n</{BOILERPLATE_TAG}>"
            )),
            text("Count the files."),
        ]);
        let answer = reply(&[parent.clone(), child]);
        assert!(final_text(&answer).starts_with("Scope: "), "{answer:?}");
        let typed_child = user(vec![
            text(&format!("<{BOILERPLATE_TAG}>\nYou are a fork.\n</{BOILERPLATE_TAG}>")),
            text(&OutputSchema::from_value(&json!({"required": ["n"], "properties": {"n": {"type": "integer", "minimum": 2}}})).unwrap().block_text()),
            text("Count the files."),
        ]);
        assert_eq!(final_text(&reply(&[parent, typed_child])), r#"{"n":2}"#);
    }
}
