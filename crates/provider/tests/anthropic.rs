//! The real `AnthropicProvider` over HTTP on loopback: against `forkd-sim-server` (the sim's
//! cache and scripts behind the Messages wire protocol) and against wiremock for the error
//! shapes and stream oddities the sim does not produce.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use forkd_core::fork::{ForkBatch, client_fork_message};
use forkd_core::request::serialize;
use forkd_core::session::{CacheSafeParams, RenderedSystem, ToolsJson};
use forkd_core::{BatchId, Block, Directive, Message, SessionId};
use forkd_provider::tokens::request_input_tokens;
use forkd_provider::{
    AnthropicConfig, AnthropicProvider, Completion, CountSource, FailureKind, Provider,
    ProviderError, SimConfig, SimProvider, StreamEvent, TokenCount,
};
use forkd_sim_server::{SimServerConfig, StreamCuts, serve};
use futures::StreamExt;
use serde_json::json;
use tokio::sync::oneshot;
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// Every test is bounded: a hang fails instead of stalling the suite.
const LIMIT: Duration = Duration::from_secs(20);

/// A sim-server on loopback; dropping it shuts the server down.
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

/// A provider on `base`. It makes one attempt per request: retrying is the engine's limiter's.
fn provider(base: &str, key: &str) -> AnthropicProvider {
    let mut config = AnthropicConfig::new(key);
    config.base_url = base.to_owned();
    config.read_timeout = Duration::from_secs(10);
    AnthropicProvider::new(config).unwrap()
}

async fn bounded(provider: &impl Provider, body: &str) -> Result<Completion, ProviderError> {
    tokio::time::timeout(LIMIT, run(provider, request(MODEL, body)))
        .await
        .expect("the request finished in time")
}

fn base() -> Body {
    Body::default()
        .tool(json!({"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}}))
        .system(&prose(1500))
        .user(&[text("Summarise the repository.")])
}

/// Five fork children of one batch, serialized by forkd as the engine would.
fn fork_children() -> Vec<String> {
    let params = CacheSafeParams {
        model: MODEL.into(),
        system: RenderedSystem::from_stored(&prose(2000)),
        tools: ToolsJson::builtin(),
        thinking: None,
        max_tokens: 4096,
    };
    let history = vec![Message::user(vec![Block::text("Audit every module.")])];
    let directives: Vec<Directive> = (0..5)
        .map(|i| Directive {
            description: format!("module {i}"),
            prompt: format!("Audit module {i}.\n@sim tool Read {{\"file_path\": \"m{i}.rs\"}}"),
        })
        .collect();
    let id = BatchId::new();
    let message = client_fork_message(id, &directives);
    let batch = ForkBatch::new(id, SessionId::new(), 1, message, 0).unwrap();
    directives
        .iter()
        .map(|d| {
            let block = ForkBatch::directive_block(d);
            let conv = batch.child_conversation(&history, &block, &[]);
            serialize(&params, &conv, true).body
        })
        .collect()
}

#[tokio::test]
async fn usage_over_http_matches_the_in_process_sim() {
    let server = start(None).await;
    let remote = provider(&server.base, "test");
    let local = SimProvider::new(SimConfig::default());
    let body = base().cache_at(1).cache_at(-1);
    let mut bodies = vec![body.json(), body.json()];
    bodies.extend(fork_children());
    for (i, body) in bodies.iter().enumerate() {
        let over_http = bounded(&remote, body).await.unwrap();
        let in_process = bounded(&local, body).await.unwrap();
        assert_eq!(over_http.usage, in_process.usage, "request {i}");
        assert_eq!(over_http.message, in_process.message, "request {i}");
        assert_eq!(over_http.stop_reason, in_process.stop_reason, "request {i}");
    }
    // The second identical request read the whole prefix; children 2..5 read the shared one.
    let second = bounded(&remote, &bodies[1]).await.unwrap();
    assert_eq!(input_side(&second), usage(0, 0, body.total()));
    let child = bounded(&remote, &bodies[4]).await.unwrap();
    assert!(child.usage.cache_read_share() > 0.9, "{:?}", child.usage);
}

#[tokio::test]
async fn each_request_is_one_attempt_and_overloads_are_retryable() {
    let server = start(None).await;
    let provider = provider(&server.base, "test");
    // Two scripted overloads: the first two requests get them, the third the answer.
    let flaky = base().user(&[text("Flaky.\n@sim fail 529 x2")]).json();
    for _ in 0..2 {
        let failed = bounded(&provider, &flaky).await;
        match failed {
            Err(e @ ProviderError::Status { status: 529, .. }) => assert!(e.is_retryable()),
            other => panic!("{other:?}"),
        }
    }
    let done = bounded(&provider, &flaky).await;
    assert_eq!(done.map(|c| c.stop_reason), Ok(Some("end_turn".into())));
}

#[tokio::test]
async fn a_rate_limit_is_reported_with_its_retry_after_at_once() {
    let server = start(None).await;
    // The sim asks for one second; waiting for it is the limiter's.
    let limited = base().user(&[text("Busy.\n@sim fail 429")]).json();
    let started = Instant::now();
    let failed = bounded(&provider(&server.base, "test"), &limited).await;
    match &failed {
        Err(e @ ProviderError::Status { status: 429, .. }) => assert_eq!(
            e.kind(),
            FailureKind::RateLimited {
                retry_after: Some(Duration::from_secs(1))
            }
        ),
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn a_bad_request_is_final() {
    let server = start(None).await;
    let bad = base().user(&[text("Bad.\n@sim fail 400")]).json();
    let failed = bounded(&provider(&server.base, "test"), &bad).await;
    match failed {
        Err(
            e @ ProviderError::Status {
                status: 400,
                retry_after: None,
                ..
            },
        ) => {
            assert!(e.to_string().contains("scripted failure"), "{e}");
            assert!(!e.is_retryable());
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_stream_cut_before_any_event_is_a_retryable_error() {
    let server = start(None).await;
    server.cuts.cut_next(0);
    let failed = bounded(&provider(&server.base, "test"), &base().json()).await;
    assert!(
        failed.as_ref().is_err_and(ProviderError::is_retryable),
        "{failed:?}"
    );
    assert_eq!(server.cuts.streams(), 1, "one attempt");
}

#[tokio::test]
async fn a_stream_cut_after_events_is_the_callers_and_the_rerequest_hits_the_cache() {
    let server = start(None).await;
    let provider = provider(&server.base, "test");
    let body = base().cache_at(-1);
    server.cuts.cut_next(3);
    let mut stream = provider.stream(body.request());
    let mut events = Vec::new();
    let error = tokio::time::timeout(LIMIT, async {
        while let Some(item) = stream.next().await {
            match item {
                Ok(ev) => events.push(ev),
                Err(e) => return Some(e),
            }
        }
        None
    })
    .await
    .unwrap();
    assert!(matches!(error, Some(ProviderError::Stream(_))), "{error:?}");
    assert_eq!(events.len(), 3, "{events:?}");
    assert!(matches!(events[0], StreamEvent::MessageStart { .. }));
    assert_eq!(server.cuts.streams(), 1, "not retried inside the provider");

    // The engine's re-request: the cut response had started, so its prefix is cached.
    let again = bounded(&provider, &body.json()).await.unwrap();
    assert_eq!(input_side(&again), usage(0, 0, body.total()));
}

#[tokio::test]
async fn keys_are_checked_and_bearer_tokens_accepted() {
    let server = start(Some("secret")).await;
    assert!(
        bounded(&provider(&server.base, "secret"), &base().json())
            .await
            .is_ok()
    );
    let refused = bounded(&provider(&server.base, "wrong"), &base().json()).await;
    assert!(
        matches!(refused, Err(ProviderError::Status { status: 401, .. })),
        "{refused:?}"
    );
    // Current SDKs send the key as a bearer token.
    let response = reqwest::Client::new()
        .post(format!("{}/v1/messages", server.base))
        .header("authorization", "Bearer secret")
        .header("anthropic-version", "2023-06-01")
        .body(base().json())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

// ---- wiremock: what the sim does not produce ----

const START: &str = r#"{"type":"message_start","message":{"id":"msg_w","type":"message","role":"assistant","model":"m","content":[],"usage":{"input_tokens":12,"output_tokens":1}}}"#;

/// An SSE body from (event, data) pairs.
fn sse(frames: &[(&str, &str)]) -> String {
    frames
        .iter()
        .map(|(e, d)| format!("event: {e}\ndata: {d}\n\n"))
        .collect()
}

fn hello() -> String {
    sse(&[
        ("message_start", START),
        ("ping", r#"{"type": "ping"}"#),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hello"}}"#,
        ),
        (
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#,
        ),
        ("some_new_event", r#"{"type":"some_new_event"}"#),
        (
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":2}}"#,
        ),
        ("message_stop", r#"{"type":"message_stop"}"#),
    ])
}

fn events(body: String) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")
}

#[tokio::test]
async fn the_body_is_sent_byte_for_byte_with_the_api_headers() {
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .and(header("x-api-key", "k"))
        .and(header("anthropic-version", "2023-06-01"))
        .and(header("content-type", "application/json"))
        .respond_with(events(hello()))
        .expect(1)
        .mount(&mock)
        .await;
    // Odd spacing and key order that any re-encoding would change.
    let body = "{\"model\":\"m\",  \"stream\":true,\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"\\u00e9\"}]}";
    let done = bounded(&provider(&mock.uri(), "k"), body).await.unwrap();
    assert_eq!(done.message.text(), "hello");
    // Absent cache fields are zero; ping and unknown events are skipped.
    assert_eq!(done.usage.input_tokens, 12);
    assert_eq!(done.usage.cache_read_input_tokens, 0);
    assert_eq!(done.usage.output_tokens, 2);
    let received = mock.received_requests().await.unwrap();
    assert_eq!(received[0].body, body.as_bytes());
}

#[tokio::test]
async fn error_bodies_of_either_shape_give_the_message() {
    // (status, content type, body, expected message)
    let cases = [
        (
            400,
            "application/json",
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: too big"}}"#,
            "max_tokens: too big (invalid_request_error)",
        ),
        (
            529,
            "application/json",
            r#"{"error":{"message":"upstream overloaded"}}"#,
            "upstream overloaded",
        ),
        (
            502,
            "text/html",
            "<html>Bad Gateway</html>",
            "<html>Bad Gateway</html>",
        ),
        (500, "application/json", "", "Internal Server Error"),
        // llama.cpp's server speaks the OpenAI shape, with a numeric code.
        (
            500,
            "application/json",
            r#"{"error":{"code":500,"message":"'messages' is required","type":"server_error"}}"#,
            "'messages' is required (server_error)",
        ),
        (
            400,
            "application/json",
            r#"{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error","n_prompt_tokens":40000,"n_ctx":32768}}"#,
            "the request exceeds the available context size (exceed_context_size_error)",
        ),
    ];
    for (status, content_type, body, expected) in cases {
        let mock = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(status).set_body_raw(body, content_type))
            .mount(&mock)
            .await;
        let failed = bounded(&provider(&mock.uri(), "k"), &base().json()).await;
        match failed {
            Err(ProviderError::Status {
                status: got,
                message,
                ..
            }) => {
                assert_eq!((got, message.as_str()), (status, expected));
            }
            other => panic!("{status}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn refusals_say_what_they_are_and_how_long_to_wait() {
    let overloaded =
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    // (response, the kind reported)
    let cases = [
        (
            ResponseTemplate::new(529).set_body_raw(overloaded, "application/json"),
            FailureKind::Unavailable,
        ),
        (
            ResponseTemplate::new(429).insert_header("retry-after", "0"),
            FailureKind::RateLimited {
                retry_after: Some(Duration::ZERO),
            },
        ),
        (
            ResponseTemplate::new(429).insert_header("retry-after", "120"),
            FailureKind::RateLimited {
                retry_after: Some(Duration::from_secs(120)),
            },
        ),
        (
            ResponseTemplate::new(429),
            FailureKind::RateLimited { retry_after: None },
        ),
    ];
    for (response, kind) in cases {
        let mock = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(response)
            .expect(1)
            .mount(&mock)
            .await;
        let started = Instant::now();
        let failed = bounded(&provider(&mock.uri(), "k"), &base().json()).await;
        assert_eq!(
            failed.as_ref().map_err(ProviderError::kind).err(),
            Some(kind)
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}

#[tokio::test]
async fn the_limits_headers_come_first_in_the_stream() {
    let mock = MockServer::start().await;
    let reset = "2026-12-03T06:00:00Z";
    Mock::given(method("POST"))
        .respond_with(
            events(hello())
                .insert_header("anthropic-ratelimit-requests-limit", "50")
                .insert_header("anthropic-ratelimit-requests-remaining", "49")
                .insert_header("anthropic-ratelimit-requests-reset", reset)
                .insert_header("anthropic-ratelimit-input-tokens-limit", "400000")
                .insert_header("anthropic-ratelimit-input-tokens-remaining", "390000")
                .insert_header("anthropic-ratelimit-input-tokens-reset", reset),
        )
        .mount(&mock)
        .await;
    let provider = provider(&mock.uri(), "k");
    let mut stream = provider.stream(base().request());
    let first = tokio::time::timeout(LIMIT, stream.next()).await.unwrap();
    let Some(Ok(StreamEvent::RateLimits(limits))) = first else {
        panic!("{first:?}");
    };
    let requests = limits.requests.unwrap();
    assert_eq!((requests.limit, requests.remaining), (50, 49));
    let input = limits.input_tokens.unwrap();
    assert_eq!((input.limit, input.remaining), (400_000, 390_000));
    assert_eq!((limits.tokens, limits.output_tokens), (None, None));
}

#[tokio::test]
async fn stream_oddities() {
    // An error event before any content stands for its status.
    let overloaded = sse(&[(
        "error",
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    )]);
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(events(overloaded))
        .mount(&mock)
        .await;
    let failed = bounded(&provider(&mock.uri(), "k"), &base().json()).await;
    assert!(
        matches!(failed, Err(ProviderError::Status { status: 529, .. })),
        "{failed:?}"
    );

    // A body that ends without message_stop after events is a stream error for the caller.
    let truncated: String = hello().split_inclusive("\n\n").take(4).collect();
    // A JSON answer where a stream was expected cannot be read as one.
    let json_reply = ResponseTemplate::new(200).set_body_raw("{}", "application/json");
    // (response, whether the error is a stream error, else an invalid request)
    let cases = [(events(truncated), true), (json_reply, false)];
    for (response, is_stream) in cases {
        let mock = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(response)
            .mount(&mock)
            .await;
        let failed = bounded(&provider(&mock.uri(), "k"), &base().json()).await;
        match (failed, is_stream) {
            (Err(ProviderError::Stream(_)), true)
            | (Err(ProviderError::InvalidRequest(_)), false) => {}
            (other, _) => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn a_refused_connection_is_unreachable() {
    // A port that was just free: nothing listens there.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let failed = bounded(&provider(&url, "k"), &base().json()).await;
    assert!(
        matches!(failed, Err(ProviderError::Unreachable(_))),
        "{failed:?}"
    );
    assert!(failed.unwrap_err().is_retryable());
}

// ---- llama.cpp's server (`llama-server`), as its source and a real run show it ----

/// The model the sessions name; the local server answers as its own.
const REQUESTED: &str = "claude-sonnet-4-5";

/// A response as llama-server streams it: its own model name, `input_tokens` counting only the
/// uncached tokens, `cache_read_input_tokens`, and no `cache_creation_input_tokens` anywhere;
/// `message_delta` carries only `output_tokens`; keep-alive comments between events.
fn llama_stream(model: &str, input: u64, read: u64) -> String {
    let start = format!(
        r#"{{"type":"message_start","message":{{"id":"chatcmpl-7","type":"message","role":"assistant","content":[],"model":"{model}","stop_reason":null,"stop_sequence":null,"usage":{{"cache_read_input_tokens":{read},"input_tokens":{input},"output_tokens":0}}}}}}"#
    );
    let mut body = sse(&[
        ("message_start", &start),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Scope: the"}}"#,
        ),
    ]);
    body.push_str(":\n\n");
    body.push_str(&sse(&[
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" store"}}"#,
        ),
        (
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#,
        ),
        (
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"output_tokens":3}}"#,
        ),
        ("message_stop", r#"{"type":"message_stop"}"#),
    ]));
    body
}

fn local_body() -> String {
    base().model(REQUESTED).cache_at(-1).json()
}

#[tokio::test]
async fn a_local_server_answering_as_its_own_model_without_cache_writes() {
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .respond_with(events(llama_stream("gemma-3-270m", 12, 2905)))
        .expect(2)
        .mount(&mock)
        .await;
    let provider = provider(&mock.uri(), "local");
    assert_eq!(provider.served_model(), None);
    let done = bounded(&provider, &local_body()).await.unwrap();
    assert_eq!(done.message.text(), "Scope: the store");
    assert_eq!(done.stop_reason.as_deref(), Some("max_tokens"));
    // No cache_creation_input_tokens: zero. Uncached and read tokens as the server said.
    assert_eq!(
        done.usage,
        forkd_core::Usage {
            output_tokens: 3,
            ..usage(12, 0, 2905)
        }
    );
    // The request went out naming the session's model; the answer's other name is kept, not
    // an error.
    let sent = &mock.received_requests().await.unwrap()[0];
    assert!(String::from_utf8_lossy(&sent.body).contains(REQUESTED));
    assert_eq!(provider.served_model().as_deref(), Some("gemma-3-270m"));
    // Clones share what was learned.
    let clone = provider.clone();
    assert!(bounded(&clone, &local_body()).await.is_ok());
    assert_eq!(clone.served_model().as_deref(), Some("gemma-3-270m"));

    // A server that names the requested model leaves nothing to note.
    let same = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(events(llama_stream(REQUESTED, 12, 0)))
        .mount(&same)
        .await;
    let provider = self::provider(&same.uri(), "local");
    assert!(bounded(&provider, &local_body()).await.is_ok());
    assert_eq!(provider.served_model(), None);
}

/// llama.cpp's server answers 500 to a request it cannot template or parse, every time.
const LLAMA_500: &str = r#"{"error":{"code":500,"message":"Conversation roles must alternate user/assistant/user/assistant/...","type":"server_error"}}"#;

#[tokio::test]
async fn a_500_for_a_malformed_request_is_reported_with_its_message() {
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500).set_body_raw(LLAMA_500, "application/json"))
        .mount(&mock)
        .await;
    let failed = bounded(&provider(&mock.uri(), "k"), &local_body()).await;
    match failed {
        Err(ProviderError::Status {
            status: 500,
            ref message,
            retry_after: None,
        }) => assert_eq!(
            message,
            "Conversation roles must alternate user/assistant/user/assistant/... (server_error)"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(mock.received_requests().await.unwrap().len(), 1);
    assert_eq!(
        failed.unwrap_err().to_string(),
        "provider returned 500: Conversation roles must alternate \
         user/assistant/user/assistant/... (server_error)"
    );

    // (status, body, the status reported): a 5xx whose body blames the request, and "not
    // implemented", are final (not retryable); an overload is worth asking again.
    let cases = [
        (
            500,
            r#"{"error":{"message":"tools[0]: invalid schema","type":"invalid_request_error","code":null}}"#,
            400,
        ),
        (
            501,
            r#"{"error":{"code":501,"message":"This server does not support tools","type":"not_supported_error"}}"#,
            501,
        ),
        (
            503,
            r#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#,
            503,
        ),
    ];
    for (status, body, reported) in cases {
        let mock = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(status).set_body_raw(body, "application/json"))
            .mount(&mock)
            .await;
        let failed = bounded(&provider(&mock.uri(), "k"), &local_body()).await;
        match &failed {
            Err(e @ ProviderError::Status { status: got, .. }) => {
                assert_eq!(*got, reported, "{body}");
                assert_eq!(
                    e.is_retryable(),
                    (500..600).contains(&reported) && reported != 501
                );
            }
            other => panic!("{body}: {other:?}"),
        }
        assert_eq!(mock.received_requests().await.unwrap().len(), 1, "{body}");
    }
}

#[tokio::test]
async fn llama_server_error_events_carry_their_message() {
    // Before any event: the status it stands for, with the server's message.
    let error_event = "event: error\ndata: {\"code\":500,\"message\":\"failed to decode the batch\",\"type\":\"server_error\"}\n\n";
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(events(error_event.to_owned()))
        .mount(&mock)
        .await;
    let failed = bounded(&provider(&mock.uri(), "k"), &local_body()).await;
    assert_eq!(
        failed.map(|c| c.stop_reason),
        Err(ProviderError::Status {
            status: 500,
            message: "failed to decode the batch (server_error)".into(),
            retry_after: None,
        })
    );
    assert_eq!(mock.received_requests().await.unwrap().len(), 1);

    // After events: the caller gets the server's message, not a bare "stream ended".
    let cut: String = llama_stream("gemma-3-270m", 12, 0)
        .split_inclusive("\n\n")
        .take(3)
        .collect::<String>()
        + error_event;
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(events(cut))
        .mount(&mock)
        .await;
    let failed = bounded(&provider(&mock.uri(), "k"), &local_body()).await;
    assert!(
        matches!(failed, Err(ProviderError::Status { status: 500, ref message, .. }) if message.starts_with("failed to decode")),
        "{failed:?}"
    );
    assert_eq!(mock.received_requests().await.unwrap().len(), 1);
}

// ---- token counting ----

async fn count(provider: &impl Provider, body: &str) -> Result<TokenCount, ProviderError> {
    tokio::time::timeout(LIMIT, provider.count_tokens(request(REQUESTED, body)))
        .await
        .expect("counted in time")
}

#[tokio::test]
async fn tokens_are_counted_by_the_server_where_it_can() {
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/messages/count_tokens"))
        .and(header("x-api-key", "k"))
        .and(header("anthropic-version", "2023-06-01"))
        .respond_with(
            ResponseTemplate::new(200).set_body_raw(r#"{"input_tokens":3517}"#, "application/json"),
        )
        .expect(1)
        .mount(&mock)
        .await;
    let body = local_body();
    let counted = count(&provider(&mock.uri(), "k"), &body).await;
    assert_eq!(
        counted,
        Ok(TokenCount {
            input_tokens: 3517,
            source: CountSource::Provider,
        })
    );
    // count_tokens takes no max_tokens or stream: the body sent has only what it accepts, each
    // field's bytes as they were.
    let sent: serde_json::Value =
        serde_json::from_slice(&mock.received_requests().await.unwrap()[0].body).unwrap();
    let original: serde_json::Value = serde_json::from_str(&body).unwrap();
    let keys: Vec<&str> = sent
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["messages", "model", "system", "tools"]);
    for key in keys {
        assert_eq!(sent[key], original[key], "{key}");
    }
}

#[tokio::test]
async fn without_a_count_endpoint_the_local_estimate_answers() {
    for status in [404, 405, 501] {
        let mock = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/messages/count_tokens"))
            .respond_with(ResponseTemplate::new(status).set_body_raw("Not Found", "text/plain"))
            .expect(1)
            .mount(&mock)
            .await;
        let provider = provider(&mock.uri(), "k");
        let body = local_body();
        let estimate = TokenCount {
            input_tokens: request_input_tokens(&body).unwrap(),
            source: CountSource::Estimate,
        };
        assert_eq!(count(&provider, &body).await, Ok(estimate), "{status}");
        // The endpoint is not asked again (`expect(1)`), by this provider or its clones.
        assert_eq!(count(&provider.clone(), &body).await, Ok(estimate));
    }

    // Other failures are errors, not estimates.
    let mock = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(401).set_body_raw(
            r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
            "application/json",
        ))
        .mount(&mock)
        .await;
    let refused = count(&provider(&mock.uri(), "k"), &local_body()).await;
    assert!(
        matches!(refused, Err(ProviderError::Status { status: 401, ref message, .. }) if message.contains("invalid x-api-key")),
        "{refused:?}"
    );
    assert!(matches!(
        count(&provider(&mock.uri(), "k"), "{not json").await,
        Err(ProviderError::InvalidRequest(_))
    ));
}

#[tokio::test]
async fn the_sim_counts_what_it_bills_over_http_and_in_process() {
    let server = start(None).await;
    let remote = provider(&server.base, "test");
    let local = SimProvider::new(SimConfig::default());
    let mut bodies = vec![base().cache_at(-1).json()];
    bodies.extend(fork_children());
    for body in &bodies {
        let in_process = count(&local, body).await.unwrap();
        let over_http = count(&remote, body).await.unwrap();
        let billed = bounded(&local, body).await.unwrap().usage.total_input();
        assert_eq!(in_process.source, CountSource::Estimate);
        assert_eq!(over_http.source, CountSource::Provider);
        assert_eq!(in_process.input_tokens, billed);
        assert_eq!(over_http.input_tokens, billed);
    }
}

/// A client's batch on a session with extended thinking, through the real client against
/// `forkd-sim-server`: forkd's per-child shape is accepted, while the old shape (a fork message
/// forkd wrote, with no thinking block, before placeholder tool results) gets the API's 400 —
/// the rule that caught forkd out, now enforced by the sim.
#[tokio::test]
async fn thinking_sessions_accept_the_per_child_shape_and_refuse_the_old_one() {
    let server = start(None).await;
    let remote = provider(&server.base, "test");
    let params = CacheSafeParams {
        model: MODEL.into(),
        system: RenderedSystem::from_stored(&prose(2000)),
        tools: ToolsJson::builtin(),
        thinking: Some(forkd_core::session::ThinkingConfig {
            budget_tokens: 2048,
        }),
        max_tokens: 4096,
    };
    let history = vec![Message::user(vec![Block::text("Audit every module.")])];
    let directive = Directive {
        description: "module 0".into(),
        prompt: "Audit module 0.".into(),
    };
    let block = ForkBatch::directive_block(&directive);
    let id = BatchId::new();

    let client = ForkBatch::client(id, SessionId::new(), 1, 0);
    let body = serialize(
        &params,
        &client.child_conversation(&history, &block, &[]),
        true,
    )
    .body;
    let done = bounded(&remote, &body).await.unwrap();
    assert_eq!(done.stop_reason.as_deref(), Some("end_turn"));

    let message = client_fork_message(id, std::slice::from_ref(&directive));
    let old = ForkBatch::new(id, SessionId::new(), 1, message, 0).unwrap();
    let body = serialize(
        &params,
        &old.child_conversation(&history, &block, &[]),
        true,
    )
    .body;
    match bounded(&remote, &body).await {
        Err(ProviderError::Status {
            status: 400,
            message,
            ..
        }) => assert!(
            message.contains("Expected 'thinking' or 'redacted_thinking', but found 'tool_use'"),
            "{message}"
        ),
        other => panic!("the old shape must be refused: {other:?}"),
    }
}
