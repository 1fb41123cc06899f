//! Reading the Messages API's SSE stream into [`StreamEvent`]s.
//!
//! Events are told apart by their data's `type` field (the `event:` line says the same, but a
//! proxy may drop it). `ping` and event types this build does not know are skipped; an `error`
//! event becomes the error its type stands for.

use std::pin::Pin;

use eventsource_stream::{EventStreamError, Eventsource};
use forkd_core::Usage;
use futures::{Stream, StreamExt};
use serde::Deserialize;

use super::http::{status_of_error_type, transport_error};
use crate::{BlockStart, ProviderError, StreamEvent};

type Events = Pin<
    Box<
        dyn Stream<Item = Result<eventsource_stream::Event, EventStreamError<reqwest::Error>>>
            + Send,
    >,
>;

/// The events of one response body.
pub(crate) struct Reader {
    events: Events,
}

impl Reader {
    pub(crate) fn new(response: reqwest::Response) -> Self {
        Self {
            events: Box::pin(response.bytes_stream().eventsource()),
        }
    }

    /// The next event of the response; `Ok(None)` when the body ended.
    pub(crate) async fn next(&mut self) -> Result<Option<StreamEvent>, ProviderError> {
        while let Some(item) = self.events.next().await {
            let event = item.map_err(|e| match e {
                EventStreamError::Transport(e) => transport_error(&e),
                other => ProviderError::Stream(format!("malformed event stream: {other}")),
            })?;
            if let Some(ev) = parse(&event.data)? {
                return Ok(Some(ev));
            }
        }
        Ok(None)
    }
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Wire {
    MessageStart {
        message: WireMessage,
    },
    ContentBlockStart {
        index: usize,
        content_block: WireBlock,
    },
    ContentBlockDelta {
        index: usize,
        delta: WireDelta,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: WireStop,
        #[serde(default)]
        usage: Option<WireOutput>,
    },
    MessageStop,
    Error {
        error: WireError,
    },
    /// `ping`, and any event type added to the API after this was written.
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct WireMessage {
    id: String,
    usage: WireUsage,
}

/// The cache fields are absent (or null) on models and accounts without prompt caching.
#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlock {
    Text,
    Thinking,
    ToolUse {
        id: String,
        name: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireDelta {
    TextDelta {
        text: String,
    },
    ThinkingDelta {
        thinking: String,
    },
    SignatureDelta {
        signature: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    /// `citations_delta` and later additions: they annotate a block without changing its text.
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct WireStop {
    #[serde(default)]
    stop_reason: Option<String>,
}

/// `message_delta`'s usage: output tokens, and (in the API's current shape) the whole usage
/// again, cumulative.
#[derive(Deserialize)]
struct WireOutput {
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

impl WireOutput {
    /// The whole usage, when the event carries its input side.
    fn whole(&self) -> Option<Usage> {
        Some(Usage {
            input_tokens: self.input_tokens?,
            cache_creation_input_tokens: self.cache_creation_input_tokens.unwrap_or(0),
            cache_read_input_tokens: self.cache_read_input_tokens.unwrap_or(0),
            output_tokens: self.output_tokens.unwrap_or(0),
        })
    }
}

#[derive(Deserialize)]
struct WireError {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    message: String,
}

/// One event's data as a [`StreamEvent`]; `None` for events to skip.
pub(crate) fn parse(data: &str) -> Result<Option<StreamEvent>, ProviderError> {
    let wire: Wire = serde_json::from_str(data)
        .map_err(|e| ProviderError::Stream(format!("malformed event {data:?}: {e}")))?;
    Ok(Some(match wire {
        Wire::MessageStart { message } => StreamEvent::MessageStart {
            message_id: message.id,
            usage: Usage {
                input_tokens: message.usage.input_tokens.unwrap_or(0),
                cache_creation_input_tokens: message.usage.cache_creation_input_tokens.unwrap_or(0),
                cache_read_input_tokens: message.usage.cache_read_input_tokens.unwrap_or(0),
                output_tokens: 0,
            },
        },
        Wire::ContentBlockStart {
            index,
            content_block,
        } => StreamEvent::BlockStart {
            index,
            block: block_start(index, content_block, data)?,
        },
        Wire::ContentBlockDelta { index, delta } => match block_delta(index, delta) {
            Some(event) => event,
            None => return Ok(None),
        },
        Wire::ContentBlockStop { index } => StreamEvent::BlockStop { index },
        Wire::MessageDelta { delta, usage } => StreamEvent::MessageDelta {
            stop_reason: delta.stop_reason,
            output_tokens: usage.as_ref().and_then(|u| u.output_tokens).unwrap_or(0),
            usage: usage.as_ref().and_then(WireOutput::whole),
        },
        Wire::MessageStop => StreamEvent::MessageStop,
        Wire::Error { error } => {
            return Err(ProviderError::Status {
                status: status_of_error_type(&error.kind),
                message: error.message,
                retry_after: None,
            });
        }
        Wire::Other => return Ok(None),
    }))
}

fn block_start(index: usize, block: WireBlock, data: &str) -> Result<BlockStart, ProviderError> {
    match block {
        WireBlock::Text => Ok(BlockStart::Text),
        WireBlock::Thinking => Ok(BlockStart::Thinking),
        WireBlock::ToolUse { id, name } => Ok(BlockStart::ToolUse { id, name }),
        // forkd cannot keep a block it has no kind for (redacted thinking, server tool results),
        // and dropping it would corrupt the conversation it is sent back in.
        WireBlock::Other => Err(ProviderError::Stream(format!(
            "content block {index} is of a kind forkd does not support: {data}"
        ))),
    }
}

fn block_delta(index: usize, delta: WireDelta) -> Option<StreamEvent> {
    Some(match delta {
        WireDelta::TextDelta { text } => StreamEvent::TextDelta { index, text },
        WireDelta::ThinkingDelta { thinking } => StreamEvent::ThinkingDelta { index, thinking },
        WireDelta::SignatureDelta { signature } => StreamEvent::SignatureDelta { index, signature },
        WireDelta::InputJsonDelta { partial_json } => StreamEvent::InputJsonDelta {
            index,
            partial_json,
        },
        WireDelta::Other => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_of_the_messages_stream() {
        let usage = |i, w, r| Usage {
            input_tokens: i,
            cache_creation_input_tokens: w,
            cache_read_input_tokens: r,
            output_tokens: 0,
        };
        let start = |u| StreamEvent::MessageStart {
            message_id: "msg_1".into(),
            usage: u,
        };
        // (event data, expected event; None when skipped)
        let cases = [
            (
                r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":3,"cache_creation_input_tokens":5,"cache_read_input_tokens":7,"output_tokens":1}}}"#,
                Some(start(usage(3, 5, 7))),
            ),
            (
                r#"{"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":3,"cache_creation_input_tokens":null,"output_tokens":1}}}"#,
                Some(start(usage(3, 0, 0))),
            ),
            (
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
                Some(StreamEvent::BlockStart {
                    index: 0,
                    block: BlockStart::Text,
                }),
            ),
            (
                r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"Read","input":{}}}"#,
                Some(StreamEvent::BlockStart {
                    index: 1,
                    block: BlockStart::ToolUse {
                        id: "toolu_1".into(),
                        name: "Read".into(),
                    },
                }),
            ),
            (
                r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\""}}"#,
                Some(StreamEvent::InputJsonDelta {
                    index: 1,
                    partial_json: "{\"a\"".into(),
                }),
            ),
            (
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"sig"}}"#,
                Some(StreamEvent::SignatureDelta {
                    index: 0,
                    signature: "sig".into(),
                }),
            ),
            (
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}"#,
                Some(StreamEvent::MessageDelta {
                    stop_reason: Some("end_turn".into()),
                    output_tokens: 15,
                    usage: None,
                }),
            ),
            (
                r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"input_tokens":3,"cache_creation_input_tokens":null,"cache_read_input_tokens":7,"output_tokens":15}}"#,
                Some(StreamEvent::MessageDelta {
                    stop_reason: Some("tool_use".into()),
                    output_tokens: 15,
                    usage: Some(Usage {
                        output_tokens: 15,
                        ..usage(3, 0, 7)
                    }),
                }),
            ),
            (r#"{"type":"message_stop"}"#, Some(StreamEvent::MessageStop)),
            (r#"{"type": "ping"}"#, None),
            (r#"{"type":"some_future_event","x":1}"#, None),
            (
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"citations_delta","citation":{}}}"#,
                None,
            ),
        ];
        for (data, expected) in cases {
            assert_eq!(parse(data), Ok(expected), "{data}");
        }
    }

    #[test]
    fn errors_in_the_stream() {
        let overloaded =
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert!(matches!(
            parse(overloaded),
            Err(ProviderError::Status { status: 529, ref message, .. }) if message == "Overloaded"
        ));
        let redacted = r#"{"type":"content_block_start","index":0,"content_block":{"type":"redacted_thinking","data":"x"}}"#;
        assert!(matches!(parse(redacted), Err(ProviderError::Stream(_))));
        assert!(matches!(parse("{not json"), Err(ProviderError::Stream(_))));
    }
}
