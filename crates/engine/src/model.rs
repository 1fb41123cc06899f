//! Model requests: one streamed request, and retries with jittered exponential backoff for
//! what may succeed on a second try.

use std::time::Duration;

use forkd_provider::{Accumulator, Completion, ModelRequest, ProviderError, StreamEvent};
use futures::StreamExt;

use crate::{Engine, RetryPolicy};

/// A completed model request and how long it took, retries and their waits included.
pub(crate) struct Timed {
    pub completion: Completion,
    /// To the end of the response.
    pub took: Duration,
    /// To the response's first content block (time to first token); `None` when it had none.
    pub first_token: Option<Duration>,
}

impl Engine {
    /// Sends a request, retrying what may succeed on a second try (429, 529, 5xx, dropped
    /// streams) with jittered exponential backoff that honours `retry-after`, and times it.
    pub(crate) async fn request_with_retries(
        &self,
        req: ModelRequest,
        on_event: &mut (dyn FnMut(&StreamEvent) + Send),
    ) -> Result<Timed, ProviderError> {
        let started = std::time::Instant::now();
        let mut first_token = None;
        let mut timing = |event: &StreamEvent| {
            if first_token.is_none() && event.starts_output() {
                first_token = Some(started.elapsed());
            }
            on_event(event);
        };
        let completion = self.request_attempts(req, &mut timing).await?;
        Ok(Timed {
            completion,
            took: started.elapsed(),
            first_token,
        })
    }

    async fn request_attempts(
        &self,
        req: ModelRequest,
        on_event: &mut (dyn FnMut(&StreamEvent) + Send),
    ) -> Result<Completion, ProviderError> {
        let policy = &self.config().retry;
        // A provider that retries before the first event has done so already: only a stream
        // cut off after events arrived is worth another request here.
        let provider_retried = self.inner.provider.retries_before_first_event();
        let mut attempt = 1;
        loop {
            let mut saw_event = false;
            let mut watch = |event: &StreamEvent| {
                saw_event = true;
                on_event(event);
            };
            let outcome = self.request_once(req.clone(), &mut watch).await;
            match outcome {
                Ok(c) => return Ok(c),
                Err(e)
                    if e.is_retryable()
                        && (saw_event || !provider_retried)
                        && attempt < policy.max_attempts =>
                {
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
        // Held for the whole response: the cap is on requests in flight, streams included.
        let _slot = match &self.inner.request_slots {
            Some(slots) => slots.clone().acquire_owned().await.ok(),
            None => None,
        };
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
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use forkd_provider::{EventStream, Provider};

    use super::*;
    use crate::EngineConfig;

    /// Answers every request with a 529 before any event, counting the requests.
    struct Overloaded {
        calls: AtomicU32,
        retries_itself: bool,
    }

    impl Provider for Overloaded {
        fn name(&self) -> &'static str {
            "overloaded"
        }

        fn stream(&self, _: ModelRequest) -> EventStream {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Box::pin(futures::stream::once(async { Err(status(None)) }))
        }

        fn retries_before_first_event(&self) -> bool {
            self.retries_itself
        }
    }

    async fn attempts(retries_itself: bool) -> u32 {
        let provider = Arc::new(Overloaded {
            calls: AtomicU32::new(0),
            retries_itself,
        });
        let store = forkd_store::SqliteStore::open_in_memory().await.unwrap();
        let config = EngineConfig {
            retry: RetryPolicy {
                max_attempts: 4,
                base_delay: Duration::from_millis(1),
                max_delay: Duration::from_millis(2),
            },
            ..EngineConfig::default()
        };
        let engine = Engine::new(Arc::new(store), provider.clone(), config);
        let req = ModelRequest {
            model: "m".into(),
            body: "{}".into(),
        };
        let outcome = engine.request_attempts(req, &mut |_| {}).await;
        assert!(outcome.is_err());
        provider.calls.load(Ordering::SeqCst)
    }

    /// A provider that retried before the first event already is not retried again on top
    /// (a persistent 529 would otherwise cost its retries times the engine's).
    #[tokio::test]
    async fn errors_before_the_first_event_are_retried_once_not_twice_over() {
        assert_eq!(attempts(true).await, 1);
        assert_eq!(attempts(false).await, 4);
    }

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
