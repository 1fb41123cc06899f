//! `POST /v1/messages`: the body handed to the sim unchanged, its answer sent back as an SSE
//! stream or as one message.
//!
//! The sim's first event (or its error) is awaited before the status line goes out, so a
//! scripted failure is an HTTP error status, as the real API answers an overloaded or
//! rate-limited request; an error after that is an SSE `error` event. When the sim limits its
//! rate, every response carries the `anthropic-ratelimit-*` headers: an admitted one as the sim
//! stated them when it admitted the request, any other as the limits stand when it answers.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use forkd_provider::{Accumulator, EventStream, ModelRequest, Provider, RateLimits, StreamEvent};
use futures::StreamExt;
use serde::Deserialize;

use crate::error::ApiError;
use crate::{AppState, authorize, wire};

/// The only fields the server itself reads; the sim parses the rest.
#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
}

pub(crate) async fn create(
    State(app): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request_id = format!("req_sim_{}", uuid::Uuid::now_v7().simple());
    let (mut response, limits) = match handle(&app, &headers, &body).await {
        Ok(answered) => answered,
        Err(e) => {
            tracing::debug!(status = e.status, message = %e.message, "Sim request failed");
            (e.into_response(), app.sim.rate_limits())
        }
    };
    let out = response.headers_mut();
    if let Ok(v) = request_id.parse() {
        out.insert("request-id", v);
    }
    let now = std::time::SystemTime::now();
    for (name, value) in limits.iter().flat_map(|l| l.anthropic_headers(now)) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            out.insert(name, value);
        }
    }
    response
}

/// A request body as text: both routes need UTF-8 (the sim and the counter parse it as JSON).
pub(crate) fn read_body(body: &[u8]) -> Result<&str, ApiError> {
    std::str::from_utf8(body).map_err(|_| ApiError::new(400, "the request body is not UTF-8"))
}

/// The response, and the limits the sim stated when it admitted the request.
async fn handle(
    app: &AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Response, Option<RateLimits>), ApiError> {
    authorize(headers, &app.config)?;
    let text = read_body(body)?;
    let head: Head = serde_json::from_str(text)
        .map_err(|e| ApiError::new(400, format!("the request body is not valid JSON: {e}")))?;
    let model = head
        .model
        .ok_or_else(|| ApiError::new(400, "model: Field required"))?;
    let mut events = app.sim.stream(ModelRequest {
        model: model.clone(),
        body: Arc::from(text),
    });
    let mut limits = None;
    let first = loop {
        match events.next().await {
            Some(Ok(StreamEvent::RateLimits(stated))) => limits = Some(stated),
            Some(Ok(event)) => break event,
            Some(Err(e)) => return Err(e.into()),
            None => return Err(ApiError::new(500, "the model produced no response")),
        }
    };
    let response = if head.stream == Some(true) {
        let cut = app.config.cuts.take();
        streamed(first, events, model, cut)
    } else {
        whole(first, events, &model).await?
    };
    Ok((response, limits))
}

/// What the body stream of a streamed response still has to do.
struct Frames {
    events: EventStream,
    model: String,
    sent: usize,
    cut: Option<usize>,
    done: bool,
}

/// The SSE response. A cut ends the body with an error, which makes hyper drop the connection
/// without the final chunk: the client sees the stream break, not end.
fn streamed(first: StreamEvent, rest: EventStream, model: String, cut: Option<usize>) -> Response {
    let events = futures::stream::once(async move { Ok(first) })
        .chain(rest)
        .boxed();
    let frames = Frames {
        events,
        model,
        sent: 0,
        cut,
        done: false,
    };
    let body = futures::stream::unfold(frames, |mut f| async move {
        if f.done {
            return None;
        }
        if f.cut == Some(f.sent) {
            f.done = true;
            tracing::debug!(
                after_events = f.sent,
                "Cutting the stream (fault injection)"
            );
            // hyper sends the status line with the first body chunk, or when the body is first
            // pending: one pending poll makes a cut before any event come after the headers.
            tokio::task::yield_now().await;
            let cut = std::io::Error::other("sim-server: stream cut (fault injection)");
            return Some((Err(cut), f));
        }
        let frame = match f.events.next().await? {
            Ok(event) => {
                f.sent += 1;
                let mut frame = wire::event_frame(&event, &f.model);
                if matches!(event, StreamEvent::MessageStart { .. }) {
                    frame.push_str(wire::PING);
                }
                frame
            }
            Err(e) => {
                f.done = true;
                wire::error_frame(&e.into())
            }
        };
        Some((Ok(Bytes::from(frame)), f))
    });
    (
        StatusCode::OK,
        [
            (CONTENT_TYPE, "text/event-stream; charset=utf-8"),
            (CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// The non-streaming response: the events folded into one message.
async fn whole(
    first: StreamEvent,
    mut rest: EventStream,
    model: &str,
) -> Result<Response, ApiError> {
    let mut acc = Accumulator::default();
    acc.push(&first).map_err(ApiError::from)?;
    while let Some(event) = rest.next().await {
        acc.push(&event?).map_err(ApiError::from)?;
    }
    let done = acc.finish()?;
    Ok((
        StatusCode::OK,
        [(CONTENT_TYPE, "application/json")],
        wire::message(&done, model).to_string(),
    )
        .into_response())
}
