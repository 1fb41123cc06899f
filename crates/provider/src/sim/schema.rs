//! What the sim answers to an output schema (docs/contracts.md, "Output schemas") when its script
//! names no `json` line: a minimal object valid against the schema, so demos and benches that ask
//! for typed results run without writing one.
//!
//! This is best effort, not a solver. It follows what schemas for results usually say — `type`,
//! `required` and `properties`, `enum` and `const`, local `$ref`s, `allOf`, the first branch of
//! `anyOf`/`oneOf`, `prefixItems`/`items`/`minItems`, string lengths and common formats, numeric
//! bounds — and ignores the rest (`pattern`, `not`, `if`/`then`/`else`, `uniqueItems`,
//! `dependentRequired`, …). A schema that leans on those may get an object that does not match,
//! which forkd then reports as it would a model's.

use serde_json::{Map, Number, Value};

/// How deep `$ref`s and nested schemas are followed: a cycle stops here.
const MAX_DEPTH: usize = 32;

/// How many schemas one answer may visit: `allOf`s of `$ref`s that fan out cannot take for ever.
const BUDGET: usize = 4_096;

/// The most bytes (roughly) one answer writes: a `minItems` or `minLength` past it is not met.
const MAX_BYTES: usize = 1 << 20;

/// Keywords whose largest value binds when schemas combine.
const LOWER_BOUNDS: [&str; 6] = [
    "minimum",
    "exclusiveMinimum",
    "minLength",
    "minItems",
    "minProperties",
    "minContains",
];

/// Keywords whose smallest value binds when schemas combine.
const UPPER_BOUNDS: [&str; 6] = [
    "maximum",
    "exclusiveMaximum",
    "maxLength",
    "maxItems",
    "maxProperties",
    "maxContains",
];

/// A minimal object valid against `schema` (best effort; see the module's notes). The answer is
/// always an object, as a final reply must be: a schema whose minimal value is something else
/// gets `{}`.
pub(crate) fn minimal(schema: &Value) -> Value {
    let mut generator = Generator {
        root: schema,
        budget: BUDGET,
        bytes: MAX_BYTES,
    };
    match generator.value(schema, 0) {
        object @ Value::Object(_) => object,
        _ => Value::Object(Map::new()),
    }
}

struct Generator<'a> {
    /// The schema `$ref`s resolve against.
    root: &'a Value,
    /// Schemas still allowed to be visited.
    budget: usize,
    /// Bytes of answer still allowed: long strings, and arrays of copies, come out of it.
    bytes: usize,
}

impl Generator<'_> {
    /// Spends one visit; false when the budget or the depth is spent.
    fn enter(&mut self, depth: usize) -> bool {
        if depth > MAX_DEPTH || self.budget == 0 {
            return false;
        }
        self.budget -= 1;
        true
    }

    /// Spends `n` bytes of answer; false (spending nothing) when fewer are left.
    fn charge(&mut self, n: usize) -> bool {
        match self.bytes.checked_sub(n) {
            Some(left) => {
                self.bytes = left;
                true
            }
            None => false,
        }
    }

    /// The schema's keywords with its `$ref` target, its `allOf` members and the first branch of
    /// its `anyOf`/`oneOf` folded in, as if one schema said all of them.
    fn flatten(&mut self, schema: &Value, depth: usize) -> Map<String, Value> {
        let mut out = Map::new();
        let Some(object) = schema.as_object() else {
            return out;
        };
        if !self.enter(depth) {
            return out;
        }
        for (key, value) in object {
            if !matches!(
                key.as_str(),
                "$ref" | "allOf" | "anyOf" | "oneOf" | "$defs" | "definitions"
            ) {
                merge_keyword(&mut out, key, value);
            }
        }
        let root = self.root;
        let mut parts: Vec<&Value> = Vec::new();
        if let Some(target) = object
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| resolve(root, r))
        {
            parts.push(target);
        }
        if let Some(all) = object.get("allOf").and_then(Value::as_array) {
            parts.extend(all);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(first) = object
                .get(key)
                .and_then(Value::as_array)
                .and_then(|a| a.first())
            {
                parts.push(first);
            }
        }
        for part in parts {
            let flat = self.flatten(part, depth + 1);
            for (key, value) in &flat {
                merge_keyword(&mut out, key, value);
            }
        }
        out
    }

    /// A minimal value valid against `schema`; null where nothing is known (or nothing is valid).
    fn value(&mut self, schema: &Value, depth: usize) -> Value {
        if !schema.is_object() || depth > MAX_DEPTH || self.budget == 0 {
            // `true` accepts anything, null included; `false` accepts nothing at all.
            return Value::Null;
        }
        let s = self.flatten(schema, depth);
        if let Some(constant) = s.get("const") {
            return constant.clone();
        }
        if let Some(first) = s
            .get("enum")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
        {
            return first.clone();
        }
        match type_of(&s) {
            Some("object") => self.object(&s, depth),
            Some("array") => self.array(&s, depth),
            Some("string") => self.string(&s),
            Some("integer") => number(&s, true),
            Some("number") => number(&s, false),
            Some("boolean") => Value::Bool(false),
            _ => Value::Null,
        }
    }

    /// Every required property; then, for `minProperties`, the other declared ones in order, then
    /// made-up names where extra properties are allowed.
    fn object(&mut self, s: &Map<String, Value>, depth: usize) -> Value {
        let empty = Map::new();
        let properties = s
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let additional = s.get("additionalProperties");
        let mut out = Map::new();
        let required = s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str);
        for name in required {
            if out.contains_key(name) {
                continue;
            }
            let value = match properties.get(name).or(additional) {
                Some(sub) => self.value(sub, depth + 1),
                None => Value::Null,
            };
            out.insert(name.to_owned(), value);
        }
        let wanted = bound(s, "minProperties");
        for (name, sub) in properties {
            if out.len() >= wanted {
                break;
            }
            // A `false` property may not be present at all.
            if !out.contains_key(name) && sub != &Value::Bool(false) {
                let value = self.value(sub, depth + 1);
                out.insert(name.clone(), value);
            }
        }
        if additional != Some(&Value::Bool(false)) {
            let mut n = 0;
            while out.len() < wanted {
                n += 1;
                let name = format!("x{n}");
                if out.contains_key(&name) {
                    continue;
                }
                let value = additional.map_or(Value::Null, |sub| self.value(sub, depth + 1));
                if !self.charge(name.len() + weight(&value)) {
                    break;
                }
                out.insert(name, value);
            }
        }
        Value::Object(out)
    }

    /// `prefixItems` each, the `contains` item `minContains` times, then `minItems` filled with
    /// the minimal item of `items`.
    fn array(&mut self, s: &Map<String, Value>, depth: usize) -> Value {
        let mut out = Vec::new();
        for prefix in s
            .get("prefixItems")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            out.push(self.value(prefix, depth + 1));
        }
        if let Some(contains) = s.get("contains") {
            let times = if s.contains_key("minContains") {
                bound(s, "minContains")
            } else {
                1
            };
            if times > 0 {
                let item = self.value(contains, depth + 1);
                self.fill(&mut out, item, times);
            }
        }
        let wanted = bound(s, "minItems");
        if out.len() < wanted {
            let item = s
                .get("items")
                .map_or(Value::Null, |sub| self.value(sub, depth + 1));
            let times = wanted - out.len();
            self.fill(&mut out, item, times);
        }
        Value::Array(out)
    }

    /// Appends `times` copies of `item`, as many as the bytes left allow.
    fn fill(&mut self, out: &mut Vec<Value>, item: Value, times: usize) {
        let each = weight(&item);
        let times = times.min(self.bytes / each);
        self.bytes -= times * each;
        out.resize(out.len() + times, item);
    }

    /// A value of a common format, else `minLength` x's.
    fn string(&mut self, s: &Map<String, Value>) -> Value {
        let formatted = match s.get("format").and_then(Value::as_str) {
            Some("date-time") => Some("1970-01-01T00:00:00Z"),
            Some("date") => Some("1970-01-01"),
            Some("time") => Some("00:00:00Z"),
            Some("email" | "idn-email") => Some("a@example.com"),
            Some("uri" | "iri" | "uri-reference" | "iri-reference") => Some("https://example.com"),
            Some("hostname" | "idn-hostname") => Some("example.com"),
            Some("ipv4") => Some("127.0.0.1"),
            Some("ipv6") => Some("::1"),
            Some("uuid") => Some("00000000-0000-0000-0000-000000000000"),
            Some("duration") => Some("P1D"),
            _ => None,
        };
        let wanted = bound(s, "minLength");
        match formatted {
            Some(f) if f.chars().count() >= wanted => Value::String(f.to_owned()),
            _ => {
                let wanted = wanted.min(self.bytes);
                self.bytes -= wanted;
                Value::String("x".repeat(wanted))
            }
        }
    }
}

/// A non-negative integer keyword (`minItems`, …), 0 when absent.
fn bound(s: &Map<String, Value>, key: &str) -> usize {
    s.get(key)
        .and_then(Value::as_f64)
        .filter(|n| *n > 0.0)
        .map_or(0, |n| {
            // Saturates: a bound past any real length is capped by the caller.
            n.ceil() as usize
        })
}

/// The type to produce: `type` as a string, or the first non-null entry of an array of them;
/// without `type`, what the keywords present imply.
fn type_of(s: &Map<String, Value>) -> Option<&str> {
    match s.get("type") {
        Some(Value::String(t)) => return Some(t),
        Some(Value::Array(types)) => {
            let mut names = types.iter().filter_map(Value::as_str);
            return names
                .clone()
                .find(|t| *t != "null")
                .or_else(|| names.next());
        }
        _ => {}
    }
    let has = |keys: &[&str]| keys.iter().any(|k| s.contains_key(*k));
    if has(&[
        "properties",
        "required",
        "additionalProperties",
        "patternProperties",
        "minProperties",
    ]) {
        Some("object")
    } else if has(&["prefixItems", "items", "minItems", "contains"]) {
        Some("array")
    } else if has(&["minLength", "maxLength", "format"]) {
        Some("string")
    } else if has(&[
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
    ]) {
        Some("number")
    } else {
        None
    }
}

/// 0, moved into the bounds: an exclusive minimum adds 1 to an integer, 0.5 to a number (the
/// middle of the range where that overshoots it); then up to a multiple of `multipleOf` where
/// that stays in bounds.
fn number(s: &Map<String, Value>, integer: bool) -> Value {
    let get = |k: &str| s.get(k).and_then(Value::as_f64);
    let step = if integer { 1.0 } else { 0.5 };
    let round_up = |n: f64| if integer { n.ceil() } else { n };
    let round_down = |n: f64| if integer { n.floor() } else { n };
    let lows = [
        get("minimum").map(round_up),
        get("exclusiveMinimum").map(|e| round_down(e) + step),
    ];
    let highs = [
        get("maximum").map(round_down),
        get("exclusiveMaximum").map(|e| round_up(e) - step),
    ];
    let low = lows.into_iter().flatten().reduce(f64::max);
    let high = highs.into_iter().flatten().reduce(f64::min);
    let mut v = 0.0_f64;
    if let Some(low) = low
        && v < low
    {
        v = low;
    }
    if let Some(high) = high
        && v > high
    {
        v = high;
    }
    if let (Some(low), Some(high)) = (low, high)
        && low > high
        && !integer
    {
        // A narrow exclusive range: its middle.
        let lo = [get("minimum"), get("exclusiveMinimum")]
            .into_iter()
            .flatten()
            .reduce(f64::max)
            .unwrap_or(low);
        let hi = [get("maximum"), get("exclusiveMaximum")]
            .into_iter()
            .flatten()
            .reduce(f64::min)
            .unwrap_or(high);
        v = (lo + hi) / 2.0;
    }
    if let Some(m) = get("multipleOf").filter(|m| *m > 0.0)
        && (!integer || m.fract() == 0.0)
        && (v / m).fract() != 0.0
    {
        let up = (v / m).ceil() * m;
        let down = (v / m).floor() * m;
        if high.is_none_or(|h| up <= h) {
            v = up;
        } else if low.is_none_or(|l| down >= l) {
            v = down;
        }
    }
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        // Whole: written without a fraction, which an integer needs.
        Value::Number(Number::from(v as i64))
    } else {
        Number::from_f64(v).map_or(Value::Null, Value::Number)
    }
}

/// Roughly the bytes a value takes as compact JSON (at least 1).
fn weight(value: &Value) -> usize {
    match value {
        Value::Null | Value::Bool(_) | Value::Number(_) => 5,
        Value::String(s) => s.len() + 2,
        Value::Array(items) => items.iter().map(weight).sum::<usize>() + 2,
        Value::Object(map) => {
            map.iter()
                .map(|(k, v)| k.len() + 3 + weight(v))
                .sum::<usize>()
                + 2
        }
    }
}

/// Merges one keyword into a flattened schema: the first value wins, except where both bind
/// (`required` unites, `properties` combine, bounds tighten, `type`s intersect).
fn merge_keyword(out: &mut Map<String, Value>, key: &str, value: &Value) {
    let Some(old) = out.get_mut(key) else {
        out.insert(key.to_owned(), value.clone());
        return;
    };
    match key {
        "required" => {
            if let (Some(have), Some(more)) = (old.as_array_mut(), value.as_array()) {
                for name in more {
                    if !have.contains(name) {
                        have.push(name.clone());
                    }
                }
            }
        }
        "properties" => {
            if let (Some(have), Some(more)) = (old.as_object_mut(), value.as_object()) {
                for (name, sub) in more {
                    match have.get_mut(name) {
                        Some(first) => {
                            *first = serde_json::json!({"allOf": [first.take(), sub.clone()]});
                        }
                        None => {
                            have.insert(name.clone(), sub.clone());
                        }
                    }
                }
            }
        }
        "items" | "additionalProperties" | "contains" => {
            *old = serde_json::json!({"allOf": [old.take(), value.clone()]});
        }
        "type" => *old = meet(old, value),
        k if LOWER_BOUNDS.contains(&k) => {
            if let (Some(a), Some(b)) = (old.as_f64(), value.as_f64())
                && b > a
            {
                *old = value.clone();
            }
        }
        k if UPPER_BOUNDS.contains(&k) => {
            if let (Some(a), Some(b)) = (old.as_f64(), value.as_f64())
                && b < a
            {
                *old = value.clone();
            }
        }
        _ => {}
    }
}

/// The types two `type` keywords both allow (an integer is a number), in the first's order; the
/// first's when they share none.
fn meet(first: &Value, second: &Value) -> Value {
    let names = |v: &Value| -> Vec<String> {
        match v {
            Value::String(t) => vec![t.clone()],
            Value::Array(ts) => ts
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            _ => Vec::new(),
        }
    };
    let (a, b) = (names(first), names(second));
    let mut both: Vec<Value> = Vec::new();
    for t in &a {
        let shared = if b.contains(t) {
            Some(t.as_str())
        } else if (t == "number" && b.iter().any(|x| x == "integer"))
            || (t == "integer" && b.iter().any(|x| x == "number"))
        {
            Some("integer")
        } else {
            None
        };
        if let Some(t) = shared
            && !both.iter().any(|x| x == t)
        {
            both.push(Value::String(t.to_owned()));
        }
    }
    match both.len() {
        0 => first.clone(),
        1 => both.swap_remove(0),
        _ => Value::Array(both),
    }
}

/// A local reference (`#`, `#/$defs/x`, `#/definitions/x`, any JSON pointer) resolved against the
/// root; anchors and other documents are not followed.
fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    if pointer.is_empty() {
        return Some(root);
    }
    let decoded = pointer.replace("%25", "%");
    root.pointer(&decoded)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use forkd_core::output::OutputSchema;
    use serde_json::json;

    use super::*;

    /// Each schema's minimal object, checked by forkd's own validator.
    fn assert_valid(schema: &Value) -> Value {
        let object = minimal(schema);
        let checked = OutputSchema::from_value(schema)
            .unwrap()
            .check(&object.to_string());
        assert!(checked.is_ok(), "{schema}\ngave {object}: {checked:?}");
        object
    }

    #[test]
    fn a_required_enum_and_a_filled_array() {
        let object = assert_valid(&json!({
            "type": "object",
            "required": ["verdict", "findings"],
            "properties": {
                "verdict": {"enum": ["pass", "fail"]},
                "findings": {"type": "array", "items": {"type": "string", "minLength": 2}, "minItems": 2},
                "note": {"type": "string"}
            },
            "additionalProperties": false
        }));
        assert_eq!(object, json!({"verdict": "pass", "findings": ["xx", "xx"]}));
    }

    #[test]
    fn nested_objects_and_an_untyped_object() {
        let object = assert_valid(&json!({
            "type": "object",
            "required": ["outer", "loose"],
            "properties": {
                "outer": {
                    "type": "object",
                    "required": ["inner"],
                    "properties": {"inner": {
                        "type": "object",
                        "required": ["flag", "nothing", "c"],
                        "properties": {
                            "flag": {"type": "boolean"},
                            "nothing": {"type": "null"},
                            "c": {"const": {"k": [1]}}
                        }
                    }}
                },
                "loose": {"required": ["any"]}
            }
        }));
        assert_eq!(
            object,
            json!({
                "outer": {"inner": {"flag": false, "nothing": null, "c": {"k": [1]}}},
                "loose": {"any": null}
            })
        );
    }

    #[test]
    fn references_resolve_and_cycles_stop() {
        let object = assert_valid(&json!({
            "$defs": {
                "verdict": {"enum": ["ok", "bad"]},
                "finding": {
                    "type": "object",
                    "required": ["file", "line"],
                    "properties": {"file": {"type": "string"}, "line": {"type": "integer", "minimum": 1}}
                },
                "tree": {
                    "type": "object",
                    "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/tree"}}}
                }
            },
            "definitions": {"count": {"type": "integer", "minimum": 3}},
            "type": "object",
            "required": ["verdict", "first", "count", "tree"],
            "properties": {
                "verdict": {"$ref": "#/$defs/verdict"},
                "first": {"$ref": "#/$defs/finding"},
                "count": {"$ref": "#/definitions/count"},
                "tree": {"$ref": "#/$defs/tree"},
                "self": {"$ref": "#"}
            }
        }));
        assert_eq!(
            object,
            json!({"verdict": "ok", "first": {"file": "", "line": 1}, "count": 3, "tree": {}})
        );
        // A schema that requires itself has no finite instance: the depth limit ends it.
        let endless = json!({
            "$defs": {"node": {"type": "object", "required": ["next"],
                               "properties": {"next": {"$ref": "#/$defs/node"}}}},
            "$ref": "#/$defs/node"
        });
        assert!(minimal(&endless).is_object());
        // Fan-out through allOf stops on the budget, not after 2^32 visits.
        let mut defs = Map::new();
        for i in 0..40 {
            let next = format!("#/$defs/d{}", i + 1);
            defs.insert(
                format!("d{i}"),
                json!({"allOf": [{"$ref": next}, {"$ref": next}]}),
            );
        }
        defs.insert("d40".into(), json!({"type": "object"}));
        assert!(minimal(&json!({"$defs": defs, "$ref": "#/$defs/d0"})).is_object());
    }

    #[test]
    fn all_of_merges_its_members() {
        let object = assert_valid(&json!({
            "allOf": [
                {"type": "object", "required": ["a"], "properties": {"a": {"type": "string"}}},
                {"required": ["b"], "properties": {"b": {"type": "integer", "minimum": 5}}},
                {"properties": {"a": {"minLength": 3}}}
            ]
        }));
        assert_eq!(object, json!({"a": "xxx", "b": 5}));
    }

    #[test]
    fn one_of_and_any_of_take_the_first_branch() {
        let object = assert_valid(&json!({
            "type": "object",
            "required": ["result", "size"],
            "properties": {
                "result": {"oneOf": [
                    {"type": "object", "required": ["kind", "value"],
                     "properties": {"kind": {"const": "ok"}, "value": {"type": "number"}}},
                    {"type": "object", "required": ["kind", "error"],
                     "properties": {"kind": {"const": "err"}, "error": {"type": "string"}}}
                ]},
                "size": {"anyOf": [{"type": "integer", "minimum": 10}, {"type": "null"}]}
            }
        }));
        assert_eq!(
            object,
            json!({"result": {"kind": "ok", "value": 0}, "size": 10})
        );
    }

    #[test]
    fn type_arrays_take_the_first_non_null_type() {
        let object = assert_valid(&json!({
            "type": "object",
            "required": ["a", "b", "c"],
            "properties": {
                "a": {"type": ["null", "string"], "minLength": 1},
                "b": {"type": ["integer", "string"]},
                "c": {"type": ["null"]}
            }
        }));
        assert_eq!(object, json!({"a": "x", "b": 0, "c": null}));
    }

    #[test]
    fn strings_have_their_length_and_format() {
        let object = assert_valid(&json!({
            "type": "object",
            "required": ["name", "at", "on", "mail", "link", "empty", "long"],
            "properties": {
                "name": {"type": "string", "minLength": 4, "maxLength": 8},
                "at": {"type": "string", "format": "date-time"},
                "on": {"type": "string", "format": "date"},
                "mail": {"type": "string", "format": "email"},
                "link": {"type": "string", "format": "uri"},
                "empty": {"type": "string", "minLength": 0},
                "long": {"type": "string", "format": "date", "minLength": 12}
            }
        }));
        assert_eq!(
            object,
            json!({
                "name": "xxxx", "at": "1970-01-01T00:00:00Z", "on": "1970-01-01",
                "mail": "a@example.com", "link": "https://example.com", "empty": "",
                "long": "xxxxxxxxxxxx"
            })
        );
    }

    #[test]
    fn numbers_move_into_their_bounds() {
        let object = assert_valid(&json!({
            "type": "object",
            "required": ["score", "ratio", "neg", "step", "narrow", "plain"],
            "properties": {
                "score": {"type": "integer", "exclusiveMinimum": 0, "maximum": 10},
                "ratio": {"type": "number", "exclusiveMinimum": 1},
                "neg": {"type": "integer", "maximum": -3},
                "step": {"type": "integer", "minimum": 7, "multipleOf": 5},
                "narrow": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 0.1},
                "plain": {"type": "number"}
            }
        }));
        assert_eq!(
            object,
            json!({"score": 1, "ratio": 1.5, "neg": -3, "step": 10, "narrow": 0.05, "plain": 0})
        );
    }

    #[test]
    fn prefix_items_then_items() {
        let object = assert_valid(&json!({
            "type": "object",
            "required": ["pair", "tagged"],
            "properties": {
                "pair": {
                    "type": "array",
                    "prefixItems": [{"type": "string", "format": "date"}, {"type": "integer", "minimum": 2}],
                    "items": {"type": "boolean"},
                    "minItems": 4
                },
                "tagged": {"type": "array", "contains": {"const": "x"}, "minContains": 2}
            }
        }));
        assert_eq!(
            object,
            json!({"pair": ["1970-01-01", 2, false, false], "tagged": ["x", "x"]})
        );
    }

    #[test]
    fn boolean_schemas_min_properties_and_untyped_roots() {
        assert_valid(&json!({
            "type": "object",
            "required": ["anything"],
            "properties": {"anything": true, "never": false},
            "minProperties": 2,
            "additionalProperties": {"type": "integer"}
        }));
        assert_eq!(minimal(&json!({"description": "free"})), json!({}));
        // The answer is an object even where the schema wants something else.
        assert_eq!(minimal(&json!({"type": "string"})), json!({}));
    }
}
