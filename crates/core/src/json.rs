//! Raw JSON that is stored and spliced, never re-serialized.
//!
//! Prompt caching is byte-exact, so forkd fixes a block's JSON bytes once (when the block is created
//! or ingested) and from then on only copies them. [`RawJson`] is that fixed text: validated once,
//! compact, immutable and cheap to clone (an `Arc<str>`), so a 100k-token prefix shared by N
//! children is held once in memory.

use std::fmt;
use std::sync::Arc;

use serde::Serialize;

/// Text that failed to parse as the JSON forkd expected.
#[derive(Debug, Clone, thiserror::Error)]
pub enum JsonError {
    #[error("invalid JSON: {0}")]
    Syntax(String),
    #[error("expected a JSON {expected}, found {found}")]
    Shape {
        expected: &'static str,
        found: &'static str,
    },
}

/// A compact JSON value whose bytes never change once created.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RawJson(Arc<str>);

impl RawJson {
    /// Serializes `value` once, compactly. The result is the value's bytes from then on.
    pub fn encode<T: Serialize + ?Sized>(value: &T) -> Self {
        // Serializing plain data (strings, numbers, derived structs, maps with string keys) into
        // a String cannot fail; fall back to `null` rather than panic if a caller breaks that.
        let text = serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned());
        Self(text.into())
    }

    /// Ingests JSON from outside (a client, the store): checks it and makes it compact. Key order
    /// is kept as written; this is the last time these bytes are produced by a serializer.
    pub fn parse(text: &str) -> Result<Self, JsonError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| JsonError::Syntax(e.to_string()))?;
        Ok(Self::encode(&value))
    }

    /// Wraps bytes that this crate itself produced earlier (read back from the store). They are
    /// checked to be JSON, but not re-encoded: what was stored is what is sent.
    pub fn from_stored(text: &str) -> Result<Self, JsonError> {
        serde_json::from_str::<serde::de::IgnoredAny>(text)
            .map_err(|e| JsonError::Syntax(e.to_string()))?;
        Ok(Self(text.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Parses the bytes into a value, for reading fields. Never re-encode the result for sending.
    pub fn value(&self) -> serde_json::Value {
        serde_json::from_str(&self.0).unwrap_or(serde_json::Value::Null)
    }

    /// Checks that the value is a JSON object.
    pub fn expect_object(&self) -> Result<(), JsonError> {
        match self.0.as_bytes().first() {
            Some(b'{') => Ok(()),
            _ => Err(JsonError::Shape {
                expected: "object",
                found: kind_of(&self.0),
            }),
        }
    }

    /// Checks that the value is a JSON array.
    pub fn expect_array(&self) -> Result<(), JsonError> {
        match self.0.as_bytes().first() {
            Some(b'[') => Ok(()),
            _ => Err(JsonError::Shape {
                expected: "array",
                found: kind_of(&self.0),
            }),
        }
    }
}

fn kind_of(text: &str) -> &'static str {
    match text.as_bytes().first() {
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

impl fmt::Debug for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MAX: usize = 120;
        if self.0.len() <= MAX {
            write!(f, "RawJson({})", &self.0)
        } else {
            let cut = (0..=MAX)
                .rev()
                .find(|i| self.0.is_char_boundary(*i))
                .unwrap_or(0);
            write!(f, "RawJson({}… {} bytes)", &self.0[..cut], self.0.len())
        }
    }
}

impl fmt::Display for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_compacts_once_and_keeps_key_order() {
        let raw = RawJson::parse("{ \"b\": 1,\n \"a\": [1, 2] }").ok();
        assert_eq!(
            raw.as_ref().map(RawJson::as_str),
            Some(r#"{"b":1,"a":[1,2]}"#)
        );
    }

    #[test]
    fn shape_checks_name_what_they_found() {
        let raw = RawJson::parse("[1]").ok();
        let err = raw
            .and_then(|r| r.expect_object().err())
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("expected a JSON object, found an array")
        );
    }

    #[test]
    fn stored_bytes_are_kept_verbatim() {
        let raw = RawJson::from_stored(r#"{"x": 1}"#).ok();
        assert_eq!(raw.as_ref().map(RawJson::as_str), Some(r#"{"x": 1}"#));
        assert!(RawJson::from_stored("{").is_err());
    }
}
