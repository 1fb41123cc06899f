//! Model calls: the one pipeline every agent's request goes through — a fork child's, a typed
//! agent's and a parent turn's. It builds the body, sends it with the one retry policy (jittered
//! exponential backoff that honours `retry-after`, for what may succeed on a second try), and
//! records it: prefix parts and fingerprint, time to first token, cost, metrics.

use std::time::Duration;

use forkd_core::pricing::{CacheTtl, Models};
use forkd_core::query::RequestRecord;
use forkd_core::request::{self, BlockPos, Conversation, SerializedRequest, fingerprint};
use forkd_core::session::CacheSafeParams;
use forkd_core::{Agent, RequestId, Usage};
use forkd_provider::{Accumulator, Completion, ModelRequest, ProviderError, StreamEvent};
use futures::StreamExt;
use tracing::Instrument;

use crate::error::Result;
use crate::{Engine, RetryPolicy, now_ms};

/// A completed model request and how long it took, retries and their waits included.
pub(crate) struct Timed {
    pub completion: Completion,
    /// To the end of the response.
    pub took: Duration,
    /// To the response's first content block (time to first token); `None` when it had none.
    pub first_token: Option<Duration>,
}

/// Where a request's recorded prefix ends: the bytes before it are what a request must share
/// with its siblings (a fork child) or with the agent's next request (a main loop).
#[derive(Debug, Clone, Copy)]
pub(crate) enum PrefixEnd {
    /// Before this block: the agent's own first block (a fork child's directive, a typed
    /// agent's prompt).
    Before(BlockPos),
    /// Before the conversation's last block: a main-loop request, whose last block is what the
    /// turn just added (the user's message, or tool results).
    LastBlock,
}

/// A request body and where its recorded prefix ends (`None` when the block it should end
/// before is not in the body).
pub(crate) struct Built {
    pub body: SerializedRequest,
    pub prefix_end: Option<usize>,
}

/// Builds a request body. Cache diagnostics rebuild recorded requests with this same function,
/// so what they compare is what was sent.
pub(crate) fn build(
    params: &CacheSafeParams,
    conversation: &Conversation,
    prefix: PrefixEnd,
) -> Built {
    let body = request::serialize(params, conversation, true);
    let prefix_end = match prefix {
        PrefixEnd::Before(pos) => body.span(pos).map(|s| s.start),
        PrefixEnd::LastBlock => Some(body.spans.last().map_or(body.body.len(), |s| s.start)),
    };
    Built { body, prefix_end }
}

/// A request's cost at the model's prices (0 for a model nobody priced).
pub(crate) fn cost(models: &Models, model: &str, usage: &Usage) -> f64 {
    models
        .get(model)
        .map(|m| usage.cost_usd(m, CacheTtl::FiveMinutes))
        .unwrap_or(0.0)
}

/// One model request of an agent.
pub(crate) struct ModelCall<'a> {
    pub agent: &'a Agent,
    /// The agent's request number: a child's turns so far, or the request within a parent turn.
    pub turn: u32,
    pub params: &'a CacheSafeParams,
    pub conversation: &'a Conversation,
    pub prefix: PrefixEnd,
    /// The request's input tokens when the caller knows them from the counts the engine keeps;
    /// `None`: the window check reads the body (counting it only when it is big).
    pub input_tokens: Option<u64>,
}

/// A model's answer and the record stored for it.
pub(crate) struct Answer {
    pub completion: Completion,
    pub record: RequestRecord,
}

impl Engine {
    /// Builds, sends and records one model request; `on_event` sees the response's events as
    /// they arrive (a gate opens on `MessageStart`, a parent streams text to its client).
    pub(crate) async fn call_model(
        &self,
        call: ModelCall<'_>,
        on_event: &mut (dyn FnMut(&StreamEvent) + Send),
    ) -> Result<Answer> {
        let Built { body, prefix_end } = build(call.params, call.conversation, call.prefix);
        self.check_request(call.params, &body.body, call.input_tokens)
            .await?;
        let prefix_fingerprint = prefix_end
            .map(|end| fingerprint(&body.body.as_bytes()[..end]))
            .unwrap_or_default();
        let prefix_parts = crate::diagnose::prefix_parts(
            &body,
            call.params.tools.raw().len(),
            prefix_end.unwrap_or(0),
        );
        let body_bytes = body.body.len() as u64;
        let id = RequestId::new();
        let span =
            tracing::info_span!("model_request", request.id = %id, turn = call.turn, body_bytes);
        let model = &call.params.model;
        let req = ModelRequest {
            model: model.clone(),
            body: body.body.into(),
        };
        let sent_at_ms = now_ms();
        let timed = self
            .request_with_retries(req, on_event)
            .instrument(span.clone())
            .await?;
        let completion = timed.completion;
        let record = RequestRecord {
            id,
            agent_id: call.agent.id,
            session_id: call.agent.session_id,
            batch_id: call.agent.batch_id,
            turn: call.turn,
            model: model.clone(),
            usage: completion.usage,
            cost_usd: cost(&self.config().models, model, &completion.usage),
            prefix_fingerprint,
            prefix_parts,
            message_count: u32::try_from(call.conversation.messages.len()).ok(),
            body_bytes,
            first_token_ms: timed.first_token.map(crate::millis),
            stop_reason: completion.stop_reason.clone(),
            sent_at_ms: Some(sent_at_ms),
            created_at_ms: now_ms(),
        };
        self.inner
            .store
            .record_request(&record)
            .instrument(span)
            .await?;
        crate::metrics::request(
            model,
            call.agent.kind.as_str(),
            &record.usage,
            record.cost_usd,
            timed.took,
            timed.first_token,
        );
        Ok(Answer { completion, record })
    }
}

impl Engine {
    /// Sends a request, retrying what may succeed on a second try (429, 529, 5xx, dropped
    /// streams) with jittered exponential backoff that honours `retry-after`, and times it.
    async fn request_with_retries(
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
