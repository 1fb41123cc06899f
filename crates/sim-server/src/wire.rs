//! The Messages API's wire shapes: each [`StreamEvent`] as an SSE frame (`event: NAME` and its
//! `data:` JSON, as the real API writes them), and a finished response as one message object.

use forkd_provider::{BlockStart, Completion, StreamEvent};
use serde_json::{Value, json};

use crate::error::ApiError;

/// The `ping` frame the API sends after `message_start` (and during long waits).
pub(crate) const PING: &str = "event: ping\ndata: {\"type\": \"ping\"}\n\n";

fn frame(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

fn usage_json(usage: &forkd_core::Usage) -> Value {
    json!({
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
        "cache_read_input_tokens": usage.cache_read_input_tokens,
        "output_tokens": usage.output_tokens,
    })
}

/// One event as an SSE frame.
pub(crate) fn event_frame(event: &StreamEvent, model: &str) -> String {
    match event {
        StreamEvent::MessageStart { message_id, usage } => {
            let message = json!({
                "id": message_id, "type": "message", "role": "assistant", "model": model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": usage_json(usage),
            });
            frame(
                "message_start",
                &json!({"type": "message_start", "message": message}),
            )
        }
        StreamEvent::BlockStart { index, block } => {
            let content_block = match block {
                BlockStart::Text => json!({"type": "text", "text": ""}),
                BlockStart::Thinking => {
                    json!({"type": "thinking", "thinking": "", "signature": ""})
                }
                BlockStart::ToolUse { id, name } => {
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}})
                }
            };
            let data = json!({"type": "content_block_start", "index": index,
                              "content_block": content_block});
            frame("content_block_start", &data)
        }
        StreamEvent::TextDelta { index, text } => {
            delta(*index, json!({"type": "text_delta", "text": text}))
        }
        StreamEvent::ThinkingDelta { index, thinking } => delta(
            *index,
            json!({"type": "thinking_delta", "thinking": thinking}),
        ),
        StreamEvent::SignatureDelta { index, signature } => delta(
            *index,
            json!({"type": "signature_delta", "signature": signature}),
        ),
        StreamEvent::InputJsonDelta {
            index,
            partial_json,
        } => delta(
            *index,
            json!({"type": "input_json_delta", "partial_json": partial_json}),
        ),
        StreamEvent::BlockStop { index } => frame(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        ),
        StreamEvent::MessageDelta {
            stop_reason,
            output_tokens,
            usage,
        } => {
            // The API's current shape repeats the whole usage here; the older one only output.
            let usage = usage
                .as_ref()
                .map_or_else(|| json!({"output_tokens": output_tokens}), usage_json);
            frame(
                "message_delta",
                &json!({"type": "message_delta",
                        "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                        "usage": usage}),
            )
        }
        StreamEvent::MessageStop => frame("message_stop", &json!({"type": "message_stop"})),
        // Sent as the response's headers, not as an event.
        StreamEvent::RateLimits(_) => String::new(),
    }
}

fn delta(index: usize, delta: Value) -> String {
    frame(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": index, "delta": delta}),
    )
}

/// An error that ends a stream after it started.
pub(crate) fn error_frame(error: &ApiError) -> String {
    format!("event: error\ndata: {}\n\n", error.body())
}

/// A finished response as the non-streaming API returns it.
pub(crate) fn message(done: &Completion, model: &str) -> Value {
    // The blocks' stored bytes are valid JSON by construction; an empty array is the fallback
    // for what cannot happen.
    let content: Value = serde_json::from_str(&done.message.content_json())
        .unwrap_or_else(|_| Value::Array(Vec::new()));
    json!({
        "id": done.message_id, "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": done.stop_reason, "stop_sequence": null,
        "usage": usage_json(&done.usage),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_the_apis() {
        // (event, expected frame)
        let cases = [
            (
                StreamEvent::BlockStart {
                    index: 1,
                    block: BlockStart::ToolUse {
                        id: "toolu_1".into(),
                        name: "Read".into(),
                    },
                },
                "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"Read\",\"input\":{}}}\n\n",
            ),
            (
                StreamEvent::TextDelta {
                    index: 0,
                    text: "hi".into(),
                },
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n",
            ),
            (
                StreamEvent::MessageDelta {
                    stop_reason: Some("end_turn".into()),
                    output_tokens: 3,
                    usage: None,
                },
                "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":3}}\n\n",
            ),
            (
                StreamEvent::MessageDelta {
                    stop_reason: Some("end_turn".into()),
                    output_tokens: 3,
                    usage: Some(forkd_core::Usage {
                        input_tokens: 1,
                        cache_creation_input_tokens: 2,
                        cache_read_input_tokens: 4,
                        output_tokens: 3,
                    }),
                },
                "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"input_tokens\":1,\"cache_creation_input_tokens\":2,\"cache_read_input_tokens\":4,\"output_tokens\":3}}\n\n",
            ),
            (
                StreamEvent::MessageStop,
                "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
            ),
        ];
        for (event, expected) in cases {
            assert_eq!(event_frame(&event, "m"), expected);
        }
        let overloaded = ApiError::new(529, "Overloaded");
        assert_eq!(
            error_frame(&overloaded),
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
        );
    }
}
