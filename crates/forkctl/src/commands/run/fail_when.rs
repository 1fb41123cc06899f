//! `run --junit-fail-when JSONPATH=VALUE`: a completed child whose structured report (the
//! object its output schema shaped) has VALUE at JSONPATH fails its JUnit case, and the run
//! exits 1 — CI goes red on the model's verdict, not only on crashes.

use std::fmt;
use std::str::FromStr;

use serde_json::Value;
use serde_json_path::JsonPath;

/// One rule: a JSONPath (RFC 9535) and the value that fails a case.
#[derive(Debug, Clone)]
pub(crate) struct FailWhen {
    /// The rule as written, for messages.
    text: String,
    path: JsonPath,
    value: Value,
}

impl FromStr for FailWhen {
    type Err = String;

    /// `$.verdict=fail`: the path is the shortest prefix before an `=` that parses as a JSONPath
    /// (a filter such as `$[?@.a=='x']` has `=` of its own); VALUE is JSON (`true`, `3`,
    /// `"fail"`), or else the text as a string.
    fn from_str(text: &str) -> Result<Self, String> {
        let mut first_error = None;
        for (at, _) in text.match_indices('=') {
            match JsonPath::parse(&text[..at]) {
                Ok(path) => {
                    let raw = &text[at + 1..];
                    let value = serde_json::from_str(raw).unwrap_or_else(|_| Value::from(raw));
                    return Ok(Self {
                        text: text.to_owned(),
                        path,
                        value,
                    });
                }
                Err(e) => {
                    first_error.get_or_insert_with(|| e.to_string());
                }
            }
        }
        Err(match first_error {
            None => format!("{text:?} is not JSONPATH=VALUE (e.g. $.verdict=fail)"),
            Some(e) => format!("{text:?}: no JSONPath before an `=` ({e})"),
        })
    }
}

impl FailWhen {
    /// Whether any node the path selects in `object` equals the rule's value.
    pub(crate) fn matches(&self, object: &Value) -> bool {
        self.path
            .query(object)
            .all()
            .into_iter()
            .any(|node| *node == self.value)
    }
}

impl fmt::Display for FailWhen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The first rule a structured report matches.
pub(crate) fn first_match<'a>(rules: &'a [FailWhen], object: &Value) -> Option<&'a FailWhen> {
    rules.iter().find(|rule| rule.matches(object))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rule(text: &str) -> FailWhen {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn values_are_json_or_else_text() {
        let report = json!({"verdict": "fail", "score": 3, "ok": false, "tags": ["x", "flaky"]});
        for (text, hit) in [
            ("$.verdict=fail", true),
            ("$.verdict=\"fail\"", true),
            ("$.verdict=pass", false),
            ("$.score=3", true),
            ("$.score=\"3\"", false),
            ("$.ok=false", true),
            ("$.tags[*]=flaky", true),
            ("$.missing=null", false),
            ("$[?@.verdict=='fail'].score=3", false),
            ("$[?@=='fail']=fail", true),
        ] {
            assert_eq!(rule(text).matches(&report), hit, "{text}");
        }
        assert_eq!(rule("$.note=a=b").value, json!("a=b"));
    }

    #[test]
    fn a_rule_without_a_path_is_refused() {
        for text in ["verdict", "verdict=fail", "$.[=x"] {
            match text.parse::<FailWhen>() {
                Err(err) => assert!(err.contains(text), "{err}"),
                Ok(rule) => panic!("{text} parsed as {rule}"),
            }
        }
    }
}
