//! Reading the Messages API's SSE stream into [`StreamEvent`]s.
//!
//! Events are told apart by their data's `type` field (the `event:` line says the same, but a
//! proxy may drop it). `ping` and event types this build does not know are skipped; an `error`
//! event becomes the error its type stands for, whether its data is the API's
//! `{"type":"error","error":{…}}` or the bare `{"code","message","type"}` that llama.cpp's server
//! sends (or an OpenAI-shaped `{"error":{…}}`).

use std::pin::Pin;

use eventsource_stream::{EventStreamError, Eventsource};
use forkd_core::Usage;
use futures::{Stream, StreamExt};
use serde::Deserialize;

use super::http::{ApiError, status_of_error_type, transport_error};
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
    model: Option<String>,
}

impl Reader {
    pub(crate) fn new(response: reqwest::Response) -> Self {
        Self {
            events: Box::pin(response.bytes_stream().eventsource()),
            model: None,
        }
    }

    /// The model the response says answered (`message_start`'s `message.model`), once known.
    pub(crate) fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// The next event of the response; `Ok(None)` when the body ended.
    pub(crate) async fn next(&mut self) -> Result<Option<StreamEvent>, ProviderError> {
        while let Some(item) = self.events.next().await {
            let event = item.map_err(|e| match e {
                EventStreamError::Transport(e) => transport_error(&e),
                other => ProviderError::Stream(format!("malformed event stream: {other}")),
            })?;
            let parsed = parse_event(&event.event, &event.data)?;
            if parsed.model.is_some() {
                self.model = parsed.model;
            }
            if let Some(ev) = parsed.event {
                return Ok(Some(ev));
            }
        }
        Ok(None)
    }
}

/// One SSE event, read.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    /// `None` for events to skip.
    pub event: Option<StreamEvent>,
    /// The model `message_start` named.
    pub model: Option<String>,
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
    /// The model that answered: a local server names its own, whatever the request asked for.
    #[serde(default)]
    model: Option<String>,
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

/// The error an `error` event (or an error object where an event was expected) stands for: the
/// status its type names, else its numeric code, else 500.
fn stream_error(error: ApiError) -> ProviderError {
    let by_type = status_of_error_type(&error.kind);
    let by_code = error
        .code
        .as_deref()
        .and_then(|c| c.parse::<u16>().ok())
        .filter(|c| (400..600).contains(c));
    let status = match by_code {
        Some(code) if by_type == 500 => code,
        _ => by_type,
    };
    ProviderError::Status {
        status,
        message: error.describe(status),
        retry_after: None,
    }
}

/// One event's data as a [`StreamEvent`]; `None` for events to skip.
#[cfg(test)]
pub(crate) fn parse(data: &str) -> Result<Option<StreamEvent>, ProviderError> {
    parse_event("", data).map(|p| p.event)
}

/// One event, by its name (`event:`, possibly empty) and data.
pub(crate) fn parse_event(name: &str, data: &str) -> Result<Parsed, ProviderError> {
    let wire: Wire = match serde_json::from_str(data) {
        Ok(Wire::Other) if name == "error" => {
            // llama.cpp's server: `event: error` with the bare error object as data.
            return Err(stream_error(ApiError::parse(data).unwrap_or_else(|| {
                ApiError {
                    message: data.to_owned(),
                    kind: String::new(),
                    code: None,
                }
            })));
        }
        Ok(wire) => wire,
        Err(e) => {
            // `{"error":{…}}` without a `type`: an error, however the server framed it.
            return Err(match ApiError::parse(data) {
                Some(error) => stream_error(error),
                None => ProviderError::Stream(format!("malformed event {data:?}: {e}")),
            });
        }
    };
    let mut model = None;
    let event = match wire {
        Wire::MessageStart { message } => {
            model = message.model;
            StreamEvent::MessageStart {
                message_id: message.id,
                usage: Usage {
                    input_tokens: message.usage.input_tokens.unwrap_or(0),
                    cache_creation_input_tokens: message
                        .usage
                        .cache_creation_input_tokens
                        .unwrap_or(0),
                    cache_read_input_tokens: message.usage.cache_read_input_tokens.unwrap_or(0),
                    output_tokens: 0,
                },
            }
        }
        Wire::ContentBlockStart {
            index,
            content_block,
        } => StreamEvent::BlockStart {
            index,
            block: block_start(index, content_block, data)?,
        },
        Wire::ContentBlockDelta { index, delta } => match block_delta(index, delta) {
            Some(event) => event,
            None => return Ok(Parsed::default()),
        },
        Wire::ContentBlockStop { index } => StreamEvent::BlockStop { index },
        Wire::MessageDelta { delta, usage } => StreamEvent::MessageDelta {
            stop_reason: delta.stop_reason,
            output_tokens: usage.as_ref().and_then(|u| u.output_tokens).unwrap_or(0),
            usage: usage.as_ref().and_then(WireOutput::whole),
        },
        Wire::MessageStop => StreamEvent::MessageStop,
        Wire::Error { error } => {
            return Err(stream_error(ApiError {
                message: error.message,
                kind: error.kind,
                code: None,
            }));
        }
        Wire::Other => return Ok(Parsed::default()),
    };
    Ok(Parsed {
        event: Some(event),
        model,
    })
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
        // llama.cpp's server: its own model name, no cache_creation_input_tokens at all.
        let local = r#"{"type":"message_start","message":{"id":"chatcmpl-1","type":"message","role":"assistant","content":[],"model":"gemma-3-270m","stop_reason":null,"stop_sequence":null,"usage":{"cache_read_input_tokens":2905,"input_tokens":12,"output_tokens":0}}}"#;
        let parsed = parse_event("message_start", local).map(|p| (p.model, p.event));
        assert_eq!(
            parsed,
            Ok((
                Some("gemma-3-270m".into()),
                Some(StreamEvent::MessageStart {
                    message_id: "chatcmpl-1".into(),
                    usage: usage(12, 0, 2905),
                })
            ))
        );
    }

    #[test]
    fn errors_in_the_stream() {
        let overloaded =
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert!(matches!(
            parse(overloaded),
            Err(ProviderError::Status { status: 529, ref message, .. }) if message == "Overloaded (overloaded_error)"
        ));
        // llama.cpp's server: `event: error` with the bare error object.
        let bare = r#"{"code":500,"message":"slot unavailable","type":"server_error"}"#;
        assert_eq!(
            parse_event("error", bare).map(|p| p.event),
            Err(ProviderError::Status {
                status: 500,
                message: "slot unavailable (server_error)".into(),
                retry_after: None,
            })
        );
        let unavailable = r#"{"code":503,"message":"Loading model","type":"unavailable_error"}"#;
        assert!(matches!(
            parse_event("error", unavailable),
            Err(ProviderError::Status { status: 503, .. })
        ));
        // An OpenAI-shaped error object where an event was expected, with a numeric code.
        let openai = r#"{"error":{"message":"context overflow","code":400}}"#;
        assert_eq!(
            parse(openai),
            Err(ProviderError::Status {
                status: 400,
                message: "context overflow".into(),
                retry_after: None,
            })
        );
        // Not JSON at all in an error event.
        assert!(matches!(
            parse_event("error", "boom"),
            Err(ProviderError::Stream(_))
        ));
        let redacted = r#"{"type":"content_block_start","index":0,"content_block":{"type":"redacted_thinking","data":"x"}}"#;
        assert!(matches!(parse(redacted), Err(ProviderError::Stream(_))));
        assert!(matches!(parse("{not json"), Err(ProviderError::Stream(_))));
    }
}
