//! The real `OpenAiProvider` over HTTP on loopback, against wiremock playing an
//! OpenAI-compatible chat-completions server: the request it sends, the chunks it reads (text,
//! tool calls, cached-token usage), errors and retries.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use forkd_core::Usage;
use forkd_provider::{Completion, OpenAiConfig, OpenAiProvider, ProviderError, RetryPolicy};
use serde_json::{Value, json};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const LIMIT: Duration = Duration::from_secs(20);

fn provider(base: &str, max_retries: u32) -> OpenAiProvider {
    OpenAiProvider::new(OpenAiConfig {
        base_url: format!("{base}/v1"),
        api_key: Some("sk-test".into()),
        model: Some("qwen2.5-7b".into()),
        read_timeout: Duration::from_secs(10),
        retry: RetryPolicy {
            max_retries,
            backoff_base: Duration::from_millis(2),
            backoff_cap: Duration::from_millis(10),
            max_retry_after: Duration::from_secs(5),
        },
        ..OpenAiConfig::default()
    })
    .unwrap()
}

async fn bounded(provider: &OpenAiProvider, body: &str) -> Result<Completion, ProviderError> {
    tokio::time::timeout(LIMIT, run(provider, request(MODEL, body)))
        .await
        .expect("the request finished in time")
}

/// An SSE body of chunks, closed by `[DONE]`.
fn sse(chunks: &[Value]) -> String {
    let mut out: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    out.push_str("data: [DONE]\n\n");
    out
}

fn delta(delta: Value, finish: Option<&str>) -> Value {
    json!({"id": "chatcmpl-7", "object": "chat.completion.chunk", "model": "qwen2.5-7b",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

fn usage_chunk(prompt: u64, cached: u64, completion: u64) -> Value {
    json!({"id": "chatcmpl-7", "choices": [], "usage": {
        "prompt_tokens": prompt, "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached}}})
}

fn answer(text: &str) -> ResponseTemplate {
    let body = sse(&[
        delta(json!({"role": "assistant", "content": ""}), None),
        delta(json!({"content": text}), None),
        delta(json!({}), Some("stop")),
        usage_chunk(2100, 2048, 9),
    ]);
    ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")
}

fn conversation() -> Body {
    Body::default()
        .tool(json!({"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}}))
        .system("You are terse.")
        .user(&[text("Read a.rs")])
        .assistant(&[tool_use("toolu_1", "Read", json!({"file_path": "a.rs"}))])
        .user(&[tool_result("toolu_1", "fn main() {}"), text("Summarise it.")])
        .cache_at(-1)
}

#[tokio::test]
async fn the_request_is_a_streaming_chat_completion() {
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header("authorization", "Bearer sk-test"))
        .and(header("content-type", "application/json"))
        .respond_with(answer("It is empty."))
        .expect(1)
        .mount(&mock)
        .await;
    let done = bounded(&provider(&mock.uri(), 0), &conversation().json()).await;
    let done = done.unwrap();
    assert_eq!(done.message.text(), "It is empty.");
    assert_eq!(done.stop_reason.as_deref(), Some("end_turn"));
    assert_eq!(
        done.usage,
        Usage {
            input_tokens: 52,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 2048,
            output_tokens: 9,
        }
    );

    let received = mock.received_requests().await.unwrap();
    let sent: Value = serde_json::from_slice(&received[0].body).unwrap();
    assert_eq!(sent["model"], "qwen2.5-7b");
    assert_eq!(sent["stream"], true);
    assert_eq!(sent["stream_options"], json!({"include_usage": true}));
    assert_eq!(sent["max_tokens"], 1024);
    assert!(sent["prompt_cache_key"].is_string());
    let roles: Vec<&str> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
    assert_eq!(
        sent["messages"][2]["tool_calls"][0]["function"]["name"],
        "Read"
    );
    assert_eq!(sent["messages"][3]["tool_call_id"], "toolu_1");
    assert_eq!(
        sent["tools"][0],
        json!({"type": "function", "function": {"name": "Read", "description": "Read a file",
                                                "parameters": {"type": "object"}}})
    );
}

#[tokio::test]
async fn tool_call_chunks_become_tool_use_blocks() {
    let mock = MockServer::start().await;
    let call = |id: Option<&str>, name: Option<&str>, args: &str| {
        json!({"tool_calls": [{"index": 0, "id": id, "type": "function",
                               "function": {"name": name, "arguments": args}}]})
    };
    let body = sse(&[
        delta(call(Some("call_9"), Some("Read"), ""), None),
        delta(call(None, None, "{\"file_path\""), None),
        delta(call(None, None, ": \"b.rs\"}"), None),
        delta(json!({}), Some("tool_calls")),
        usage_chunk(40, 0, 12),
    ]);
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(body, "text/event-stream"))
        .mount(&mock)
        .await;
    let done = bounded(&provider(&mock.uri(), 0), &conversation().json())
        .await
        .unwrap();
    let (id, name, block) = done.message.tool_uses().next().unwrap();
    assert_eq!((id, name), ("call_9", "Read"));
    assert_eq!(block.tool_input(), Some(json!({"file_path": "b.rs"})));
    assert_eq!(done.stop_reason.as_deref(), Some("tool_use"));
    assert_eq!(done.usage.input_tokens, 40);
}

#[tokio::test]
async fn siblings_send_one_prompt_cache_key() {
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(answer("ok"))
        .mount(&mock)
        .await;
    let provider = provider(&mock.uri(), 0);
    let sibling = |directive: &str| {
        Body::default()
            .system(&prose(300))
            .user(&[text("Shared context."), text(directive)])
            .json()
    };
    for d in ["Audit module a.", "Audit module b."] {
        bounded(&provider, &sibling(d)).await.unwrap();
    }
    let keys: Vec<Value> = mock
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| serde_json::from_slice::<Value>(&r.body).unwrap()["prompt_cache_key"].clone())
        .collect();
    assert_eq!(keys.len(), 2);
    assert!(keys[0].is_string());
    assert_eq!(keys[0], keys[1]);
}

#[tokio::test]
async fn client_errors_are_final_and_server_errors_retried() {
    let mock = MockServer::start().await;
    let error = r#"{"error":{"message":"This model's maximum context length is 8192 tokens","type":"invalid_request_error","code":null}}"#;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(400).set_body_raw(error, "application/json"))
        .expect(1)
        .mount(&mock)
        .await;
    let failed = bounded(&provider(&mock.uri(), 3), &conversation().json()).await;
    assert!(
        matches!(failed, Err(ProviderError::Status { status: 400, ref message, .. }) if message.contains("maximum context length")),
        "{failed:?}"
    );

    // 503, then a 429 asking for 20 ms, then a stream cut short (no finish, no usage, no
    // [DONE]): all retried, because nothing was yielded yet.
    let mock = MockServer::start().await;
    let cut = format!("data: {}\n\n", delta(json!({"content": "par"}), None));
    let failures = [
        ResponseTemplate::new(503),
        ResponseTemplate::new(429).insert_header("retry-after-ms", "20"),
        ResponseTemplate::new(200).set_body_raw(cut, "text/event-stream"),
    ];
    for response in failures {
        Mock::given(method("POST"))
            .respond_with(response)
            .up_to_n_times(1)
            .expect(1)
            .mount(&mock)
            .await;
    }
    Mock::given(method("POST"))
        .respond_with(answer("whole"))
        .expect(1)
        .mount(&mock)
        .await;
    let done = bounded(&provider(&mock.uri(), 3), &conversation().json()).await;
    assert_eq!(done.map(|c| c.message.text()), Ok("whole".into()));
}

#[tokio::test]
async fn an_error_chunk_is_a_status_error() {
    let mock = MockServer::start().await;
    let body = sse(&[
        delta(json!({"content": "par"}), None),
        json!({"error": {"message": "engine died", "code": 500}}),
    ]);
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(body, "text/event-stream"))
        .expect(2)
        .mount(&mock)
        .await;
    let failed = bounded(&provider(&mock.uri(), 1), &conversation().json()).await;
    assert!(
        matches!(failed, Err(ProviderError::Status { status: 500, ref message, .. }) if message == "engine died"),
        "{failed:?}"
    );
}

#[tokio::test]
async fn bodies_it_cannot_convert_are_refused_before_sending() {
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(answer("never"))
        .expect(0)
        .mount(&mock)
        .await;
    let image = Body::default()
        .user(&[json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}).to_string()])
        .json();
    let refused = bounded(&provider(&mock.uri(), 3), &image).await;
    assert!(
        matches!(refused, Err(ProviderError::InvalidRequest(_))),
        "{refused:?}"
    );
}
