//! Model requests: one streamed request, and retries with jittered exponential backoff for
//! what may succeed on a second try.

use std::time::Duration;

use forkd_provider::{Accumulator, Completion, ModelRequest, ProviderError, StreamEvent};
use futures::StreamExt;

use crate::{Engine, RetryPolicy};

impl Engine {
    /// Sends a request, retrying what may succeed on a second try (429, 529, 5xx, dropped
    /// streams) with jittered exponential backoff that honours `retry-after`.
    pub(crate) async fn request_with_retries(
        &self,
        req: ModelRequest,
        on_event: &mut (dyn FnMut(&StreamEvent) + Send),
    ) -> Result<Completion, ProviderError> {
        let policy = &self.config().retry;
        let mut attempt = 1;
        loop {
            match self.request_once(req.clone(), on_event).await {
                Ok(c) => return Ok(c),
                Err(e) if e.is_retryable() && attempt < policy.max_attempts => {
                    let delay = backoff(policy, attempt, &e);
                    tracing::info!(attempt, error = %e, ?delay, "Retrying model request");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn request_once(
        &self,
        req: ModelRequest,
        on_event: &mut (dyn FnMut(&StreamEvent) + Send),
    ) -> Result<Completion, ProviderError> {
        let mut stream = self.inner.provider.stream(req);
        let mut acc = Accumulator::default();
        while let Some(event) = stream.next().await {
            let event = event?;
            on_event(&event);
            acc.push(&event)?;
        }
        acc.finish()
    }
}

fn backoff(policy: &RetryPolicy, attempt: u32, err: &ProviderError) -> Duration {
    if let ProviderError::Status {
        retry_after: Some(after),
        ..
    } = err
    {
        return (*after).min(policy.max_delay);
    }
    let exp = policy
        .base_delay
        .saturating_mul(1 << attempt.saturating_sub(1).min(16));
    let capped = exp.min(policy.max_delay);
    // Jitter between half and all of the delay: retries of many children must not line up.
    let fraction = 0.5 + fastrand::f64() / 2.0;
    capped.mul_f64(fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(retry_after: Option<Duration>) -> ProviderError {
        ProviderError::Status {
            status: 529,
            message: "overloaded".into(),
            retry_after,
        }
    }

    #[test]
    fn backoff_grows_with_jitter_caps_and_honours_retry_after() {
        let policy = RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        };
        for attempt in 1..=3u32 {
            let full = Duration::from_millis(100 * (1 << (attempt - 1)));
            let d = backoff(&policy, attempt, &status(None));
            assert!(d >= full / 2 && d <= full, "attempt {attempt}: {d:?}");
        }
        assert!(backoff(&policy, 9, &status(None)) <= Duration::from_secs(1));
        let after = backoff(&policy, 1, &status(Some(Duration::from_millis(700))));
        assert_eq!(after, Duration::from_millis(700));
        let capped = backoff(&policy, 1, &status(Some(Duration::from_secs(60))));
        assert_eq!(capped, Duration::from_secs(1));
    }
}
