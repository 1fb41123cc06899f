//! The Messages-to-chat-completions conversion, case by case.

use serde_json::{Value, json};

use super::*;

fn converted(body: &Value, options: &Options) -> Value {
    match convert(&body.to_string(), options) {
        Ok(out) => serde_json::from_str(&out).unwrap_or(Value::Null),
        Err(e) => panic!("{body}: {e}"),
    }
}

#[test]
fn a_tool_conversation_converts_message_by_message() {
    let body = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 512,
        "stream": true,
        "tools": [{"name": "Read", "description": "Read a file",
                   "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
        "system": [{"type": "text", "text": "You are terse."},
                   {"type": "text", "text": "Context.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "Read a.rs"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm", "signature": "s"},
                {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "a.rs"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "fn main() {}"},
                {"type": "text", "text": "Placeholder."},
                {"type": "text", "text": "Now summarise."}
            ]},
            {"role": "assistant", "content": [{"type": "text", "text": "It is empty."}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
                 "content": [{"type": "text", "text": "denied"}]}
            ]}
        ]
    });
    let expected = json!({
        "model": "claude-sonnet-4-5",
        "messages": [
            {"role": "system", "content": "You are terse.\n\nContext."},
            {"role": "user", "content": "Read a.rs"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "toolu_1", "type": "function",
                 "function": {"name": "Read", "arguments": "{\"file_path\":\"a.rs\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "fn main() {}"},
            {"role": "user", "content": "Placeholder.\n\nNow summarise."},
            {"role": "assistant", "content": "It is empty."},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: denied"}
        ],
        "tools": [{"type": "function", "function": {
            "name": "Read", "description": "Read a file", "parameters": {"type": "object"}}}],
        "max_tokens": 512,
        "stream": true,
        "stream_options": {"include_usage": true}
    });
    assert_eq!(converted(&body, &Options::default()), expected);
}

#[test]
fn options_and_sampling_fields() {
    let body = json!({
        "model": "claude-sonnet-4-5", "max_tokens": 8, "temperature": 0.5, "top_p": 0.9,
        "stop_sequences": ["END"], "tool_choice": {"type": "tool", "name": "Read",
        "disable_parallel_tool_use": true},
        "system": "sys",
        "messages": [{"role": "user", "content": "hi"}]
    });
    let options = Options {
        model: Some("qwen2.5".into()),
        prompt_cache_key: true,
    };
    let out = converted(&body, &options);
    assert_eq!(out["model"], "qwen2.5");
    assert_eq!(out["temperature"], 0.5);
    assert_eq!(out["top_p"], 0.9);
    assert_eq!(out["stop"], json!(["END"]));
    assert_eq!(
        out["tool_choice"],
        json!({"type": "function", "function": {"name": "Read"}})
    );
    assert_eq!(out["parallel_tool_calls"], false);
    assert_eq!(
        out["prompt_cache_key"],
        Value::from(prompt_cache_key(None, Some("\"sys\"")))
    );
    // (Anthropic tool_choice, chat-completions tool_choice)
    for (choice, mapped) in [("auto", "auto"), ("any", "required"), ("none", "none")] {
        let body = json!({"model": "m", "tool_choice": {"type": choice},
                          "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(converted(&body, &Options::default())["tool_choice"], mapped);
    }
}

#[test]
fn siblings_share_a_prompt_cache_key() {
    let body = |directive: &str| {
        json!({
            "model": "m", "max_tokens": 8,
            "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
            "system": [{"type": "text", "text": "shared"}],
            "messages": [{"role": "user", "content": directive}]
        })
    };
    let options = Options {
        model: None,
        prompt_cache_key: true,
    };
    let key = |b: &Value| converted(b, &options)["prompt_cache_key"].clone();
    assert_eq!(key(&body("one")), key(&body("two")));
    let mut other = body("one");
    other["system"][0]["text"] = Value::from("changed");
    assert_ne!(key(&body("one")), key(&other));
    assert_ne!(
        prompt_cache_key(Some("ab"), Some("c")),
        prompt_cache_key(Some("a"), Some("bc"))
    );
}

#[test]
fn unsupported_bodies_are_invalid_requests() {
    let cases = [
        json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "data": ""}}]}]}),
        json!({"model": "m", "tools": [{"type": "web_search_20250305", "name": "web_search"}],
               "messages": [{"role": "user", "content": "hi"}]}),
        json!({"model": "m", "messages": [{"role": "system", "content": "hi"}]}),
        json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "tool_result", "content": "no id"}]}]}),
        json!({"messages": []}),
    ];
    for body in cases {
        assert!(
            matches!(
                convert(&body.to_string(), &Options::default()),
                Err(ProviderError::InvalidRequest(_))
            ),
            "{body}"
        );
    }
}

#[test]
fn conversion_is_deterministic() {
    let body = json!({"model": "m", "system": "s", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}]}]})
    .to_string();
    let options = Options {
        model: None,
        prompt_cache_key: true,
    };
    assert_eq!(convert(&body, &options).ok(), convert(&body, &options).ok());
}
