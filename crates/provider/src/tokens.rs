//! Deterministic token counts: tiktoken's o200k_base BPE, standing in for the model's tokenizer.
//!
//! The counts only need to be deterministic and of a realistic size, not to match any real model
//! exactly. The same large prefix is counted once per sibling of a fork batch, so counts of long
//! texts are memoized by their SHA-256.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, PoisonError};

use serde::Deserialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tiktoken_rs::CoreBPE;

use crate::ProviderError;

/// Texts shorter than this are counted directly: hashing them costs about as much as counting.
const MEMO_MIN_BYTES: usize = 256;
/// The memo is cleared when it reaches this many entries, which bounds its memory.
const MEMO_CAP: usize = 100_000;

/// The BPE, loaded once; `None` if its tables fail to load, in which case counts are estimated.
static BPE: LazyLock<Option<CoreBPE>> = LazyLock::new(|| match tiktoken_rs::o200k_base() {
    Ok(bpe) => Some(bpe),
    Err(e) => {
        tracing::warn!(error = %e, "o200k_base failed to load; estimating tokens as bytes/4");
        None
    }
});

static MEMO: LazyLock<Mutex<HashMap<[u8; 32], u64>>> = LazyLock::new(Default::default);

/// The number of tokens in `text` (o200k_base; special-token markers count as plain text).
pub fn count(text: &str) -> u64 {
    if text.len() < MEMO_MIN_BYTES {
        return count_uncached(text);
    }
    let key: [u8; 32] = Sha256::digest(text.as_bytes()).into();
    if let Some(&n) = memo().get(&key) {
        return n;
    }
    // Counted outside the lock: two threads may count the same text, which is harmless.
    let n = count_uncached(text);
    let mut memo = memo();
    if memo.len() >= MEMO_CAP {
        memo.clear();
    }
    memo.insert(key, n);
    n
}

/// The tokens of one request block, given the text that stands for it: a tool definition's or a
/// message content block's compact JSON (without `cache_control`), or a system block's text.
pub fn block_tokens(block_json: &str) -> u64 {
    count(block_json)
}

/// The input tokens of a Messages API request body, counted block by block as the sim counts
/// them (a tool definition's or a content block's compact JSON without its `cache_control`, a
/// system block's text), so for the sim this is exactly the input side of the usage the request
/// would report. The model is not checked: any body of the API's shape can be counted.
pub fn request_input_tokens(body: &str) -> Result<u64, ProviderError> {
    #[derive(Deserialize)]
    struct Body {
        #[serde(default)]
        tools: Vec<Value>,
        #[serde(default)]
        system: Option<Value>,
        messages: Vec<BodyMessage>,
    }
    #[derive(Deserialize)]
    struct BodyMessage {
        content: Value,
    }
    let invalid = |what: String| ProviderError::InvalidRequest(what);
    let body: Body =
        serde_json::from_str(body).map_err(|e| invalid(format!("the request body: {e}")))?;
    let mut total = 0;
    for (i, tool) in body.tools.iter().enumerate() {
        total += block_tokens(
            &identity(tool).ok_or_else(|| invalid(format!("tools[{i}] is not an object")))?,
        );
    }
    match &body.system {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => total += count(text),
        Some(Value::Array(blocks)) => {
            for block in blocks {
                total += count(block.get("text").and_then(Value::as_str).unwrap_or(""));
            }
        }
        Some(_) => return Err(invalid("system is not a string or a list of blocks".into())),
    }
    for (i, message) in body.messages.iter().enumerate() {
        match &message.content {
            Value::String(text) => {
                let block = serde_json::json!({"type": "text", "text": text});
                total += block_tokens(&block.to_string());
            }
            Value::Array(blocks) => {
                for (j, block) in blocks.iter().enumerate() {
                    let json = identity(block).ok_or_else(|| {
                        invalid(format!("messages[{i}].content[{j}] is not an object"))
                    })?;
                    total += block_tokens(&json);
                }
            }
            _ => {
                return Err(invalid(format!(
                    "messages[{i}].content is not a string or a list"
                )));
            }
        }
    }
    Ok(total)
}

/// A block's compact JSON without its breakpoint (a breakpoint costs no tokens); the keys keep
/// their order, so a block forkd built compactly is its own bytes.
fn identity(block: &Value) -> Option<String> {
    let mut map: Map<String, Value> = block.as_object()?.clone();
    map.shift_remove("cache_control");
    serde_json::to_string(&map).ok()
}

fn memo() -> std::sync::MutexGuard<'static, HashMap<[u8; 32], u64>> {
    // The map holds plain numbers, so a panic elsewhere cannot leave it inconsistent.
    MEMO.lock().unwrap_or_else(PoisonError::into_inner)
}

fn count_uncached(text: &str) -> u64 {
    match BPE.as_ref() {
        Some(bpe) => bpe.encode_ordinary(text).len() as u64,
        None => text.len().div_ceil(4) as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_deterministic_and_plausible() {
        assert_eq!(count(""), 0);
        assert_eq!(count("hello world"), 2);
        let long = "The quick brown fox jumps over the lazy dog. ".repeat(100);
        let first = count(&long);
        assert_eq!(first, count(&long), "memoized count agrees");
        assert!((900..=1100).contains(&first), "{first}");
    }

    #[test]
    fn special_token_markers_are_plain_text() {
        assert!(count("<|endoftext|>") > 1);
    }

    #[test]
    fn request_bodies_are_counted_block_by_block() {
        let tool =
            r#"{"name":"Read","description":"Read a file","input_schema":{"type":"object"}}"#;
        let block = r#"{"type":"text","text":"Summarise the repository."}"#;
        let body = format!(
            r#"{{"model":"any-model","max_tokens":9,"stream":true,
                "tools":[{tool_cc}],
                "system":[{{"type":"text","text":"You help.","cache_control":{{"type":"ephemeral"}}}}],
                "messages":[{{"role":"user","content":[{block}]}},
                            {{"role":"assistant","content":"Hello there."}}]}}"#,
            tool_cc = r#"{"name":"Read","description":"Read a file","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral"}}"#,
        );
        let expected = block_tokens(tool)
            + count("You help.")
            + block_tokens(block)
            + block_tokens(r#"{"type":"text","text":"Hello there."}"#);
        assert_eq!(request_input_tokens(&body), Ok(expected));
        let plain_system = r#"{"system":"You help.","messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(
            request_input_tokens(plain_system),
            Ok(count("You help.") + block_tokens(r#"{"type":"text","text":"hi"}"#))
        );
        for bad in [
            "{not json",
            r#"{"model":"m"}"#,
            r#"{"messages":[{"role":"user","content":7}]}"#,
            r#"{"system":7,"messages":[]}"#,
            r#"{"tools":[1],"messages":[]}"#,
        ] {
            assert!(
                matches!(
                    request_input_tokens(bad),
                    Err(ProviderError::InvalidRequest(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn block_tokens_count_the_given_text() {
        let block = r#"{"type":"text","text":"hi"}"#;
        assert_eq!(block_tokens(block), count(block));
    }
}
