//! The limiter on tokio's paused clock: waits are exact and take no real time. A request's
//! attempts are driven by `answer`, which stands for the provider.

#![allow(clippy::unwrap_used)]

use std::sync::Mutex;

use forkd_provider::{FailureKind, Quota};

use super::*;

/// A key with no server (as the embedded sim's): no slow start, so these tests see the
/// limiter's other controls alone (`learning_tests` has the slow start).
fn key() -> LimitKey {
    LimitKey {
        credential: Credential::new("anthropic", "", Some("k")),
        model: "claude-test".into(),
    }
}

fn ticket(tenant: &str, class: Class) -> Ticket {
    Ticket {
        tenant: tenant.into(),
        class,
        cost: Cost {
            input_tokens: 1000.0,
            output_tokens: 100.0,
        },
        prefix: None,
    }
}

fn config() -> AdmissionConfig {
    AdmissionConfig {
        patience: Duration::from_secs(15 * 60),
        unreachable_patience: Duration::from_secs(5),
        backoff_base: Duration::from_millis(100),
        backoff_cap: Duration::from_secs(1),
        ..AdmissionConfig::default()
    }
}

fn rate_limited(retry_after: Option<u64>) -> ProviderError {
    ProviderError::Status {
        status: 429,
        message: "rate limit exceeded (rate_limit_error)".into(),
        retry_after: retry_after.map(Duration::from_secs),
    }
}

type Answer<'a> = &'a (dyn Fn(Instant) -> Result<(), ProviderError> + Sync);

/// A provider that refuses the first attempt of all (its clones share it) for `retry_after`
/// seconds, and admits every other.
#[derive(Clone, Default)]
struct RefusesFirst {
    refused: Arc<Mutex<bool>>,
}

impl RefusesFirst {
    fn answer(
        &self,
        retry_after: u64,
    ) -> impl Fn(Instant) -> Result<(), ProviderError> + Sync + use<> {
        let refused = Arc::clone(&self.refused);
        move |_| {
            if std::mem::replace(&mut *refused.lock().unwrap(), true) {
                Ok(())
            } else {
                Err(rate_limited(Some(retry_after)))
            }
        }
    }
}

/// One request through the limiter: the instants its attempts were admitted, and how it ended.
async fn run(
    admission: &Admission,
    ticket: Ticket,
    stop: &CancellationToken,
    answer: Answer<'_>,
) -> (Vec<Instant>, Result<(), Refused>) {
    let mut attempts = admission.request(&key(), ticket);
    let mut admitted = Vec::new();
    loop {
        if let Err(refused) = attempts.admit(stop).await {
            return (admitted, Err(refused));
        }
        let now = Instant::now();
        admitted.push(now);
        match answer(now) {
            Ok(()) => {
                attempts.succeeded();
                return (admitted, Ok(()));
            }
            Err(e) => {
                if let Err(refused) = attempts.failed(e, stop).await {
                    return (admitted, Err(refused));
                }
            }
        }
    }
}

type Ran = (Vec<Instant>, Result<(), Refused>);

/// [`run`] on a task of its own, `delay` from now.
fn spawn_run(
    admission: &Arc<Admission>,
    stop: &CancellationToken,
    ticket: Ticket,
    delay: Duration,
    answer: impl Fn(Instant) -> Result<(), ProviderError> + Send + Sync + 'static,
) -> tokio::task::JoinHandle<Ran> {
    let (admission, stop) = (Arc::clone(admission), stop.clone());
    tokio::spawn(async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        run(&admission, ticket, &stop, &answer).await
    })
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_holds_every_request_of_the_key() {
    let admission = Arc::new(Admission::new(config()));
    let stop = CancellationToken::new();
    let t0 = Instant::now();
    // The first attempt of all is refused for three seconds; then everything is admitted.
    let answer = RefusesFirst::default().answer(3);
    let (first, done) = run(&admission, ticket("a", Class::Batch), &stop, &answer).await;
    assert!(done.is_ok());
    assert_eq!(first.len(), 2);
    assert!(first[1] - t0 >= Duration::from_secs(3));
    // At most 10 % jitter on top.
    assert!(first[1] - t0 <= Duration::from_millis(3300));

    // Requests that came during the pause, for the same key, waited for it too.
    let admission = Arc::new(Admission::new(config()));
    let provider = RefusesFirst::default();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..10 {
        // The others come 100 ms after the first.
        let delay = Duration::from_millis(if i == 0 { 0 } else { 100 });
        let answer = provider.answer(3);
        tasks.push(spawn_run(
            &admission,
            &stop,
            ticket("a", Class::Batch),
            delay,
            answer,
        ));
    }
    let mut admitted = Vec::new();
    for task in tasks {
        let (at, done) = task.await.unwrap();
        assert!(done.is_ok());
        admitted.extend(at);
    }
    admitted.sort();
    assert_eq!(admitted.len(), 11, "ten requests and one retry");
    assert_eq!(
        admitted[0], t0,
        "only the refused attempt went before the pause"
    );
    for at in &admitted[1..] {
        assert!(*at - t0 >= Duration::from_secs(3), "{:?}", *at - t0);
    }
}

#[tokio::test(start_paused = true)]
async fn a_storm_of_refusals_longer_than_any_retry_count_completes_every_request() {
    let admission = Arc::new(Admission::new(config()));
    let stop = CancellationToken::new();
    let t0 = Instant::now();
    // For two minutes the provider refuses everything, asking for a second each time.
    let storm = Duration::from_secs(120);
    let mut tasks = Vec::new();
    for i in 0..50 {
        let answer = move |now: Instant| {
            if now - t0 < storm {
                Err(rate_limited(Some(1)))
            } else {
                Ok(())
            }
        };
        let tenant = if i % 2 == 0 { "a" } else { "b" };
        tasks.push(spawn_run(
            &admission,
            &stop,
            ticket(tenant, Class::Batch),
            Duration::ZERO,
            answer,
        ));
    }
    let mut refused = 0;
    for task in tasks {
        let (admitted, done) = task.await.unwrap();
        assert!(done.is_ok(), "{done:?}");
        assert!(*admitted.last().unwrap() - t0 >= storm);
        refused += admitted.len() - 1;
    }
    // Backing off as one client: about one probe per pause, not fifty.
    assert!(refused < 50 + 2 * 120, "{refused} refusals");
}

#[tokio::test(start_paused = true)]
async fn spent_patience_fails_naming_the_limit_the_wait_and_the_refusals() {
    let admission = Admission::new(AdmissionConfig {
        patience: Duration::from_secs(10),
        ..config()
    });
    let stop = CancellationToken::new();
    let t0 = Instant::now();
    let answer = |_: Instant| Err(rate_limited(Some(2)));
    let (admitted, done) = run(&admission, ticket("a", Class::Batch), &stop, &answer).await;
    let Err(Refused::Provider(error)) = done else {
        panic!("{done:?}");
    };
    let ProviderError::GaveUp {
        waited, refusals, ..
    } = &error
    else {
        panic!("{error:?}");
    };
    assert_eq!(*refusals as usize, admitted.len());
    assert!((4..=5).contains(refusals), "{refusals}");
    assert!(*waited <= Duration::from_secs(10), "{waited:?}");
    assert!(Instant::now() - t0 <= Duration::from_secs(10));
    let message = error.to_string();
    for part in [
        "gave up after waiting",
        "anthropic on claude-test",
        "patience 10s",
        "refused attempts",
        "rate limit exceeded",
    ] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    assert!(!error.is_retryable());
    assert!(matches!(
        error.kind(),
        FailureKind::RateLimited {
            retry_after: Some(_)
        }
    ));
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_provider_has_a_short_patience_and_a_reachable_one_the_long_one() {
    let admission = Admission::new(config());
    let stop = CancellationToken::new();
    let t0 = Instant::now();
    let answer = |_: Instant| Err(ProviderError::Unreachable("connection refused".into()));
    let (admitted, done) = run(&admission, ticket("a", Class::Batch), &stop, &answer).await;
    assert!(
        matches!(&done, Err(Refused::Provider(ProviderError::GaveUp { last, .. })) if matches!(**last, ProviderError::Unreachable(_))),
        "{done:?}"
    );
    assert!(Instant::now() - t0 <= Duration::from_secs(5));
    assert!(admitted.len() > 2, "it tried a few times first");

    // Once a refusal showed the provider is there, a connection that fails is waited for as
    // long as any refusal.
    let admission = Admission::new(config());
    let t0 = Instant::now();
    let answer = move |now: Instant| {
        let since = now - t0;
        if since.is_zero() {
            Err(rate_limited(Some(1)))
        } else if since < Duration::from_secs(30) {
            Err(ProviderError::Unreachable("connection reset".into()))
        } else {
            Ok(())
        }
    };
    let (_, done) = run(&admission, ticket("a", Class::Batch), &stop, &answer).await;
    assert!(done.is_ok(), "{done:?}");
}

#[tokio::test(start_paused = true)]
async fn what_asking_again_cannot_mend_fails_at_once() {
    let admission = Admission::new(config());
    let stop = CancellationToken::new();
    let answer = |_: Instant| {
        Err(ProviderError::Status {
            status: 401,
            message: "invalid x-api-key".into(),
            retry_after: None,
        })
    };
    let (admitted, done) = run(&admission, ticket("a", Class::Batch), &stop, &answer).await;
    assert_eq!(admitted.len(), 1);
    assert!(
        matches!(
            done,
            Err(Refused::Provider(ProviderError::Status { status: 401, .. }))
        ),
        "{done:?}"
    );

    // A plain 500 a few times, then the server's message.
    let answer = |_: Instant| {
        Err(ProviderError::Status {
            status: 500,
            message: "Conversation roles must alternate".into(),
            retry_after: None,
        })
    };
    let (admitted, done) = run(&admission, ticket("a", Class::Batch), &stop, &answer).await;
    assert_eq!(
        admitted.len(),
        1 + config().max_server_error_retries as usize
    );
    assert!(
        matches!(
            done,
            Err(Refused::Provider(ProviderError::Status { status: 500, .. }))
        ),
        "{done:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stop_ends_a_long_wait_at_once() {
    let admission = Arc::new(Admission::new(config()));
    let stop = CancellationToken::new();
    let t0 = Instant::now();
    let provider = RefusesFirst::default();
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let answer = provider.answer(600);
        tasks.push(spawn_run(
            &admission,
            &stop,
            ticket("a", Class::Batch),
            Duration::ZERO,
            answer,
        ));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    // One waits after its refusal, the other for its turn: both end now.
    for task in tasks {
        let (admitted, done) = task.await.unwrap();
        assert!(matches!(done, Err(Refused::Stopped)), "{done:?}");
        assert!(admitted.len() <= 1);
    }
    assert_eq!(Instant::now() - t0, Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn parent_turns_go_first_and_tenants_take_turns() {
    let admission = Arc::new(Admission::new(AdmissionConfig {
        initial_concurrency: 1,
        max_concurrency: 1,
        ..config()
    }));
    let stop = CancellationToken::new();
    // Hold the one place while the others queue.
    let mut holder = admission.request(&key(), ticket("a", Class::Batch));
    holder.admit(&stop).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let arrivals = [
        ("a", Class::Batch),
        ("a", Class::Batch),
        ("a", Class::Batch),
        ("a", Class::Batch),
        ("b", Class::Batch),
        ("a", Class::Batch),
        ("b", Class::Interactive),
    ];
    for (i, (tenant, class)) in arrivals.into_iter().enumerate() {
        let order = Arc::clone(&order);
        let answer = move |_: Instant| {
            order.lock().unwrap().push(i);
            Ok(())
        };
        tasks.push(spawn_run(
            &admission,
            &stop,
            ticket(tenant, class),
            Duration::ZERO,
            answer,
        ));
        // Each is queued before the next arrives.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    holder.succeeded();
    drop(holder);
    for task in tasks {
        assert!(task.await.unwrap().1.is_ok());
    }
    // The parent turn, then a and b in turn, then the rest of a's.
    assert_eq!(*order.lock().unwrap(), [6, 0, 4, 1, 2, 3, 5]);
}

#[tokio::test(start_paused = true)]
async fn requests_are_paced_by_the_limits_the_provider_states() {
    let admission = Arc::new(Admission::new(config()));
    let stop = CancellationToken::new();
    // A response says: 10 requests a second, none left now.
    let mut first = admission.request(&key(), ticket("a", Class::Batch));
    first.admit(&stop).await.unwrap().limits(&RateLimits {
        requests: Some(Quota {
            limit: 10,
            remaining: 0,
            reset: Duration::from_secs(1),
        }),
        ..RateLimits::default()
    });
    first.succeeded();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..18 {
        let ticket = ticket("a", Class::Batch);
        tasks.push(spawn_run(&admission, &stop, ticket, Duration::ZERO, |_| {
            Ok(())
        }));
    }
    let mut admitted = Vec::new();
    for task in tasks {
        let (at, done) = task.await.unwrap();
        assert!(done.is_ok());
        admitted.extend(at);
    }
    admitted.sort();
    // The rate is learned between 9/s and 10/s: 18 requests take about two seconds, evenly.
    let span = *admitted.last().unwrap() - t0;
    assert!(
        span >= Duration::from_millis(1700) && span <= Duration::from_millis(2100),
        "{span:?}"
    );
    let ninth = admitted[8] - t0;
    assert!(ninth >= Duration::from_millis(800), "{ninth:?}");
}

#[tokio::test(start_paused = true)]
async fn a_warm_prefix_is_not_charged_as_uncached_input() {
    let admission = Admission::new(config());
    let stop = CancellationToken::new();
    let (fingerprint, total, prefix) = ("batch-1", 10_000, 9_000);
    assert_eq!(
        admission.uncached_estimate(&key(), 1, fingerprint, total, prefix),
        total
    );
    // Child 1's response starts: it wrote the shared prefix to the cache.
    let mut child = admission.request(&key(), ticket("a", Class::Batch));
    child.admit(&stop).await.unwrap().started(
        1,
        fingerprint,
        &Usage {
            input_tokens: 1_000,
            cache_creation_input_tokens: 9_000,
            cache_read_input_tokens: 0,
            output_tokens: 1,
        },
    );
    child.succeeded();
    // A sibling reads it: only its own part counts.
    assert_eq!(
        admission.uncached_estimate(&key(), 2, fingerprint, total, prefix),
        1_000
    );
    // Child 1's next request starts with what its last one cached.
    assert_eq!(
        admission.uncached_estimate(&key(), 1, "another", 12_000, 0),
        3_000
    );
    // The cache forgets after five minutes, and so does the limiter.
    tokio::time::sleep(CACHE_TTL).await;
    assert_eq!(
        admission.uncached_estimate(&key(), 2, fingerprint, total, prefix),
        total
    );
}

#[tokio::test(start_paused = true)]
async fn a_prefix_that_went_cold_is_gated_again() {
    let admission = Arc::new(Admission::new(config()));
    let stop = CancellationToken::new();
    let prefix: Arc<str> = "batch-1".into();
    let sibling = || Ticket {
        prefix: Some(Arc::clone(&prefix)),
        ..ticket("a", Class::Batch)
    };
    let wrote = Usage {
        input_tokens: 100,
        cache_creation_input_tokens: 9_000,
        cache_read_input_tokens: 0,
        output_tokens: 1,
    };
    // Child 1 wrote the prefix; then everything waited past the cache's lifetime.
    let mut first = admission.request(&key(), sibling());
    first
        .admit(&stop)
        .await
        .unwrap()
        .started(1, &prefix, &wrote);
    first.succeeded();
    drop(first);
    tokio::time::sleep(CACHE_TTL + Duration::from_secs(1)).await;

    // Three siblings come back: one goes, the others wait for its response to start.
    let mut writer = admission.request(&key(), sibling());
    let observer = writer.admit(&stop).await.unwrap();
    let admitted = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..2 {
        let admission = Arc::clone(&admission);
        let stop = stop.clone();
        let admitted = Arc::clone(&admitted);
        let ticket = sibling();
        tasks.push(tokio::spawn(async move {
            let mut attempts = admission.request(&key(), ticket);
            attempts.admit(&stop).await.unwrap();
            admitted.lock().unwrap().push((i, Instant::now()));
            attempts.succeeded();
        }));
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        admitted.lock().unwrap().is_empty(),
        "held while the prefix is cold"
    );
    // Another prefix is not held back.
    let mut other = admission.request(
        &key(),
        Ticket {
            prefix: Some("batch-2".into()),
            ..ticket("a", Class::Batch)
        },
    );
    other.admit(&stop).await.unwrap();
    other.succeeded();

    let released = Instant::now();
    observer.started(
        2,
        &prefix,
        &Usage {
            input_tokens: 100,
            cache_creation_input_tokens: 9_000,
            cache_read_input_tokens: 0,
            output_tokens: 0,
        },
    );
    for task in tasks {
        task.await.unwrap();
    }
    let admitted = admitted.lock().unwrap().clone();
    assert_eq!(admitted.len(), 2);
    assert!(admitted.iter().all(|(_, at)| *at == released));
    writer.succeeded();

    // A writer that ends without its response starting lets the next one write.
    tokio::time::sleep(CACHE_TTL + Duration::from_secs(1)).await;
    let mut failed_writer = admission.request(&key(), sibling());
    failed_writer.admit(&stop).await.unwrap();
    let next = {
        let admission = Arc::clone(&admission);
        let stop = stop.clone();
        let ticket = sibling();
        tokio::spawn(async move {
            let mut attempts = admission.request(&key(), ticket);
            attempts.admit(&stop).await.unwrap();
            Instant::now()
        })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!next.is_finished(), "held while the first writes");
    let ended = Instant::now();
    drop(failed_writer);
    assert_eq!(next.await.unwrap(), ended);
}
