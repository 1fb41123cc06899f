//! A provider's rate limits as its responses state them: Anthropic's
//! `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`
//! (resets as RFC 3339 instants) and OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`
//! (resets as Go durations such as `6m0s`), read into one shape. The limiter in forkd's engine
//! paces requests by them; the sim writes the Anthropic headers for its own limits.

use std::time::{Duration, SystemTime};

/// One limit as a response stated it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// The most the limit admits when it is full (requests, or tokens).
    pub limit: u64,
    /// What it still admits now.
    pub remaining: u64,
    /// How long until it is full again (Anthropic: "fully replenished"; OpenAI: "reset").
    pub reset: Duration,
}

impl Quota {
    /// The rate at which the limit refills, where the quota tells it: what is missing over the
    /// time it takes to come back (a token bucket refills continuously). `None` while it is
    /// full, or when the response gave no time.
    pub fn refill_per_sec(&self) -> Option<f64> {
        let missing = self.limit.saturating_sub(self.remaining);
        let secs = self.reset.as_secs_f64();
        (missing > 0 && secs > 0.0).then(|| missing as f64 / secs)
    }
}

/// Every limit a response stated. Fields a provider does not send stay `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RateLimits {
    pub requests: Option<Quota>,
    /// Input and output together (Anthropic's `tokens`, OpenAI's `tokens`).
    pub tokens: Option<Quota>,
    /// Uncached input tokens (Anthropic's `input-tokens`; cache reads do not count for most
    /// models).
    pub input_tokens: Option<Quota>,
    pub output_tokens: Option<Quota>,
}

/// The limits' names in Anthropic's headers, with the field each one fills.
/// Which field of [`RateLimits`] a header's limit fills.
type Field = fn(&mut RateLimits) -> &mut Option<Quota>;

const ANTHROPIC: [(&str, Field); 4] = [
    ("requests", |l| &mut l.requests),
    ("tokens", |l| &mut l.tokens),
    ("input-tokens", |l| &mut l.input_tokens),
    ("output-tokens", |l| &mut l.output_tokens),
];

/// The same for OpenAI's headers.
const OPENAI: [(&str, Field); 2] = [
    ("requests", |l| &mut l.requests),
    ("tokens", |l| &mut l.tokens),
];

impl RateLimits {
    /// Whether no limit was stated.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Reads Anthropic's headers; `header` returns a header's value by its lower-case name.
    /// Resets are instants, taken relative to `now` (one in the past is "full now").
    pub fn from_anthropic<'a>(header: impl Fn(&str) -> Option<&'a str>, now: SystemTime) -> Self {
        let mut limits = Self::default();
        for (name, field) in ANTHROPIC {
            let get = |part: &str| header(&format!("anthropic-ratelimit-{name}-{part}"));
            let reset = get("reset").and_then(|v| {
                let at = humantime::parse_rfc3339_weak(v.trim()).ok()?;
                Some(at.duration_since(now).unwrap_or(Duration::ZERO))
            });
            *field(&mut limits) = quota(get("limit"), get("remaining"), reset);
        }
        limits
    }

    /// Reads OpenAI's headers (`x-ratelimit-limit-requests`, …, resets like `6m0s` or `20ms`).
    pub fn from_openai<'a>(header: impl Fn(&str) -> Option<&'a str>) -> Self {
        let mut limits = Self::default();
        for (name, field) in OPENAI {
            let get = |part: &str| header(&format!("x-ratelimit-{part}-{name}"));
            let reset = get("reset").and_then(go_duration);
            *field(&mut limits) = quota(get("limit"), get("remaining"), reset);
        }
        limits
    }

    /// The limits as Anthropic's headers, resets as RFC 3339 instants (with milliseconds)
    /// after `now`: what the sim's server sends.
    pub fn anthropic_headers(&self, now: SystemTime) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut copy = *self;
        for (name, field) in ANTHROPIC {
            let Some(q) = *field(&mut copy) else { continue };
            let reset = humantime::format_rfc3339_millis(now + q.reset).to_string();
            let prefix = format!("anthropic-ratelimit-{name}");
            out.push((format!("{prefix}-limit"), q.limit.to_string()));
            out.push((format!("{prefix}-remaining"), q.remaining.to_string()));
            out.push((format!("{prefix}-reset"), reset));
        }
        out
    }
}

/// A quota from its three header values: a limit and what remains are needed; a missing or
/// unreadable reset is "now".
fn quota(limit: Option<&str>, remaining: Option<&str>, reset: Option<Duration>) -> Option<Quota> {
    let number = |v: Option<&str>| v?.trim().parse::<u64>().ok();
    Some(Quota {
        limit: number(limit)?,
        remaining: number(remaining)?,
        reset: reset.unwrap_or(Duration::ZERO),
    })
}

/// A duration as Go prints one (`1h2m3.5s`, `6m0s`, `250ms`, `0s`), as OpenAI-compatible
/// servers send their resets. A bare number is seconds.
fn go_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).ok();
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        rest = &rest[unit..];
        total += value * scale;
    }
    (!text.is_empty())
        .then(|| Duration::try_from_secs_f64(total).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn go_durations() {
        let ms = |s: &str| go_duration(s).map(|d| d.as_millis());
        assert_eq!(ms("6m0s"), Some(360_000));
        assert_eq!(ms("1h2m3.5s"), Some(3_723_500));
        assert_eq!(ms("250ms"), Some(250));
        assert_eq!(ms("0s"), Some(0));
        assert_eq!(ms("2"), Some(2000));
        assert_eq!(ms("1.5"), Some(1500));
        assert_eq!(ms(""), None);
        assert_eq!(ms("5 parsecs"), None);
        assert_eq!(ms("m"), None);
    }

    #[test]
    fn anthropic_headers_round_trip() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let limits = RateLimits {
            requests: Some(Quota {
                limit: 50,
                remaining: 10,
                reset: Duration::from_millis(800),
            }),
            input_tokens: Some(Quota {
                limit: 400_000,
                remaining: 400_000,
                reset: Duration::ZERO,
            }),
            ..RateLimits::default()
        };
        let map: HashMap<String, String> = limits.anthropic_headers(now).into_iter().collect();
        assert_eq!(map["anthropic-ratelimit-requests-limit"], "50");
        assert_eq!(
            map["anthropic-ratelimit-requests-reset"],
            "2027-01-15T08:00:00.800Z"
        );
        let read = RateLimits::from_anthropic(|k| map.get(k).map(String::as_str), now);
        assert_eq!(read, limits);
        let rate = read.requests.and_then(|q| q.refill_per_sec());
        assert_eq!(rate, Some(50.0), "40 missing, back in 0.8 s");
        assert_eq!(read.input_tokens.and_then(|q| q.refill_per_sec()), None);
    }

    #[test]
    fn anthropic_resets_in_the_past_are_now_and_partial_limits_are_skipped() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let map = headers(&[
            ("anthropic-ratelimit-requests-limit", "1000"),
            ("anthropic-ratelimit-requests-remaining", "999"),
            ("anthropic-ratelimit-requests-reset", "2020-01-01T00:00:00Z"),
            ("anthropic-ratelimit-tokens-limit", "9"),
        ]);
        let read = RateLimits::from_anthropic(|k| map.get(k).map(String::as_str), now);
        assert_eq!(
            read.requests,
            Some(Quota {
                limit: 1000,
                remaining: 999,
                reset: Duration::ZERO
            })
        );
        assert_eq!(read.tokens, None, "no remaining: not a quota");
        assert!(RateLimits::from_anthropic(|_| None, now).is_empty());
    }

    #[test]
    fn openai_headers() {
        let map = headers(&[
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-remaining-requests", "59"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-limit-tokens", "150000"),
            ("x-ratelimit-remaining-tokens", "149984"),
            ("x-ratelimit-reset-tokens", "6ms"),
        ]);
        let read = RateLimits::from_openai(|k| map.get(k).map(String::as_str));
        assert_eq!(
            read.requests,
            Some(Quota {
                limit: 60,
                remaining: 59,
                reset: Duration::from_secs(1)
            })
        );
        assert_eq!(
            read.tokens.map(|q| (q.remaining, q.reset)),
            Some((149_984, Duration::from_millis(6)))
        );
        assert_eq!(read.input_tokens, None);
    }
}
