//! The sim-server over real HTTP on loopback: the Messages API's wire format, its errors, its
//! authentication, token counting, and the stream cuts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use forkd_provider::{SimConfig, SimProvider};
use forkd_sim_server::{SimServerConfig, StreamCuts, serve};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::oneshot;

const MODEL: &str = "claude-sonnet-4-5";

/// A running server; dropping it shuts the server down.
struct Server {
    base: String,
    cuts: StreamCuts,
    _stop: oneshot::Sender<()>,
}

async fn start(api_key: Option<&str>) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let cuts = StreamCuts::new();
    let config = SimServerConfig {
        api_key: api_key.map(str::to_owned),
        cuts: cuts.clone(),
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let sim = SimProvider::new(SimConfig::default());
    tokio::spawn(serve(listener, sim, config, async {
        let _ = stopped.await;
    }));
    Server {
        base,
        cuts,
        _stop: stop,
    }
}

fn body(text: &str, stream: bool) -> Value {
    json!({
        "model": MODEL, "max_tokens": 1024, "stream": stream,
        "system": [{"type": "text", "text": "You are a test.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]
    })
}

async fn post(server: &Server, path: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}{path}", server.base))
        .header("x-api-key", "test")
        .header("anthropic-version", "2023-06-01")
        .body(body.to_string())
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap()
}

/// The SSE frames of a body: (event name, data).
fn frames(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (event, data) = f.split_once('\n').unwrap();
            let event = event.strip_prefix("event: ").unwrap().to_owned();
            let data = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            (event, data)
        })
        .collect()
}

#[tokio::test]
async fn a_stream_is_the_messages_api_event_sequence() {
    let server = start(None).await;
    let response = post(&server, "/v1/messages", &body("Go.\n@sim think hmm", true)).await;
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"].to_str().unwrap();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    assert!(response.headers().contains_key("request-id"));
    let frames = frames(&response.text().await.unwrap());
    let names: Vec<&str> = frames.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..3], ["message_start", "ping", "content_block_start"]);
    assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"]);
    for (name, data) in &frames {
        assert_eq!(
            data["type"],
            name.as_str(),
            "an event's name is its data's type"
        );
    }
    let message = &frames[0].1["message"];
    assert_eq!(message["model"], MODEL);
    assert_eq!(message["role"], "assistant");
    let usage = &message["usage"];
    for field in [
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    ] {
        assert!(usage[field].is_u64(), "{field}: {usage}");
    }
    assert_eq!(frames[2].1["content_block"]["type"], "thinking");
    let stop = &frames[frames.len() - 2].1;
    assert_eq!(stop["delta"]["stop_reason"], "end_turn");
    assert!(stop["usage"]["output_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn a_non_streaming_request_gets_one_message_and_count_tokens_agrees() {
    let server = start(None).await;
    let request = body("Summarise.\n@sim say all good", false);
    let counted = post(&server, "/v1/messages/count_tokens", &request).await;
    assert_eq!(counted.status(), 200);
    let counted: Value = json_of(counted).await;

    let response = post(&server, "/v1/messages", &request).await;
    assert_eq!(response.status(), 200);
    let message: Value = json_of(response).await;
    assert_eq!(message["type"], "message");
    assert_eq!(message["stop_reason"], "end_turn");
    assert_eq!(message["stop_sequence"], Value::Null);
    assert!(
        message["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("Result: all good")
    );
    let usage = &message["usage"];
    let input: u64 = [
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    ]
    .iter()
    .map(|f| usage[*f].as_u64().unwrap())
    .sum();
    assert_eq!(counted["input_tokens"].as_u64(), Some(input));
}

/// A response's JSON body (`Response::json` needs a reqwest feature forkd does not use).
async fn json_of(response: reqwest::Response) -> Value {
    serde_json::from_str(&response.text().await.unwrap()).unwrap()
}

#[tokio::test]
async fn errors_have_the_apis_statuses_and_bodies() {
    let server = start(None).await;
    // (body, status, error type)
    let cases = [
        (body("x\n@sim fail 529", true), 529, "overloaded_error"),
        (body("x\n@sim fail 500", false), 500, "api_error"),
        (body("x\n@sim fail 400", true), 400, "invalid_request_error"),
        (
            json!({"model": "gpt-2", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}),
            400,
            "invalid_request_error",
        ),
        (json!({"max_tokens": 1}), 400, "invalid_request_error"),
    ];
    for (request, status, kind) in cases {
        let response = post(&server, "/v1/messages", &request).await;
        assert_eq!(response.status(), status, "{request}");
        let error = json_of(response).await;
        assert_eq!(error["type"], "error");
        assert_eq!(error["error"]["type"], kind, "{request}");
        assert!(error["error"]["message"].is_string());
    }
    let limited = post(&server, "/v1/messages", &body("x\n@sim fail 429", true)).await;
    assert_eq!(limited.status(), 429);
    assert_eq!(limited.headers()["retry-after"], "1");
    let nowhere = post(&server, "/v1/nowhere", &json!({})).await;
    assert_eq!(nowhere.status(), 404);
    assert_eq!(json_of(nowhere).await["error"]["type"], "not_found_error");
}

#[tokio::test]
async fn keys_come_as_x_api_key_or_bearer() {
    let open = start(None).await;
    let keyed = start(Some("secret")).await;
    let client = reqwest::Client::new();
    let request = body("hi", false).to_string();
    // (server, headers, expected status)
    type Headers = &'static [(&'static str, &'static str)];
    let cases: [(&Server, Headers, u16); 6] = [
        (&open, &[("x-api-key", "anything")], 200),
        (&open, &[("authorization", "Bearer anything")], 200),
        (&open, &[], 401),
        (&keyed, &[("x-api-key", "secret")], 200),
        (&keyed, &[("authorization", "Bearer secret")], 200),
        (&keyed, &[("x-api-key", "wrong")], 401),
    ];
    for (server, headers, status) in cases {
        let mut req = client
            .post(format!("{}/v1/messages", server.base))
            .body(request.clone());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let response = req.send().await.unwrap();
        assert_eq!(response.status(), status, "{headers:?}");
        if status == 401 {
            let error = json_of(response).await;
            assert_eq!(error["error"]["type"], "authentication_error");
        }
    }
}

/// Reads a body to its end or its break: the bytes that came, and whether it broke.
async fn read_all(response: reqwest::Response) -> (String, bool) {
    let mut bytes = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(c) => bytes.extend_from_slice(&c),
            Err(_) => return (String::from_utf8(bytes).unwrap(), true),
        }
    }
    (String::from_utf8(bytes).unwrap(), false)
}

#[tokio::test]
async fn armed_cuts_break_the_next_streams() {
    let server = start(None).await;
    server.cuts.cut_next(0);
    server.cuts.cut_next(2);
    // (cut after, events that arrive before the break)
    for expected in [0, 2] {
        let response = post(&server, "/v1/messages", &body("Go.", true)).await;
        assert_eq!(response.status(), 200);
        let (text, broke) = read_all(response).await;
        assert!(broke, "the body breaks instead of ending");
        let events = frames(&text)
            .into_iter()
            .filter(|(name, _)| name != "ping")
            .count();
        assert_eq!(events, expected, "{text}");
    }
    assert_eq!(server.cuts.pending(), 0);
    let (text, broke) = read_all(post(&server, "/v1/messages", &body("Go.", true)).await).await;
    assert!(
        !broke && text.contains("message_stop"),
        "later streams are whole"
    );
    assert_eq!(server.cuts.streams(), 3);
}
