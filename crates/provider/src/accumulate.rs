//! Folding a stream of [`StreamEvent`]s into the finished assistant message and its usage.

use std::collections::BTreeMap;

use forkd_core::{Block, Message, RawJson, Usage};

use crate::{BlockStart, ProviderError, StreamEvent};

/// A finished response.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The assistant message, its blocks in index order.
    pub message: Message,
    /// The usage `message_delta` reported whole when it did; else the input side from
    /// `message_start` and `output_tokens` from `message_delta`.
    pub usage: Usage,
    pub stop_reason: Option<String>,
    pub message_id: String,
}

/// A content block while its deltas arrive.
#[derive(Debug)]
enum Partial {
    Text(String),
    Thinking {
        thinking: String,
        signature: String,
    },
    ToolUse {
        id: String,
        name: String,
        json: String,
    },
}

#[derive(Debug)]
struct Slot {
    partial: Partial,
    stopped: bool,
}

/// Consumes a response's events in order; [`Accumulator::finish`] yields the [`Completion`].
#[derive(Debug, Default)]
pub struct Accumulator {
    message_id: Option<String>,
    usage: Usage,
    stop_reason: Option<String>,
    blocks: BTreeMap<usize, Slot>,
    stopped: bool,
}

fn broken(what: impl Into<String>) -> ProviderError {
    ProviderError::Stream(what.into())
}

impl Accumulator {
    /// Applies one event. Events that do not fit what came before (a delta for a block that never
    /// started, a second `message_start`, anything after `message_stop`) are stream errors.
    pub fn push(&mut self, ev: &StreamEvent) -> Result<(), ProviderError> {
        if self.stopped {
            return Err(broken("event after message_stop"));
        }
        if self.message_id.is_none()
            && !matches!(
                ev,
                StreamEvent::MessageStart { .. } | StreamEvent::RateLimits(_)
            )
        {
            return Err(broken("event before message_start"));
        }
        match ev {
            StreamEvent::MessageStart { message_id, usage } => {
                if self.message_id.is_some() {
                    return Err(broken("second message_start"));
                }
                self.message_id = Some(message_id.clone());
                self.usage = Usage {
                    output_tokens: 0,
                    ..*usage
                };
            }
            StreamEvent::BlockStart { index, block } => {
                if self.blocks.contains_key(index) {
                    return Err(broken(format!("block {index} started twice")));
                }
                let partial = match block {
                    BlockStart::Text => Partial::Text(String::new()),
                    BlockStart::Thinking => Partial::Thinking {
                        thinking: String::new(),
                        signature: String::new(),
                    },
                    BlockStart::ToolUse { id, name } => Partial::ToolUse {
                        id: id.clone(),
                        name: name.clone(),
                        json: String::new(),
                    },
                };
                self.blocks.insert(
                    *index,
                    Slot {
                        partial,
                        stopped: false,
                    },
                );
            }
            StreamEvent::TextDelta { index, text } => match self.open(*index)? {
                Partial::Text(buf) => buf.push_str(text),
                _ => return Err(mismatch(*index, "text_delta")),
            },
            StreamEvent::ThinkingDelta { index, thinking } => match self.open(*index)? {
                Partial::Thinking { thinking: buf, .. } => buf.push_str(thinking),
                _ => return Err(mismatch(*index, "thinking_delta")),
            },
            StreamEvent::SignatureDelta { index, signature } => match self.open(*index)? {
                Partial::Thinking { signature: buf, .. } => buf.push_str(signature),
                _ => return Err(mismatch(*index, "signature_delta")),
            },
            StreamEvent::InputJsonDelta {
                index,
                partial_json,
            } => match self.open(*index)? {
                Partial::ToolUse { json, .. } => json.push_str(partial_json),
                _ => return Err(mismatch(*index, "input_json_delta")),
            },
            StreamEvent::BlockStop { index } => {
                self.open(*index)?;
                if let Some(slot) = self.blocks.get_mut(index) {
                    slot.stopped = true;
                }
            }
            StreamEvent::MessageDelta {
                stop_reason,
                output_tokens,
                usage,
            } => {
                self.stop_reason = stop_reason.clone();
                match usage {
                    Some(usage) => self.usage = *usage,
                    None => self.usage.output_tokens = *output_tokens,
                }
            }
            StreamEvent::MessageStop => self.stopped = true,
            // The provider's, not the message's.
            StreamEvent::RateLimits(_) => {}
        }
        Ok(())
    }

    /// The block at `index`, if it started and has not stopped.
    fn open(&mut self, index: usize) -> Result<&mut Partial, ProviderError> {
        match self.blocks.get_mut(&index) {
            Some(slot) if !slot.stopped => Ok(&mut slot.partial),
            Some(_) => Err(broken(format!("event for block {index} after its stop"))),
            None => Err(broken(format!("event for unknown block {index}"))),
        }
    }

    /// The completed response; an error if the stream ended before `message_stop`.
    pub fn finish(self) -> Result<Completion, ProviderError> {
        if !self.stopped {
            return Err(broken("stream ended before message_stop"));
        }
        let message_id = self
            .message_id
            .ok_or_else(|| broken("stream had no message_start"))?;
        let blocks = self
            .blocks
            .into_values()
            .map(|slot| match slot.partial {
                Partial::Text(text) => Ok(Block::text(&text)),
                Partial::Thinking {
                    thinking,
                    signature,
                } => Ok(Block::thinking(&thinking, &signature)),
                Partial::ToolUse { id, name, json } => {
                    // A tool called without arguments may stream no input at all.
                    let json = if json.trim().is_empty() { "{}" } else { &json };
                    let input = RawJson::parse(json)
                        .map_err(|e| broken(format!("tool_use {id}: input: {e}")))?;
                    Block::tool_use(&id, &name, &input)
                        .map_err(|e| broken(format!("tool_use {id}: {e}")))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Completion {
            message: Message::assistant(blocks),
            usage: self.usage,
            stop_reason: self.stop_reason,
            message_id,
        })
    }
}

fn mismatch(index: usize, what: &str) -> ProviderError {
    broken(format!("{what} for block {index} of another kind"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage() -> Usage {
        Usage {
            input_tokens: 5,
            cache_creation_input_tokens: 7,
            cache_read_input_tokens: 11,
            output_tokens: 0,
        }
    }

    fn run(events: &[StreamEvent]) -> Result<Completion, ProviderError> {
        let mut acc = Accumulator::default();
        for ev in events {
            acc.push(ev)?;
        }
        acc.finish()
    }

    fn full() -> Vec<StreamEvent> {
        use StreamEvent::*;
        vec![
            MessageStart {
                message_id: "msg_1".into(),
                usage: usage(),
            },
            BlockStart {
                index: 0,
                block: crate::BlockStart::Thinking,
            },
            ThinkingDelta {
                index: 0,
                thinking: "hm".into(),
            },
            SignatureDelta {
                index: 0,
                signature: "sig".into(),
            },
            BlockStop { index: 0 },
            BlockStart {
                index: 1,
                block: crate::BlockStart::Text,
            },
            TextDelta {
                index: 1,
                text: "a".into(),
            },
            TextDelta {
                index: 1,
                text: "b".into(),
            },
            BlockStop { index: 1 },
            BlockStart {
                index: 2,
                block: crate::BlockStart::ToolUse {
                    id: "t1".into(),
                    name: "Read".into(),
                },
            },
            InputJsonDelta {
                index: 2,
                partial_json: r#"{"file_path""#.into(),
            },
            InputJsonDelta {
                index: 2,
                partial_json: r#": "a.rs"}"#.into(),
            },
            BlockStop { index: 2 },
            BlockStart {
                index: 3,
                block: crate::BlockStart::ToolUse {
                    id: "t2".into(),
                    name: "Glob".into(),
                },
            },
            BlockStop { index: 3 },
            MessageDelta {
                stop_reason: Some("tool_use".into()),
                output_tokens: 42,
                usage: None,
            },
            MessageStop,
        ]
    }

    #[test]
    fn round_trip_builds_blocks_and_usage() -> Result<(), Box<dyn std::error::Error>> {
        let done = run(&full())?;
        let expected = Message::assistant(vec![
            Block::thinking("hm", "sig"),
            Block::text("ab"),
            Block::parse(
                r#"{"type":"tool_use","id":"t1","name":"Read","input":{"file_path":"a.rs"}}"#,
            )?,
            Block::parse(r#"{"type":"tool_use","id":"t2","name":"Glob","input":{}}"#)?,
        ]);
        assert_eq!(done.message, expected);
        assert_eq!(done.message_id, "msg_1");
        assert_eq!(done.stop_reason.as_deref(), Some("tool_use"));
        assert_eq!(
            done.usage,
            Usage {
                output_tokens: 42,
                ..usage()
            }
        );
        Ok(())
    }

    /// The stated limits come first, before `message_start`: they are the provider's, not the
    /// message's, and change nothing in it.
    #[test]
    fn the_limits_before_message_start_are_not_part_of_the_message() -> Result<(), ProviderError> {
        let mut events = vec![StreamEvent::RateLimits(crate::RateLimits::default())];
        events.extend(full());
        assert_eq!(run(&events)?, run(&full())?);
        Ok(())
    }

    #[test]
    fn usage_in_message_delta_supersedes_message_start() -> Result<(), ProviderError> {
        let mut events = full();
        let end = Usage {
            input_tokens: 176,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 1024,
            output_tokens: 9,
        };
        let n = events.len();
        events[n - 2] = StreamEvent::MessageDelta {
            stop_reason: Some("tool_use".into()),
            output_tokens: 9,
            usage: Some(end),
        };
        assert_eq!(run(&events)?.usage, end);
        Ok(())
    }

    #[test]
    fn malformed_streams_are_stream_errors() {
        let ev = full();
        // (description, events)
        let cases: Vec<(&str, Vec<StreamEvent>)> = vec![
            ("truncated", ev[..ev.len() - 1].to_vec()),
            ("no message_start", ev[1..].to_vec()),
            (
                "unknown index",
                [
                    &ev[..1],
                    &[StreamEvent::TextDelta {
                        index: 9,
                        text: "x".into(),
                    }],
                ]
                .concat(),
            ),
            (
                "wrong kind",
                [
                    &ev[..2],
                    &[StreamEvent::TextDelta {
                        index: 0,
                        text: "x".into(),
                    }],
                ]
                .concat(),
            ),
            (
                "bad json",
                [
                    &ev[..10],
                    &[StreamEvent::InputJsonDelta {
                        index: 2,
                        partial_json: "{".into(),
                    }],
                    &ev[12..],
                ]
                .concat(),
            ),
            (
                "after stop",
                [&ev[..], &[StreamEvent::MessageStop]].concat(),
            ),
        ];
        for (name, events) in cases {
            assert!(
                matches!(run(&events), Err(ProviderError::Stream(_))),
                "{name}"
            );
        }
    }
}
