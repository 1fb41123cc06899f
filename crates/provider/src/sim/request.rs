//! Reading a Messages API request body as the simulated model sees it: a sequence of blocks
//! (tools, system, message content) with their cache identities, token counts and breakpoints,
//! plus the parsed messages for the script interpreter.

use forkd_core::Role;
use forkd_core::pricing::{self, CacheTtl, ModelSpec};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::{ProviderError, tokens};

/// The most `cache_control` breakpoints one request may carry.
const MAX_BREAKPOINTS: usize = 4;

/// Which lookback run a block belongs to: consecutive tool_use blocks are one position, and so are
/// consecutive tool_result blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Run {
    ToolUse,
    ToolResult,
    Other,
}

impl Run {
    /// Whether a block of this run and the next one share a lookback position.
    pub(crate) fn joins(self, next: Run) -> bool {
        self == next && self != Run::Other
    }
}

/// One block of the request, in prefix order.
#[derive(Debug, Clone)]
pub(crate) struct CacheBlock {
    /// Chained hash of every block identity up to and including this one (and the model).
    pub prefix: [u8; 32],
    pub tokens: u64,
    pub run: Run,
    /// The block carries `cache_control`, with this lifetime.
    pub breakpoint: Option<CacheTtl>,
}

/// One message, its content blocks parsed (without `cache_control`).
#[derive(Debug, Clone)]
pub(crate) struct SimMessage {
    pub role: Role,
    pub blocks: Vec<Value>,
}

/// A parsed request.
#[derive(Debug)]
pub(crate) struct SimRequest {
    pub model: &'static ModelSpec,
    pub blocks: Vec<CacheBlock>,
    pub messages: Vec<SimMessage>,
}

#[derive(Deserialize)]
struct Body<'a> {
    model: String,
    #[allow(dead_code, reason = "required by the API; the sim ignores the limit")]
    max_tokens: u64,
    #[serde(default, borrow)]
    thinking: Option<&'a RawValue>,
    #[serde(default, borrow)]
    tools: Vec<&'a RawValue>,
    #[serde(default, borrow)]
    system: Option<&'a RawValue>,
    #[serde(borrow)]
    messages: Vec<BodyMessage<'a>>,
}

#[derive(Deserialize)]
struct BodyMessage<'a> {
    role: Role,
    #[serde(borrow)]
    content: &'a RawValue,
}

fn invalid(what: impl Into<String>) -> ProviderError {
    ProviderError::InvalidRequest(what.into())
}

fn bad_request(what: impl Into<String>) -> ProviderError {
    ProviderError::Status {
        status: 400,
        message: what.into(),
        retry_after: None,
    }
}

/// Builds the block sequence while chaining the prefix hash.
struct Builder {
    hash: [u8; 32],
    blocks: Vec<CacheBlock>,
    breakpoints: usize,
}

impl Builder {
    fn push(&mut self, tag: &[u8], identity: &str, tokens: u64, run: Run, bp: Option<CacheTtl>) {
        let mut h = Sha256::new();
        h.update(self.hash);
        // Tag and length keep distinct block sequences from hashing alike.
        h.update(tag);
        h.update((identity.len() as u64).to_le_bytes());
        h.update(identity.as_bytes());
        self.hash = h.finalize().into();
        self.breakpoints += usize::from(bp.is_some());
        self.blocks.push(CacheBlock {
            prefix: self.hash,
            tokens,
            run,
            breakpoint: bp,
        });
    }
}

/// A block object with its `cache_control` taken out, and the breakpoint it carried.
fn strip(raw: &str, what: &str) -> Result<(Map<String, Value>, Option<CacheTtl>), ProviderError> {
    let value: Value = serde_json::from_str(raw).map_err(|e| invalid(format!("{what}: {e}")))?;
    let Value::Object(mut map) = value else {
        return Err(invalid(format!("{what} is not a JSON object")));
    };
    let bp =
        map.shift_remove("cache_control")
            .map(|cc| match cc.get("ttl").and_then(Value::as_str) {
                Some("1h") => CacheTtl::OneHour,
                _ => CacheTtl::FiveMinutes,
            });
    Ok((map, bp))
}

fn encode(map: &Map<String, Value>) -> String {
    // Re-encoding a map of plain JSON values cannot fail; with preserve_order the key order is
    // the request's own, so a compact block re-encodes to its own bytes.
    serde_json::to_string(map).unwrap_or_default()
}

fn text_block(text: &str) -> Map<String, Value> {
    let mut map = Map::new();
    map.insert("type".into(), Value::from("text"));
    map.insert("text".into(), Value::from(text));
    map
}

/// Parses a request body. Malformed bodies and unknown models are invalid requests; too many
/// breakpoints, or one on a thinking block, are a 400 as the API answers.
pub(crate) fn parse(body: &str) -> Result<SimRequest, ProviderError> {
    let body: Body<'_> = serde_json::from_str(body).map_err(|e| invalid(format!("body: {e}")))?;
    let model = pricing::model(&body.model).ok_or_else(|| {
        invalid(format!(
            "unknown model {:?}; known: {}",
            body.model,
            pricing::model_names()
        ))
    })?;
    if body.messages.is_empty() {
        return Err(invalid("messages must not be empty"));
    }
    let mut seed = Sha256::new();
    seed.update(b"forkd-sim-cache\0");
    seed.update(model.name.as_bytes());
    let mut b = Builder {
        hash: seed.finalize().into(),
        blocks: Vec::new(),
        breakpoints: 0,
    };

    for (i, tool) in body.tools.iter().enumerate() {
        let (map, bp) = strip(tool.get(), &format!("tools[{i}]"))?;
        let identity = encode(&map);
        b.push(
            b"tool",
            &identity,
            tokens::block_tokens(&identity),
            Run::Other,
            bp,
        );
    }

    match body.system.map(RawValue::get) {
        None => {}
        Some(raw) if raw.starts_with('"') => {
            let text: String =
                serde_json::from_str(raw).map_err(|e| invalid(format!("system: {e}")))?;
            b.push(
                b"system",
                &encode(&text_block(&text)),
                tokens::count(&text),
                Run::Other,
                None,
            );
        }
        Some(raw) => {
            let blocks: Vec<&RawValue> =
                serde_json::from_str(raw).map_err(|e| invalid(format!("system: {e}")))?;
            for (i, block) in blocks.iter().enumerate() {
                let (map, bp) = strip(block.get(), &format!("system[{i}]"))?;
                let text = map
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(format!("system[{i}] is not a text block")))?;
                let tokens = tokens::count(text);
                b.push(b"system", &encode(&map), tokens, Run::Other, bp);
            }
        }
    }

    // Changing the thinking config invalidates the message part of the cache, not tools/system.
    let mut thinking_tag = b"thinking:".to_vec();
    match body.thinking {
        Some(t) => {
            let v: Value =
                serde_json::from_str(t.get()).map_err(|e| invalid(format!("thinking: {e}")))?;
            thinking_tag
                .extend_from_slice(serde_json::to_string(&v).unwrap_or_default().as_bytes());
        }
        None => thinking_tag.extend_from_slice(b"none"),
    }

    let mut messages = Vec::with_capacity(body.messages.len());
    for (mi, message) in body.messages.iter().enumerate() {
        let raw = message.content.get();
        let contents: Vec<(Map<String, Value>, Option<CacheTtl>)> = if raw.starts_with('"') {
            let text: String = serde_json::from_str(raw)
                .map_err(|e| invalid(format!("messages[{mi}].content: {e}")))?;
            vec![(text_block(&text), None)]
        } else {
            let blocks: Vec<&RawValue> = serde_json::from_str(raw)
                .map_err(|e| invalid(format!("messages[{mi}].content: {e}")))?;
            blocks
                .iter()
                .enumerate()
                .map(|(bi, block)| strip(block.get(), &format!("messages[{mi}].content[{bi}]")))
                .collect::<Result<_, _>>()?
        };
        let mut parsed = Vec::with_capacity(contents.len());
        for (bi, (map, bp)) in contents.into_iter().enumerate() {
            let ty = map.get("type").and_then(Value::as_str).unwrap_or("");
            let run = match ty {
                "tool_use" => Run::ToolUse,
                "tool_result" => Run::ToolResult,
                _ => Run::Other,
            };
            if bp.is_some() && matches!(ty, "thinking" | "redacted_thinking") {
                return Err(bad_request(format!(
                    "messages[{mi}].content[{bi}]: cache_control cannot be set on a {ty} block"
                )));
            }
            let identity = encode(&map);
            let mut tag = match message.role {
                Role::User => b"user".to_vec(),
                Role::Assistant => b"assistant".to_vec(),
            };
            if mi == 0 && bi == 0 {
                tag.extend_from_slice(&thinking_tag);
            }
            b.push(&tag, &identity, tokens::block_tokens(&identity), run, bp);
            parsed.push(Value::Object(map));
        }
        messages.push(SimMessage {
            role: message.role,
            blocks: parsed,
        });
    }

    if b.breakpoints > MAX_BREAKPOINTS {
        return Err(bad_request(format!(
            "A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {}.",
            b.breakpoints
        )));
    }
    Ok(SimRequest {
        model,
        blocks: b.blocks,
        messages,
    })
}
