//! A request's trouble with its provider: what it has been through since its first refusal,
//! what a failure means for the next attempt, the backoff, and the error that ends its wait.

use std::sync::Arc;
use std::time::Duration;

use forkd_provider::{FailureKind, ProviderError};
use tokio::time::Instant;

use super::{Key, Refused, lock};
use crate::config::AdmissionConfig;

/// What a request has been through since its first refusal.
#[derive(Debug)]
pub(super) struct Trouble {
    /// Counts the request among its key's throttled ones while it lives.
    _throttled: Throttled,
    pub(super) since: Instant,
    pub(super) patience: Duration,
    pub(super) refusals: u32,
    pub(super) server_errors: u32,
    backoffs: u32,
    pub(super) last: Option<ProviderError>,
}

impl Trouble {
    pub(super) fn new(now: Instant, config: &AdmissionConfig, key: &Arc<Key>) -> Self {
        key.state().throttled += 1;
        Self {
            _throttled: Throttled(Arc::clone(key)),
            since: now,
            // The short patience until a refusal shows the provider is there.
            patience: config.unreachable_patience.min(config.patience),
            refusals: 0,
            server_errors: 0,
            backoffs: 0,
            last: None,
        }
    }

    pub(super) fn deadline(&self) -> Instant {
        self.since + self.patience
    }

    pub(super) fn backoff(&mut self, config: &AdmissionConfig) -> Duration {
        let wait = jittered_backoff(config, self.backoffs);
        self.backoffs += 1;
        wait
    }
}

/// A throttled request, counted in its key's `throttled` until dropped.
#[derive(Debug)]
struct Throttled(Arc<Key>);

impl Drop for Throttled {
    fn drop(&mut self) {
        self.0.state().throttled -= 1;
    }
}

pub(super) fn give_up(key: &Key, trouble: Option<Trouble>, when: &str) -> Refused {
    let Some(t) = trouble else {
        return Refused::Stopped;
    };
    let waited = t.since.elapsed();
    let limits = lock(&key.state).buckets.describe();
    let mut why = format!(
        "{} on {} at {:?}",
        key.name.credential.provider, key.name.model, key.name.credential.endpoint
    );
    if !limits.is_empty() {
        why.push_str(&format!("; its limits: {limits}"));
    }
    why.push_str(&format!(
        "; patience {}: {when}",
        humantime::format_duration(Duration::from_secs(t.patience.as_secs()))
    ));
    let last = t
        .last
        .unwrap_or_else(|| ProviderError::Stream("no answer".into()));
    Refused::Provider(ProviderError::GaveUp {
        why,
        waited,
        refusals: t.refusals,
        last: Box::new(last),
    })
}

/// Exponential backoff with "equal jitter": half of the step fixed, half random.
pub(super) fn jittered_backoff(config: &AdmissionConfig, n: u32) -> Duration {
    let step = config
        .backoff_base
        .saturating_mul(2u32.saturating_pow(n.min(16)))
        .min(config.backoff_cap);
    let half = step / 2;
    half + half.mul_f64(fastrand::f64())
}

pub(super) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What a failed attempt means for the next one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Failure {
    RateLimited {
        retry_after: Option<Duration>,
    },
    /// 529, 502, 503, 504, or a stream cut off: busy, try again.
    Overloaded,
    /// Another 5xx: maybe the request, maybe the server.
    ServerError,
    Unreachable,
    /// Asking again cannot help.
    Final,
}

impl Failure {
    pub(super) fn of(error: &ProviderError) -> Self {
        match (error, error.kind()) {
            (ProviderError::GaveUp { .. }, _) => Failure::Final,
            (ProviderError::Unreachable(_), _) => Failure::Unreachable,
            (_, FailureKind::RateLimited { retry_after }) => Failure::RateLimited { retry_after },
            (ProviderError::Status { status, .. }, FailureKind::Unavailable)
                if !matches!(status, 502 | 503 | 504 | 529) =>
            {
                Failure::ServerError
            }
            (_, FailureKind::Unavailable) => Failure::Overloaded,
            (_, FailureKind::Unauthorized | FailureKind::Rejected) => Failure::Final,
        }
    }

    /// The metric's label.
    pub(super) fn label(self, error: &ProviderError) -> String {
        match (self, error) {
            (_, ProviderError::Status { status, .. }) => status.to_string(),
            (Failure::Unreachable, _) => "unreachable".to_owned(),
            _ => "stream".to_owned(),
        }
    }
}
