//! The real `OpenAiProvider` over HTTP on loopback, against wiremock playing an
//! OpenAI-compatible chat-completions server: the request it sends, the chunks it reads (text,
//! tool calls, cached-token usage), errors and retries; and against a bare TCP server that holds
//! its body open, to see events arrive before the response ends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use forkd_core::Usage;
use forkd_provider::{
    Accumulator, BlockStart, Completion, FailureKind, OpenAiConfig, OpenAiProvider, Provider,
    ProviderError, StreamEvent,
};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const LIMIT: Duration = Duration::from_secs(20);

/// A provider on `base`. It makes one attempt per request: retrying is the engine's limiter's.
fn provider(base: &str) -> OpenAiProvider {
    OpenAiProvider::new(OpenAiConfig {
        base_url: format!("{base}/v1"),
        api_key: Some("sk-test".into()),
        model: Some("qwen2.5-7b".into()),
        read_timeout: Duration::from_secs(10),
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
    let done = bounded(&provider(&mock.uri()), &conversation().json()).await;
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
    let done = bounded(&provider(&mock.uri()), &conversation().json())
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
    let provider = provider(&mock.uri());
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
async fn client_errors_are_final_and_server_errors_retryable() {
    let mock = MockServer::start().await;
    let error = r#"{"error":{"message":"This model's maximum context length is 8192 tokens","type":"invalid_request_error","code":null}}"#;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(400).set_body_raw(error, "application/json"))
        .expect(1)
        .mount(&mock)
        .await;
    let failed = bounded(&provider(&mock.uri()), &conversation().json()).await;
    assert!(
        matches!(failed, Err(ProviderError::Status { status: 400, ref message, .. }) if message.contains("maximum context length")),
        "{failed:?}"
    );

    // 503, a 429 asking for 20 ms, a stream that ends before its first chunk: each one
    // attempt, and each worth another (the limiter's to make).
    let failures = [
        (ResponseTemplate::new(503), FailureKind::Unavailable),
        (
            ResponseTemplate::new(429).insert_header("retry-after-ms", "20"),
            FailureKind::RateLimited {
                retry_after: Some(Duration::from_millis(20)),
            },
        ),
        (
            ResponseTemplate::new(200).set_body_raw(": keep-alive\n\n", "text/event-stream"),
            FailureKind::Unavailable,
        ),
    ];
    for (response, kind) in failures {
        let mock = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(response)
            .expect(1)
            .mount(&mock)
            .await;
        let failed = bounded(&provider(&mock.uri()), &conversation().json()).await;
        assert_eq!(
            failed.as_ref().map_err(ProviderError::kind).err(),
            Some(kind)
        );
        assert!(failed.unwrap_err().is_retryable());
    }
}

#[tokio::test]
async fn the_limits_headers_come_first_in_the_stream() {
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            answer("limited")
                .insert_header("x-ratelimit-limit-requests", "60")
                .insert_header("x-ratelimit-remaining-requests", "59")
                .insert_header("x-ratelimit-reset-requests", "1s")
                .insert_header("x-ratelimit-limit-tokens", "150000")
                .insert_header("x-ratelimit-remaining-tokens", "149000")
                .insert_header("x-ratelimit-reset-tokens", "6m0s"),
        )
        .mount(&mock)
        .await;
    let (events, error) = events(&provider(&mock.uri()), &conversation().json()).await;
    assert_eq!(error, None);
    let Some(StreamEvent::RateLimits(limits)) = events.first() else {
        panic!("{events:?}");
    };
    let requests = limits.requests.unwrap();
    assert_eq!(
        (requests.limit, requests.remaining, requests.reset),
        (60, 59, Duration::from_secs(1))
    );
    let tokens = limits.tokens.unwrap();
    assert_eq!(
        (tokens.limit, tokens.remaining, tokens.reset),
        (150_000, 149_000, Duration::from_secs(360))
    );
}

/// Every event of one request, up to the first error.
async fn events(
    provider: &OpenAiProvider,
    body: &str,
) -> (Vec<StreamEvent>, Option<ProviderError>) {
    let collect = async {
        let mut stream = provider.stream(request(MODEL, body));
        let mut events = Vec::new();
        while let Some(item) = stream.next().await {
            match item {
                Ok(ev) => events.push(ev),
                Err(e) => return (events, Some(e)),
            }
        }
        (events, None)
    };
    tokio::time::timeout(LIMIT, collect)
        .await
        .expect("the request finished in time")
}

#[tokio::test]
async fn a_stream_cut_after_its_first_events_goes_to_the_caller() {
    // No finish, no usage, no [DONE]: the text was already yielded, so the provider does not
    // retry (it never does); the engine re-requests.
    let mock = MockServer::start().await;
    let cut = format!("data: {}\n\n", delta(json!({"content": "par"}), None));
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(cut, "text/event-stream"))
        .up_to_n_times(1)
        .expect(1)
        .mount(&mock)
        .await;
    Mock::given(method("POST"))
        .respond_with(answer("never"))
        .expect(0)
        .mount(&mock)
        .await;
    let (events, error) = events(&provider(&mock.uri()), &conversation().json()).await;
    assert!(matches!(error, Some(ProviderError::Stream(_))), "{error:?}");
    assert!(matches!(
        events.as_slice(),
        [
            StreamEvent::MessageStart { .. },
            StreamEvent::BlockStart { .. },
            StreamEvent::TextDelta { text, .. },
        ] if text == "par"
    ));
}

#[tokio::test]
async fn usage_comes_whole_in_the_closing_message_delta() {
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(answer("cached"))
        .mount(&mock)
        .await;
    let (events, error) = events(&provider(&mock.uri()), &conversation().json()).await;
    assert_eq!(error, None);
    let end = Usage {
        input_tokens: 52,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: 2048,
        output_tokens: 9,
    };
    assert_eq!(
        events,
        [
            StreamEvent::MessageStart {
                message_id: "chatcmpl-7".into(),
                usage: Usage::default(),
            },
            StreamEvent::BlockStart {
                index: 0,
                block: BlockStart::Text,
            },
            StreamEvent::TextDelta {
                index: 0,
                text: "cached".into(),
            },
            StreamEvent::BlockStop { index: 0 },
            StreamEvent::MessageDelta {
                stop_reason: Some("end_turn".into()),
                output_tokens: 9,
                usage: Some(end),
            },
            StreamEvent::MessageStop,
        ]
    );
    let mut acc = Accumulator::default();
    for ev in &events {
        acc.push(ev).unwrap();
    }
    assert_eq!(acc.finish().unwrap().usage, end);
}

#[tokio::test]
async fn an_error_chunk_is_a_status_error() {
    // After text was yielded: the error goes to the caller as it is, without a retry here.
    let mock = MockServer::start().await;
    let body = sse(&[
        delta(json!({"content": "par"}), None),
        json!({"error": {"message": "engine died", "code": 500}}),
    ]);
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(body, "text/event-stream"))
        .expect(1)
        .mount(&mock)
        .await;
    let failed = bounded(&provider(&mock.uri()), &conversation().json()).await;
    assert!(
        matches!(failed, Err(ProviderError::Status { status: 500, ref message, .. }) if message == "engine died"),
        "{failed:?}"
    );

    // As the first chunk: the status it names.
    let mock = MockServer::start().await;
    let body = sse(&[json!({"error": {"message": "engine died", "code": 503}})]);
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(body, "text/event-stream"))
        .expect(1)
        .mount(&mock)
        .await;
    let failed = bounded(&provider(&mock.uri()), &conversation().json()).await;
    assert!(
        matches!(failed, Err(ProviderError::Status { status: 503, .. })),
        "{failed:?}"
    );
}

/// Reads one HTTP request (headers, then a body of `content-length` bytes).
async fn read_request(socket: &mut tokio::net::TcpStream) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = socket.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the client closed before its request was whole");
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        if buf.len() >= end + 4 + length {
            return;
        }
    }
}

#[tokio::test]
async fn events_are_yielded_while_the_body_is_still_open() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (go_on, resume) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        read_request(&mut socket).await;
        let data = |chunks: &[Value]| -> String {
            chunks.iter().map(|c| format!("data: {c}\n\n")).collect()
        };
        // A body delimited by the connection's close, sent in two parts.
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
        let first = data(&[
            delta(json!({"role": "assistant", "content": ""}), None),
            delta(json!({"content": "Hel"}), None),
        ]);
        socket.write_all(head.as_bytes()).await.unwrap();
        socket.write_all(first.as_bytes()).await.unwrap();
        socket.flush().await.unwrap();
        // The rest only once the client has seen the first text.
        resume.await.unwrap();
        let rest = sse(&[
            delta(json!({"content": "lo"}), None),
            delta(json!({}), Some("stop")),
            usage_chunk(1500, 1024, 2),
        ]);
        socket.write_all(rest.as_bytes()).await.unwrap();
        socket.shutdown().await.unwrap();
    });

    let provider = provider(&base);
    let mut stream = provider.stream(request(MODEL, &conversation().json()));
    let mut acc = Accumulator::default();
    let first_text = async {
        loop {
            let ev = stream.next().await.expect("an event").unwrap();
            acc.push(&ev).unwrap();
            if let StreamEvent::TextDelta { text, .. } = ev {
                return text;
            }
        }
    };
    // A provider that waited for the whole body would wait here for ever.
    let text = tokio::time::timeout(LIMIT, first_text)
        .await
        .expect("the first text came while the body was open");
    assert_eq!(text, "Hel");
    go_on.send(()).unwrap();
    let rest = async {
        while let Some(ev) = stream.next().await {
            acc.push(&ev.unwrap()).unwrap();
        }
    };
    tokio::time::timeout(LIMIT, rest).await.unwrap();
    server.await.unwrap();
    let done = acc.finish().unwrap();
    assert_eq!(done.message.text(), "Hello");
    assert_eq!(
        done.usage,
        Usage {
            input_tokens: 476,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 1024,
            output_tokens: 2,
        }
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
    let refused = bounded(&provider(&mock.uri()), &image).await;
    assert!(
        matches!(refused, Err(ProviderError::InvalidRequest(_))),
        "{refused:?}"
    );
}
