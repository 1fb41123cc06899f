//! Figure 1, cache efficiency: the share of the children's input read from cache, and the batch's
//! input cost, for (a) forks with warm-up gating, (b) the same forks launched all at once, (c) N
//! independent agents launched together, against (d) the calculator's optimum.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use forkd_core::calc;
use forkd_core::pricing::{self, CacheTtl};
use forkd_core::{SessionId, Usage};
use forkd_engine::{BatchOptions, StatsScope};
use forkd_provider::{EventStream, ModelRequest, Provider};
use forkd_store::{Durability, NotificationFilter, Store};
use futures::{FutureExt, StreamExt};
use serde_json::json;
use tokio::sync::watch;

use crate::common::{self, Corpus, Ctx};
use crate::report::{Check, Section, Table, Verdict};

/// What one way of running N directives cost, from the engine's own statistics.
#[derive(Debug, Clone, Default)]
struct Outcome {
    /// Tokens every child's first request shares (`CacheStats::shared_prefix_tokens`).
    shared_prefix: u64,
    usage: Usage,
    requests: u32,
    children: u32,
    input_cost_usd: f64,
}

impl Outcome {
    fn read_share(&self) -> f64 {
        self.usage.cache_read_share()
    }

    /// Mean tokens of a child's own part of its first request (its directive).
    fn directive_tokens(&self) -> f64 {
        if self.requests == 0 {
            return 0.0;
        }
        self.usage.total_input() as f64 / self.requests as f64 - self.shared_prefix as f64
    }

    fn add(&mut self, s: &forkd_engine::CacheStats) {
        self.shared_prefix = self.shared_prefix.max(s.shared_prefix_tokens);
        self.usage += s.usage;
        self.requests += s.requests;
        self.children += s.children;
        self.input_cost_usd += s.input_cost_usd;
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "shared_prefix_tokens": self.shared_prefix,
            "children": self.children,
            "requests": self.requests,
            "input_tokens": self.usage.input_tokens,
            "cache_creation_input_tokens": self.usage.cache_creation_input_tokens,
            "cache_read_input_tokens": self.usage.cache_read_input_tokens,
            "read_share": self.read_share(),
            "input_cost_usd": self.input_cost_usd,
        })
    }
}

/// One (speed, prefix, N) point.
struct Point {
    speed: f64,
    prefix_target: u64,
    n: usize,
    gated: Outcome,
    at_once: Outcome,
    /// (c): N independent agents whose first requests are sent together.
    independent: Outcome,
    /// (c′): the same agents, each request sent as soon as its session's commit is done, so the
    /// requests go out one commit apart.
    staggered: Outcome,
    /// How far apart (c′)'s first and last first requests reached the sim.
    staggered_spread: Duration,
    /// The calculator's forks (the optimum) and independent agents (no cache at all).
    calc_fork_usd: f64,
    calc_independent_usd: f64,
    /// The best share a fork batch can read: children 2..N read the prefix.
    ideal_share: f64,
}

/// The forks of one batch, on a fresh sim (cold cache).
async fn forks(
    store: &Arc<dyn Store>,
    ws: &Path,
    context: &forkd_engine::ContextFile,
    speed: f64,
    n: usize,
    gating: bool,
) -> anyhow::Result<Outcome> {
    let engine = common::engine(store, common::sim(speed));
    let session = engine
        .create_session(common::new_session(ws, context))
        .await?;
    let batch = common::fork_and_wait(&engine, &session, n, gating).await?;
    let mut out = Outcome::default();
    out.add(&common::batch_stats(&engine, batch.batch_id).await?);
    engine.shutdown(Duration::from_millis(100)).await;
    Ok(out)
}

/// A provider in front of another that, with `hold`, holds the first `n` requests until all `n`
/// have been sent, then sends them on together: N agents launched at the same instant, whose
/// first requests reach the provider together as a batch's siblings' do. Later requests pass
/// straight through. Either way it records when the first `n` arrived.
///
/// Without it, N independent launches reach the sim one SQLite commit apart (a few milliseconds
/// each, with building the request), which the sim's speed factor does not scale: at speed 0.01
/// its time to first token over a 10k prefix is 7 ms, so 32 launches spread over 16–60 ms stand
/// for launches seconds apart at a realistic pace, not for agents started together.
struct LaunchTogether {
    inner: Arc<dyn Provider>,
    n: usize,
    hold: bool,
    sent: AtomicUsize,
    all_sent: watch::Sender<bool>,
    arrivals: Mutex<Vec<Instant>>,
}

/// How long a held request waits for the others before it goes anyway (an agent that failed
/// before its request would otherwise hold the rest forever); the bench then reports it.
const HOLD_LIMIT: Duration = Duration::from_secs(60);

impl LaunchTogether {
    fn new(inner: Arc<dyn Provider>, n: usize, hold: bool) -> Self {
        Self {
            inner,
            n,
            hold,
            sent: AtomicUsize::new(0),
            all_sent: watch::Sender::new(n == 0),
            arrivals: Mutex::new(Vec::with_capacity(n)),
        }
    }

    /// Whether all `n` first requests arrived (and, with `hold`, went on together rather than
    /// alone after the limit).
    fn all_arrived(&self) -> bool {
        *self.all_sent.borrow()
    }

    /// From the first of the first `n` requests' arrival to the last's.
    fn spread(&self) -> Duration {
        let arrivals = self.arrivals.lock().unwrap_or_else(PoisonError::into_inner);
        match (arrivals.iter().min(), arrivals.iter().max()) {
            (Some(first), Some(last)) => *last - *first,
            _ => Duration::ZERO,
        }
    }
}

impl Provider for LaunchTogether {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn stream(&self, request: ModelRequest) -> EventStream {
        let i = self.sent.fetch_add(1, Ordering::SeqCst);
        if i >= self.n {
            return self.inner.stream(request);
        }
        self.arrivals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Instant::now());
        if i + 1 == self.n {
            self.all_sent.send_replace(true);
        }
        if !self.hold {
            return self.inner.stream(request);
        }
        let mut open = self.all_sent.subscribe();
        let inner = Arc::clone(&self.inner);
        async move {
            // Waiting ends when all are sent, or at the limit (an error here only means the
            // sender is gone, which cannot happen while `self` lives).
            let _ = tokio::time::timeout(HOLD_LIMIT, open.wait_for(|all| *all)).await;
            inner.stream(request)
        }
        .flatten_stream()
        .boxed()
    }

    fn credential(&self) -> forkd_provider::Credential {
        self.inner.credential()
    }
}

/// N sessions over the same context, one directive each, on a fresh sim: all sessions are
/// created first, then their directives are submitted at once. `together`: their first requests
/// are held until all N are sent ([`LaunchTogether`]); otherwise each goes out as soon as its
/// session's commit is done, one commit after another.
async fn independents(
    store: &Arc<dyn Store>,
    ws: &Path,
    context: &forkd_engine::ContextFile,
    speed: f64,
    n: usize,
    together: bool,
) -> anyhow::Result<(Outcome, Duration)> {
    let launch = Arc::new(LaunchTogether::new(common::sim(speed), n, together));
    let engine = common::engine(store, Arc::clone(&launch) as Arc<dyn Provider>);
    let mut sessions: Vec<SessionId> = Vec::with_capacity(n);
    for _ in 0..n {
        sessions.push(
            engine
                .create_session(common::new_session(ws, context))
                .await?
                .id,
        );
    }
    let since = store.last_notification_seq().await?;
    let submits = sessions.iter().enumerate().map(|(i, id)| {
        engine.fork_batch(
            *id,
            vec![common::directive(i)],
            BatchOptions {
                warmup_gating: Some(true),
                ..BatchOptions::default()
            },
        )
    });
    for submitted in futures::future::join_all(submits).await {
        submitted?;
    }
    common::wait_notifications(&engine, since, NotificationFilter::default(), n).await?;
    if !launch.all_arrived() {
        anyhow::bail!("(c): the {n} agents' first requests did not all arrive");
    }
    let mut out = Outcome::default();
    for id in sessions {
        out.add(&engine.cache_stats(StatsScope::Session(id)).await?);
    }
    engine.shutdown(Duration::from_millis(100)).await;
    Ok((out, launch.spread()))
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    let (prefixes, ns, speeds): (&[u64], &[usize], &[f64]) = if ctx.quick {
        (&[10_000, 100_000], &[2, 8, 32], &[0.0, 0.01])
    } else {
        (&[10_000, 48_500, 100_000], &[2, 5, 8, 16, 32], &[0.0, 0.01])
    };
    let dir = ctx.tempdir("forkd-bench-cache-")?;
    let ws = dir.path();
    let store: Arc<dyn Store> =
        Arc::new(common::open_store(&ws.join("forkd.db"), Durability::Normal).await?);
    let model = pricing::model(pricing::DEFAULT_MODEL)
        .ok_or_else(|| anyhow::anyhow!("{} is not in the price table", pricing::DEFAULT_MODEL))?;
    let largest = prefixes.iter().copied().max().unwrap_or(0);
    let corpus = Corpus::generate(largest + 1000);

    let mut overhead = std::collections::HashMap::new();
    for &n in ns.iter().chain(std::iter::once(&1)) {
        overhead.insert(n, common::prefix_overhead(ws, n).await?);
    }

    let mut points = Vec::new();
    for &speed in speeds {
        for &p in prefixes {
            for &n in ns {
                let budget = p.saturating_sub(overhead.get(&n).copied().unwrap_or(0));
                let context = corpus.context(budget);
                eprintln!("  cache: speed {speed}, prefix {}, N {n}", common::ktok(p));
                let gated = forks(&store, ws, &context, speed, n, true).await?;
                let at_once = forks(&store, ws, &context, speed, n, false).await?;
                let (independent, _) = independents(&store, ws, &context, speed, n, true).await?;
                let (staggered, staggered_spread) =
                    independents(&store, ws, &context, speed, n, false).await?;
                let (pt, d) = (gated.shared_prefix, gated.directive_tokens().round() as u64);
                let estimate = calc::estimate(model, pt, d, n as u64, CacheTtl::FiveMinutes);
                let nf = n as f64;
                let ideal_share =
                    (nf - 1.0) * pt as f64 / (nf * (pt as f64 + gated.directive_tokens()));
                points.push(Point {
                    speed,
                    prefix_target: p,
                    n,
                    gated,
                    at_once,
                    independent,
                    staggered,
                    staggered_spread,
                    calc_fork_usd: estimate.fork_cost_usd,
                    calc_independent_usd: estimate.independent_cost_usd,
                    ideal_share,
                });
            }
        }
    }
    Ok(section(&points, started.elapsed()))
}

fn ratio(x: f64, d: f64) -> String {
    format!("{:.3}", x / d)
}

fn section(points: &[Point], took: Duration) -> Section {
    let mut tables = Vec::new();
    let mut speeds: Vec<f64> = points.iter().map(|p| p.speed).collect();
    speeds.dedup();
    for speed in &speeds {
        let caption = if *speed == 0.0 {
            "**Sim at speed 0** (instant: a response starts the moment it is polled).".to_owned()
        } else {
            format!(
                "**Sim at speed {speed}** ({:.0}% of the realistic pace: a response starts \
                 {speed}·(0.2 s + 50 µs per uncached token) after it is sent, so requests sent \
                 together overlap as they would on a real provider).",
                speed * 100.0
            )
        };
        let mut t = Table::new(
            caption,
            &[
                "prefix",
                "N",
                "shared prefix P",
                "ideal read share",
                "(a) gated",
                "(b) all at once",
                "(c) independent, together",
                "(c′) staggered",
                "(c) request prefix",
                "(d) optimum, input $",
                "(a) cost ÷ (d)",
                "(b) ÷ (d)",
                "(c) ÷ (d)",
                "(c′) ÷ (d)",
                "(c′) first requests spread over, ms",
                "no cache ÷ (d)",
            ],
        );
        for p in points.iter().filter(|p| p.speed == *speed) {
            t.row(vec![
                common::ktok(p.prefix_target),
                p.n.to_string(),
                p.gated.shared_prefix.to_string(),
                common::pct(p.ideal_share),
                common::pct(p.gated.read_share()),
                common::pct(p.at_once.read_share()),
                common::pct(p.independent.read_share()),
                common::pct(p.staggered.read_share()),
                p.independent.shared_prefix.to_string(),
                format!("{:.4}", p.calc_fork_usd),
                ratio(p.gated.input_cost_usd, p.calc_fork_usd),
                ratio(p.at_once.input_cost_usd, p.calc_fork_usd),
                ratio(p.independent.input_cost_usd, p.calc_fork_usd),
                ratio(p.staggered.input_cost_usd, p.calc_fork_usd),
                format!("{:.1}", common::ms(p.staggered_spread)),
                ratio(p.calc_independent_usd, p.calc_fork_usd),
            ]);
        }
        tables.push(t);
    }

    let mut checks = Vec::new();
    for speed in &speeds {
        let at: Vec<&Point> = points.iter().filter(|p| p.speed == *speed).collect();
        let label = format!("cache, sim speed {speed}");
        let worst_share = at
            .iter()
            .map(|p| (p.gated.read_share() / p.ideal_share, p))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((share, p)) = worst_share {
            checks.push(Check::judge(
                format!("{label}: (a) read share"),
                "≥ 99% of the ideal share, every row",
                format!(
                    "worst {:.2}% of ideal (prefix {}, N {})",
                    share * 100.0,
                    common::ktok(p.prefix_target),
                    p.n
                ),
                share >= 0.99,
                || format!("{:.2} points", (0.99 - share) * 100.0),
            ));
        }
        let worst_cost = at
            .iter()
            .map(|p| (p.gated.input_cost_usd / p.calc_fork_usd, p))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((r, p)) = worst_cost {
            checks.push(Check::judge(
                format!("{label}: (a) cost"),
                "within 1% of (d), every row",
                format!(
                    "worst {:+.2}% (prefix {}, N {})",
                    (r - 1.0) * 100.0,
                    common::ktok(p.prefix_target),
                    p.n
                ),
                r <= 1.01,
                || format!("{:.2} points", (r - 1.01) * 100.0),
            ));
        }
        for (name, pick, judged) in [
            (
                "(b) all at once",
                (|p: &Point| p.at_once.input_cost_usd) as fn(&Point) -> f64,
                true,
            ),
            (
                "(c) independent, launched together",
                |p: &Point| p.independent.input_cost_usd,
                true,
            ),
            (
                "(c′) independent, staggered by their commits",
                |p: &Point| p.staggered.input_cost_usd,
                false,
            ),
        ] {
            let clearly: Vec<&&Point> = at
                .iter()
                .filter(|p| pick(p) >= 1.10 * p.gated.input_cost_usd)
                .collect();
            let least = at
                .iter()
                .map(|p| (pick(p) / p.gated.input_cost_usd, p))
                .min_by(|a, b| a.0.total_cmp(&b.0));
            let target = "clearly more than (a) (≥ 10% more), every row";
            let measured = match least {
                Some((r, p)) => format!(
                    "{} of {} rows; least {r:.3}× (a) (prefix {}, N {})",
                    clearly.len(),
                    at.len(),
                    common::ktok(p.prefix_target),
                    p.n
                ),
                None => "no rows".to_owned(),
            };
            let verdict = if !judged {
                Some(
                    "for comparison only: launches spread out by the daemon's commits, which the \
                     sim's speed factor does not scale; (c) is the alternative judged"
                        .to_owned(),
                )
            } else if *speed == 0.0 {
                Some(
                    "at speed 0 a response starts before the next request is sent, so nothing \
                     overlaps; see speed 0.01"
                        .to_owned(),
                )
            } else {
                None
            };
            let figure = format!("{label}: {name} cost");
            checks.push(match verdict {
                Some(why) => Check::new(figure, target, measured, Verdict::NotApplicable(why)),
                None => Check::judge(figure, target, measured, clearly.len() == at.len(), || {
                    format!("{} of {} rows", at.len() - clearly.len(), at.len())
                }),
            });
        }
    }

    let notes = vec![
        "Read share: cache-read tokens ÷ all input tokens of the children's requests (each child \
         answers in one request). Ideal: children 2..N read the shared prefix P, child 1 writes \
         it, so (N−1)·P ÷ N·(P+D). Figures are the engine's own (`Engine::cache_stats`, from the \
         stored request records)."
            .into(),
        "Cost: the batch's input cost (output is the same in every column), as a ratio to (d) \
         `forkd_core::calc`'s fork cost P·1.25·b + N·D·1.25·b + (N−1)·P·0.1·b for the measured \
         P and D: child 1 writes the shared prefix, children 2..N read it, and every child \
         writes its own directive (its block carries a breakpoint, so its later turns hit). \
         \"no cache\" is the calculator's independent agents, N·(P+D)·b."
            .into(),
        "P is the parent's history plus the shared boilerplate block: a client's batch gives \
         every child the same prefix whatever N. The context is sized so that P is the target."
            .into(),
        "(c): N independent agents launched together, as a user who wants N agents on the \
         same material starts them in parallel. N sessions with the same system prompt and \
         context are created first; then each gets its directive (a batch of one child) at \
         once, and their first requests are held until all N are sent and go to the sim \
         together. Without the hold, each session's own commit and request building (a few \
         milliseconds per agent, which the sim's speed factor does not scale) would space them \
         out: see (c′). Their requests \
         share tools, system and context (\"(c) request prefix\": what they share, their \
         sessions' history); whatever they read comes from each other's entries (the sim serves what was \
         written before a request is sent). Each scenario runs on a fresh sim, so every column \
         starts with a cold cache."
            .into(),
        "(c′) staggered, for comparison only (not judged): the same N agents without the hold, \
         each first request sent as soon as its session's batch is committed and its request \
         built, one SQLite commit after another; the spread column is from the first of them \
         to the last. At speed 0.01 that spread is one to several times the sim's time to \
         first token (7 ms over a 10k prefix, 52 ms over 100k), so the later agents read the \
         earlier ones' entries at the end of the shared context; at a realistic pace (×100) \
         the same spread is a small part of one time to first token, and the agents overlap \
         as in (c)."
            .into(),
        "At speed 0 a response starts the instant it is polled, so siblings launched together \
         (b) mostly find the first child's entry already written: the sim's cache is honest \
         about timing, and at speed 0 there is almost none. At speed 0.01 requests sent \
         together overlap as on a real provider, and (b) and (c) pay for a write per child."
            .into(),
    ];
    let data = json!(
        points
            .iter()
            .map(|p| json!({
                "sim_speed": p.speed,
                "prefix_target_tokens": p.prefix_target,
                "children": p.n,
                "ideal_read_share": p.ideal_share,
                "gated": p.gated.json(),
                "all_at_once": p.at_once.json(),
                "independent": p.independent.json(),
                "independent_staggered": p.staggered.json(),
                "independent_staggered_spread_ms": common::ms(p.staggered_spread),
                "calc_fork_cost_usd": p.calc_fork_usd,
                "calc_independent_cost_usd": p.calc_independent_usd,
            }))
            .collect::<Vec<_>>()
    );
    Section {
        id: "cache",
        title: "1. Cache efficiency: forks against the alternatives".into(),
        compared_with: "(d) the calculator's optimum (`forkd_core::calc`), the ideal read \
                        share, and each other: (a) forks with warm-up gating (the default), (b) \
                        the same forks all at once (`warmup_gating: Some(false)`), (c) N \
                        independent agents launched together ((c′): staggered by their \
                        commits, for comparison). Engine + `SimProvider` + SQLite, no gRPC."
            .into(),
        tables,
        notes,
        checks,
        data,
        seconds: took.as_secs_f64(),
    }
}
