//! Folding a chat-completions SSE stream (`chat.completion.chunk`s, then `data: [DONE]`) into
//! Messages-API-shaped [`StreamEvent`]s as the chunks arrive.
//!
//! Each chunk gives the events it makes known at once: `MessageStart` with the first chunk, then
//! the blocks as their deltas come (thinking, text, each tool call), one open at a time as in the
//! Messages API. Chat completions report usage only in the last chunk, so `MessageStart` says
//! zero usage and the closing `MessageDelta` carries the whole of it.

use std::collections::BTreeMap;

use forkd_core::Usage;
use serde::Deserialize;
use serde_json::Value;

use crate::{BlockStart, ProviderError, StreamEvent};

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    /// vLLM and others report a failure mid-stream as a chunk with an `error` object.
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    /// vLLM and DeepSeek name a reasoning model's thinking `reasoning_content`; Ollama and
    /// OpenRouter name it `reasoning`.
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ToolCallDelta>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<usize>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

/// A tool call while its deltas arrive.
#[derive(Debug, Default)]
struct ToolDraft {
    id: Option<String>,
    name: String,
    /// Its block's index once the block started. The block starts with the first arguments (or
    /// when something else begins), so that a name sent in pieces is whole by then.
    block: Option<usize>,
    /// Its block stopped: something else began after it.
    closed: bool,
}

/// The block being streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    /// A thinking or text block, by block index.
    Thinking(usize),
    Text(usize),
    /// A tool call, by the server's call index (its block may not have started yet).
    Tool(usize),
}

/// A response while its chunks arrive: what was already yielded, and what is still open.
#[derive(Debug, Default)]
pub(crate) struct Draft {
    /// Set when `MessageStart` was given.
    message_id: Option<String>,
    next_block: usize,
    open: Option<Open>,
    /// Whitespace-only content that came while no text block was open; it opens none, but
    /// leads the next text block if one comes.
    held: String,
    tools: BTreeMap<usize, ToolDraft>,
    /// Tool blocks started, for the ids of calls that came without one.
    tools_started: usize,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    /// `MessageStop` was given.
    finished: bool,
}

impl Draft {
    /// Whether the response is complete: its `MessageStop` was given.
    pub(crate) fn finished(&self) -> bool {
        self.finished
    }

    /// Folds one SSE event's data in; returns the events it makes known, in order (none, when
    /// the chunk only adds to what is held back). The response completes at `[DONE]`, or at a
    /// finish reason and usage (for servers that close without `[DONE]`); its closing events
    /// come with the chunk that completed it, and later data is ignored.
    pub(crate) fn push(&mut self, data: &str) -> Result<Vec<StreamEvent>, ProviderError> {
        let mut out = Vec::new();
        if self.finished {
            return Ok(out);
        }
        if data.trim() == "[DONE]" {
            self.finish(&mut out);
            return Ok(out);
        }
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| ProviderError::Stream(format!("malformed chunk {data:?}: {e}")))?;
        if let Some(error) = chunk.error {
            return Err(stream_error(&error));
        }
        self.start(chunk.id, &mut out);
        if let Some(u) = chunk.usage {
            let cached = u
                .prompt_tokens_details
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0);
            self.usage = Some(Usage {
                input_tokens: u.prompt_tokens.saturating_sub(cached),
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: cached,
                output_tokens: u.completion_tokens,
            });
        }
        // forkd asks for one choice; a server that sends more sends them with other indices,
        // which would interleave two answers, so only the first is read.
        if let Some(choice) = chunk.choices.into_iter().next() {
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(reason);
            }
            self.apply(choice.delta.unwrap_or_default(), &mut out)?;
        }
        if self.finish_reason.is_some() && self.usage.is_some() {
            self.finish(&mut out);
        }
        Ok(out)
    }

    /// The body ended. A response that gave its finish reason is complete, usage or not; one
    /// that did not was cut off.
    pub(crate) fn end(&mut self) -> Result<Vec<StreamEvent>, ProviderError> {
        let mut out = Vec::new();
        if self.finished {
            return Ok(out);
        }
        if self.finish_reason.is_none() {
            return Err(ProviderError::Stream(
                "the response ended before it was complete".into(),
            ));
        }
        self.finish(&mut out);
        Ok(out)
    }

    /// `MessageStart`, with the first chunk. Its usage is zero: chat completions say it last.
    fn start(&mut self, id: Option<String>, out: &mut Vec<StreamEvent>) {
        if self.message_id.is_some() {
            return;
        }
        let message_id =
            id.unwrap_or_else(|| format!("chatcmpl-forkd-{}", uuid::Uuid::now_v7().simple()));
        self.message_id = Some(message_id.clone());
        out.push(StreamEvent::MessageStart {
            message_id,
            usage: Usage::default(),
        });
    }

    fn apply(&mut self, delta: Delta, out: &mut Vec<StreamEvent>) -> Result<(), ProviderError> {
        for part in [delta.reasoning_content, delta.reasoning]
            .into_iter()
            .flatten()
        {
            self.thinking(part, out);
        }
        if let Some(text) = delta.content {
            self.text(text, out);
        }
        for call in delta.tool_calls {
            self.tool_call(call, out)?;
        }
        Ok(())
    }

    fn thinking(&mut self, thinking: String, out: &mut Vec<StreamEvent>) {
        if thinking.is_empty() {
            return;
        }
        let index = match self.open {
            Some(Open::Thinking(index)) => index,
            _ => {
                let index = self.begin(BlockStart::Thinking, out);
                self.open = Some(Open::Thinking(index));
                index
            }
        };
        out.push(StreamEvent::ThinkingDelta { index, thinking });
    }

    fn text(&mut self, text: String, out: &mut Vec<StreamEvent>) {
        if text.is_empty() {
            return;
        }
        let (index, text) = match self.open {
            Some(Open::Text(index)) => (index, text),
            // Servers send a newline or two between reasoning and answer, or after tool calls;
            // alone, that would be a block of nothing.
            _ if text.trim().is_empty() => {
                self.held.push_str(&text);
                return;
            }
            _ => {
                let index = self.begin(BlockStart::Text, out);
                self.open = Some(Open::Text(index));
                (index, std::mem::take(&mut self.held) + &text)
            }
        };
        out.push(StreamEvent::TextDelta { index, text });
    }

    fn tool_call(
        &mut self,
        call: ToolCallDelta,
        out: &mut Vec<StreamEvent>,
    ) -> Result<(), ProviderError> {
        // Servers that omit the index send each call whole, with a new id.
        let index = call
            .index
            .unwrap_or_else(|| match self.tools.last_key_value() {
                Some((last, t)) if !t.closed && (call.id.is_none() || call.id == t.id) => *last,
                Some((last, _)) => last + 1,
                None => 0,
            });
        let (name, arguments) = match call.function {
            Some(f) => (f.name.unwrap_or_default(), f.arguments.unwrap_or_default()),
            None => (String::new(), String::new()),
        };
        if self.tools.get(&index).is_some_and(|t| t.closed) {
            if name.is_empty() && arguments.is_empty() {
                return Ok(());
            }
            return Err(ProviderError::Stream(format!(
                "tool call {index} continued after another block began"
            )));
        }
        if self.open != Some(Open::Tool(index)) {
            self.close(out);
            self.open = Some(Open::Tool(index));
        }
        let tool = self.tools.entry(index).or_default();
        // Once its block started, a call's id and name are said; servers that repeat them
        // change nothing.
        if tool.block.is_none() {
            if call.id.is_some() {
                tool.id = call.id;
            }
            tool.name.push_str(&name);
        }
        if !arguments.is_empty() {
            let block = self.start_tool(index, out);
            out.push(StreamEvent::InputJsonDelta {
                index: block,
                partial_json: arguments,
            });
        }
        Ok(())
    }

    /// Starts the next block.
    fn begin(&mut self, block: BlockStart, out: &mut Vec<StreamEvent>) -> usize {
        self.close(out);
        let index = self.next_block;
        self.next_block += 1;
        out.push(StreamEvent::BlockStart { index, block });
        index
    }

    /// The block of tool call `call`, started now if it was not.
    fn start_tool(&mut self, call: usize, out: &mut Vec<StreamEvent>) -> usize {
        let tool = self.tools.entry(call).or_default();
        if let Some(block) = tool.block {
            return block;
        }
        let index = self.next_block;
        self.next_block += 1;
        tool.block = Some(index);
        // Anthropic tool ids allow only [A-Za-z0-9_-]; a server that sends none gets one.
        let id = match &tool.id {
            Some(id) => id.clone(),
            None => format!(
                "call_{}_{}",
                self.message_id
                    .as_deref()
                    .unwrap_or("")
                    .replace(['.', ':'], "_"),
                self.tools_started
            ),
        };
        self.tools_started += 1;
        out.push(StreamEvent::BlockStart {
            index,
            block: BlockStart::ToolUse {
                id,
                name: tool.name.clone(),
            },
        });
        index
    }

    /// Stops the open block, if any (a tool call that sent no arguments starts it first).
    fn close(&mut self, out: &mut Vec<StreamEvent>) {
        let index = match self.open.take() {
            None => return,
            Some(Open::Thinking(index) | Open::Text(index)) => index,
            Some(Open::Tool(call)) => {
                let index = self.start_tool(call, out);
                if let Some(tool) = self.tools.get_mut(&call) {
                    tool.closed = true;
                }
                index
            }
        };
        out.push(StreamEvent::BlockStop { index });
    }

    /// The closing events: the open block's stop, the stop reason and usage, `MessageStop`.
    fn finish(&mut self, out: &mut Vec<StreamEvent>) {
        self.start(None, out);
        self.close(out);
        if self.usage.is_none() {
            tracing::warn!("The server reported no usage; counting this response as 0 tokens");
        }
        out.push(StreamEvent::MessageDelta {
            stop_reason: Some(stop_reason(
                self.finish_reason.as_deref(),
                !self.tools.is_empty(),
            )),
            output_tokens: self.usage.map_or(0, |u| u.output_tokens),
            usage: self.usage,
        });
        out.push(StreamEvent::MessageStop);
        self.finished = true;
    }
}

/// The Messages API stop reason for a finish reason. A response with tool calls is a
/// `tool_use` whatever the server said: some (Ollama) finish those with `stop`.
fn stop_reason(finish: Option<&str>, has_tools: bool) -> String {
    if has_tools {
        return "tool_use".into();
    }
    match finish {
        Some("stop") | None => "end_turn",
        Some("tool_calls" | "function_call") => "tool_use",
        Some("length") => "max_tokens",
        Some("content_filter") => "refusal",
        Some(other) => other,
    }
    .into()
}

/// An error chunk as a status error: its numeric `code` when it has one, else 500.
fn stream_error(error: &Value) -> ProviderError {
    let status = error
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| (400..600).contains(c))
        .unwrap_or(500);
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .map_or_else(|| error.to_string(), str::to_owned);
    ProviderError::Status {
        status,
        message,
        retry_after: None,
    }
}

#[cfg(test)]
mod tests;
