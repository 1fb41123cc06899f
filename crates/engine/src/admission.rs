//! Admission: the one place that decides when a model request may go, and what happens after
//! the provider refuses one. Every agent's requests — fork children, typed agents, parent turns,
//! compaction — pass through it (`model.rs`); providers make one attempt per request.
//!
//! There is one limiter per **key**: the provider's kind, base URL and key fingerprint
//! ([`Credential`]) and the model, since a provider's limits are per credential and model class.
//! For each key it keeps:
//!
//! - **the limits the provider stated** (`bucket`): its `*-ratelimit-*` headers teach each
//!   limit's capacity and refill rate, and requests are paced by them — each admitted request
//!   is charged one request, its estimated uncached input tokens (the prefix forkd knows is warm
//!   is not counted: cache reads do not count for the input limit) and `max_tokens` of output;
//!   the usage that comes back corrects the charge. Pacing by rate, not by concurrency: a
//!   per-minute quota is spent by how many requests start, not by how many are open.
//! - **one pause for the key**: a 429's `retry-after` (with up to 10 % jitter) holds every
//!   request for the key, not only the refused one — the daemon backs off as one client. A 503
//!   with `retry-after` is a limit too.
//! - **a pace learned from refusals** (`learn`): a 429 is evidence that the key sent faster
//!   than the provider admits, whatever its headers say (a provider counting in windows, one
//!   that states nothing): the key is paced to what the provider did admit, with a small
//!   burst, and the pace is raised again while nothing is refused. Until a provider over the
//!   network states a limit, its key starts slowly (8 requests a second, doubled every 250 ms
//!   while requests wait), so a limit nothing states meets a few requests at first, not a
//!   window's worth. A 429 before anything was answered makes the key probe: one request at a
//!   time until one succeeds.
//! - **a concurrency window** for overload (529, 503 and other 5xx): additive increase per
//!   success, halved at most once a second on overload. It is the right control for a server
//!   that is busy, and the wrong one for quotas, so it is only that.
//! - **a fair queue** (`queue`): parent turns before batch work, tenants in turn within each,
//!   and a request sent again after a refusal before its tenant's others.
//!
//! A refused request waits and goes again while its **patience** lasts: `provider_patience`
//! (15 minutes by default) from its first refusal; a provider that cannot be reached at all
//! (refused connection, DNS, TLS) has a short patience of its own (60 s), so a wrong base URL
//! fails fast. A plain 500 is tried only a few times (a self-hosted server answers 500 to a
//! request it cannot handle, every time). What cannot succeed by asking again (400, 401, 403)
//! fails at once. When patience is spent the request fails naming the limit, how long it waited
//! and how many refusals it got ([`ProviderError::GaveUp`]). A kill drops the waiting future;
//! shutdown's drain ends the wait through `stop`.

mod bucket;
mod capacity;
mod learn;
mod trouble;
mod warmth;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use forkd_core::Usage;
use forkd_provider::{Credential, ProviderError, RateLimits};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use crate::fair_queue::Class;
use crate::fair_queue::FairQueue;
use bucket::Buckets;
pub(crate) use bucket::Cost;
pub use capacity::{KeyCapacity, LimitSource, PacedLimit};
use learn::{Change, Learner};
use trouble::{Failure, Trouble, give_up, jittered_backoff, sleep_until};
#[cfg(test)]
use warmth::CACHE_TTL;
use warmth::Warmth;

use crate::config::AdmissionConfig;

/// One limit: whose, and for which model.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct LimitKey {
    pub credential: Credential,
    pub model: String,
}

/// One request asking to go.
#[derive(Debug, Clone)]
pub(crate) struct Ticket {
    pub tenant: Arc<str>,
    pub class: Class,
    pub cost: Cost,
    /// The fingerprint of the prefix the request shares with others (a batch's children), if
    /// any: a prefix that was warm and went cold is re-gated (see [`KeyState::warming`]).
    pub prefix: Option<Arc<str>>,
}

/// Why a request did not go.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The provider's answer (or the last one, once patience ran out).
    Provider(ProviderError),
    /// The daemon is shutting down: the request was never sent.
    Stopped,
}

/// The limiters of one daemon, by key.
#[derive(Debug, Default)]
pub(crate) struct Admission {
    config: AdmissionConfig,
    keys: Mutex<HashMap<LimitKey, Arc<Key>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is a few field writes: a panic cannot leave them torn.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The longest the limiter waits for a bucket in one go (it looks again then).
const MAX_TIMER: Duration = Duration::from_secs(3600);

impl Admission {
    pub(crate) fn new(config: AdmissionConfig) -> Self {
        Self {
            config,
            keys: Mutex::default(),
        }
    }

    fn key(&self, name: &LimitKey) -> Arc<Key> {
        let mut keys = lock(&self.keys);
        let key = keys.entry(name.clone()).or_insert_with(|| {
            Arc::new(Key {
                name: name.clone(),
                state: Mutex::new(KeyState::new(&self.config)),
            })
        });
        Arc::clone(key)
    }

    /// The uncached input tokens of a request of `total` input tokens, of which the first
    /// `prefix` share the fingerprint `fingerprint`, sent by `agent`: what the cache will not
    /// serve, as far as the limiter knows what is warm.
    pub(crate) fn uncached_estimate(
        &self,
        name: &LimitKey,
        agent: u128,
        fingerprint: &str,
        total: u64,
        prefix: u64,
    ) -> u64 {
        let key = self.key(name);
        let state = lock(&key.state);
        let now = Instant::now();
        let mut warm = 0;
        if state.warm.prefix(fingerprint, now) {
            warm = prefix;
        }
        if let Some(previous) = state.warm.agent(agent, now) {
            warm = warm.max(previous);
        }
        total.saturating_sub(warm)
    }

    /// Starts a request through `name`'s limiter. The caller loops: [`Attempts::admit`] waits
    /// for its turn, the caller sends, then reports [`Attempts::succeeded`] or
    /// [`Attempts::failed`], which waits before the next attempt or says to stop.
    pub(crate) fn request(&self, name: &LimitKey, ticket: Ticket) -> Attempts<'_> {
        Attempts {
            config: &self.config,
            key: self.key(name),
            ticket,
            trouble: None,
            permit: None,
        }
    }
}

/// One request's attempts through its key's limiter.
#[derive(Debug)]
pub(crate) struct Attempts<'a> {
    config: &'a AdmissionConfig,
    key: Arc<Key>,
    ticket: Ticket,
    trouble: Option<Trouble>,
    permit: Option<Permit>,
}

impl Attempts<'_> {
    /// Waits until the request may go: its turn in the queue, the key's pause over, room in
    /// the window and in every limit. The [`Observer`] reports what the response says.
    pub(crate) async fn admit(&mut self, stop: &CancellationToken) -> Result<Observer, Refused> {
        self.permit = None;
        let deadline = self.trouble.as_ref().map(Trouble::deadline);
        let permit = tokio::select! {
            biased;
            () = stop.cancelled() => return Err(Refused::Stopped),
            permit = self.key.acquire(&self.ticket, self.trouble.is_some()) => permit,
            () = sleep_until(deadline) => {
                return Err(give_up(&self.key, self.trouble.take(), "spent waiting for its turn"));
            }
        };
        let observer = permit.observer();
        self.permit = Some(permit);
        Ok(observer)
    }

    /// The attempt got its answer.
    pub(crate) fn succeeded(&mut self) {
        if let Some(permit) = self.permit.take() {
            permit.succeeded();
        }
        if let Some(t) = &self.trouble {
            let name = &self.key.name;
            crate::metrics::throttle_wait(name.credential.provider, &name.model, t.since.elapsed());
        }
    }

    /// The attempt failed with `error`: waits before the next attempt (`Ok`), or says why there
    /// is none (`Err`: a failure that asking again cannot mend, patience spent, shutdown).
    pub(crate) async fn failed(
        &mut self,
        error: ProviderError,
        stop: &CancellationToken,
    ) -> Result<(), Refused> {
        let config = self.config;
        let key = Arc::clone(&self.key);
        let permit = self.permit.take();
        let now = Instant::now();
        let failure = Failure::of(&error);
        let t = self
            .trouble
            .get_or_insert_with(|| Trouble::new(now, config, &key));
        let own_wait = match failure {
            Failure::Final => return Err(Refused::Provider(error)),
            Failure::ServerError if t.server_errors >= config.max_server_error_retries => {
                return Err(Refused::Provider(error));
            }
            Failure::RateLimited { retry_after } => {
                if let Some(p) = &permit {
                    p.refund();
                }
                let sent = permit.as_ref().map(|p| p.sent);
                key.rate_limited(retry_after, sent, t.refusals, config, now);
                Duration::ZERO
            }
            Failure::Overloaded => {
                key.overloaded(now);
                t.backoff(config)
            }
            Failure::ServerError => {
                t.server_errors += 1;
                t.backoff(config)
            }
            Failure::Unreachable => t.backoff(config),
        };
        drop(permit);
        t.refusals += 1;
        if failure != Failure::Unreachable {
            t.patience = config.patience;
        }
        let wait = own_wait.max(key.pause_left(now));
        crate::metrics::throttled(
            key.name.credential.provider,
            &key.name.model,
            failure.label(&error),
        );
        tracing::info!(
            provider = key.name.credential.provider,
            model = %key.name.model,
            refusals = t.refusals,
            wait_ms = wait.as_millis() as u64,
            error = %error,
            "The provider refused a request; it goes again"
        );
        t.last = Some(error);
        // A wait that would end past the patience is not begun.
        if now + wait > t.deadline() {
            return Err(give_up(
                &key,
                self.trouble.take(),
                "spent before the next attempt could go",
            ));
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => Err(Refused::Stopped),
            () = tokio::time::sleep(own_wait) => Ok(()),
        }
    }
}

/// One key's limiter.
#[derive(Debug)]
struct Key {
    name: LimitKey,
    state: Mutex<KeyState>,
}

#[derive(Debug)]
struct KeyState {
    queue: FairQueue<Waiter>,
    in_flight: usize,
    /// The concurrency window (AIMD).
    window: f64,
    max_window: f64,
    /// Every request of the key waits until then (a 429's `retry-after`).
    paused_until: Option<Instant>,
    /// A 429 came before any limit was known: one request at a time until one succeeds.
    probing: bool,
    last_decrease: Option<Instant>,
    buckets: Buckets,
    /// The pace learned from refusals.
    learner: Learner,
    /// Requests waiting to go again after a refusal.
    throttled: usize,
    /// When the timer that pumps the queue next fires.
    timer: Option<Instant>,
    warm: Warmth,
    /// Re-gating: a prefix that was warm once and has gone cold (its requests waited past the
    /// cache's lifetime) lets one request through to write it again — its permit's id is kept
    /// here — and holds the others sharing it in `held` until that request's response starts
    /// (or it ends without: then the next one goes).
    warming: HashMap<Arc<str>, u64>,
    held: HashMap<Arc<str>, Vec<Waiter>>,
    next_permit: u64,
    /// What the limiter's gauges show now.
    shown: Option<Shown>,
}

/// One key's limiter as its gauges last showed it.
#[derive(Debug, PartialEq)]
struct Shown {
    window: f64,
    in_flight: usize,
    waiting: usize,
    rates: [(&'static str, Option<f64>); 4],
}

impl KeyState {
    fn new(config: &AdmissionConfig) -> Self {
        let max = config.max_concurrency.max(1) as f64;
        Self {
            queue: FairQueue::default(),
            in_flight: 0,
            window: (config.initial_concurrency.max(1) as f64).min(max),
            max_window: max,
            paused_until: None,
            probing: false,
            last_decrease: None,
            buckets: Buckets::default(),
            learner: Learner::default(),
            throttled: 0,
            timer: None,
            warm: Warmth::default(),
            warming: HashMap::new(),
            held: HashMap::new(),
            next_permit: 0,
            shown: None,
        }
    }

    /// Puts the requests held for `prefix` back at the front of their queues, in order.
    fn release(&mut self, prefix: &str) {
        self.warming.remove(prefix);
        for waiter in self.held.remove(prefix).into_iter().flatten().rev() {
            let tenant = Arc::clone(&waiter.tenant);
            self.queue.push(waiter.class, &tenant, waiter, true);
        }
    }
}

#[derive(Debug)]
struct Waiter {
    cost: Cost,
    tenant: Arc<str>,
    class: Class,
    prefix: Option<Arc<str>>,
    tx: oneshot::Sender<Permit>,
}

impl Key {
    fn state(&self) -> MutexGuard<'_, KeyState> {
        lock(&self.state)
    }

    async fn acquire(self: &Arc<Self>, ticket: &Ticket, first: bool) -> Permit {
        loop {
            let (tx, rx) = oneshot::channel();
            let waiter = Waiter {
                cost: ticket.cost,
                tenant: Arc::clone(&ticket.tenant),
                class: ticket.class,
                prefix: ticket.prefix.clone(),
                tx,
            };
            self.state()
                .queue
                .push(ticket.class, &ticket.tenant, waiter, first);
            self.pump();
            if let Ok(permit) = rx.await {
                return permit;
            }
        }
    }

    /// Admits the waiting requests that may go now, in the queue's order, and sets a timer for
    /// when the next may.
    fn pump(self: &Arc<Self>) {
        let mut wake_at = None;
        {
            let mut s = self.state();
            let now = Instant::now();
            while let Some(head) = s.queue.peek() {
                if head.tx.is_closed() {
                    s.queue.pop();
                    continue;
                }
                let cost = head.cost;
                // A cold prefix another request is writing: this one waits for it, aside.
                let cold = head.prefix.clone().filter(|p| s.warm.went_cold(p, now));
                if let Some(p) = &cold
                    && s.warming.contains_key(p)
                {
                    if let Some(waiter) = s.queue.pop() {
                        s.held.entry(Arc::clone(p)).or_default().push(waiter);
                    }
                    continue;
                }
                if let Some(until) = s.paused_until {
                    if until > now {
                        wake_at = Some(until);
                        break;
                    }
                    s.paused_until = None;
                }
                if s.in_flight as f64 >= s.window.floor().max(1.0) || (s.probing && s.in_flight > 0)
                {
                    break;
                }
                // A provider over the network may be a gateway limiting without a word:
                // until its headers state a limit, the key starts slowly (`learn::Learner`).
                if !s.buckets.known() && !self.name.credential.endpoint.is_empty() {
                    s.learner.start(now);
                }
                if let Some(change) = s.learner.probe(now) {
                    self.learned(change);
                }
                let wait = s.buckets.wait(cost, now).max(s.learner.wait(now));
                if !wait.is_zero() {
                    wake_at = Some(now + wait.min(MAX_TIMER));
                    break;
                }
                let Some(waiter) = s.queue.pop() else { break };
                s.buckets.take(cost, now);
                s.learner.take(now);
                s.in_flight += 1;
                s.next_permit += 1;
                let id = s.next_permit;
                if let Some(p) = &cold {
                    s.warming.insert(Arc::clone(p), id);
                }
                let permit = Permit {
                    key: Arc::clone(self),
                    sent: now,
                    charged: Arc::new(Mutex::new(cost)),
                    armed: true,
                    warming: cold.map(|p| (p, id)),
                };
                if let Err(mut unsent) = waiter.tx.send(permit) {
                    unsent.armed = false;
                    s.in_flight -= 1;
                    s.buckets.refund(cost, now);
                    if let Some((p, _)) = unsent.warming.take() {
                        s.release(&p);
                    }
                }
            }
            // The gauges, when what they show changed: a pump runs several times a request.
            let shown = Shown {
                window: s.window,
                in_flight: s.in_flight,
                waiting: s.queue.len(),
                rates: s.buckets.rates(),
            };
            if s.shown.as_ref() != Some(&shown) {
                crate::metrics::limiter(
                    self.name.credential.provider,
                    &self.name.model,
                    shown.window,
                    shown.in_flight,
                    shown.waiting,
                    &shown.rates,
                );
                s.shown = Some(shown);
            }
            match wake_at {
                Some(at) if s.timer.is_none_or(|t| at < t) => s.timer = Some(at),
                _ => wake_at = None,
            }
        }
        if let Some(at) = wake_at {
            let key = Arc::clone(self);
            tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                {
                    let mut s = key.state();
                    if s.timer == Some(at) {
                        s.timer = None;
                    }
                }
                key.pump();
            });
        }
    }

    fn pause_left(&self, now: Instant) -> Duration {
        self.state()
            .paused_until
            .map_or(Duration::ZERO, |u| u.saturating_duration_since(now))
    }

    /// A 429 (or a 503 that says when to come back) for the request sent at `sent`: every
    /// request of the key waits as the provider asked, and the pace is learned from it.
    fn rate_limited(
        self: &Arc<Self>,
        retry_after: Option<Duration>,
        sent: Option<Instant>,
        refusals: u32,
        config: &AdmissionConfig,
        now: Instant,
    ) {
        let wait = match retry_after {
            Some(after) => after + after.mul_f64(0.1 * fastrand::f64()),
            None => jittered_backoff(config, refusals),
        };
        {
            let mut s = self.state();
            let until = now + wait.min(MAX_TIMER);
            s.paused_until = Some(s.paused_until.map_or(until, |u| u.max(until)));
            if let Some(change) = sent.and_then(|sent| s.learner.refused(sent, now)) {
                self.learned(change);
            }
            s.learner.pause(now, until);
            // Nothing to pace by: one request at a time until one is answered.
            if !s.buckets.known() && s.learner.rate().is_none() {
                s.probing = true;
            }
        }
        self.pump();
    }

    /// Says what the limiter learned.
    fn learned(&self, change: Change) {
        let (provider, model) = (self.name.credential.provider, &self.name.model);
        match change {
            Change::Lowered { measured, rate } => tracing::info!(
                provider,
                model = %model,
                measured = format!("{measured:.2}/s"),
                pace = format!("{rate:.2}/s"),
                "The provider refused a request: its key is paced to what it admitted"
            ),
            Change::Started => tracing::debug!(
                provider,
                model = %model,
                "The key's slow start ended without a rate to pace to"
            ),
            Change::Raised { rate } => tracing::debug!(
                provider,
                model = %model,
                pace = format!("{rate:.2}/s"),
                "No refusal for a while: the key's pace is raised"
            ),
        }
    }

    fn overloaded(&self, now: Instant) {
        let mut s = self.state();
        if s.last_decrease
            .is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_secs(1))
        {
            s.window = (s.window / 2.0).max(1.0);
            s.last_decrease = Some(now);
        }
    }
}

/// A request's place in flight. Dropping it frees the place.
#[derive(Debug)]
pub(crate) struct Permit {
    key: Arc<Key>,
    /// When it was admitted: when the request went.
    sent: Instant,
    /// What the buckets were charged for it, as corrected so far.
    charged: Arc<Mutex<Cost>>,
    armed: bool,
    /// The cold prefix this request writes again for the others held on it, and its id there.
    warming: Option<(Arc<str>, u64)>,
}

impl Permit {
    fn observer(&self) -> Observer {
        Observer {
            key: Arc::clone(&self.key),
            charged: Arc::clone(&self.charged),
        }
    }

    fn succeeded(&self) {
        let mut s = self.key.state();
        s.learner.answered(self.sent, Instant::now());
        s.probing = false;
        s.window = (s.window + 1.0 / s.window).min(s.max_window);
    }

    /// Gives the charge back: the provider refused the request and counted nothing.
    fn refund(&self) {
        let cost = *lock(&self.charged);
        self.key.state().buckets.refund(cost, Instant::now());
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        {
            let mut s = self.key.state();
            s.in_flight -= 1;
            // Ended without its response starting (refused, failed, killed): the requests
            // held on its prefix go, and the first of them writes it.
            if let Some((p, id)) = self.warming.take()
                && s.warming.get(&p) == Some(&id)
            {
                s.release(&p);
            }
        }
        self.key.pump();
    }
}

/// What an attempt tells the limiter about its response, as it streams.
#[derive(Debug, Clone)]
pub(crate) struct Observer {
    key: Arc<Key>,
    charged: Arc<Mutex<Cost>>,
}

impl Observer {
    /// The limits the response's headers stated.
    pub(crate) fn limits(&self, limits: &RateLimits) {
        {
            let mut s = self.key.state();
            s.buckets.observe(limits, Instant::now());
            if s.buckets.known() {
                s.learner.stated();
            }
        }
        self.key.pump();
    }

    /// The input side of the usage (at `message_start`): the charge becomes the uncached
    /// input the provider counted, and what the request read or wrote is warm from now on:
    /// the prefix `fingerprint` names, and everything the agent sent.
    /// A provider that reports usage only at the end (chat completions) says zero at the
    /// start: the charge then stands until the end's usage comes.
    pub(crate) fn started(&self, agent: u128, fingerprint: &str, usage: &Usage) {
        if *usage == Usage::default() {
            return;
        }
        let now = Instant::now();
        let uncached = (usage.input_tokens + usage.cache_creation_input_tokens) as f64;
        let cached = usage.cache_creation_input_tokens + usage.cache_read_input_tokens;
        {
            let mut s = self.key.state();
            let mut charged = lock(&self.charged);
            let delta = Cost {
                input_tokens: uncached - charged.input_tokens,
                output_tokens: 0.0,
            };
            charged.input_tokens = uncached;
            s.buckets.correct(delta, now);
            if cached > 0 {
                if !fingerprint.is_empty() {
                    s.warm.warmed_prefix(fingerprint, now);
                    if s.warming.contains_key(fingerprint) {
                        s.release(fingerprint);
                    }
                }
                s.warm.warmed_agent(agent, cached, now);
            }
        }
        self.key.pump();
    }

    /// The output tokens the response produced (at its end): the `max_tokens` charged at
    /// admission is corrected to them.
    pub(crate) fn finished(&self, output_tokens: u64) {
        {
            let mut s = self.key.state();
            let mut charged = lock(&self.charged);
            let delta = Cost {
                input_tokens: 0.0,
                output_tokens: output_tokens as f64 - charged.output_tokens,
            };
            charged.output_tokens = output_tokens as f64;
            s.buckets.correct(delta, Instant::now());
        }
        self.key.pump();
    }
}

#[cfg(test)]
mod learning_tests;
#[cfg(test)]
mod tests;
