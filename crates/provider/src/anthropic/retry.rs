//! Retrying a model request that failed before its first event: which failures are retried, how
//! long to wait (jittered exponential backoff, or the server's `retry-after`), and the loop.
//!
//! Both HTTP providers share this. A request is retried only while nothing of its response has
//! reached the caller: once an event was yielded, a failure goes to the caller (the engine
//! re-requests the whole turn, and its prefix hits the cache).

use std::future::Future;
use std::time::Duration;

use crate::ProviderError;

/// How a provider retries a request that failed before its first event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt; 0 never retries.
    pub max_retries: u32,
    /// The backoff before the first retry; each further retry doubles it.
    pub backoff_base: Duration,
    /// The longest backoff, however many retries came before.
    pub backoff_cap: Duration,
    /// A `retry-after` longer than this is not waited out: the error goes to the caller, which
    /// knows better whether a long wait is worth it.
    pub max_retry_after: Duration,
    /// Retries, at most, for a 500 (or another 5xx that is not an overload or gateway status:
    /// 429, 502, 503, 504, 529 may use all of `max_retries`). The Anthropic API's 500s pass, but
    /// a self-hosted server (llama.cpp's) answers 500 to a request its template or parser
    /// cannot handle, every time: a few tries tell the two apart without hammering the server.
    pub max_server_error_retries: u32,
}

impl Default for RetryPolicy {
    /// Five retries from 0.5 s, capped at 30 s: about a minute of trying in all, which rides
    /// out a short overload without hiding an outage; two for a plain 500.
    fn default() -> Self {
        Self {
            max_retries: 5,
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
            max_server_error_retries: 2,
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries.
    pub fn never() -> Self {
        Self {
            max_retries: 0,
            ..Self::default()
        }
    }

    /// The wait before retry number `retry` (0 for the first) after `error`, or `None` when the
    /// error is final: not retryable, retries used up, or a `retry-after` too long to wait.
    pub fn delay(&self, retry: u32, error: &ProviderError) -> Option<Duration> {
        if retry >= self.max_retries || !error.is_retryable() {
            return None;
        }
        if let ProviderError::Status { status, .. } = error
            && !is_overload(*status)
            && retry >= self.max_server_error_retries
        {
            return None;
        }
        match error {
            ProviderError::Status {
                retry_after: Some(after),
                ..
            } => (*after <= self.max_retry_after).then_some(*after),
            _ => Some(self.backoff(retry)),
        }
    }

    /// Exponential backoff with "equal jitter": half of the step is fixed, so a retry never
    /// comes at once, and half is random, so clients that failed together spread out.
    fn backoff(&self, retry: u32) -> Duration {
        let step = self
            .backoff_base
            .saturating_mul(2u32.saturating_pow(retry))
            .min(self.backoff_cap);
        let half = step / 2;
        half + half.mul_f64(fastrand::f64())
    }
}

/// Statuses that say "busy, try again" rather than "this failed": rate limits, overload, and a
/// gateway that could not reach or wait for the server.
fn is_overload(status: u16) -> bool {
    matches!(status, 429 | 502 | 503 | 504 | 529)
}

/// Runs `attempt` until it succeeds or `policy` says the error is final.
pub(crate) async fn retrying<T, F, Fut>(
    provider: &'static str,
    policy: &RetryPolicy,
    mut attempt: F,
) -> Result<T, ProviderError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ProviderError>>,
{
    let mut retry = 0;
    loop {
        let error = match attempt().await {
            Ok(value) => return Ok(value),
            Err(e) => e,
        };
        let Some(wait) = policy.delay(retry, &error) else {
            return Err(error);
        };
        tracing::warn!(
            provider,
            retry = retry + 1,
            wait_ms = wait.as_millis() as u64,
            error = %error,
            "Retrying model request"
        );
        tokio::time::sleep(wait).await;
        retry += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16, retry_after: Option<Duration>) -> ProviderError {
        ProviderError::Status {
            status,
            message: String::new(),
            retry_after,
        }
    }

    #[test]
    fn delays_follow_the_policy() {
        let policy = RetryPolicy {
            max_retries: 3,
            backoff_base: Duration::from_millis(100),
            backoff_cap: Duration::from_millis(300),
            max_retry_after: Duration::from_secs(2),
            max_server_error_retries: 1,
        };
        let secs = Duration::from_secs;
        // (retry number, error, the wait's bounds or None for a final error)
        let cases = [
            (0, status(529, None), Some((50, 100))),
            (0, status(500, None), Some((50, 100))),
            // A 500 has fewer retries than an overload.
            (1, status(500, None), None),
            (1, status(503, None), Some((100, 200))),
            (2, status(502, None), Some((150, 300))),
            (2, ProviderError::Stream("cut".into()), Some((150, 300))),
            (3, status(529, None), None),
            (0, status(501, None), None),
            (0, status(400, None), None),
            (0, ProviderError::InvalidRequest("x".into()), None),
            (0, status(429, Some(secs(1))), Some((1000, 1000))),
            (0, status(429, Some(secs(3))), None),
        ];
        for (retry, error, bounds) in cases {
            let got = policy.delay(retry, &error).map(|d| d.as_millis() as u64);
            match (got, bounds) {
                (None, None) => {}
                (Some(ms), Some((lo, hi))) => assert!((lo..=hi).contains(&ms), "{error:?}: {ms}"),
                other => panic!("{error:?}: {other:?}"),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retrying_stops_at_success_or_a_final_error() {
        let policy = RetryPolicy {
            max_retries: 5,
            ..RetryPolicy::default()
        };
        let mut calls = 0;
        let got = retrying("test", &policy, || {
            calls += 1;
            let n = calls;
            async move { if n < 3 { Err(status(529, None)) } else { Ok(n) } }
        })
        .await;
        assert_eq!(got, Ok(3));

        let mut calls = 0;
        let got: Result<(), _> = retrying("test", &policy, || {
            calls += 1;
            async { Err(status(400, None)) }
        })
        .await;
        assert!(matches!(
            got,
            Err(ProviderError::Status { status: 400, .. })
        ));
        assert_eq!(calls, 1);
    }
}
