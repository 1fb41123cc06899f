//! A `tools/call` result as the model sees it: text content joined, structured content as JSON
//! when no text carries it, images kept as images, `isError` as an error result.

use serde_json::Value;

/// One image of a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub media_type: String,
    /// Base64, as the server sent it.
    pub data: String,
}

/// What a call produced, for the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallOutput {
    pub text: String,
    pub images: Vec<Image>,
    pub is_error: bool,
}

impl CallOutput {
    pub fn error(text: impl Into<String>) -> CallOutput {
        CallOutput {
            text: text.into(),
            images: Vec::new(),
            is_error: true,
        }
    }
}

/// Maps a `CallToolResult` (as JSON) into the model's view of it.
pub fn map_result(result: &Value) -> CallOutput {
    let mut parts: Vec<String> = Vec::new();
    let mut images = Vec::new();
    let items = result
        .get("content")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for item in &items {
        let str_of = |key: &str| item.get(key).and_then(Value::as_str).unwrap_or_default();
        match str_of("type") {
            "text" => parts.push(str_of("text").to_owned()),
            "image" => images.push(Image {
                media_type: str_of("mimeType").to_owned(),
                data: str_of("data").to_owned(),
            }),
            "audio" => parts.push(format!(
                "[audio ({}) omitted: the model cannot receive audio]",
                str_of("mimeType")
            )),
            "resource_link" => parts.push(format!(
                "[resource {}{}]",
                str_of("uri"),
                match str_of("name") {
                    "" => String::new(),
                    name => format!(" ({name})"),
                }
            )),
            "resource" => {
                let resource = item.get("resource").cloned().unwrap_or(Value::Null);
                match resource.get("text").and_then(Value::as_str) {
                    Some(text) => parts.push(text.to_owned()),
                    None => parts.push(format!(
                        "[binary resource {} omitted]",
                        resource
                            .get("uri")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                    )),
                }
            }
            other => parts.push(format!("[content of type {other:?} omitted]")),
        }
    }
    // Structured content is meant to be repeated as text by the server; where it is not, the
    // model still gets it.
    if parts.is_empty()
        && let Some(structured) = result.get("structuredContent").filter(|v| !v.is_null())
    {
        parts.push(structured.to_string());
    }
    CallOutput {
        text: parts.join("\n"),
        images,
        is_error: result
            .get("isError")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn results_map_by_content_type() {
        let out = map_result(&json!({
            "content": [
                {"type": "text", "text": "one"},
                {"type": "image", "data": "AAAA", "mimeType": "image/png"},
                {"type": "resource", "resource": {"uri": "file:///a", "text": "two"}},
                {"type": "resource_link", "uri": "file:///b", "name": "b"}
            ],
            "isError": true
        }));
        assert_eq!(out.text, "one\ntwo\n[resource file:///b (b)]");
        assert_eq!(
            out.images,
            [Image {
                media_type: "image/png".into(),
                data: "AAAA".into()
            }]
        );
        assert!(out.is_error);
    }

    #[test]
    fn structured_content_shows_when_no_text_carries_it() {
        let out = map_result(&json!({"content": [], "structuredContent": {"sum": 3}}));
        assert_eq!(out.text, r#"{"sum":3}"#);
        assert!(!out.is_error);
        let out = map_result(&json!({
            "content": [{"type": "text", "text": "3"}],
            "structuredContent": {"sum": 3}
        }));
        assert_eq!(out.text, "3");
    }
}
