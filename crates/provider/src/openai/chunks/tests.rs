//! Folding chat-completions chunks into Messages API events.

use serde_json::json;

use super::*;
use crate::Accumulator;

/// All the events of the chunks, then `[DONE]`.
fn fold(chunks: &[serde_json::Value]) -> Result<Vec<StreamEvent>, ProviderError> {
    let mut draft = Draft::default();
    let mut events = Vec::new();
    for c in chunks {
        events.extend(draft.push(&c.to_string())?);
    }
    events.extend(draft.push("[DONE]")?);
    assert!(draft.finished());
    Ok(events)
}

fn complete(events: &[StreamEvent]) -> Result<crate::Completion, ProviderError> {
    let mut acc = Accumulator::default();
    for ev in events {
        acc.push(ev)?;
    }
    acc.finish()
}

fn chunk(delta: serde_json::Value, finish: Option<&str>) -> serde_json::Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

fn usage_chunk(prompt: u64, cached: u64, completion: u64) -> serde_json::Value {
    json!({"id": "chatcmpl-1", "choices": [], "usage": {
        "prompt_tokens": prompt, "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached}}})
}

#[test]
fn text_and_usage_with_cached_tokens() -> Result<(), ProviderError> {
    let events = fold(&[
        chunk(json!({"role": "assistant", "content": ""}), None),
        chunk(json!({"content": "Hel"}), None),
        chunk(json!({"content": "lo"}), None),
        chunk(json!({}), Some("stop")),
        usage_chunk(1200, 1024, 7),
    ])?;
    let done = complete(&events)?;
    assert_eq!(done.message.text(), "Hello");
    assert_eq!(done.message_id, "chatcmpl-1");
    assert_eq!(done.stop_reason.as_deref(), Some("end_turn"));
    assert_eq!(
        done.usage,
        Usage {
            input_tokens: 176,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 1024,
            output_tokens: 7,
        }
    );
    Ok(())
}

#[test]
fn tool_call_deltas_become_tool_use_blocks() -> Result<(), ProviderError> {
    let call = |index: usize, id: Option<&str>, name: Option<&str>, args: &str| {
        json!({"tool_calls": [{"index": index, "id": id, "type": "function",
               "function": {"name": name, "arguments": args}}]})
    };
    let events = fold(&[
        chunk(json!({"reasoning_content": "think"}), None),
        chunk(json!({"content": "Reading."}), None),
        chunk(call(0, Some("call_a"), Some("Read"), ""), None),
        chunk(call(0, None, None, "{\"file_path\":"), None),
        chunk(call(0, None, None, "\"a.rs\"}"), None),
        chunk(call(1, Some("call_b"), Some("Glob"), "{}"), None),
        chunk(json!({}), Some("tool_calls")),
        usage_chunk(10, 0, 5),
    ])?;
    let done = complete(&events)?;
    let tools: Vec<(String, String)> = done
        .message
        .tool_uses()
        .map(|(id, name, _)| (id.to_owned(), name.to_owned()))
        .collect();
    assert_eq!(
        tools,
        [
            ("call_a".into(), "Read".into()),
            ("call_b".into(), "Glob".into())
        ]
    );
    assert_eq!(done.message.blocks.len(), 4, "thinking, text, two tools");
    assert_eq!(
        done.message.blocks[2].tool_input(),
        Some(json!({"file_path": "a.rs"}))
    );
    assert_eq!(done.stop_reason.as_deref(), Some("tool_use"));
    Ok(())
}

#[test]
fn calls_without_index_or_id() -> Result<(), ProviderError> {
    let events = fold(&[
        chunk(
            json!({"tool_calls": [{"function": {"name": "Read", "arguments": "{}"}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"id": "x", "function": {"name": "Glob", "arguments": "{}"}}]}),
            Some("stop"),
        ),
    ])?;
    let starts: Vec<&StreamEvent> = events
        .iter()
        .filter(|e| matches!(e, StreamEvent::BlockStart { .. }))
        .collect();
    assert_eq!(starts.len(), 2);
    assert!(matches!(
        events.iter().rev().nth(1),
        Some(StreamEvent::MessageDelta { stop_reason: Some(r), usage: None, .. }) if r == "tool_use"
    ));
    let done = complete(&events)?;
    let ids: Vec<&str> = done.message.tool_uses().map(|(id, _, _)| id).collect();
    assert_eq!(ids, ["call_chatcmpl-1_0", "x"]);
    assert_eq!(done.usage, Usage::default(), "no usage reported");
    Ok(())
}

#[test]
fn finish_reasons_map_to_stop_reasons() {
    // (finish_reason, whether tool calls came, stop_reason)
    let cases = [
        (Some("stop"), false, "end_turn"),
        (Some("tool_calls"), true, "tool_use"),
        (Some("stop"), true, "tool_use"),
        (Some("length"), false, "max_tokens"),
        (Some("content_filter"), false, "refusal"),
        (None, false, "end_turn"),
    ];
    for (finish, tools, expected) in cases {
        assert_eq!(stop_reason(finish, tools), expected, "{finish:?}");
    }
}

#[test]
fn completeness_and_errors() {
    let mut draft = Draft::default();
    assert!(!draft.finished());
    let stop = draft.push(&chunk(json!({}), Some("stop")).to_string());
    assert!(matches!(
        stop.as_deref(),
        Ok([StreamEvent::MessageStart { .. }])
    ));
    assert!(!draft.finished(), "usage still to come");
    let usage = draft.push(&usage_chunk(1, 0, 1).to_string());
    assert!(matches!(
        usage.as_deref(),
        Ok([StreamEvent::MessageDelta { .. }, StreamEvent::MessageStop])
    ));
    assert!(draft.finished());
    assert_eq!(draft.push("[DONE]"), Ok(vec![]), "nothing after the stop");

    let error = json!({"error": {"message": "context too long", "code": 400}}).to_string();
    assert!(matches!(
        Draft::default().push(&error),
        Err(ProviderError::Status { status: 400, ref message, .. }) if message == "context too long"
    ));
    assert!(matches!(
        Draft::default().push("{oops"),
        Err(ProviderError::Stream(_))
    ));
}

/// The events each chunk gives, chunk by chunk: nothing waits for the end but what must.
#[test]
fn events_come_as_their_chunks_do() -> Result<(), ProviderError> {
    use StreamEvent::*;
    let call = |index: usize, id: Option<&str>, name: Option<&str>, args: &str| {
        json!({"tool_calls": [{"index": index, "id": id, "type": "function",
               "function": {"name": name, "arguments": args}}]})
    };
    let tool = |id: &str, name: &str| crate::BlockStart::ToolUse {
        id: id.into(),
        name: name.into(),
    };
    let json = |index: usize, s: &str| InputJsonDelta {
        index,
        partial_json: s.into(),
    };
    let end = Usage {
        input_tokens: 1176,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: 1024,
        output_tokens: 30,
    };
    // (chunk, the events it gives)
    let steps: Vec<(serde_json::Value, Vec<StreamEvent>)> = vec![
        (
            chunk(json!({"role": "assistant", "content": ""}), None),
            vec![MessageStart {
                message_id: "chatcmpl-1".into(),
                usage: Usage::default(),
            }],
        ),
        (
            chunk(json!({"reasoning_content": "hm"}), None),
            vec![
                BlockStart {
                    index: 0,
                    block: crate::BlockStart::Thinking,
                },
                ThinkingDelta {
                    index: 0,
                    thinking: "hm".into(),
                },
            ],
        ),
        // Whitespace between reasoning and answer opens no block; it leads the text.
        (chunk(json!({"content": "\n\n"}), None), vec![]),
        (
            chunk(json!({"content": "Reading"}), None),
            vec![
                BlockStop { index: 0 },
                BlockStart {
                    index: 1,
                    block: crate::BlockStart::Text,
                },
                TextDelta {
                    index: 1,
                    text: "\n\nReading".into(),
                },
            ],
        ),
        (
            chunk(json!({"content": "."}), None),
            vec![TextDelta {
                index: 1,
                text: ".".into(),
            }],
        ),
        // A call's block starts with its arguments, so that its name is whole.
        (
            chunk(call(0, Some("call_a"), Some("Re"), ""), None),
            vec![BlockStop { index: 1 }],
        ),
        (chunk(call(0, None, Some("ad"), ""), None), vec![]),
        (
            chunk(call(0, None, None, "{\"file_path\":"), None),
            vec![
                BlockStart {
                    index: 2,
                    block: tool("call_a", "Read"),
                },
                json(2, "{\"file_path\":"),
            ],
        ),
        (
            chunk(call(0, None, None, "\"a.rs\"}"), None),
            vec![json(2, "\"a.rs\"}")],
        ),
        (
            chunk(call(1, Some("call_b"), Some("Glob"), "{}"), None),
            vec![
                BlockStop { index: 2 },
                BlockStart {
                    index: 3,
                    block: tool("call_b", "Glob"),
                },
                json(3, "{}"),
            ],
        ),
        (chunk(json!({"content": "\n"}), None), vec![]),
        (chunk(json!({}), Some("tool_calls")), vec![]),
        (
            usage_chunk(2200, 1024, 30),
            vec![
                BlockStop { index: 3 },
                MessageDelta {
                    stop_reason: Some("tool_use".into()),
                    output_tokens: 30,
                    usage: Some(end),
                },
                MessageStop,
            ],
        ),
    ];
    let mut draft = Draft::default();
    let mut all = Vec::new();
    for (n, (data, expected)) in steps.into_iter().enumerate() {
        let got = draft.push(&data.to_string())?;
        assert_eq!(got, expected, "chunk {n}: {data}");
        all.extend(got);
    }
    assert!(draft.finished());
    let done = complete(&all)?;
    assert_eq!(done.usage, end, "the usage of the last chunk");
    assert_eq!(done.message.text(), "\n\nReading.");
    assert_eq!(done.message.blocks.len(), 4);
    Ok(())
}

#[test]
fn the_body_ending_early() -> Result<(), ProviderError> {
    // Cut before any finish reason: the response is incomplete.
    let mut draft = Draft::default();
    draft.push(&chunk(json!({"content": "par"}), None).to_string())?;
    assert!(matches!(draft.end(), Err(ProviderError::Stream(_))));

    // Closed after the finish reason but without usage or `[DONE]`: complete, at zero usage.
    let mut draft = Draft::default();
    draft.push(&chunk(json!({"content": "whole"}), Some("length")).to_string())?;
    let closing = draft.end()?;
    assert_eq!(
        closing,
        [
            StreamEvent::BlockStop { index: 0 },
            StreamEvent::MessageDelta {
                stop_reason: Some("max_tokens".into()),
                output_tokens: 0,
                usage: None,
            },
            StreamEvent::MessageStop,
        ]
    );
    assert!(draft.finished());
    assert_eq!(draft.end(), Ok(vec![]));
    Ok(())
}

#[test]
fn a_call_that_resumes_after_another_block_is_an_error() -> Result<(), ProviderError> {
    let call = |index: usize, args: &str| {
        chunk(
            json!({"tool_calls": [{"index": index, "function": {"arguments": args}}]}),
            None,
        )
        .to_string()
    };
    let mut draft = Draft::default();
    draft.push(&call(0, "{"))?;
    draft.push(&call(1, "{}"))?;
    // An empty delta for the stopped call changes nothing; more arguments cannot be placed.
    assert_eq!(draft.push(&call(0, "")), Ok(vec![]));
    assert!(matches!(
        draft.push(&call(0, "}")),
        Err(ProviderError::Stream(_))
    ));
    Ok(())
}
