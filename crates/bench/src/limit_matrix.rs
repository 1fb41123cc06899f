//! Figure 10b: the limiter at providers that limit as others do. The same client batch as
//! figure 10's, against `forkd sim-server` limiting requests with each algorithm (a token
//! bucket, a sliding window, a fixed window) and each header mode (Anthropic's rate headers,
//! only `retry-after`, nothing): 200 children at 20 requests/s and 1000 at 50 requests/s.
//!
//! The floor is the admitted requests over the rate. Targets in every cell: every child
//! completes, 429s ≤ 5 % of the admitted requests, wall ≤ 1.2 × the floor.

use std::time::Instant;

use serde_json::json;

use crate::common::{self, Corpus, Ctx};
use crate::limits::{HISTORY, Plan, batch};
use crate::report::{Check, Section, Table};

const ALGORITHMS: [&str; 3] = ["token-bucket", "sliding-window", "fixed-window"];
const HEADERS: [&str; 3] = ["anthropic", "retry-after-only", "none"];

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    let corpus = Corpus::generate(HISTORY + 5_000);
    let sizes: &[(usize, u32)] = if ctx.quick {
        &[(100, 20)]
    } else {
        &[(200, 20), (1000, 50)]
    };
    let mut t = Table::new(
        format!(
            "A client batch over a {} history through the `anthropic` provider against `forkd \
             sim-server --rate-limit requests=R,per=1s,algorithm=A,headers=H` (sim speed 0), \
             one run per cell. The floor: admitted requests ÷ R. 429s are counted against the \
             admitted requests.",
            common::ktok(HISTORY)
        ),
        &[
            "algorithm",
            "headers",
            "children @ rate",
            "completed",
            "wall s",
            "wall ÷ floor",
            "admitted",
            "429s (÷ admitted)",
        ],
    );
    let mut checks = Vec::new();
    let mut data = Vec::new();
    for &(n, rate) in sizes {
        for algorithm in ALGORITHMS {
            for headers in HEADERS {
                let spec =
                    format!("requests={rate},per=1s,algorithm={algorithm},headers={headers}");
                let plan = Plan {
                    name: spec.clone(),
                    n,
                    limit: Some((spec.clone(), f64::from(rate), f64::INFINITY)),
                };
                eprintln!("  limit-matrix: {spec} × {n}…");
                let run = batch(ctx, &corpus, &plan, false).await?;
                let admitted = run.requests - run.refused;
                let share = run.refused as f64 / admitted.max(1) as f64;
                let ratio = run.ratio();
                t.row(vec![
                    algorithm.to_owned(),
                    headers.to_owned(),
                    format!("{n} @ {rate}/s"),
                    format!("{}/{n}", run.completed),
                    format!("{:.2}", run.wall_s),
                    format!("{ratio:.3}"),
                    admitted.to_string(),
                    format!("{} ({})", run.refused, common::pct(share)),
                ]);
                data.push(json!({
                    "algorithm": algorithm,
                    "headers": headers,
                    "children": n,
                    "rate": rate,
                    "wall_s": run.wall_s,
                    "floor_s": run.floor_s,
                    "requests": run.requests,
                    "refused": run.refused,
                }));
                let cell = format!("limit-matrix: {algorithm}, {headers}, {n} @ {rate}/s");
                let (max_share, max_ratio) =
                    if algorithm == "token-bucket" && headers == "anthropic" {
                        (0.03, 1.15)
                    } else {
                        (0.05, 1.2)
                    };
                checks.push(Check::judge(
                    format!("{cell}: 429s"),
                    format!("429s ≤ {} of admitted requests", common::pct(max_share)),
                    common::pct(share),
                    share <= max_share,
                    || common::pct(share),
                ));
                checks.push(Check::judge(
                    format!("{cell}: wall"),
                    format!("wall ≤ {max_ratio} × the floor"),
                    format!("{ratio:.3} ×"),
                    ratio <= max_ratio,
                    || format!("{ratio:.3} ×"),
                ));
            }
        }
    }
    Ok(Section {
        id: "limit-matrix",
        title: "10b. The limiter at providers that limit otherwise".into(),
        compared_with: "the floor the limit sets; figure 10 (the token bucket with Anthropic's \
                        headers, which the limiter was first built for)"
            .into(),
        tables: vec![t],
        notes: vec![
            "A sliding window counts what it admitted over the last second; a fixed window \
             starts from nothing each second; `retry-after-only` states no limit, `none` not \
             even when to come back. The limiter learns a pace from each refusal \
             (docs/operations.md, \"The provider limiter\")."
                .into(),
        ],
        checks,
        data: json!(data),
        seconds: started.elapsed().as_secs_f64(),
    })
}
