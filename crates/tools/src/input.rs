//! Typed access to a tool call's JSON input, with errors that name the offending field.

use serde_json::Value;

use crate::error::ToolError;

/// A required string field.
pub(crate) fn required_str<'a>(
    input: &'a Value,
    field: &'static str,
) -> Result<&'a str, ToolError> {
    match input.get(field) {
        None | Some(Value::Null) => Err(ToolError::MissingField { field }),
        Some(value) => value.as_str().ok_or(ToolError::WrongType {
            field,
            expected: "a string",
        }),
    }
}

/// An optional string field; `null` counts as absent.
pub(crate) fn optional_str<'a>(
    input: &'a Value,
    field: &'static str,
) -> Result<Option<&'a str>, ToolError> {
    match input.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value.as_str().map(Some).ok_or(ToolError::WrongType {
            field,
            expected: "a string",
        }),
    }
}

/// An optional positive integer field. Models sometimes send `"10"` or `10.0`; both are
/// accepted when they denote a whole number, since refusing them only costs a turn.
pub(crate) fn optional_positive(
    input: &Value,
    field: &'static str,
) -> Result<Option<u64>, ToolError> {
    let wrong = ToolError::WrongType {
        field,
        expected: "a positive integer",
    };
    let number = match input.get(field) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                .map(|f| f as u64)
        }),
        Some(Value::String(s)) => s.trim().parse::<u64>().ok(),
        Some(_) => None,
    };
    match number {
        Some(n) if n > 0 => Ok(Some(n)),
        _ => Err(wrong),
    }
}

/// An optional boolean field (default `false`).
pub(crate) fn optional_bool(input: &Value, field: &'static str) -> Result<bool, ToolError> {
    match input.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ToolError::WrongType {
            field,
            expected: "true or false",
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn errors_name_the_field() {
        let input = json!({"file_path": 3, "offset": "x", "replace_all": "yes"});
        let missing = required_str(&input, "content").unwrap_err().to_string();
        assert_eq!(missing, "missing required field `content`");
        let wrong = required_str(&input, "file_path").unwrap_err().to_string();
        assert_eq!(wrong, "field `file_path` must be a string");
        let bad_int = optional_positive(&input, "offset").unwrap_err().to_string();
        assert!(bad_int.contains("`offset`"), "{bad_int}");
        assert!(optional_bool(&input, "replace_all").is_err());
    }

    #[test]
    fn lenient_integers() {
        let input = json!({"a": 5, "b": "7", "c": 3.0, "d": 0, "e": -2, "f": 1.5});
        assert_eq!(optional_positive(&input, "a").unwrap(), Some(5));
        assert_eq!(optional_positive(&input, "b").unwrap(), Some(7));
        assert_eq!(optional_positive(&input, "c").unwrap(), Some(3));
        assert_eq!(optional_positive(&input, "missing").unwrap(), None);
        for field in ["d", "e", "f"] {
            assert!(optional_positive(&input, field).is_err(), "{field}");
        }
    }
}
