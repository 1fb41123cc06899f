//! Folding chat-completions chunks into Messages API events.

use serde_json::json;

use super::*;
use crate::Accumulator;

fn fold(chunks: &[serde_json::Value]) -> Result<Draft, ProviderError> {
    let mut draft = Draft::default();
    for c in chunks {
        draft.push(&c.to_string())?;
    }
    draft.push("[DONE]")?;
    Ok(draft)
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
    let draft = fold(&[
        chunk(json!({"role": "assistant", "content": ""}), None),
        chunk(json!({"content": "Hel"}), None),
        chunk(json!({"content": "lo"}), None),
        chunk(json!({}), Some("stop")),
        usage_chunk(1200, 1024, 7),
    ])?;
    assert!(draft.complete());
    let mut acc = Accumulator::default();
    for ev in draft.into_events() {
        acc.push(&ev)?;
    }
    let done = acc.finish()?;
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
    let draft = fold(&[
        chunk(json!({"reasoning_content": "think"}), None),
        chunk(json!({"content": "Reading."}), None),
        chunk(call(0, Some("call_a"), Some("Read"), ""), None),
        chunk(call(0, None, None, "{\"file_path\":"), None),
        chunk(call(0, None, None, "\"a.rs\"}"), None),
        chunk(call(1, Some("call_b"), Some("Glob"), "{}"), None),
        chunk(json!({}), Some("tool_calls")),
        usage_chunk(10, 0, 5),
    ])?;
    let mut acc = Accumulator::default();
    for ev in draft.into_events() {
        acc.push(&ev)?;
    }
    let done = acc.finish()?;
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
    let draft = fold(&[
        chunk(
            json!({"tool_calls": [{"function": {"name": "Read", "arguments": "{}"}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"id": "x", "function": {"name": "Glob", "arguments": "{}"}}]}),
            Some("stop"),
        ),
    ])?;
    let events = draft.into_events();
    let starts: Vec<&StreamEvent> = events
        .iter()
        .filter(|e| matches!(e, StreamEvent::BlockStart { .. }))
        .collect();
    assert_eq!(starts.len(), 2);
    assert!(matches!(
        events.iter().rev().nth(1),
        Some(StreamEvent::MessageDelta { stop_reason: Some(r), .. }) if r == "tool_use"
    ));
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
    assert!(!draft.complete());
    assert!(
        draft
            .push(&chunk(json!({}), Some("stop")).to_string())
            .is_ok()
    );
    assert!(!draft.complete(), "usage still to come");
    assert!(draft.push(&usage_chunk(1, 0, 1).to_string()).is_ok());
    assert!(draft.complete());

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
