//! Folding a chat-completions SSE stream (`chat.completion.chunk`s, then `data: [DONE]`) into a
//! response, and the response into Messages-API-shaped [`StreamEvent`]s.
//!
//! Chat completions report usage in the last chunk, but a [`StreamEvent::MessageStart`] must
//! carry the input side of usage first. So the whole response is folded before any event is
//! yielded: an OpenAI response reaches the caller at once, when it is complete. This also means
//! a stream cut anywhere is retried inside the provider, since nothing was yielded yet.

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

#[derive(Debug, Default)]
struct ToolDraft {
    id: Option<String>,
    name: String,
    arguments: String,
}

/// A response while its chunks arrive.
#[derive(Debug, Default)]
pub(crate) struct Draft {
    id: Option<String>,
    reasoning: String,
    text: String,
    tools: BTreeMap<usize, ToolDraft>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    done: bool,
}

impl Draft {
    /// Whether the stream said it is complete: `[DONE]`, or a finish reason and usage (for
    /// servers that close without `[DONE]`).
    pub(crate) fn complete(&self) -> bool {
        self.done || (self.finish_reason.is_some() && self.usage.is_some())
    }

    /// Folds one event's data in.
    pub(crate) fn push(&mut self, data: &str) -> Result<(), ProviderError> {
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| ProviderError::Stream(format!("malformed chunk {data:?}: {e}")))?;
        if let Some(error) = chunk.error {
            return Err(stream_error(&error));
        }
        if self.id.is_none() {
            self.id = chunk.id;
        }
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
            self.apply(choice.delta.unwrap_or_default());
        }
        Ok(())
    }

    fn apply(&mut self, delta: Delta) {
        for part in [delta.reasoning_content, delta.reasoning]
            .into_iter()
            .flatten()
        {
            self.reasoning.push_str(&part);
        }
        if let Some(text) = delta.content {
            self.text.push_str(&text);
        }
        for call in delta.tool_calls {
            // Servers that omit the index send each call whole, with a new id.
            let index = call
                .index
                .unwrap_or_else(|| match self.tools.last_key_value() {
                    Some((last, t)) if call.id.is_none() || call.id == t.id => *last,
                    Some((last, _)) => last + 1,
                    None => 0,
                });
            let tool = self.tools.entry(index).or_default();
            if call.id.is_some() {
                tool.id = call.id;
            }
            if let Some(f) = call.function {
                tool.name.push_str(f.name.as_deref().unwrap_or(""));
                tool.arguments
                    .push_str(f.arguments.as_deref().unwrap_or(""));
            }
        }
    }

    /// The response as Messages API events: thinking, text, then each tool call as a block.
    pub(crate) fn into_events(self) -> Vec<StreamEvent> {
        let message_id = self
            .id
            .unwrap_or_else(|| format!("chatcmpl-forkd-{}", uuid::Uuid::now_v7().simple()));
        let usage = self.usage.unwrap_or_else(|| {
            tracing::warn!("The server reported no usage; counting this response as 0 tokens");
            Usage::default()
        });
        let events = vec![StreamEvent::MessageStart {
            message_id: message_id.clone(),
            usage: Usage {
                output_tokens: 0,
                ..usage
            },
        }];
        let mut blocks = Blocks { events, index: 0 };
        if !self.reasoning.is_empty() {
            blocks.push(BlockStart::Thinking, |index| StreamEvent::ThinkingDelta {
                index,
                thinking: self.reasoning,
            });
        }
        if !self.text.is_empty() {
            blocks.push(BlockStart::Text, |index| StreamEvent::TextDelta {
                index,
                text: self.text,
            });
        }
        let has_tools = !self.tools.is_empty();
        for (n, tool) in self.tools.into_values().enumerate() {
            // Anthropic tool ids allow only [A-Za-z0-9_-]; a server that sends none gets one.
            let id = tool
                .id
                .unwrap_or_else(|| format!("call_{}_{n}", message_id.replace(['.', ':'], "_")));
            let start = BlockStart::ToolUse {
                id,
                name: tool.name,
            };
            blocks.push(start, |index| StreamEvent::InputJsonDelta {
                index,
                partial_json: tool.arguments,
            });
        }
        let mut events = blocks.events;
        events.push(StreamEvent::MessageDelta {
            stop_reason: Some(stop_reason(self.finish_reason.as_deref(), has_tools)),
            output_tokens: usage.output_tokens,
        });
        events.push(StreamEvent::MessageStop);
        events
    }
}

/// Events under construction, with the index of the next block.
struct Blocks {
    events: Vec<StreamEvent>,
    index: usize,
}

impl Blocks {
    /// One whole block: its start, its one delta, its stop.
    fn push(&mut self, start: BlockStart, delta: impl FnOnce(usize) -> StreamEvent) {
        let index = self.index;
        self.events.push(StreamEvent::BlockStart {
            index,
            block: start,
        });
        self.events.push(delta(index));
        self.events.push(StreamEvent::BlockStop { index });
        self.index += 1;
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
