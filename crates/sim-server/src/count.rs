//! `POST /v1/messages/count_tokens`: the request's input tokens, counted block by block as the
//! sim counts them, so the answer equals the input side of the usage a request would report.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use forkd_core::pricing;
use forkd_provider::tokens::{block_tokens, count};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::messages::read_body;
use crate::{AppState, authorize};

#[derive(Deserialize)]
struct CountBody {
    model: String,
    #[serde(default)]
    tools: Vec<Value>,
    #[serde(default)]
    system: Option<Value>,
    messages: Vec<CountMessage>,
}

#[derive(Deserialize)]
struct CountMessage {
    content: Value,
}

pub(crate) async fn count_tokens(
    State(app): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let counted = authorize(&headers, &app.config)
        .and_then(|()| read_body(&body))
        .and_then(input_tokens);
    match counted {
        Ok(n) => (
            [(CONTENT_TYPE, "application/json")],
            json!({"input_tokens": n}).to_string(),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

/// A block's JSON without its breakpoint: what the sim counts (a breakpoint costs no tokens).
fn identity(block: &Value, what: &str) -> Result<String, ApiError> {
    let Value::Object(map) = block else {
        return Err(ApiError::new(400, format!("{what}: not an object")));
    };
    let mut map = map.clone();
    // `shift_remove` keeps the other keys in order, so the JSON is the block's own.
    map.shift_remove("cache_control");
    serde_json::to_string(&map).map_err(|e| ApiError::new(400, format!("{what}: {e}")))
}

fn text_block(text: &str) -> Value {
    let mut map = Map::new();
    map.insert("type".into(), Value::from("text"));
    map.insert("text".into(), Value::from(text));
    Value::Object(map)
}

/// The input tokens of a request body.
pub(crate) fn input_tokens(body: &str) -> Result<u64, ApiError> {
    let body: CountBody = serde_json::from_str(body)
        .map_err(|e| ApiError::new(400, format!("the request body is invalid: {e}")))?;
    if pricing::model(&body.model).is_none() {
        return Err(ApiError::new(
            400,
            format!(
                "unknown model {:?}; known: {}",
                body.model,
                pricing::model_names()
            ),
        ));
    }
    let mut total = 0;
    for (i, tool) in body.tools.iter().enumerate() {
        total += block_tokens(&identity(tool, &format!("tools[{i}]"))?);
    }
    match &body.system {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => total += count(text),
        Some(Value::Array(blocks)) => {
            for block in blocks {
                total += count(block.get("text").and_then(Value::as_str).unwrap_or(""));
            }
        }
        Some(_) => {
            return Err(ApiError::new(
                400,
                "system: not a string or a list of blocks",
            ));
        }
    }
    for (i, message) in body.messages.iter().enumerate() {
        let blocks = match &message.content {
            Value::String(text) => vec![text_block(text)],
            Value::Array(blocks) => blocks.clone(),
            _ => {
                return Err(ApiError::new(
                    400,
                    format!("messages[{i}].content: invalid"),
                ));
            }
        };
        for (bi, block) in blocks.iter().enumerate() {
            total += block_tokens(&identity(block, &format!("messages[{i}].content[{bi}]"))?);
        }
    }
    Ok(total)
}
