//! Limits on a child's run: `fork --timeout 10m …` and a batch file's `timeout: 10m` (for the
//! batch, or for one directive), turned into the wire's `Limits`. A child past one of its limits
//! ends `timed_out` with a partial report that names the limit. Whatever is left unset here is
//! the next layer's: the batch's (for a directive), then the tenant's and the daemon's defaults.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use clap::Args;
use forkd_proto::v1::Limits;
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{Value, json};

/// The limit flags of `forkctl fork`.
#[derive(Debug, Clone, Default, Args)]
pub struct LimitArgs {
    /// Wall time each child may run, from its start (e.g. 10m, 1h30m); past it the child ends
    /// `timed_out` with a partial report.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,

    /// How long each child may go without model output and without a tool call starting or
    /// finishing (e.g. 2m); past it the child ends `timed_out`. Time its requests wait on the
    /// provider's rate limits does not count.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub idle_timeout: Option<Duration>,

    /// Model requests each child may make (e.g. 30); a child with no final answer by then ends
    /// `timed_out`.
    #[arg(long, value_name = "N", value_parser = parse_count::<u32>)]
    pub max_turns: Option<u32>,

    /// Output tokens each child may write, counted between its requests; a child past them ends
    /// `timed_out`. The model's own `max_tokens` is left alone, so the cache is kept.
    #[arg(long, value_name = "N", value_parser = parse_count::<u64>)]
    pub max_output_tokens: Option<u64>,

    /// Leave out of --timeout the time a child's requests wait on the provider's rate limits.
    #[arg(long)]
    pub timeout_excludes_throttle: bool,
}

impl LimitArgs {
    /// The flags as limits; unset when no flag is given.
    pub fn limits(&self) -> Option<Limits> {
        LimitSpec {
            timeout: self.timeout,
            idle_timeout: self.idle_timeout,
            max_turns: self.max_turns,
            max_output_tokens: self.max_output_tokens,
            timeout_excludes_throttle: self.timeout_excludes_throttle.then_some(true),
        }
        .limits()
    }
}

/// Limits as a batch file or the flags give them; `None`: not given at this layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitSpec {
    pub timeout: Option<Duration>,
    pub idle_timeout: Option<Duration>,
    pub max_turns: Option<u32>,
    pub max_output_tokens: Option<u64>,
    pub timeout_excludes_throttle: Option<bool>,
}

impl LimitSpec {
    /// Refuses a limit of 0 (it would stop the child before it starts), naming its key after
    /// `at` (`""` for the batch's keys, `directives[1].` for a directive's).
    pub fn check(&self, at: &str) -> Result<(), String> {
        let durations = [
            ("timeout", self.timeout),
            ("idle_timeout", self.idle_timeout),
        ];
        for (name, duration) in durations {
            if let Some(d) = duration {
                millis(d).map_err(|e| format!("`{at}{name}` {e}"))?;
            }
        }
        let counts = [
            ("max_turns", self.max_turns.map(u64::from)),
            ("max_output_tokens", self.max_output_tokens),
        ];
        for (name, count) in counts {
            if count == Some(0) {
                return Err(format!("`{at}{name}` {ZERO}"));
            }
        }
        Ok(())
    }

    /// The wire's limits (0 for a limit not given); `None` when none is given. Checked first
    /// ([`LimitSpec::check`]): a duration too long for milliseconds is the longest there is.
    pub fn limits(&self) -> Option<Limits> {
        if *self == LimitSpec::default() {
            return None;
        }
        let ms =
            |d: Option<Duration>| d.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Some(Limits {
            timeout_ms: ms(self.timeout),
            idle_timeout_ms: ms(self.idle_timeout),
            max_turns: self.max_turns.unwrap_or(0),
            max_output_tokens: self.max_output_tokens.unwrap_or(0),
            timeout_excludes_throttle: self.timeout_excludes_throttle,
        })
    }
}

/// Why a limit of 0 is refused.
const ZERO: &str = "must be more than 0 (leave it out for no limit)";

/// A limit's duration in milliseconds, the wire's unit: at least 1 ms.
fn millis(d: Duration) -> Result<u64, String> {
    if d.is_zero() {
        return Err(ZERO.to_owned());
    }
    match u64::try_from(d.as_millis()) {
        Ok(0) => Err("must be 1ms or more".to_owned()),
        Ok(ms) => Ok(ms),
        Err(_) => Err("is too long".to_owned()),
    }
}

/// `90s`, `10m`, `1h30m`, `2h 15m` (humantime's spelling), without checking its size.
fn parse_human(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("`{text}` is not a duration such as 90s, 10m or 1h30m ({e})"))
}

/// Parses a duration flag: `90s`, `10m`, `1h30m`; 0 is refused.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = parse_human(text)?;
    millis(d)?;
    Ok(d)
}

/// Parses a count flag (`--max-turns`, `--max-output-tokens`); 0 is refused.
pub fn parse_count<T>(text: &str) -> Result<T, String>
where
    T: FromStr + Default + PartialEq,
{
    let n: T = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a whole number, or is too large"))?;
    if n == T::default() {
        return Err(ZERO.to_owned());
    }
    Ok(n)
}

/// A batch file's duration (`timeout: 10m`), read with [`parse_human`]: a malformed one is
/// named with its line; 0 is left to [`LimitSpec::check`], which names its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileDuration(pub Duration);

impl<'de> Deserialize<'de> for FileDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DurationVisitor;

        impl Visitor<'_> for DurationVisitor {
            type Value = FileDuration;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as 90s, 10m or 1h30m")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<FileDuration, E> {
                parse_human(text).map(FileDuration).map_err(E::custom)
            }
        }

        deserializer.deserialize_str(DurationVisitor)
    }
}

/// An agent's resolved limits (`ps --json`): each of the five fields, `null` when it has no
/// such limit; `null` as a whole when the daemon sent none.
pub fn limits_json(limits: Option<&Limits>) -> Value {
    let Some(l) = limits else {
        return Value::Null;
    };
    let set = |v: u64| (v > 0).then_some(v);
    json!({
        "timeout_ms": set(l.timeout_ms),
        "idle_timeout_ms": set(l.idle_timeout_ms),
        "max_turns": (l.max_turns > 0).then_some(l.max_turns),
        "max_output_tokens": set(l.max_output_tokens),
        "timeout_excludes_throttle": l.timeout_excludes_throttle,
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cmd {
        #[command(flatten)]
        limits: LimitArgs,
    }

    fn flags(args: &[&str]) -> Result<Option<Limits>, String> {
        Cmd::try_parse_from(std::iter::once("fork").chain(args.iter().copied()))
            .map(|cmd| cmd.limits.limits())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn no_flag_leaves_the_limits_unset() {
        assert_eq!(flags(&[]), Ok(None));
    }

    #[test]
    fn the_flags_fill_the_limits() {
        let limits = flags(&[
            "--timeout",
            "10m",
            "--idle-timeout",
            "1m30s",
            "--max-turns",
            "30",
            "--max-output-tokens",
            "20000",
            "--timeout-excludes-throttle",
        ]);
        assert_eq!(
            limits,
            Ok(Some(Limits {
                timeout_ms: 600_000,
                idle_timeout_ms: 90_000,
                max_turns: 30,
                max_output_tokens: 20_000,
                timeout_excludes_throttle: Some(true),
            }))
        );
        // One flag sets one field; the others stay 0, the next layer's.
        assert_eq!(
            flags(&["--timeout", "2h 15m"]),
            Ok(Some(Limits {
                timeout_ms: 8_100_000,
                ..Limits::default()
            }))
        );
        assert_eq!(
            flags(&["--timeout-excludes-throttle"]),
            Ok(Some(Limits {
                timeout_excludes_throttle: Some(true),
                ..Limits::default()
            }))
        );
    }

    #[test]
    fn zero_and_malformed_flags_are_refused() {
        for (args, expected) in [
            (["--timeout", "0s"], "must be more than 0"),
            (["--timeout", "0"], "must be more than 0"),
            (["--idle-timeout", "500us"], "must be 1ms or more"),
            (
                ["--timeout", "ten minutes"],
                "is not a duration such as 90s",
            ),
            (["--timeout", "10"], "is not a duration"),
            (["--max-turns", "0"], "must be more than 0"),
            (["--max-output-tokens", "0"], "must be more than 0"),
            (["--max-turns", "thirty"], "is not a whole number"),
            (["--max-turns=-1", "--timeout=1m"], "is not a whole number"),
            (["--max-turns", "5000000000"], "or is too large"),
        ] {
            match flags(&args) {
                Err(e) => {
                    assert!(e.contains(expected), "{args:?}: {e}");
                    let flag = args[0].split('=').next().unwrap_or_default();
                    assert!(e.contains(flag), "{args:?} names its flag: {e}");
                }
                Ok(limits) => panic!("{args:?} parsed as {limits:?}"),
            }
        }
    }

    #[test]
    fn a_file_s_limits_are_checked_by_key() {
        let zero = LimitSpec {
            timeout: Some(Duration::ZERO),
            ..LimitSpec::default()
        };
        assert_eq!(
            zero.check("directives[1]."),
            Err("`directives[1].timeout` must be more than 0 (leave it out for no limit)".into())
        );
        let zero = LimitSpec {
            max_output_tokens: Some(0),
            ..LimitSpec::default()
        };
        assert_eq!(
            zero.check(""),
            Err("`max_output_tokens` must be more than 0 (leave it out for no limit)".into())
        );
        let fine = LimitSpec {
            timeout_excludes_throttle: Some(false),
            ..LimitSpec::default()
        };
        assert_eq!(fine.check(""), Ok(()));
        // `false` is given, so it is sent: it overrides a lower layer's `true`.
        assert_eq!(
            fine.limits().and_then(|l| l.timeout_excludes_throttle),
            Some(false)
        );
        assert_eq!(LimitSpec::default().limits(), None);
    }

    #[test]
    fn an_agent_s_limits_read_as_json_with_nulls_for_none() {
        assert_eq!(limits_json(None), Value::Null);
        let limits = Limits {
            timeout_ms: 2_000,
            max_turns: 30,
            ..Limits::default()
        };
        assert_eq!(
            limits_json(Some(&limits)),
            json!({
                "timeout_ms": 2000,
                "idle_timeout_ms": null,
                "max_turns": 30,
                "max_output_tokens": null,
                "timeout_excludes_throttle": null,
            })
        );
    }
}
