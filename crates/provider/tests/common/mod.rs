//! Request bodies built by hand, and a driver that runs them through the sim.
#![allow(dead_code, reason = "each test file uses a part of these helpers")]

use std::sync::Arc;

use forkd_core::{BlockKind, Message, Usage};
use forkd_provider::tokens::{block_tokens, count};
use forkd_provider::{Accumulator, Completion, ModelRequest, Provider, ProviderError, StreamEvent};
use futures::StreamExt;
use serde_json::{Value, json};

pub const MODEL: &str = "claude-sonnet-4-5";

const CACHE_CONTROL: &str = r#","cache_control":{"type":"ephemeral"}"#;

pub fn text(s: &str) -> String {
    json!({"type": "text", "text": s}).to_string()
}

pub fn tool_use(id: &str, name: &str, input: Value) -> String {
    json!({"type": "tool_use", "id": id, "name": name, "input": input}).to_string()
}

pub fn tool_result(id: &str, content: &str) -> String {
    json!({"type": "tool_result", "tool_use_id": id, "content": content}).to_string()
}

/// A long text of about `tokens` tokens (each word is two).
pub fn prose(tokens: usize) -> String {
    (0..tokens / 2).map(|i| format!("w{} ", i % 97)).collect()
}

/// One block of a body and whether it carries a breakpoint (and with which extra fields).
#[derive(Debug, Clone)]
struct Item {
    json: String,
    tokens: u64,
    cache: Option<&'static str>,
}

/// A Messages API request body, block by block, that knows each block's tokens.
#[derive(Debug, Clone)]
pub struct Body {
    pub model: String,
    tools: Vec<Item>,
    system: Vec<Item>,
    messages: Vec<(&'static str, Vec<Item>)>,
}

impl Default for Body {
    fn default() -> Self {
        Self {
            model: MODEL.into(),
            tools: Vec::new(),
            system: Vec::new(),
            messages: Vec::new(),
        }
    }
}

fn item(json: String) -> Item {
    Item {
        tokens: block_tokens(&json),
        json,
        cache: None,
    }
}

impl Body {
    pub fn model(mut self, model: &str) -> Self {
        self.model = model.into();
        self
    }

    pub fn tool(mut self, def: Value) -> Self {
        self.tools.push(item(def.to_string()));
        self
    }

    pub fn system(mut self, s: &str) -> Self {
        self.system.push(Item {
            json: text(s),
            tokens: count(s),
            cache: None,
        });
        self
    }

    pub fn user(mut self, blocks: &[String]) -> Self {
        self.messages
            .push(("user", blocks.iter().cloned().map(item).collect()));
        self
    }

    pub fn assistant(mut self, blocks: &[String]) -> Self {
        self.messages
            .push(("assistant", blocks.iter().cloned().map(item).collect()));
        self
    }

    /// Appends a message from a completion, as an agent loop would.
    pub fn reply(self, message: &Message) -> Self {
        let blocks: Vec<String> = message.blocks.iter().map(|b| b.raw().to_string()).collect();
        self.assistant(&blocks)
    }

    fn items(&self) -> impl Iterator<Item = &Item> {
        self.tools
            .iter()
            .chain(&self.system)
            .chain(self.messages.iter().flat_map(|(_, b)| b))
    }

    fn items_mut(&mut self) -> impl Iterator<Item = &mut Item> {
        self.tools
            .iter_mut()
            .chain(&mut self.system)
            .chain(self.messages.iter_mut().flat_map(|(_, b)| b))
    }

    /// Puts a breakpoint on the `i`-th block (tools, system, messages in order; negative counts
    /// from the end).
    pub fn cache_at(self, i: isize) -> Self {
        self.cache_with(i, CACHE_CONTROL)
    }

    pub fn cache_with(mut self, i: isize, field: &'static str) -> Self {
        let n = self.items().count() as isize;
        let i = if i < 0 { n + i } else { i };
        if let Some(it) = self.items_mut().nth(i as usize) {
            it.cache = Some(field);
        }
        self
    }

    /// All blocks' tokens.
    pub fn total(&self) -> u64 {
        self.items().map(|i| i.tokens).sum()
    }

    /// Tokens of the first `n` blocks.
    pub fn prefix(&self, n: usize) -> u64 {
        self.items().take(n).map(|i| i.tokens).sum()
    }

    /// How many blocks the body has.
    pub fn len(&self) -> usize {
        self.items().count()
    }

    pub fn json(&self) -> String {
        let render = |it: &Item| match it.cache {
            None => it.json.clone(),
            Some(cc) => format!("{}{cc}}}", &it.json[..it.json.len() - 1]),
        };
        let list = |items: &[Item]| items.iter().map(render).collect::<Vec<_>>().join(",");
        let messages: Vec<String> = self
            .messages
            .iter()
            .map(|(role, blocks)| format!(r#"{{"role":"{role}","content":[{}]}}"#, list(blocks)))
            .collect();
        format!(
            r#"{{"model":"{}","max_tokens":1024,"stream":true,"tools":[{}],"system":[{}],"messages":[{}]}}"#,
            self.model,
            list(&self.tools),
            list(&self.system),
            messages.join(",")
        )
    }

    pub fn request(&self) -> ModelRequest {
        request(&self.model, &self.json())
    }
}

pub fn request(model: &str, body: &str) -> ModelRequest {
    ModelRequest {
        model: model.into(),
        body: Arc::from(body),
    }
}

pub fn usage(input: u64, write: u64, read: u64) -> Usage {
    Usage {
        input_tokens: input,
        cache_creation_input_tokens: write,
        cache_read_input_tokens: read,
        output_tokens: 0,
    }
}

/// The input side of a completion's usage.
pub fn input_side(c: &Completion) -> Usage {
    Usage {
        output_tokens: 0,
        ..c.usage
    }
}

/// Drains a stream into a completion.
pub async fn collect(mut stream: forkd_provider::EventStream) -> Result<Completion, ProviderError> {
    let mut acc = Accumulator::default();
    while let Some(ev) = stream.next().await {
        acc.push(&ev?)?;
    }
    acc.finish()
}

pub async fn run(sim: &impl Provider, req: ModelRequest) -> Result<Completion, ProviderError> {
    collect(sim.stream(req)).await
}

/// Runs an agent loop: every tool_use gets an `ok` tool_result, until the model ends its turn.
pub async fn converse(sim: &impl Provider, mut body: Body) -> Vec<Completion> {
    let mut out = Vec::new();
    for _ in 0..20 {
        let done = match run(sim, body.request()).await {
            Ok(c) => c,
            Err(e) => panic!("request failed: {e}"),
        };
        body = body.reply(&done.message);
        let results: Vec<String> = done
            .message
            .blocks
            .iter()
            .filter_map(|b| match b.kind() {
                BlockKind::ToolUse { id, .. } => Some(tool_result(id, "ok")),
                _ => None,
            })
            .collect();
        let end = done.stop_reason.as_deref() == Some("end_turn");
        out.push(done);
        if end {
            return out;
        }
        body = body.user(&results);
    }
    panic!("the conversation did not end");
}

/// Whether an event is message_start.
pub fn is_start(ev: &StreamEvent) -> bool {
    matches!(ev, StreamEvent::MessageStart { .. })
}
