//! Messages and content blocks, each block held as its fixed JSON bytes.
//!
//! A [`Block`] pairs the bytes that are sent with the little forkd needs to know about them (its
//! kind, a tool_use id). Constructors serialize exactly once; [`Block::parse`] ingests a block
//! from outside. Nothing here ever rebuilds a block's bytes from its parsed form.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::json::{JsonError, RawJson};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "user" => Some(Role::User),
            "assistant" => Some(Role::Assistant),
            _ => None,
        }
    }
}

/// What a block is, as far as caching and the agent loop care.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BlockKind {
    Text,
    /// Thinking and redacted thinking: they cannot carry a cache breakpoint.
    Thinking,
    ToolUse {
        id: String,
        name: String,
    },
    ToolResult {
        tool_use_id: String,
        is_error: bool,
    },
    /// Any other block type (images, documents, server tools): carried verbatim.
    Other(String),
}

/// One content block: its kind and its fixed JSON bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Block {
    kind: BlockKind,
    raw: RawJson,
}

/// A block that is not the JSON object the Messages API expects.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BlockError {
    #[error(transparent)]
    Json(#[from] JsonError),
    #[error("content block has no \"type\" field")]
    MissingType,
    #[error("{kind} block is missing its {field:?} field")]
    MissingField {
        kind: &'static str,
        field: &'static str,
    },
    #[error("content blocks must not carry \"cache_control\": forkd places breakpoints itself")]
    CacheControl,
}

#[derive(Serialize)]
struct TextBlock<'a> {
    r#type: &'static str,
    text: &'a str,
}

#[derive(Serialize)]
struct ThinkingBlock<'a> {
    r#type: &'static str,
    thinking: &'a str,
    signature: &'a str,
}

#[derive(Serialize)]
struct ToolUseBlock<'a> {
    r#type: &'static str,
    id: &'a str,
    name: &'a str,
    input: &'a serde_json::value::RawValue,
}

#[derive(Serialize)]
struct ToolResultBlock<'a> {
    r#type: &'static str,
    tool_use_id: &'a str,
    content: &'a str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    is_error: bool,
}

impl Block {
    pub fn text(text: &str) -> Self {
        Self {
            kind: BlockKind::Text,
            raw: RawJson::encode(&TextBlock {
                r#type: "text",
                text,
            }),
        }
    }

    pub fn thinking(thinking: &str, signature: &str) -> Self {
        Self {
            kind: BlockKind::Thinking,
            raw: RawJson::encode(&ThinkingBlock {
                r#type: "thinking",
                thinking,
                signature,
            }),
        }
    }

    /// A tool_use block. `input` must be a JSON object; it is spliced in as given.
    pub fn tool_use(id: &str, name: &str, input: &RawJson) -> Result<Self, BlockError> {
        input.expect_object()?;
        let input_raw: &serde_json::value::RawValue = serde_json::from_str(input.as_str())
            .map_err(|e| BlockError::Json(JsonError::Syntax(e.to_string())))?;
        Ok(Self {
            kind: BlockKind::ToolUse {
                id: id.to_owned(),
                name: name.to_owned(),
            },
            raw: RawJson::encode(&ToolUseBlock {
                r#type: "tool_use",
                id,
                name,
                input: input_raw,
            }),
        })
    }

    pub fn tool_result(tool_use_id: &str, content: &str, is_error: bool) -> Self {
        Self {
            kind: BlockKind::ToolResult {
                tool_use_id: tool_use_id.to_owned(),
                is_error,
            },
            raw: RawJson::encode(&ToolResultBlock {
                r#type: "tool_result",
                tool_use_id,
                content,
                is_error,
            }),
        }
    }

    /// A tool_result whose content is an array of blocks (text and images), as an MCP tool's
    /// result with images is. `content` must be a JSON array.
    pub fn tool_result_content(tool_use_id: &str, content: &RawJson, is_error: bool) -> Self {
        #[derive(Serialize)]
        struct Blocks<'a> {
            r#type: &'static str,
            tool_use_id: &'a str,
            content: &'a serde_json::value::RawValue,
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            is_error: bool,
        }
        let raw = serde_json::value::RawValue::from_string(content.as_str().to_owned())
            .ok()
            .map(|content| {
                RawJson::encode(&Blocks {
                    r#type: "tool_result",
                    tool_use_id,
                    content: &content,
                    is_error,
                })
            });
        match raw {
            Some(raw) => Self {
                kind: BlockKind::ToolResult {
                    tool_use_id: tool_use_id.to_owned(),
                    is_error,
                },
                raw,
            },
            None => Self::tool_result(tool_use_id, content.as_str(), is_error),
        }
    }

    /// Ingests a block from outside (a client or a provider's response): validated and compacted
    /// once. Blocks carrying `cache_control` are refused: breakpoints are forkd's to place.
    pub fn parse(text: &str) -> Result<Self, BlockError> {
        let raw = RawJson::parse(text)?;
        Self::classify(raw)
    }

    /// Rebuilds a block from bytes that forkd stored earlier, keeping them verbatim.
    pub fn from_stored(text: &str) -> Result<Self, BlockError> {
        Self::classify(RawJson::from_stored(text)?)
    }

    fn classify(raw: RawJson) -> Result<Self, BlockError> {
        raw.expect_object()?;
        let value = raw.value();
        if value.get("cache_control").is_some() {
            return Err(BlockError::CacheControl);
        }
        let ty = value
            .get("type")
            .and_then(Value::as_str)
            .ok_or(BlockError::MissingType)?;
        let field = |kind: &'static str, field: &'static str| {
            value
                .get(field)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or(BlockError::MissingField { kind, field })
        };
        let kind = match ty {
            "text" => {
                field("text", "text")?;
                BlockKind::Text
            }
            "thinking" | "redacted_thinking" => BlockKind::Thinking,
            "tool_use" => BlockKind::ToolUse {
                id: field("tool_use", "id")?,
                name: field("tool_use", "name")?,
            },
            "tool_result" => BlockKind::ToolResult {
                tool_use_id: field("tool_result", "tool_use_id")?,
                is_error: value.get("is_error").and_then(Value::as_bool) == Some(true),
            },
            other => BlockKind::Other(other.to_owned()),
        };
        Ok(Self { kind, raw })
    }

    pub fn kind(&self) -> &BlockKind {
        &self.kind
    }

    pub fn raw(&self) -> &RawJson {
        &self.raw
    }

    /// The text of a text block.
    pub fn as_text(&self) -> Option<String> {
        match self.kind {
            BlockKind::Text => self
                .raw
                .value()
                .get("text")
                .and_then(Value::as_str)
                .map(str::to_owned),
            _ => None,
        }
    }

    /// The text content of a tool_result block (empty when it has none, or holds blocks).
    pub fn tool_result_text(&self) -> Option<String> {
        match self.kind {
            BlockKind::ToolResult { .. } => Some(match self.raw.value().get("content") {
                Some(Value::String(text)) => text.clone(),
                // A result with images: its text blocks.
                Some(Value::Array(items)) => items
                    .iter()
                    .filter_map(|i| i.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n"),
                _ => String::new(),
            }),
            _ => None,
        }
    }

    /// The input of a tool_use block.
    pub fn tool_input(&self) -> Option<Value> {
        match self.kind {
            BlockKind::ToolUse { .. } => self.raw.value().get("input").cloned(),
            _ => None,
        }
    }

    /// Whether a cache breakpoint may sit on this block (thinking blocks cannot carry one).
    pub fn can_carry_breakpoint(&self) -> bool {
        !matches!(self.kind, BlockKind::Thinking)
    }

    /// Whether this block and `next` belong to one lookback position: a run of consecutive
    /// tool_use blocks is one position, and so is a run of tool_result blocks.
    pub fn same_run(&self, next: &Block) -> bool {
        matches!(
            (&self.kind, &next.kind),
            (BlockKind::ToolUse { .. }, BlockKind::ToolUse { .. })
                | (BlockKind::ToolResult { .. }, BlockKind::ToolResult { .. })
        )
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Message {
    pub role: Role,
    pub blocks: Vec<Block>,
}

impl Message {
    pub fn new(role: Role, blocks: Vec<Block>) -> Self {
        Self { role, blocks }
    }

    pub fn user(blocks: Vec<Block>) -> Self {
        Self::new(Role::User, blocks)
    }

    pub fn assistant(blocks: Vec<Block>) -> Self {
        Self::new(Role::Assistant, blocks)
    }

    /// The tool_use blocks of this message, in order.
    pub fn tool_uses(&self) -> impl Iterator<Item = (&str, &str, &Block)> {
        self.blocks.iter().filter_map(|b| match &b.kind {
            BlockKind::ToolUse { id, name } => Some((id.as_str(), name.as_str(), b)),
            _ => None,
        })
    }

    /// The message's content array as JSON text: the blocks' bytes joined, nothing re-encoded.
    pub fn content_json(&self) -> String {
        let mut out =
            String::with_capacity(2 + self.blocks.iter().map(|b| b.raw.len() + 1).sum::<usize>());
        out.push('[');
        for (i, block) in self.blocks.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(block.raw.as_str());
        }
        out.push(']');
        out
    }

    /// Rebuilds a message from a stored content array, keeping each block's bytes verbatim.
    pub fn from_stored(role: Role, content_json: &str) -> Result<Self, BlockError> {
        let blocks: Vec<&serde_json::value::RawValue> = serde_json::from_str(content_json)
            .map_err(|e| BlockError::Json(JsonError::Syntax(e.to_string())))?;
        let blocks = blocks
            .into_iter()
            .map(|b| Block::from_stored(b.get()))
            .collect::<Result<_, _>>()?;
        Ok(Self { role, blocks })
    }

    /// All the text of the message's text blocks, joined by newlines.
    pub fn text(&self) -> String {
        self.blocks
            .iter()
            .filter_map(Block::as_text)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_emit_compact_api_json() {
        assert_eq!(
            Block::text("hi \"x\"").raw().as_str(),
            r#"{"type":"text","text":"hi \"x\""}"#
        );
        assert_eq!(
            Block::tool_result("t1", "ok", false).raw().as_str(),
            r#"{"type":"tool_result","tool_use_id":"t1","content":"ok"}"#
        );
        let input = RawJson::parse(r#"{"prompt": "go", "description": "d"}"#).ok();
        let block = input.and_then(|i| Block::tool_use("t1", "Agent", &i).ok());
        assert_eq!(
            block.map(|b| b.raw().as_str().to_owned()).as_deref(),
            Some(
                r#"{"type":"tool_use","id":"t1","name":"Agent","input":{"prompt":"go","description":"d"}}"#
            )
        );
    }

    #[test]
    fn parse_classifies_and_refuses_bad_blocks() {
        let b = Block::parse(r#"{"type":"tool_use","id":"a","name":"Read","input":{}}"#).ok();
        assert!(matches!(
            b.map(|b| b.kind().clone()),
            Some(BlockKind::ToolUse { .. })
        ));
        assert!(matches!(
            Block::parse(r#"{"text":"x"}"#),
            Err(BlockError::MissingType)
        ));
        assert!(matches!(
            Block::parse(r#"{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}"#),
            Err(BlockError::CacheControl)
        ));
        assert!(matches!(
            Block::parse(r#"{"type":"text"}"#),
            Err(BlockError::MissingField { .. })
        ));
    }

    #[test]
    fn stored_messages_round_trip_byte_for_byte() {
        let msg = Message::user(vec![Block::text("a"), Block::tool_result("t", "r", true)]);
        let back = Message::from_stored(Role::User, &msg.content_json()).ok();
        assert_eq!(back.as_ref(), Some(&msg));
    }
}
