//! `[webhooks]` in `config.toml` (docs/operations.md, "Webhooks and schedules"): where
//! deliveries may go and how long they are retried.

use std::time::Duration;

use serde::Deserialize;

use super::flags::humantime_duration;

/// `[webhooks]` as written.
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhooksSection {
    /// Allow loopback, private, link-local and CGNAT addresses (tests, private networks). Cloud
    /// metadata addresses stay refused.
    pub allow_private: Option<bool>,
    /// One attempt's limit (`"10s"`).
    pub timeout: Option<String>,
    /// How long a delivery is retried after its first attempt (`"24h"`).
    pub retry_for: Option<String>,
    /// The longest wait between two attempts (`"1h"`).
    pub max_backoff: Option<String>,
    /// An endpoint whose every attempt failed for this long is disabled (`"5d"`).
    pub disable_after: Option<String>,
    /// How long a rotated-out secret still signs (`"24h"`).
    pub rotation_overlap: Option<String>,
    /// Attempts in flight at once on this daemon (64).
    pub concurrency: Option<usize>,
}

impl WebhooksSection {
    /// This section over `config`.
    pub(super) fn apply(
        &self,
        mut config: forkd_engine::WebhookConfig,
    ) -> anyhow::Result<forkd_engine::WebhookConfig> {
        let duration = |key: &str, value: &Option<String>, into: &mut Duration| {
            if let Some(v) = value {
                *into = humantime_duration(v)
                    .map_err(|e| anyhow::anyhow!("config.toml: [webhooks] {key} = {v:?}: {e}"))?;
            }
            anyhow::Ok(())
        };
        if let Some(allow) = self.allow_private {
            config.allow_private = allow;
        }
        duration("timeout", &self.timeout, &mut config.timeout)?;
        duration("retry_for", &self.retry_for, &mut config.retry.retry_for)?;
        duration(
            "max_backoff",
            &self.max_backoff,
            &mut config.retry.max_backoff,
        )?;
        duration(
            "disable_after",
            &self.disable_after,
            &mut config.retry.disable_after,
        )?;
        duration(
            "rotation_overlap",
            &self.rotation_overlap,
            &mut config.rotation_overlap,
        )?;
        if config.timeout.is_zero() {
            anyhow::bail!("config.toml: [webhooks] timeout must be more than 0s");
        }
        if let Some(n) = self.concurrency {
            anyhow::ensure!(
                n > 0,
                "config.toml: [webhooks] concurrency must be at least 1"
            );
            config.concurrency = n;
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn parse(text: &str) -> anyhow::Result<forkd_engine::WebhookConfig> {
        let section: WebhooksSection = toml::from_str(text)?;
        section.apply(forkd_engine::WebhookConfig::default())
    }

    #[test]
    fn defaults_hold_until_a_key_says_otherwise() {
        let defaults = parse("").expect("empty is fine");
        assert!(!defaults.allow_private);
        assert_eq!(defaults.timeout, Duration::from_secs(10));
        assert_eq!(defaults.retry.retry_for, Duration::from_secs(24 * 3600));
        assert_eq!(
            defaults.retry.disable_after,
            Duration::from_secs(5 * 24 * 3600)
        );
        let set = parse(
            "allow_private = true\ntimeout = \"2s\"\nretry_for = \"1m\"\nmax_backoff = \"5s\"\n\
             disable_after = \"10m\"\nrotation_overlap = \"1h\"\nconcurrency = 8\n",
        )
        .expect("valid");
        assert!(set.allow_private);
        assert_eq!(set.timeout, Duration::from_secs(2));
        assert_eq!(set.retry.retry_for, Duration::from_secs(60));
        assert_eq!(set.retry.max_backoff, Duration::from_secs(5));
        assert_eq!(set.retry.disable_after, Duration::from_secs(600));
        assert_eq!(set.rotation_overlap, Duration::from_secs(3600));
        assert_eq!(set.concurrency, 8);
    }

    #[test]
    fn bad_values_name_their_key() {
        let err = parse("retry_for = \"soon\"").expect_err("not a duration");
        assert!(err.to_string().contains("[webhooks] retry_for"), "{err}");
        assert!(parse("timeout = \"0s\"").is_err());
        assert!(parse("concurrency = 0").is_err());
        assert!(
            parse("allow_privates = true").is_err(),
            "unknown keys are errors"
        );
    }
}
