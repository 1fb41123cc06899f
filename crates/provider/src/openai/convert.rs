//! Converting a Messages API body into a chat-completions request.
//!
//! The conversion is deterministic (same body, same bytes out) and goes message by message, so
//! siblings whose bodies share a prefix get requests whose messages share it too: a server's
//! prefix cache (vLLM, SGLang, llama.cpp) matches on the rendered prompt, not on JSON bytes.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::ProviderError;

#[derive(Deserialize)]
struct Body<'a> {
    model: String,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default, borrow)]
    system: Option<&'a RawValue>,
    #[serde(default, borrow)]
    tools: Option<&'a RawValue>,
    messages: Vec<InMessage>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    temperature: Option<Value>,
    #[serde(default)]
    top_p: Option<Value>,
    #[serde(default)]
    stop_sequences: Option<Value>,
}

#[derive(Deserialize)]
struct InMessage {
    role: String,
    content: Value,
}

/// What to send, besides the converted body.
#[derive(Debug, Clone, Default)]
pub(crate) struct Options {
    /// Replaces the body's model name (forkd's sessions name Anthropic models).
    pub model: Option<String>,
    /// Whether to send `prompt_cache_key`.
    pub prompt_cache_key: bool,
}

fn invalid(what: impl Into<String>) -> ProviderError {
    ProviderError::InvalidRequest(what.into())
}

/// The chat-completions request for a Messages API body, compact JSON.
pub(crate) fn convert(body: &str, options: &Options) -> Result<String, ProviderError> {
    let body: Body<'_> = serde_json::from_str(body).map_err(|e| invalid(format!("body: {e}")))?;
    let messages = messages(&body)?;
    let mut out = Map::new();
    out.insert(
        "model".into(),
        Value::from(options.model.clone().unwrap_or(body.model)),
    );
    out.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = body.tools {
        let tools = convert_tools(tools.get())?;
        if !tools.is_empty() {
            out.insert("tools".into(), Value::Array(tools));
        }
    }
    if let Some(choice) = &body.tool_choice {
        insert_tool_choice(choice, &mut out)?;
    }
    // `max_tokens`, not `max_completion_tokens`: every OpenAI-compatible server forkd targets
    // (vLLM, SGLang, llama.cpp, Ollama) reads it.
    let optional = [
        ("max_tokens", body.max_tokens.map(Value::from)),
        ("temperature", body.temperature),
        ("top_p", body.top_p),
        ("stop", body.stop_sequences),
    ];
    for (key, value) in optional {
        if let Some(v) = value {
            out.insert(key.into(), v);
        }
    }
    out.insert("stream".into(), Value::Bool(true));
    out.insert("stream_options".into(), json!({"include_usage": true}));
    if options.prompt_cache_key {
        let key = prompt_cache_key(
            body.tools.map(RawValue::get),
            body.system.map(RawValue::get),
        );
        out.insert("prompt_cache_key".into(), Value::from(key));
    }
    serde_json::to_string(&out).map_err(|e| invalid(format!("encoding the request: {e}")))
}

/// The system prompt and the messages, in order.
fn messages(body: &Body<'_>) -> Result<Vec<Value>, ProviderError> {
    let mut out = Vec::new();
    if let Some(system) = body.system {
        let value: Value =
            serde_json::from_str(system.get()).map_err(|e| invalid(format!("system: {e}")))?;
        let text = texts(&value, "system")?;
        if !text.is_empty() {
            out.push(json!({"role": "system", "content": text}));
        }
    }
    for (i, message) in body.messages.iter().enumerate() {
        match message.role.as_str() {
            "user" => user(&message.content, i, &mut out)?,
            "assistant" => out.push(assistant(&message.content, i)?),
            other => return Err(invalid(format!("messages[{i}]: unknown role {other:?}"))),
        }
    }
    Ok(out)
}

/// A stable key from the tools and system bytes: every sibling of a fork batch (and every turn
/// of a session) shares them, so they share one key and land on the same cache.
pub(crate) fn prompt_cache_key(tools: Option<&str>, system: Option<&str>) -> String {
    let mut h = Sha256::new();
    for part in [tools, system] {
        let bytes = part.unwrap_or("").as_bytes();
        // Lengths keep ("ab", "c") and ("a", "bc") apart.
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    }
    format!("forkd-{}", hex::encode(&h.finalize()[..16]))
}

/// The text of a string or of an array of text blocks, blocks joined by a blank line.
fn texts(content: &Value, what: &str) -> Result<String, ProviderError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut parts = Vec::with_capacity(blocks.len());
            for (i, block) in blocks.iter().enumerate() {
                match block_type(block) {
                    "text" => parts.push(text_of(block)),
                    other => {
                        return Err(invalid(format!(
                            "{what}[{i}]: {other:?} blocks cannot be sent to an OpenAI-compatible \
                             server"
                        )));
                    }
                }
            }
            Ok(parts.join("\n\n"))
        }
        Value::Null => Ok(String::new()),
        _ => Err(invalid(format!(
            "{what}: not a string or an array of blocks"
        ))),
    }
}

fn block_type(block: &Value) -> &str {
    block.get("type").and_then(Value::as_str).unwrap_or("")
}

fn text_of(block: &Value) -> &str {
    block.get("text").and_then(Value::as_str).unwrap_or("")
}

fn str_field<'v>(block: &'v Value, key: &str, what: &str) -> Result<&'v str, ProviderError> {
    block
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("{what}: no {key}")))
}

/// A user message: its tool_results become `tool` messages (which must follow the assistant's
/// tool calls directly, so they come first), its text one `user` message after them.
fn user(content: &Value, i: usize, out: &mut Vec<Value>) -> Result<(), ProviderError> {
    let Value::Array(blocks) = content else {
        out.push(json!({"role": "user", "content": texts(content, &format!("messages[{i}]"))?}));
        return Ok(());
    };
    let mut text = Vec::new();
    for (bi, block) in blocks.iter().enumerate() {
        let what = format!("messages[{i}].content[{bi}]");
        match block_type(block) {
            "text" => text.push(block.clone()),
            "tool_result" => {
                let id = str_field(block, "tool_use_id", &what)?;
                let mut result = texts(block.get("content").unwrap_or(&Value::Null), &what)?;
                // Chat completions have no error flag on a tool message: say it in the text.
                if block.get("is_error").and_then(Value::as_bool) == Some(true) {
                    result = format!("Error: {result}");
                }
                out.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
            }
            other => {
                return Err(invalid(format!(
                    "{what}: {other:?} blocks cannot be sent to an OpenAI-compatible server"
                )));
            }
        }
    }
    if !text.is_empty() {
        let joined = texts(&Value::Array(text), &format!("messages[{i}]"))?;
        out.push(json!({"role": "user", "content": joined}));
    }
    Ok(())
}

/// An assistant message: text as content, tool_use blocks as tool calls. Thinking blocks are
/// dropped: chat completions take no reasoning back.
fn assistant(content: &Value, i: usize) -> Result<Value, ProviderError> {
    let Value::Array(blocks) = content else {
        return Ok(
            json!({"role": "assistant", "content": texts(content, &format!("messages[{i}]"))?}),
        );
    };
    let mut text = Vec::new();
    let mut calls = Vec::new();
    for (bi, block) in blocks.iter().enumerate() {
        let what = format!("messages[{i}].content[{bi}]");
        match block_type(block) {
            "text" => text.push(text_of(block)),
            "thinking" | "redacted_thinking" => {}
            "tool_use" => {
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(json!({
                    "id": str_field(block, "id", &what)?,
                    "type": "function",
                    "function": {
                        "name": str_field(block, "name", &what)?,
                        "arguments": input.to_string(),
                    },
                }));
            }
            other => {
                return Err(invalid(format!(
                    "{what}: {other:?} blocks cannot be sent to an OpenAI-compatible server"
                )));
            }
        }
    }
    let mut message = Map::new();
    message.insert("role".into(), Value::from("assistant"));
    // Content may be null only when there are tool calls.
    let content = if text.is_empty() && !calls.is_empty() {
        Value::Null
    } else {
        Value::from(text.join("\n\n"))
    };
    message.insert("content".into(), content);
    if !calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    Ok(Value::Object(message))
}

fn convert_tools(raw: &str) -> Result<Vec<Value>, ProviderError> {
    let tools: Vec<Value> =
        serde_json::from_str(raw).map_err(|e| invalid(format!("tools: {e}")))?;
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            let what = format!("tools[{i}]");
            let schema = tool.get("input_schema").ok_or_else(|| {
                invalid(format!(
                    "{what}: no input_schema (server tools are not supported)"
                ))
            })?;
            let mut function = Map::new();
            function.insert("name".into(), Value::from(str_field(tool, "name", &what)?));
            if let Some(d) = tool.get("description") {
                function.insert("description".into(), d.clone());
            }
            function.insert("parameters".into(), schema.clone());
            Ok(json!({"type": "function", "function": function}))
        })
        .collect()
}

fn insert_tool_choice(choice: &Value, out: &mut Map<String, Value>) -> Result<(), ProviderError> {
    let mapped = match block_type(choice) {
        "auto" => Value::from("auto"),
        "any" => Value::from("required"),
        "none" => Value::from("none"),
        "tool" => {
            json!({"type": "function", "function": {"name": str_field(choice, "name", "tool_choice")?}})
        }
        other => return Err(invalid(format!("tool_choice: unknown type {other:?}"))),
    };
    out.insert("tool_choice".into(), mapped);
    if choice
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        == Some(true)
    {
        out.insert("parallel_tool_calls".into(), Value::Bool(false));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
