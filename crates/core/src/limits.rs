//! Limits on an agent's run: wall time, time without progress, model requests, output tokens
//! (docs/contracts.md, "Limits"). An agent past one ends `timed_out`, saying which.
//!
//! Limits come in layers — a child's own, its batch's, its tenant's defaults, the daemon's — and
//! [`Limits::over`] lays one over the next: a field set in the upper layer wins. None of them
//! changes a byte of a model request: the output-token cap is checked on counted usage between
//! requests, never sent as a per-child `max_tokens` (which sits before `tools` in the request and
//! would split siblings' shared prefix).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The limits of one agent's run; `None`: no limit at this layer (a lower layer's, if any).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Wall time from the agent's first start, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Time without a model output token and without a tool call starting or finishing, in
    /// milliseconds. Time its requests wait on the provider's limits is not counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// Model requests at most.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    /// Output tokens at most, over its counted usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
    /// Whether `timeout` leaves out the time its requests waited on the provider's limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_excludes_throttle: Option<bool>,
}

impl Limits {
    /// `self` laid over `below`: each field `self` sets, else `below`'s.
    pub fn over(self, below: Limits) -> Limits {
        Limits {
            timeout_ms: self.timeout_ms.or(below.timeout_ms),
            idle_timeout_ms: self.idle_timeout_ms.or(below.idle_timeout_ms),
            max_turns: self.max_turns.or(below.max_turns),
            max_output_tokens: self.max_output_tokens.or(below.max_output_tokens),
            timeout_excludes_throttle: self
                .timeout_excludes_throttle
                .or(below.timeout_excludes_throttle),
        }
    }

    /// Whether no field is set.
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }

    /// A limit of zero is refused (it would stop the agent before it starts): the field's name.
    pub fn check(&self) -> Result<(), String> {
        let zero = [
            ("timeout", self.timeout_ms == Some(0)),
            ("idle_timeout", self.idle_timeout_ms == Some(0)),
            ("max_turns", self.max_turns == Some(0)),
            ("max_output_tokens", self.max_output_tokens == Some(0)),
        ];
        match zero.iter().find(|(_, is_zero)| *is_zero) {
            Some((name, _)) => Err(format!(
                "{name} must be more than 0 (leave it unset for no limit)"
            )),
            None => Ok(()),
        }
    }

    pub fn timeout(&self) -> Option<Duration> {
        self.timeout_ms.map(Duration::from_millis)
    }

    pub fn idle_timeout(&self) -> Option<Duration> {
        self.idle_timeout_ms.map(Duration::from_millis)
    }

    pub fn excludes_throttle(&self) -> bool {
        self.timeout_excludes_throttle.unwrap_or(false)
    }
}

/// The limit that stopped an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Timeout(Duration),
    IdleTimeout(Duration),
    MaxTurns(u32),
    MaxOutputTokens(u64),
}

impl Limit {
    /// Its name as options and the JSON shapes spell it.
    pub fn name(self) -> &'static str {
        match self {
            Limit::Timeout(_) => "timeout",
            Limit::IdleTimeout(_) => "idle_timeout",
            Limit::MaxTurns(_) => "max_turns",
            Limit::MaxOutputTokens(_) => "max_output_tokens",
        }
    }
}

impl fmt::Display for Limit {
    /// What stopped it, as the agent's error and report say: `timed out: its timeout of 10m
    /// (wall time since it started) ran out`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Timeout(d) => write!(
                f,
                "timed out: its timeout of {} (wall time since it started) ran out",
                short(*d)
            ),
            Limit::IdleTimeout(d) => write!(
                f,
                "timed out: no model output and no tool call started or finished for {} \
                 (its idle_timeout)",
                short(*d)
            ),
            Limit::MaxTurns(n) => write!(
                f,
                "timed out: no final answer after {n} model requests (its max_turns)"
            ),
            Limit::MaxOutputTokens(n) => write!(
                f,
                "timed out: it wrote {n} output tokens or more (its max_output_tokens)"
            ),
        }
    }
}

/// `d` as people write it: `90s`, `10m`, `1h30m`, `1.5s`.
pub fn short(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) {
        return format!("{}s", d.as_secs_f64());
    }
    let s = d.as_secs();
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_upper_layer_s_fields_win_and_the_rest_come_from_below() {
        let child = Limits {
            timeout_ms: Some(1_000),
            ..Limits::default()
        };
        let batch = Limits {
            timeout_ms: Some(60_000),
            max_turns: Some(30),
            ..Limits::default()
        };
        let daemon = Limits {
            max_turns: Some(50),
            idle_timeout_ms: Some(900_000),
            ..Limits::default()
        };
        let resolved = child.over(batch).over(daemon);
        assert_eq!(resolved.timeout_ms, Some(1_000));
        assert_eq!(resolved.max_turns, Some(30));
        assert_eq!(resolved.idle_timeout_ms, Some(900_000));
        assert_eq!(resolved.max_output_tokens, None);
        assert!(!resolved.excludes_throttle());
    }

    #[test]
    fn a_zero_limit_is_refused_by_name() {
        let limits = Limits {
            idle_timeout_ms: Some(0),
            ..Limits::default()
        };
        assert!(limits.check().unwrap_err().starts_with("idle_timeout"));
        assert!(Limits::default().check().is_ok());
    }

    #[test]
    fn limits_are_stored_as_the_fields_set() {
        let limits = Limits {
            max_turns: Some(3),
            ..Limits::default()
        };
        let json = serde_json::to_string(&limits).unwrap();
        assert_eq!(json, r#"{"max_turns":3}"#);
        assert_eq!(serde_json::from_str::<Limits>(&json).unwrap(), limits);
        assert!(serde_json::from_str::<Limits>(r#"{"max_turn":3}"#).is_err());
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(short(Duration::from_secs(600)), "10m");
        assert_eq!(short(Duration::from_secs(5400)), "1h30m");
        assert_eq!(short(Duration::from_secs(0)), "0s");
        assert_eq!(short(Duration::from_millis(1500)), "1.5s");
        assert_eq!(
            Limit::Timeout(Duration::from_secs(2)).to_string(),
            "timed out: its timeout of 2s (wall time since it started) ran out"
        );
    }
}
