//! Reading a Messages API request body as the simulated model sees it: a sequence of blocks
//! (tools, system, message content) with their cache identities, token counts and breakpoints,
//! plus the parsed messages for the script interpreter.
//!
//! Every sibling of a fork batch sends the same prefix, and each carries the batch's fork message
//! (one tool_use and one placeholder result per child), so a batch of N sends N·N small blocks.
//! Reading each block (parsing it, re-encoding it, counting its tokens) is what costs; a
//! [`BlockMemo`] does it once per distinct block and hands out the result by the block's bytes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

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
    pub blocks: Vec<Arc<Value>>,
}

/// What the sim reads from one tool definition or content block, wherever it stands: all of it a
/// function of the block's JSON text.
#[derive(Debug)]
struct BlockInfo {
    /// SHA-256 of the block's identity: its compact JSON without `cache_control`.
    digest: [u8; 32],
    tokens: u64,
    run: Run,
    /// A `thinking` or `redacted_thinking` block.
    thinking: bool,
    breakpoint: Option<CacheTtl>,
    /// The block without `cache_control`, for the script interpreter.
    value: Arc<Value>,
}

/// About the most memory a [`BlockMemo`] holds, counting an entry as twice its block's bytes (the
/// text as key, the parsed block); it starts over when this is reached.
const MEMO_MAX_BYTES: usize = 32 << 20;

/// What the sim read from each distinct block, by the block's JSON text, so that a block sent
/// again (the shared prefix, the fork message in every sibling's request) is not parsed and
/// counted again. A block's text fully determines what is read from it, so the memo changes no
/// count, identity or breakpoint: only how often they are worked out.
#[derive(Debug, Default)]
pub(crate) struct BlockMemo {
    inner: Mutex<MemoMaps>,
}

#[derive(Debug, Default)]
struct MemoMaps {
    /// Content blocks and tool definitions (JSON objects).
    objects: HashMap<Box<str>, Arc<BlockInfo>>,
    /// A message's content given as a string (the text block it stands for).
    strings: HashMap<Box<str>, Arc<BlockInfo>>,
    /// Twice the bytes of the keys held.
    bytes: usize,
}

impl BlockMemo {
    fn get(&self, string: bool, raw: &str) -> Option<Arc<BlockInfo>> {
        let maps = self.lock();
        let map = if string { &maps.strings } else { &maps.objects };
        map.get(raw).cloned()
    }

    fn insert(&self, string: bool, raw: &str, info: &Arc<BlockInfo>) {
        let cost = 2 * raw.len();
        if cost > MEMO_MAX_BYTES / 4 {
            return;
        }
        let mut maps = self.lock();
        if maps.bytes + cost > MEMO_MAX_BYTES {
            *maps = MemoMaps::default();
        }
        let map = if string {
            &mut maps.strings
        } else {
            &mut maps.objects
        };
        if map.insert(raw.into(), Arc::clone(info)).is_none() {
            maps.bytes += cost;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoMaps> {
        // The maps only gain or lose whole entries, so a panic elsewhere cannot leave them
        // half-changed.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many distinct blocks are held (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let maps = self.lock();
        maps.objects.len() + maps.strings.len()
    }
}

/// A parsed request.
#[derive(Debug)]
pub(crate) struct SimRequest {
    pub model: &'static ModelSpec,
    pub blocks: Vec<CacheBlock>,
    pub messages: Vec<SimMessage>,
    /// Whether extended thinking is enabled: the model then opens every reply with thinking.
    pub thinking: bool,
}

#[derive(Deserialize)]
struct Body<'a> {
    model: String,
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
    /// Appends a block, `digest` being the SHA-256 of its identity.
    fn push(&mut self, tag: &[u8], digest: &[u8; 32], tokens: u64, run: Run, bp: Option<CacheTtl>) {
        let mut h = Sha256::new();
        h.update(self.hash);
        // The tag, and the digest's fixed length after it, keep distinct block sequences from
        // hashing alike.
        h.update(tag);
        h.update(digest);
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
fn strip(
    raw: &str,
    what: impl Fn() -> String,
) -> Result<(Map<String, Value>, Option<CacheTtl>), ProviderError> {
    let value: Value =
        serde_json::from_str(raw).map_err(|e| invalid(format!("{}: {e}", what())))?;
    let Value::Object(mut map) = value else {
        return Err(invalid(format!("{} is not a JSON object", what())));
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

fn digest(identity: &str) -> [u8; 32] {
    Sha256::digest(identity.as_bytes()).into()
}

/// What the sim reads from a tool definition or content block, without its `cache_control`.
fn block_info(map: Map<String, Value>, breakpoint: Option<CacheTtl>) -> BlockInfo {
    let identity = encode(&map);
    let ty = map.get("type").and_then(Value::as_str).unwrap_or("");
    let run = match ty {
        "tool_use" => Run::ToolUse,
        "tool_result" => Run::ToolResult,
        _ => Run::Other,
    };
    BlockInfo {
        digest: digest(&identity),
        tokens: tokens::block_tokens(&identity),
        run,
        thinking: matches!(ty, "thinking" | "redacted_thinking"),
        breakpoint,
        value: Arc::new(Value::Object(map)),
    }
}

/// Reads one block: `raw` is a JSON object, or with `string` a message's string content (the
/// text block it stands for). With a memo, a block read before is not read again.
fn read_block(
    memo: Option<&BlockMemo>,
    string: bool,
    raw: &str,
    what: impl Fn() -> String,
) -> Result<Arc<BlockInfo>, ProviderError> {
    if let Some(hit) = memo.and_then(|m| m.get(string, raw)) {
        return Ok(hit);
    }
    let info = if string {
        let text: String =
            serde_json::from_str(raw).map_err(|e| invalid(format!("{}: {e}", what())))?;
        block_info(text_block(&text), None)
    } else {
        let (map, bp) = strip(raw, what)?;
        block_info(map, bp)
    };
    let info = Arc::new(info);
    if let Some(m) = memo {
        m.insert(string, raw, &info);
    }
    Ok(info)
}

/// Parses a request body, reading every block afresh (the plain path, which the memoized one must
/// match).
#[cfg(test)]
pub(crate) fn parse(body: &str) -> Result<SimRequest, ProviderError> {
    parse_with(body, None)
}

/// Parses a request body. Malformed bodies and unknown models are invalid requests; too many
/// breakpoints, or one on a thinking block, are a 400 as the API answers. With a memo, each
/// distinct block is read once; the result is the same as without.
pub(crate) fn parse_with(
    body: &str,
    memo: Option<&BlockMemo>,
) -> Result<SimRequest, ProviderError> {
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
        let info = read_block(memo, false, tool.get(), || format!("tools[{i}]"))?;
        b.push(
            b"tool",
            &info.digest,
            info.tokens,
            Run::Other,
            info.breakpoint,
        );
    }

    match body.system.map(RawValue::get) {
        None => {}
        Some(raw) if raw.starts_with('"') => {
            let text: String =
                serde_json::from_str(raw).map_err(|e| invalid(format!("system: {e}")))?;
            b.push(
                b"system",
                &digest(&encode(&text_block(&text))),
                tokens::count(&text),
                Run::Other,
                None,
            );
        }
        Some(raw) => {
            let blocks: Vec<&RawValue> =
                serde_json::from_str(raw).map_err(|e| invalid(format!("system: {e}")))?;
            for (i, block) in blocks.iter().enumerate() {
                let (map, bp) = strip(block.get(), || format!("system[{i}]"))?;
                let text = map
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(format!("system[{i}] is not a text block")))?;
                let tokens = tokens::count(text);
                b.push(b"system", &digest(&encode(&map)), tokens, Run::Other, bp);
            }
        }
    }

    // Changing the thinking config invalidates the message part of the cache, not tools/system.
    let mut thinking_tag = b"thinking:".to_vec();
    let mut thinking = false;
    match body.thinking {
        Some(t) => {
            let v: Value =
                serde_json::from_str(t.get()).map_err(|e| invalid(format!("thinking: {e}")))?;
            thinking = v.get("type").and_then(Value::as_str) == Some("enabled");
            thinking_tag
                .extend_from_slice(serde_json::to_string(&v).unwrap_or_default().as_bytes());
        }
        None => thinking_tag.extend_from_slice(b"none"),
    }

    let mut messages = Vec::with_capacity(body.messages.len());
    for (mi, message) in body.messages.iter().enumerate() {
        let raw = message.content.get();
        let what = |bi: Option<usize>| match bi {
            None => format!("messages[{mi}].content"),
            Some(bi) => format!("messages[{mi}].content[{bi}]"),
        };
        let contents: Vec<Arc<BlockInfo>> = if raw.starts_with('"') {
            vec![read_block(memo, true, raw, || what(None))?]
        } else {
            let blocks: Vec<&RawValue> =
                serde_json::from_str(raw).map_err(|e| invalid(format!("{}: {e}", what(None))))?;
            blocks
                .iter()
                .enumerate()
                .map(|(bi, block)| read_block(memo, false, block.get(), || what(Some(bi))))
                .collect::<Result<_, _>>()?
        };
        let mut parsed = Vec::with_capacity(contents.len());
        for (bi, info) in contents.into_iter().enumerate() {
            if info.breakpoint.is_some() && info.thinking {
                let ty = info.value.get("type").and_then(Value::as_str).unwrap_or("");
                return Err(bad_request(format!(
                    "{}: cache_control cannot be set on a {ty} block",
                    what(Some(bi))
                )));
            }
            let mut tag = match message.role {
                Role::User => b"user".to_vec(),
                Role::Assistant => b"assistant".to_vec(),
            };
            if mi == 0 && bi == 0 {
                tag.extend_from_slice(&thinking_tag);
            }
            b.push(&tag, &info.digest, info.tokens, info.run, info.breakpoint);
            parsed.push(Arc::clone(&info.value));
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
    if thinking {
        check_thinking_turns(&messages)?;
    }
    let input: u64 = b.blocks.iter().map(|block| block.tokens).sum();
    check_window(model, input, body.max_tokens)?;
    Ok(SimRequest {
        model,
        blocks: b.blocks,
        messages,
        thinking,
    })
}

/// The Messages API's rule for extended thinking: when the last user message carries tool
/// results, the assistant message before it — the one whose tool calls they answer — must open
/// with a thinking block (thinking blocks are signed, so nobody but the model can write one).
/// Earlier assistant messages are not checked.
fn check_thinking_turns(messages: &[SimMessage]) -> Result<(), ProviderError> {
    let block_type = |b: &Arc<Value>| {
        b.get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let Some(last_user) = messages.iter().rposition(|m| m.role == Role::User) else {
        return Ok(());
    };
    if !messages[last_user]
        .blocks
        .iter()
        .any(|b| block_type(b) == "tool_result")
    {
        return Ok(());
    }
    let Some(assistant) = messages[..last_user]
        .iter()
        .rposition(|m| m.role == Role::Assistant)
    else {
        return Ok(());
    };
    let first = messages[assistant]
        .blocks
        .first()
        .map(block_type)
        .unwrap_or_default();
    if matches!(first.as_str(), "thinking" | "redacted_thinking") {
        return Ok(());
    }
    Err(bad_request(format!(
        "messages.{assistant}.content.0.type: Expected 'thinking' or 'redacted_thinking', but \
         found '{first}'. When 'thinking' is enabled, a final 'assistant' message must start \
         with a thinking block (preceeding the lastmost set of 'tool_use' and 'tool_result' \
         blocks). We recommend you include thinking blocks from previous turns. To avoid this \
         requirement, disable 'thinking'."
    )))
}

/// The context window, with the API's own words: the prompt alone may not exceed it, and the
/// prompt plus `max_tokens` may not either.
fn check_window(model: &ModelSpec, input: u64, max_tokens: u64) -> Result<(), ProviderError> {
    let window = model.context_window;
    if input > window {
        return Err(bad_request(format!(
            "prompt is too long: {input} tokens > {window} maximum"
        )));
    }
    if input + max_tokens > window {
        return Err(bad_request(format!(
            "input length and `max_tokens` exceed context limit: {input} + {max_tokens} > \
             {window}, decrease input length or `max_tokens` and try again"
        )));
    }
    Ok(())
}
