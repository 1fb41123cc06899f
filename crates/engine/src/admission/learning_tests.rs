//! The limiter against the sim's limits of every kind (`forkd_provider::SimProvider` with a
//! rate limit: a token bucket, a sliding window, a fixed window; Anthropic's headers, only
//! `retry-after`, nothing), on tokio's paused clock: a batch of requests all submitted at once,
//! each sent through the limiter to the sim until it is admitted. What is asserted is counted
//! (refusals, completions), never timed.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use forkd_provider::{ModelRequest, Provider, ProviderError, SimConfig, SimProvider, StreamEvent};
use futures::StreamExt;

use super::*;

fn key() -> LimitKey {
    LimitKey {
        credential: Credential::new("anthropic", "http://127.0.0.1:1", Some("k")),
        model: "claude-sonnet-4-5".into(),
    }
}

fn ticket() -> Ticket {
    Ticket {
        tenant: "local".into(),
        class: Class::Batch,
        cost: Cost {
            input_tokens: 20.0,
            output_tokens: 10.0,
        },
        prefix: None,
    }
}

fn request() -> ModelRequest {
    let body = serde_json::json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Go.\n@sim say done"}],
    });
    ModelRequest {
        model: "claude-sonnet-4-5".into(),
        body: Arc::from(body.to_string()),
    }
}

/// One request sent until the sim admits it (or the limiter gives up), its `retry-after` in whole
/// seconds.
async fn send(admission: &Admission, sim: &SimProvider, stop: &CancellationToken) -> bool {
    let mut attempts = admission.request(&key(), ticket());
    loop {
        let Ok(observer) = attempts.admit(stop).await else {
            return false;
        };
        let mut events = sim.stream(request());
        match events.next().await {
            Some(Ok(first)) => {
                if let StreamEvent::RateLimits(limits) = &first {
                    observer.limits(limits);
                }
                attempts.succeeded();
                while events.next().await.is_some() {}
                return true;
            }
            Some(Err(mut e)) => {
                // As the API and `forkd sim-server` send it: whole seconds, rounded up.
                if let ProviderError::Status {
                    retry_after: Some(after),
                    ..
                } = &mut e
                {
                    *after =
                        Duration::from_secs(after.as_secs() + u64::from(after.subsec_nanos() > 0));
                }
                if attempts.failed(e, stop).await.is_err() {
                    return false;
                }
            }
            None => return false,
        }
    }
}

/// A fresh sim limiting as `spec` says, and a limiter.
fn setup(spec: &str) -> (SimProvider, Arc<Admission>) {
    let sim = SimProvider::new(SimConfig {
        speed: 0.0,
        rate_limit: Some(spec.parse().unwrap()),
    });
    let admission = Arc::new(Admission::new(AdmissionConfig {
        backoff_base: Duration::from_millis(500),
        backoff_cap: Duration::from_secs(2),
        ..AdmissionConfig::default()
    }));
    (sim, admission)
}

/// Submits `n` requests at once; how many completed.
async fn submit(sim: &SimProvider, admission: &Arc<Admission>, n: usize) -> usize {
    let stop = CancellationToken::new();
    let runs: Vec<_> = (0..n)
        .map(|_| {
            let (admission, sim, stop) = (Arc::clone(admission), sim.clone(), stop.clone());
            tokio::spawn(async move { send(&admission, &sim, &stop).await })
        })
        .collect();
    let mut completed = 0;
    for run in runs {
        completed += usize::from(run.await.unwrap());
    }
    completed
}

fn refusals(sim: &SimProvider) -> usize {
    sim.answered().iter().filter(|a| a.status == 429).count()
}

/// Before the limiter learned from refusals, 200 requests at 20 a second met 444 to 9,517 429s
/// in every cell but the token bucket with Anthropic's headers (and 9 in the windows with
/// them); now a few, in each.
#[tokio::test(start_paused = true)]
async fn every_kind_of_limit_is_learned_with_few_refusals() {
    let mut seen = Vec::new();
    for algorithm in ["token-bucket", "sliding-window", "fixed-window"] {
        for headers in ["anthropic", "retry-after-only", "none"] {
            let spec = format!("requests=20,per=1s,algorithm={algorithm},headers={headers}");
            let (sim, admission) = setup(&spec);
            let completed = submit(&sim, &admission, 200).await;
            let refused = refusals(&sim);
            seen.push(format!("{spec}: {completed} completed, {refused} refused"));
            assert_eq!(completed, 200, "{seen:#?}");
            // At most 5 % of them, the target (the runs here meet 0 to 3).
            assert!(refused <= 10, "{seen:#?}");
        }
    }
}

/// A limit halved mid-batch, then doubled: the limiter follows it down within a few refusals,
/// and back up by raising its pace while nothing is refused.
#[tokio::test(start_paused = true)]
async fn a_limit_that_changes_is_followed_both_ways() {
    let spec = |rate: u32| {
        format!("requests={rate},per=1s,algorithm=sliding-window,headers=retry-after-only")
            .parse()
            .unwrap()
    };
    let (sim, admission) =
        setup("requests=40,per=1s,algorithm=sliding-window,headers=retry-after-only");
    assert_eq!(submit(&sim, &admission, 400).await, 400);
    let learned = refusals(&sim);
    // Ceilings with room for the jitter of `retry-after`: the runs here meet 1, 2 and 2.
    assert!(learned <= 6, "{learned} refusals to learn 40/s");
    let pace = |admission: &Admission| lock(&admission.key(&key()).state).learner.rate().unwrap();
    let at_40 = pace(&admission);
    assert!((30.0..=44.0).contains(&at_40), "{at_40}");

    sim.set_rate_limit(spec(20));
    assert_eq!(submit(&sim, &admission, 300).await, 300);
    let halved = refusals(&sim) - learned;
    assert!(halved <= 5, "{halved} refusals to follow the limit down");
    let at_20 = pace(&admission);
    assert!((14.0..=22.0).contains(&at_20), "{at_20}");

    sim.set_rate_limit(spec(40));
    assert_eq!(submit(&sim, &admission, 1200).await, 1200);
    let doubled = refusals(&sim) - learned - halved;
    assert!(doubled <= 6, "{doubled} refusals to follow the limit up");
    let at_40_again = pace(&admission);
    assert!(at_40_again >= 34.0, "{at_40_again}: found the room again");
}
