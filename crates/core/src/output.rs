//! Output schemas (docs/contracts.md, "Output schemas"): a JSON Schema that a batch's children, or
//! a typed agent, end with an object valid against.
//!
//! The schema never travels in request parameters, where it would make every child's request
//! differ from its parent's before the first byte of history. It is a text block of its own after
//! the fork boilerplate, the same for every sibling, so it belongs to the shared prefix and carries
//! the shared breakpoint. A child's final reply is checked against it; a reply that does not match
//! gets one follow-up naming each violation, and a second mismatch ends the child `failed`.

use serde_json::Value;

use crate::message::{Block, Message, Role};

/// The tag around the schema block.
pub const SCHEMA_TAG: &str = "forkd-output-schema";

/// The tag around the follow-up a mismatched reply gets.
pub const MISMATCH_TAG: &str = "forkd-output-mismatch";

/// The most bytes a schema may have, as compact JSON.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;

/// The most violations a follow-up (or a failure) lists; the rest are counted.
const MAX_LISTED: usize = 20;

/// A schema that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("the output schema is {len} bytes; the limit is {max}")]
    TooLarge { len: usize, max: usize },
    #[error("the output schema is not JSON: {0}")]
    NotJson(String),
    #[error("the output schema must be a JSON object, not {0}")]
    NotObject(&'static str),
    #[error("the output schema is not a valid JSON Schema 2020-12 document: {0}")]
    Invalid(String),
}

/// A checked JSON Schema (draft 2020-12), held as compact JSON. Remote and file references are
/// never resolved: a schema that needs one is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputSchema {
    json: String,
}

impl OutputSchema {
    /// Parses and checks a schema a client or a model submitted.
    pub fn parse(text: &str) -> Result<Self, SchemaError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| SchemaError::NotJson(e.to_string()))?;
        Self::from_value(&value)
    }

    /// Checks a schema already parsed (an `Agent` call's input).
    pub fn from_value(value: &Value) -> Result<Self, SchemaError> {
        if !value.is_object() {
            return Err(SchemaError::NotObject(json_type(value)));
        }
        let json = value.to_string();
        if json.len() > MAX_SCHEMA_BYTES {
            return Err(SchemaError::TooLarge {
                len: json.len(),
                max: MAX_SCHEMA_BYTES,
            });
        }
        if let Err(e) = jsonschema::draft202012::meta::validate(value) {
            let at = e.instance_path().to_string();
            let at = if at.is_empty() { "/".to_owned() } else { at };
            return Err(SchemaError::Invalid(format!("at {at}: {e}")));
        }
        validator(value).map_err(SchemaError::Invalid)?;
        Ok(Self { json })
    }

    /// A schema as stored with its batch or agent, checked when it was submitted.
    pub fn from_stored(json: String) -> Self {
        Self { json }
    }

    /// The schema as compact JSON: what is stored, and what idempotency digests cover.
    pub fn as_str(&self) -> &str {
        &self.json
    }

    fn value(&self) -> Result<Value, String> {
        serde_json::from_str(&self.json).map_err(|e| format!("the stored schema is not JSON: {e}"))
    }

    /// The schema block's text: how to end, then the schema. Its bytes depend on the schema
    /// alone, so every sibling reads the same block.
    pub fn block_text(&self) -> String {
        let pretty = self
            .value()
            .ok()
            .and_then(|v| serde_json::to_string_pretty(&v).ok())
            .unwrap_or_else(|| self.json.clone());
        format!(
            "<{SCHEMA_TAG}>\n\
             Your final reply is data. Instead of any report format given above, end with one \
             JSON object that is valid against the JSON Schema (draft 2020-12) below: the object \
             alone, or inside one ```json fence, with nothing after it. forkd checks it, and \
             tells you once what does not match. Your status, usage and the files you changed \
             are recorded beside it, so do not repeat them unless the schema asks for them.\n\
             ```json\n{pretty}\n```\n\
             </{SCHEMA_TAG}>"
        )
    }

    /// The schema block.
    pub fn block(&self) -> Block {
        Block::text(&self.block_text())
    }

    /// Checks a final reply: the object it holds when that is valid, else each violation.
    pub fn check(&self, reply: &str) -> Result<Value, Vec<String>> {
        let object = extract_object(reply).map_err(|e| vec![e])?;
        let schema = self.value().map_err(|e| vec![e])?;
        let validator = validator(&schema).map_err(|e| vec![e])?;
        let violations: Vec<String> = validator
            .iter_errors(&object)
            .map(|e| {
                let at = e.instance_path().to_string();
                let at = if at.is_empty() { "/".to_owned() } else { at };
                format!("at {at}: {e}")
            })
            .collect();
        if violations.is_empty() {
            Ok(object)
        } else {
            Err(violations)
        }
    }
}

/// The compiled validator: draft 2020-12, no retrieval of any reference outside the schema,
/// patterns on the linear-time regex engine (a tenant's pattern cannot backtrack for ever).
fn validator(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::draft202012::options()
        .offline()
        .with_pattern_options(jsonschema::PatternOptions::regex())
        .build(schema)
        .map_err(|e| e.to_string())
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The JSON object a final reply holds: the whole reply, or the contents of its one ```json (or
/// bare ```) fence.
pub fn extract_object(reply: &str) -> Result<Value, String> {
    let trimmed = reply.trim();
    let text = if trimmed.starts_with('{') {
        trimmed
    } else {
        let fences = fences(reply);
        match fences.as_slice() {
            [one] => one.trim(),
            [] => {
                return Err(
                    "the reply holds no JSON object: write the object alone, or inside \
                            one ```json fence"
                        .to_owned(),
                );
            }
            many => {
                return Err(format!(
                    "the reply has {} fenced blocks; give the object in one ```json fence",
                    many.len()
                ));
            }
        }
    };
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("the JSON does not parse: {e}"))?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(format!(
            "the reply's JSON is {}, not an object",
            json_type(&value)
        ))
    }
}

/// The contents of the reply's fenced blocks tagged `json` or untagged.
fn fences(reply: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = reply;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        let Some(line_end) = after.find('\n') else {
            break;
        };
        let tag = after[..line_end].trim();
        let body = &after[line_end + 1..];
        let Some(close) = body.find("```") else {
            break;
        };
        if tag.is_empty() || tag.eq_ignore_ascii_case("json") {
            found.push(&body[..close]);
        }
        rest = &body[close + 3..];
    }
    found
}

/// The violations as a list: one line each, the first [`MAX_LISTED`], then how many more.
pub fn list_violations(violations: &[String]) -> String {
    let mut lines: Vec<String> = violations
        .iter()
        .take(MAX_LISTED)
        .map(|v| format!("- {v}"))
        .collect();
    if violations.len() > MAX_LISTED {
        lines.push(format!("- and {} more", violations.len() - MAX_LISTED));
    }
    lines.join("\n")
}

/// The one follow-up a mismatched final reply gets: a user message naming each violation.
pub fn follow_up(violations: &[String]) -> Message {
    Message::user(vec![Block::text(&format!(
        "<{MISMATCH_TAG}>\n\
         Your final reply does not match the output schema:\n{}\n\
         Reply again with only the corrected JSON object, alone or inside one ```json fence. This \
         is the only follow-up: a reply that still does not match ends your work as failed.\n\
         </{MISMATCH_TAG}>",
        list_violations(violations)
    ))])
}

/// Whether `message` is a follow-up forkd sent for a mismatched reply.
pub fn is_follow_up(message: &Message) -> bool {
    let open = format!("<{MISMATCH_TAG}>");
    message.role == Role::User
        && message
            .blocks
            .iter()
            .filter_map(Block::as_text)
            .any(|t| t.trim_start().starts_with(&open))
}

/// The schema a schema block's text carries (compact or pretty JSON), for a model that reads
/// it: the simulated model answers it.
pub fn schema_in_block(text: &str) -> Option<&str> {
    let body = text.trim_start().strip_prefix(&format!("<{SCHEMA_TAG}>"))?;
    let start = body.find("```json\n")? + "```json\n".len();
    let end = body[start..].rfind("\n```")? + start;
    Some(&body[start..end])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn verdict_schema() -> OutputSchema {
        OutputSchema::from_value(&json!({
            "type": "object",
            "required": ["verdict", "findings"],
            "properties": {
                "verdict": {"enum": ["pass", "fail"]},
                "findings": {"type": "array", "items": {"type": "string"}}
            },
            "additionalProperties": false
        }))
        .unwrap()
    }

    #[test]
    fn a_valid_reply_gives_its_object_alone_or_fenced() {
        let schema = verdict_schema();
        let object = json!({"verdict": "pass", "findings": []});
        assert_eq!(
            schema.check(r#" {"verdict":"pass","findings":[]} "#),
            Ok(object.clone())
        );
        let fenced = "Here it is.\n```json\n{\"verdict\": \"pass\", \"findings\": []}\n```\n";
        assert_eq!(schema.check(fenced), Ok(object.clone()));
        assert_eq!(
            schema.check("```\n{\"verdict\":\"pass\",\"findings\":[]}\n```"),
            Ok(object)
        );
    }

    #[test]
    fn each_violation_is_named_with_its_place() {
        let schema = verdict_schema();
        let err = schema
            .check(r#"{"verdict": "maybe", "findings": [1], "extra": true}"#)
            .unwrap_err();
        assert_eq!(err.len(), 3, "{err:?}");
        assert!(err.iter().any(|e| e.starts_with("at /verdict:")), "{err:?}");
        assert!(
            err.iter().any(|e| e.starts_with("at /findings/0:")),
            "{err:?}"
        );
        assert!(err.iter().any(|e| e.contains("extra")), "{err:?}");
        let missing = schema.check("{}").unwrap_err();
        assert!(
            missing.iter().all(|e| e.starts_with("at /:")),
            "{missing:?}"
        );
    }

    #[test]
    fn a_reply_without_one_object_says_why() {
        let schema = verdict_schema();
        for (reply, needle) in [
            ("All good.", "holds no JSON object"),
            ("```json\n{}\n```\n```json\n{}\n```", "2 fenced blocks"),
            ("```json\n{nope\n```", "does not parse"),
            ("```json\n[1]\n```", "an array, not an object"),
        ] {
            let err = schema.check(reply).unwrap_err();
            assert!(err[0].contains(needle), "{reply}: {err:?}");
        }
    }

    #[test]
    fn bad_schemas_are_refused_by_name() {
        for (text, needle) in [
            ("{nope", "not JSON"),
            ("[1]", "must be a JSON object"),
            (r#"{"type": "objet"}"#, "not a valid JSON Schema"),
            (r#"{"minimum": "five"}"#, "not a valid JSON Schema"),
            (r#"{"pattern": "("}"#, "not a valid JSON Schema"),
        ] {
            let err = OutputSchema::parse(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
        let big = format!(r#"{{"description": "{}"}}"#, "x".repeat(MAX_SCHEMA_BYTES));
        assert!(matches!(
            OutputSchema::parse(&big),
            Err(SchemaError::TooLarge { .. })
        ));
    }

    #[test]
    fn remote_and_file_references_are_never_resolved() {
        for reference in [
            "https://example.com/schema.json",
            "file:///etc/passwd",
            "other.json#/defs/x",
        ] {
            let schema = json!({"$ref": reference});
            let err = OutputSchema::from_value(&schema);
            assert!(
                matches!(err, Err(SchemaError::Invalid(_))),
                "{reference}: {err:?}"
            );
        }
        // A reference inside the schema resolves.
        let local = json!({
            "$defs": {"v": {"enum": ["pass", "fail"]}},
            "type": "object",
            "properties": {"verdict": {"$ref": "#/$defs/v"}}
        });
        let schema = OutputSchema::from_value(&local).unwrap();
        assert!(schema.check(r#"{"verdict":"pass"}"#).is_ok());
        assert!(schema.check(r#"{"verdict":"nope"}"#).is_err());
    }

    #[test]
    fn the_block_carries_the_schema_and_the_follow_up_is_recognised() {
        let schema = verdict_schema();
        let text = schema.block_text();
        assert!(text.starts_with(&format!("<{SCHEMA_TAG}>")));
        let carried: Value = serde_json::from_str(schema_in_block(&text).unwrap()).unwrap();
        assert_eq!(carried.to_string(), schema.as_str());
        // Built twice, the same bytes: siblings cannot differ here.
        assert_eq!(schema.block(), verdict_schema().block());

        let many: Vec<String> = (0..25).map(|i| format!("at /{i}: bad")).collect();
        let follow_up = follow_up(&many);
        assert!(is_follow_up(&follow_up));
        let text = follow_up.text();
        assert!(text.contains("- at /19: bad") && !text.contains("- at /20: bad"));
        assert!(text.contains("- and 5 more"), "{text}");
        assert!(!is_follow_up(&Message::user(vec![Block::text("hello")])));
    }
}
