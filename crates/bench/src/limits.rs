//! Figure 10: client batches at the provider's limits. The engine's `anthropic` provider against a
//! `forkd sim-server` in this process that limits its rate as the API does (`--rate-limit`): a
//! batch's wall time against the floor the limits set, the share of requests refused, the same
//! batch without limits, and another tenant's turn sent while the batch runs at the limit.
//!
//! The floor is the largest of the limits' floors: admitted requests over the request rate,
//! uncached input tokens over the input-token rate. Each bucket starts full, so a run may beat
//! the floor by one bucket's worth; "paced" is the wall against the floor less that bucket: how
//! close to the limit's own pace the batch went.

use std::sync::Arc;
use std::time::{Duration, Instant};

use forkd_core::tenant::Tenant;
use forkd_engine::{Engine, EngineConfig, ParentEvent};
use forkd_provider::{AnthropicConfig, AnthropicProvider, SimConfig, SimProvider};
use forkd_store::{Durability, Store};
use futures::StreamExt;
use serde_json::json;

use crate::common::{self, Corpus, Ctx};
use crate::report::{Check, Section, Table};

pub(crate) const HISTORY: u64 = 10_000;

/// One limited (or unlimited) configuration.
pub(crate) struct Plan {
    pub name: String,
    pub n: usize,
    /// `--rate-limit`'s spec, and the rates it sets per second (requests, input tokens; the
    /// buckets' capacities are the same numbers, `per=1s`).
    pub limit: Option<(String, f64, f64)>,
}

/// What one run of a plan measured.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Run {
    pub completed: usize,
    pub wall_s: f64,
    pub floor_s: f64,
    /// The floor less what the full buckets admit at once.
    paced_floor_s: f64,
    pub requests: usize,
    pub refused: usize,
    /// Another tenant's turn sent 2 s into the batch: to its first text, and on an idle engine.
    turn_ms: Option<(f64, f64)>,
}

impl Run {
    pub(crate) fn ratio(&self) -> f64 {
        if self.floor_s > 0.0 {
            self.wall_s / self.floor_s
        } else {
            f64::NAN
        }
    }

    fn paced(&self) -> f64 {
        if self.paced_floor_s > 0.0 {
            self.wall_s / self.paced_floor_s
        } else {
            f64::NAN
        }
    }

    pub(crate) fn refused_share(&self) -> f64 {
        self.refused as f64 / self.requests.max(1) as f64
    }
}

fn median_by(runs: &[Run], key: impl Fn(&Run) -> f64) -> Run {
    let mut sorted = runs.to_vec();
    sorted.sort_by(|a, b| key(a).total_cmp(&key(b)));
    sorted[sorted.len() / 2]
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    let corpus = Corpus::generate(HISTORY + 5_000);
    let reps = if ctx.quick { 1 } else { 3 };
    let (big, small) = if ctx.quick { (300, 50) } else { (1000, 200) };
    let plans = [
        Plan {
            name: "50 requests/s, 400k input tokens/s".into(),
            n: big,
            limit: Some((
                "requests=50,input_tokens=400000,per=1s".into(),
                50.0,
                400_000.0,
            )),
        },
        Plan {
            name: "5 requests/s".into(),
            n: small,
            limit: Some(("requests=5,per=1s".into(), 5.0, f64::INFINITY)),
        },
        Plan {
            name: "no limits".into(),
            n: big,
            limit: None,
        },
    ];
    let mut t = Table::new(
        format!(
            "A client batch over a {} history through the `anthropic` provider against `forkd \
             sim-server --rate-limit …` (sim speed 0), warm-up gating on; the median of {reps} \
             runs by wall time. The floor: the largest of admitted requests ÷ the request rate \
             and uncached input tokens ÷ the input-token rate; the buckets start full, so \
             \"paced\" is the wall against the floor less one bucket. Another tenant's turn is sent 2 s \
             into the first batch; its time to first text is against the same turn on the idle \
             engine.",
            common::ktok(HISTORY)
        ),
        &[
            "limits",
            "children",
            "completed",
            "wall s",
            "floor s",
            "wall ÷ floor",
            "paced (wall ÷ floor less a bucket)",
            "requests",
            "429s",
            "other tenant's first text ms (idle ms)",
        ],
    );
    let mut checks = Vec::new();
    let mut data = Vec::new();
    for plan in &plans {
        eprintln!("  limits: {} × {}…", plan.name, plan.n);
        let mut runs = Vec::new();
        for rep in 0..reps {
            let fairness = rep == 0 && plan.limit.is_some() && plan.n == big;
            runs.push(batch(ctx, &corpus, plan, fairness).await?);
        }
        let m = median_by(&runs, |r| r.wall_s);
        let turn = runs.iter().find_map(|r| r.turn_ms);
        t.row(vec![
            plan.name.to_owned(),
            plan.n.to_string(),
            format!("{}/{}", m.completed, plan.n),
            format!("{:.2}", m.wall_s),
            plan.limit
                .as_ref()
                .map_or("—".to_owned(), |_| format!("{:.2}", m.floor_s)),
            plan.limit
                .as_ref()
                .map_or("—".to_owned(), |_| format!("{:.3}", m.ratio())),
            plan.limit
                .as_ref()
                .map_or("—".to_owned(), |_| format!("{:.3}", m.paced())),
            m.requests.to_string(),
            format!("{} ({})", m.refused, common::pct(m.refused_share())),
            turn.map_or("—".to_owned(), |(busy, idle)| {
                format!("{busy:.1} ({idle:.1})")
            }),
        ]);
        data.push(json!({
            "plan": plan.name,
            "children": plan.n,
            "runs": runs.iter().map(|r| json!({
                "completed": r.completed,
                "wall_s": r.wall_s,
                "floor_s": r.floor_s,
                "paced_floor_s": r.paced_floor_s,
                "requests": r.requests,
                "refused": r.refused,
                "turn_ms": r.turn_ms,
            })).collect::<Vec<_>>(),
        }));
        let completed = runs.iter().all(|r| r.completed == plan.n);
        checks.push(Check::judge(
            format!("limits: {} × {}: completed", plan.name, plan.n),
            "every child completed, every run",
            format!(
                "{} of {} runs complete",
                runs.iter().filter(|r| r.completed == plan.n).count(),
                runs.len()
            ),
            completed,
            || "children failed".into(),
        ));
        if plan.limit.is_some() {
            let ratio = m.ratio();
            checks.push(Check::judge(
                format!("limits: {} × {}: wall", plan.name, plan.n),
                "wall ≤ 1.15 × the floor (median)",
                format!("{ratio:.3} × ({:.2} s for {:.2} s)", m.wall_s, m.floor_s),
                ratio <= 1.15,
                || format!("{ratio:.3} ×"),
            ));
            let share = m.refused_share();
            checks.push(Check::judge(
                format!("limits: {} × {}: 429s", plan.name, plan.n),
                "429s ≤ 3% of requests (median run)",
                common::pct(share),
                share <= 0.03,
                || common::pct(share),
            ));
        }
        if let (Some((busy, idle)), Some((_, rate, _))) = (turn, &plan.limit) {
            let bound = 2.0 * idle + 1000.0 / rate;
            checks.push(Check::judge(
                "limits: another tenant's turn during a batch at the limit",
                "first text ≤ 2 × an idle engine's + 1/rate",
                format!("{busy:.1} ms (bound {bound:.1} ms)"),
                busy <= bound,
                || format!("{busy:.1} ms"),
            ));
        }
    }
    Ok(Section {
        id: "limits",
        title: "10. Client batches at the provider's limits".into(),
        compared_with: "the floor the limits set; the same batch without limits (and figure 9's \
                        SQLite row, the same 1000-child batch through a `forkd serve` process)"
            .into(),
        tables: vec![t],
        notes: vec![
            "The sim refuses what its buckets cannot take with 429 and `retry-after`, and states \
             `anthropic-ratelimit-*` on every response; forkd learns each limit's rate from \
             them and paces by it, counting only uncached input (siblings reading child 1's \
             prefix are not charged for it)."
                .into(),
        ],
        checks,
        data: json!(data),
        seconds: started.elapsed().as_secs_f64(),
    })
}

pub(crate) async fn batch(
    ctx: &Ctx,
    corpus: &Corpus,
    plan: &Plan,
    fairness: bool,
) -> anyhow::Result<Run> {
    let sim = SimProvider::new(SimConfig {
        speed: 0.0,
        rate_limit: plan
            .limit
            .as_ref()
            .map(|(spec, ..)| spec.parse())
            .transpose()
            .map_err(anyhow::Error::msg)?,
    });
    let url = common::sim_server(sim.clone()).await?;
    let mut config = AnthropicConfig::new(common::SIM_API_KEY);
    config.base_url = url;
    let provider = Arc::new(AnthropicProvider::new(config)?);

    let dir = ctx.tempdir("forkd-bench-limits-")?;
    let ws = dir.path();
    let store: Arc<dyn Store> =
        Arc::new(common::open_store(&ws.join("forkd.db"), Durability::Normal).await?);
    // The other tenant works in a root of its own: tenants never share a workspace.
    let (local_ws, beta_ws) = (ws.join("local"), ws.join("beta"));
    std::fs::create_dir_all(&local_ws)?;
    std::fs::create_dir_all(&beta_ws)?;
    let mut config = EngineConfig::default();
    config
        .workspaces
        .roots
        .insert("beta".into(), vec![std::fs::canonicalize(&beta_ws)?]);
    let engine = Engine::new(store, provider, config);
    let context = corpus.context(HISTORY);
    let session = engine
        .create_session(common::new_session(&local_ws, &context))
        .await?;

    let other = if fairness {
        let beta = engine.for_tenant(Tenant::new("beta")?);
        let view = beta
            .create_session(common::new_session(&beta_ws, &context))
            .await?;
        let idle = first_text_ms(&engine, view.session.id, "An idle turn.").await?;
        Some((view.session.id, idle))
    } else {
        None
    };
    let answered_before = sim.answered().len();

    let t0 = Instant::now();
    let batch = {
        let engine = engine.clone();
        let session = session.clone();
        let n = plan.n;
        tokio::spawn(async move { common::fork_and_wait(&engine, &session, n, true).await })
    };
    let turn_ms = match other {
        Some((id, idle)) => {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let busy = first_text_ms(&engine, id, "A turn during the batch.").await?;
            Some((busy, idle))
        }
        None => None,
    };
    let submitted = batch.await??;
    let wall_s = t0.elapsed().as_secs_f64();

    let answered = sim.answered();
    let during = &answered[answered_before.min(answered.len())..];
    let requests = during.len();
    let refused = during.iter().filter(|a| a.status == 429).count();
    let admitted = requests - refused;
    let stats = common::batch_stats(&engine, submitted.batch_id).await?;
    let uncached = (stats.usage.input_tokens + stats.usage.cache_creation_input_tokens) as f64;
    let floors = |bucket: f64| {
        plan.limit
            .as_ref()
            .map_or(0.0, |&(_, requests_per_s, input_per_s)| {
                ((admitted as f64 - bucket * requests_per_s) / requests_per_s)
                    .max((uncached - bucket * input_per_s) / input_per_s)
                    .max(0.0)
            })
    };
    // The buckets hold one period's worth (`per=1s`).
    let (floor_s, paced_floor_s) = (floors(0.0), floors(1.0));
    Ok(Run {
        // `fork_and_wait` fails unless every child completed.
        completed: plan.n,
        wall_s,
        floor_s,
        paced_floor_s,
        requests,
        refused,
        turn_ms,
    })
}

/// Runs one parent turn of `session` (another tenant's); milliseconds to its first text.
async fn first_text_ms(
    engine: &Engine,
    session: forkd_core::SessionId,
    text: &str,
) -> anyhow::Result<f64> {
    let beta = engine.for_tenant(Tenant::new("beta")?);
    let t0 = Instant::now();
    let mut events = beta.send_message(session, text.into(), None).await?;
    let mut first = None;
    while let Some(event) = events.next().await {
        if let ParentEvent::TextDelta(_) = event? {
            first.get_or_insert_with(|| common::ms(t0.elapsed()));
        }
    }
    first.ok_or_else(|| anyhow::anyhow!("the turn produced no text"))
}
