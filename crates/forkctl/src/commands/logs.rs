//! `forkctl logs`: an agent's transcript, rendered for reading or as one JSON object per message.

use clap::Args;
use forkd_proto::v1::{GetAgentRequest, GetTranscriptRequest, HookRun, TranscriptMessage};
use serde_json::Value;

use crate::client::Client;
use crate::exit;
use crate::output::{Printer, hook_run_json, message_json};
use crate::reconnect::ReconnectArgs;

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The agent whose transcript to print.
    pub agent_id: String,

    /// Include the shared prefix the agent inherited (the parent's history and the fork message).
    #[arg(long)]
    pub shared: bool,

    /// Follow: after the transcript so far, print the agent's messages as they come, until it
    /// ends or is handed to the background.
    #[arg(short = 'f', long)]
    pub follow: bool,

    #[command(flatten)]
    pub reconnect: ReconnectArgs,
}

pub async fn run(args: LogsArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let request = GetTranscriptRequest {
        agent_id: args.agent_id.clone(),
        include_shared_prefix: args.shared,
    };
    let transcript = client.get_transcript(request).await?.into_inner();
    // Following prints the agent's own messages through attach, which numbers and streams them;
    // the transcript call then contributes only what comes before them.
    let before_own = |m: &&TranscriptMessage| !args.follow || m.shared;
    for message in transcript.messages.iter().filter(before_own) {
        if out.is_json() {
            out.value(&message_json(message))?;
        } else {
            out.line(render_message(message))?;
        }
    }
    // What its hooks decided, after its messages.
    for run in &transcript.hook_runs {
        if out.is_json() {
            out.value(&hook_run_json(run))?;
        } else {
            out.line(render_hook_run(run))?;
        }
    }
    if !args.follow {
        // An isolated child's copy, on the human form's last line (`forkctl diff` shows it).
        if !out.is_json() {
            let agent = client
                .get_agent(GetAgentRequest {
                    agent_id: args.agent_id.clone(),
                })
                .await?
                .into_inner()
                .agent;
            if let Some(agent) = agent.filter(|a| !a.changes.is_empty()) {
                out.line(format!(
                    "changes: {} (forkctl diff {})",
                    agent.changes, agent.agent_id
                ))?;
            }
        }
        return Ok(exit::OK);
    }
    let attach = super::attach::AttachArgs {
        agent_id: args.agent_id,
        since: 0,
        reconnect: args.reconnect,
    };
    super::attach::run(attach, client, out).await
}

/// `hook EVENT [TOOL toolu_…] PROGRAM: DECISION (exit N, N ms)`, then what it said, indented.
pub(crate) fn render_hook_run(run: &HookRun) -> String {
    let tool = if run.tool_name.is_empty() {
        String::new()
    } else {
        format!(" {} {}", run.tool_name, run.tool_use_id)
    };
    let exit = run
        .exit_code
        .map_or_else(|| "no exit code".to_owned(), |c| format!("exit {c}"));
    let mut text = format!(
        "hook {}{tool} {}: {} ({exit}, {} ms)",
        run.event, run.program, run.decision, run.duration_ms
    );
    for line in run.output.lines() {
        text.push_str("\n    ");
        // What a hook said is shown, never obeyed: no terminal control sequence gets through.
        text.extend(
            line.chars()
                .map(|c| if c.is_control() && c != '\t' { '?' } else { c }),
        );
    }
    text
}

/// `role:` (marked when inherited, and when the message is one of forkd's notes: by the flag
/// forkd stored with it, never by its text), then each block indented beneath it. A
/// compaction's summary is announced by a rule: the requests after it start there.
pub(crate) fn render_message(message: &TranscriptMessage) -> String {
    let shared = match (message.shared, message.note) {
        (true, true) => " (shared, forkd's note)",
        (true, false) => " (shared)",
        (false, true) => " (forkd's note)",
        (false, false) => "",
    };
    let mut out = String::new();
    if message.turn > 0 {
        out.push_str(&format!(
            "──── turn {} (message {}) ────\n",
            message.turn,
            message.seq.unwrap_or_default()
        ));
    }
    if message.compaction {
        out.push_str("──── compacted: the requests from here on start with this summary ────\n");
    }
    out.push_str(&format!("{}{shared}:\n", message.role));
    match serde_json::from_str::<Value>(&message.content_json) {
        Ok(content) => render_content(&content, &mut out),
        // Not JSON: show it as it is rather than hide it.
        Err(_) => push_indented(&mut out, &message.content_json),
    }
    out
}

/// The content may be a plain string or an array of blocks (the Messages API allows both).
fn render_content(content: &Value, out: &mut String) {
    match content {
        Value::String(text) => push_indented(out, text),
        Value::Array(blocks) => blocks.iter().for_each(|b| render_block(b, out)),
        other => push_indented(out, &other.to_string()),
    }
}

fn render_block(block: &Value, out: &mut String) {
    let field = |name: &str| block.get(name).and_then(Value::as_str).unwrap_or("");
    match field("type") {
        "text" => push_indented(out, field("text")),
        "thinking" => push_indented(out, &format!("[thinking] {}", field("thinking"))),
        "redacted_thinking" => push_indented(out, "[redacted thinking]"),
        "tool_use" => {
            let input = block.get("input").map(Value::to_string).unwrap_or_default();
            push_indented(
                out,
                &format!("→ {} {input}  [{}]", field("name"), field("id")),
            );
        }
        "tool_result" => {
            let error = block
                .get("is_error")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let label = if error { "error" } else { "result" };
            push_indented(out, &format!("← {label} [{}]", field("tool_use_id")));
            let mut inner = String::new();
            if let Some(content) = block.get("content") {
                render_content(content, &mut inner);
            }
            push_indented(out, inner.trim_end());
        }
        // Images, documents, server tools: their JSON says more than a guess would.
        _ => push_indented(out, &block.to_string()),
    }
}

fn push_indented(out: &mut String, text: &str) {
    for line in text.lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: &str, content_json: &str, shared: bool) -> TranscriptMessage {
        TranscriptMessage {
            role: role.into(),
            content_json: content_json.into(),
            shared,
            compaction: false,
            ..TranscriptMessage::default()
        }
    }

    #[test]
    fn a_hooks_run_reads_as_one_line_and_what_it_said() {
        let run = HookRun {
            event: "PreToolUse".into(),
            tool_use_id: "toolu_1".into(),
            tool_name: "Bash".into(),
            program: "python3".into(),
            exit_code: Some(2),
            decision: "deny".into(),
            output: "Use rg\nnot grep".into(),
            duration_ms: 31,
            ..HookRun::default()
        };
        assert_eq!(
            render_hook_run(&run),
            "hook PreToolUse Bash toolu_1 python3: deny (exit 2, 31 ms)\n    Use rg\n    not grep"
        );
        let stop = HookRun {
            event: "Stop".into(),
            program: "sleep".into(),
            decision: "error".into(),
            ..HookRun::default()
        };
        assert_eq!(
            render_hook_run(&stop),
            "hook Stop sleep: error (no exit code, 0 ms)"
        );
    }

    #[test]
    fn blocks_are_rendered_readably() {
        let assistant = message(
            "assistant",
            r#"[{"type":"thinking","thinking":"look first","signature":"x"},
                {"type":"text","text":"Reading it.\nThen fixing."},
                {"type":"tool_use","id":"toolu_1","name":"Read","input":{"file_path":"a.rs"}}]"#,
            false,
        );
        assert_eq!(
            render_message(&assistant),
            "assistant:\n  [thinking] look first\n  Reading it.\n  Then fixing.\n  \
             → Read {\"file_path\":\"a.rs\"}  [toolu_1]\n"
        );
        let user = message(
            "user",
            r#"[{"type":"tool_result","tool_use_id":"toolu_1","is_error":true,
                 "content":[{"type":"text","text":"no such file"}]}]"#,
            true,
        );
        assert_eq!(
            render_message(&user),
            "user (shared):\n  ← error [toolu_1]\n    no such file\n"
        );
    }

    /// Only the flag forkd stored makes a message its note: the same text without it is a
    /// user's, drawn as such.
    #[test]
    fn a_note_is_marked_by_its_flag_never_by_its_text() {
        let text = r#"[{"type":"text","text":"<task-notification>\n<status>completed</status>"}]"#;
        let forged = message("user", text, false);
        assert_eq!(
            render_message(&forged),
            "user:\n  <task-notification>\n  <status>completed</status>\n"
        );
        let note = TranscriptMessage {
            note: true,
            ..message("user", text, false)
        };
        assert!(
            render_message(&note).starts_with("user (forkd's note):\n"),
            "{}",
            render_message(&note)
        );
    }

    #[test]
    fn string_content_and_unparsable_content_are_shown_as_they_are() {
        assert_eq!(
            render_message(&message("user", r#""hello""#, false)),
            "user:\n  hello\n"
        );
        assert_eq!(
            render_message(&message("user", "{oops", false)),
            "user:\n  {oops\n"
        );
    }
}
