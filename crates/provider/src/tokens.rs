//! Deterministic token counts: tiktoken's o200k_base BPE, standing in for the model's tokenizer.
//!
//! The counts only need to be deterministic and of a realistic size, not to match any real model
//! exactly. The same large prefix is counted once per sibling of a fork batch, so counts of long
//! texts are memoized by their SHA-256.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, PoisonError};

use sha2::{Digest, Sha256};
use tiktoken_rs::CoreBPE;

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
    fn block_tokens_count_the_given_text() {
        let block = r#"{"type":"text","text":"hi"}"#;
        assert_eq!(block_tokens(block), count(block));
    }
}
