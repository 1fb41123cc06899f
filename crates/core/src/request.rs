//! Serialization of a Messages API request by splicing stored bytes.
//!
//! The body is written field by field in a fixed order — model, max_tokens, stream, thinking,
//! tools, system, messages — so that for two requests with the same cache-safe params and the same
//! message prefix, the bodies agree byte for byte up to the first block where they differ. Blocks
//! are copied from their stored bytes; a breakpoint is spliced in as a `cache_control` field
//! appended to the block's object. Nothing is parsed and re-encoded.

use sha2::{Digest, Sha256};

use crate::message::{Message, Role};
use crate::session::CacheSafeParams;

/// The most `cache_control` breakpoints a request may carry.
pub const MAX_BREAKPOINTS: usize = 4;

const CACHE_CONTROL: &str = r#","cache_control":{"type":"ephemeral"}"#;

/// A block's place in a conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockPos {
    pub message: usize,
    pub block: usize,
}

/// The messages of one request and the shared breakpoints the caller asks for (in priority
/// order). The system prompt and the last block always get one.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    pub messages: Vec<Message>,
    pub anchors: Vec<BlockPos>,
}

impl Conversation {
    pub fn plain(messages: Vec<Message>) -> Self {
        Self {
            messages,
            anchors: Vec::new(),
        }
    }

    /// A session's main-loop request. With `reply_breakpoint`, the end of the last assistant
    /// message gets a breakpoint too: the cache then holds the history up to that reply, which a
    /// branch or a batch that starts right after it reads instead of writing it again. It costs
    /// nothing: everything up to the last breakpoint is written anyway.
    pub fn main_loop(messages: Vec<Message>, reply_breakpoint: bool) -> Self {
        let anchors = if reply_breakpoint {
            messages
                .iter()
                .rposition(|m| m.role == Role::Assistant && !m.blocks.is_empty())
                .map(|message| BlockPos {
                    message,
                    block: messages[message].blocks.len() - 1,
                })
                .into_iter()
                .collect()
        } else {
            Vec::new()
        };
        Self { messages, anchors }
    }
}

/// Where one block's bytes sit in a serialized body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSpan {
    pub pos: BlockPos,
    pub start: usize,
    pub end: usize,
}

/// A serialized request body and what forkd needs to know about it.
#[derive(Debug, Clone, PartialEq)]
pub struct SerializedRequest {
    pub body: String,
    /// Every message block's byte range in `body`.
    pub spans: Vec<BlockSpan>,
    /// Message blocks that carry a breakpoint.
    pub breakpoints: Vec<BlockPos>,
    /// Whether the system prompt carries one (when a slot was left for it).
    pub system_breakpoint: bool,
}

impl SerializedRequest {
    /// The byte range of one block.
    pub fn span(&self, pos: BlockPos) -> Option<BlockSpan> {
        self.spans.iter().copied().find(|s| s.pos == pos)
    }

    /// A fingerprint of the body up to (not including) `pos`'s block: equal fingerprints mean
    /// byte-identical prefixes.
    pub fn prefix_fingerprint(&self, pos: BlockPos) -> Option<String> {
        let span = self.span(pos)?;
        Some(fingerprint(&self.body.as_bytes()[..span.start]))
    }
}

/// A short hex SHA-256 of some bytes.
pub fn fingerprint(bytes: &[u8]) -> String {
    hex::encode(&Sha256::digest(bytes)[..16])
}

/// The block that carries a breakpoint meant for `pos`: `pos` itself, or the nearest earlier block
/// of its message when `pos` is a thinking block (which cannot carry one).
fn carrier(messages: &[Message], mut pos: BlockPos) -> Option<BlockPos> {
    loop {
        let block = messages.get(pos.message)?.blocks.get(pos.block)?;
        if block.can_carry_breakpoint() {
            return Some(pos);
        }
        pos.block = pos.block.checked_sub(1)?;
    }
}

/// Picks the message breakpoints: the last block first (so the cap never drops the breakpoint of
/// the request's own prefix), then the anchors in priority order, at most `MAX_BREAKPOINTS`.
/// The system prompt gets a breakpoint only if a slot is left: any message breakpoint's prefix
/// contains the system prompt, so it is the least valuable one.
fn plan_breakpoints(conv: &Conversation) -> (Vec<BlockPos>, bool) {
    let last = conv
        .messages
        .iter()
        .rposition(|m| !m.blocks.is_empty())
        .map(|m| BlockPos {
            message: m,
            block: conv.messages[m].blocks.len() - 1,
        });
    let mut picked: Vec<BlockPos> = Vec::new();
    for pos in last.into_iter().chain(conv.anchors.iter().copied()) {
        if let Some(p) = carrier(&conv.messages, pos)
            && !picked.contains(&p)
            && picked.len() < MAX_BREAKPOINTS
        {
            picked.push(p);
        }
    }
    picked.sort();
    let system = picked.len() < MAX_BREAKPOINTS;
    (picked, system)
}

/// How many lookback positions lie after `from` up to and including `to`: block boundaries, where
/// a run of consecutive tool_use blocks (or tool_result blocks) counts once. A breakpoint at `to`
/// finds an entry at `from` only if this is below the provider's lookback (20).
pub fn positions_between(messages: &[Message], from: BlockPos, to: BlockPos) -> usize {
    let blocks: Vec<(BlockPos, &crate::message::Block)> = messages
        .iter()
        .enumerate()
        .flat_map(|(mi, m)| {
            m.blocks.iter().enumerate().map(move |(bi, b)| {
                (
                    BlockPos {
                        message: mi,
                        block: bi,
                    },
                    b,
                )
            })
        })
        .collect();
    blocks
        .iter()
        .enumerate()
        .filter(|(_, (pos, _))| *pos > from && *pos <= to)
        .filter(|(i, (pos, block))| {
            *pos == to
                || blocks
                    .get(i + 1)
                    .is_none_or(|(_, next)| !block.same_run(next))
        })
        .count()
}

fn push_json_str(out: &mut String, s: &str) {
    // Encoding a &str to JSON cannot fail.
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}

/// Serializes a request body. `stream` decides the `stream` field (true for forkd's own runs).
pub fn serialize(params: &CacheSafeParams, conv: &Conversation, stream: bool) -> SerializedRequest {
    let (breakpoints, system_breakpoint) = plan_breakpoints(conv);
    let approx = params.system.as_str().len()
        + params.tools.raw().len()
        + conv
            .messages
            .iter()
            .flat_map(|m| m.blocks.iter())
            .map(|b| b.raw().len() + 1)
            .sum::<usize>()
        + 256;
    let mut out = String::with_capacity(approx);
    out.push_str(r#"{"model":"#);
    push_json_str(&mut out, &params.model);
    out.push_str(&format!(r#","max_tokens":{}"#, params.max_tokens));
    out.push_str(if stream {
        r#","stream":true"#
    } else {
        r#","stream":false"#
    });
    if let Some(thinking) = params.thinking {
        out.push_str(r#","thinking":"#);
        out.push_str(&thinking.to_json());
    }
    out.push_str(r#","tools":"#);
    out.push_str(params.tools.raw().as_str());
    out.push_str(r#","system":[{"type":"text","text":"#);
    push_json_str(&mut out, params.system.as_str());
    if system_breakpoint {
        out.push_str(CACHE_CONTROL);
    }
    out.push_str(r#"}],"messages":["#);

    let mut spans = Vec::new();
    let mut open_role: Option<Role> = None;
    for (mi, message) in conv.messages.iter().enumerate() {
        if message.blocks.is_empty() {
            continue;
        }
        // Consecutive messages of one role are sent as one message, as the API itself would
        // combine them; the rule is deterministic, so siblings still agree byte for byte.
        if open_role == Some(message.role) {
            out.push(',');
        } else {
            if open_role.is_some() {
                out.push_str("]},");
            }
            out.push_str(r#"{"role":""#);
            out.push_str(message.role.as_str());
            out.push_str(r#"","content":["#);
            open_role = Some(message.role);
        }
        for (bi, block) in message.blocks.iter().enumerate() {
            if bi > 0 {
                out.push(',');
            }
            let pos = BlockPos {
                message: mi,
                block: bi,
            };
            let start = out.len();
            let raw = block.raw().as_str().trim_end();
            if breakpoints.contains(&pos) {
                // Every stored block is a JSON object: drop its closing brace, add the field.
                out.push_str(&raw[..raw.len().saturating_sub(1)]);
                out.push_str(CACHE_CONTROL);
                out.push('}');
            } else {
                out.push_str(raw);
            }
            spans.push(BlockSpan {
                pos,
                start,
                end: out.len(),
            });
        }
    }
    if open_role.is_some() {
        out.push_str("]}");
    }
    out.push_str("]}");
    SerializedRequest {
        body: out,
        spans,
        breakpoints,
        system_breakpoint,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Block;
    use crate::session::{RenderedSystem, ThinkingConfig, ToolsJson};

    fn params() -> CacheSafeParams {
        CacheSafeParams {
            model: "claude-sonnet-4-5".into(),
            system: RenderedSystem::from_stored("sys"),
            tools: ToolsJson::from_stored("[]").unwrap_or_else(|_| ToolsJson::builtin()),
            thinking: Some(ThinkingConfig {
                budget_tokens: 1024,
            }),
            max_tokens: 100,
        }
    }

    #[test]
    fn a_main_loop_request_may_mark_the_end_of_the_last_reply_too() {
        let messages = vec![
            Message::user(vec![Block::text("u1")]),
            Message::assistant(vec![Block::thinking("t", "s"), Block::text("a1")]),
            Message::user(vec![Block::text("u2")]),
            Message::assistant(vec![Block::text("a2"), Block::text("a2, more")]),
            Message::user(vec![Block::text("note")]),
            Message::user(vec![Block::text("u3")]),
        ];
        let last = BlockPos {
            message: 5,
            block: 0,
        };
        let reply = BlockPos {
            message: 3,
            block: 1,
        };
        let marked = serialize(
            &params(),
            &Conversation::main_loop(messages.clone(), true),
            true,
        );
        assert_eq!(marked.breakpoints, vec![reply, last]);
        assert!(marked.system_breakpoint);
        let plain = serialize(
            &params(),
            &Conversation::main_loop(messages.clone(), false),
            true,
        );
        assert_eq!(plain.breakpoints, vec![last]);
        assert_eq!(
            plain,
            serialize(&params(), &Conversation::plain(messages), true)
        );
        // Up to the reply's breakpoint, a branch that goes on after it sends the same bytes.
        let branch = vec![
            Message::user(vec![Block::text("u1")]),
            Message::assistant(vec![Block::thinking("t", "s"), Block::text("a1")]),
            Message::user(vec![Block::text("u2")]),
            Message::assistant(vec![Block::text("a2"), Block::text("a2, more")]),
            Message::user(vec![Block::text("another u3")]),
        ];
        let other = serialize(&params(), &Conversation::main_loop(branch, true), true);
        let end = |r: &SerializedRequest| r.span(reply).map(|s| s.end).unwrap_or_default();
        assert_eq!(end(&marked), end(&other));
        assert_eq!(marked.body[..end(&marked)], other.body[..end(&other)]);
        // Without any reply yet, only the last block is marked.
        let first = Conversation::main_loop(vec![Message::user(vec![Block::text("u1")])], true);
        assert_eq!(serialize(&params(), &first, true).breakpoints.len(), 1);
    }

    #[test]
    fn body_is_valid_json_with_breakpoints_spliced() {
        let conv = Conversation::plain(vec![
            Message::user(vec![Block::text("a")]),
            Message::user(vec![Block::text("b")]),
            Message::assistant(vec![Block::thinking("t", "s")]),
        ]);
        let req = serialize(&params(), &conv, true);
        let value: serde_json::Value = serde_json::from_str(&req.body).unwrap_or_default();
        assert_eq!(
            value["messages"].as_array().map(Vec::len),
            Some(2),
            "users merged"
        );
        // The last block is thinking: the breakpoint moves to... nothing earlier in that message.
        assert!(req.breakpoints.is_empty());
        assert_eq!(
            req.body,
            r#"{"model":"claude-sonnet-4-5","max_tokens":100,"stream":true,"thinking":{"type":"enabled","budget_tokens":1024},"tools":[],"system":[{"type":"text","text":"sys","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s"}]}]}"#
        );
    }

    #[test]
    fn at_most_four_breakpoints_and_the_last_block_always_gets_one() {
        let messages: Vec<Message> = (0..6)
            .map(|i| Message::user(vec![Block::text(&i.to_string())]))
            .collect();
        let anchors = (0..5)
            .map(|m| BlockPos {
                message: m,
                block: 0,
            })
            .collect();
        let conv = Conversation {
            messages: messages.clone(),
            anchors,
        };
        let req = serialize(&params(), &conv, true);
        assert_eq!(req.breakpoints.len(), MAX_BREAKPOINTS);
        assert!(!req.system_breakpoint, "the system prompt yields its slot");
        assert!(req.breakpoints.contains(&BlockPos {
            message: 5,
            block: 0
        }));
        assert_eq!(req.body.matches("cache_control").count(), MAX_BREAKPOINTS);

        // With a slot free, the system prompt takes it.
        let req = serialize(&params(), &Conversation::plain(messages), true);
        assert!(req.system_breakpoint);
        assert_eq!(req.body.matches("cache_control").count(), 2);
    }

    #[test]
    fn tool_runs_count_as_one_lookback_position() {
        let input =
            crate::json::RawJson::parse("{}").unwrap_or_else(|_| crate::json::RawJson::encode(&()));
        let uses: Vec<Block> = (0..30)
            .filter_map(|i| Block::tool_use(&format!("t{i}"), "Read", &input).ok())
            .collect();
        let results: Vec<Block> = (0..30)
            .map(|i| Block::tool_result(&format!("t{i}"), "r", false))
            .collect();
        let messages = vec![
            Message::user(vec![Block::text("a")]),
            Message::assistant(uses),
            Message::user(results),
            Message::user((0..5).map(|i| Block::text(&i.to_string())).collect()),
        ];
        let from = BlockPos {
            message: 0,
            block: 0,
        };
        let to = BlockPos {
            message: 3,
            block: 4,
        };
        assert_eq!(positions_between(&messages, from, to), 2 + 5);
    }
}
