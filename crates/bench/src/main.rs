//! forkd's benchmark suite (`scripts/bench.sh`): one run measures cache efficiency against the
//! alternatives, the daemon's overhead, memory and disk per child, durability cost and recovery,
//! and notification latency, and prints them as Markdown (and JSON with `--json FILE`), each
//! figure against what it is compared with and the targets in docs/contracts.md.
//!
//! One module per figure; `common` holds what they share. Everything runs on the embedded sim
//! (no network) with seeded inputs.

mod branches;
mod cache;
mod common;
mod compaction;
mod durability;
mod faults;
mod hooks;
mod isolation;
mod limit_matrix;
mod limits;
mod memory;
mod notify;
mod overhead;
mod report;
mod sandbox;
mod sandbox_load;
mod scale;
mod scaleout;
mod schedules;
mod schemas;
mod traces;
mod uploads;
mod webhooks;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use serde_json::json;

use report::Section;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Figure {
    Cache,
    Overhead,
    Memory,
    Durability,
    Notifications,
    Scale,
    Sandbox,
    Compaction,
    Scaleout,
    Limits,
    LimitMatrix,
    Isolation,
    Branches,
    Schemas,
    Traces,
    Faults,
    Uploads,
    Sandboxload,
    Webhooks,
    Schedules,
    Hooks,
}

/// forkd's benchmark suite.
#[derive(Debug, Parser)]
#[command(name = "forkd-bench", version)]
struct Cli {
    /// A smaller run (under 2 minutes on 2 cores): fewer prefixes, N and repetitions.
    #[arg(long)]
    quick: bool,
    /// Also write every figure and raw measurement as one JSON object to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Run only these figures (comma-separated).
    #[arg(long, value_delimiter = ',')]
    only: Vec<Figure>,
    /// Where the temporary databases go (a disk, not tmpfs, for honest fsync figures).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Internal: measure one memory point (PREFIX:N:LIMIT_SECONDS) and print it as JSON.
    #[arg(long, hide = true, value_name = "PREFIX:N:LIMIT")]
    memory_probe: Option<String>,
}

/// The machine, as `nproc` and `lscpu` would name it.
fn machine() -> serde_json::Value {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name")?.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default();
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    json!({"cpus": cpus, "cpu_model": model, "memory_gib": mem_gib, "load_average_1m": load})
}

async fn run_figure(figure: Figure, ctx: &common::Ctx) -> anyhow::Result<Section> {
    match figure {
        Figure::Cache => cache::run(ctx).await,
        Figure::Overhead => overhead::run(ctx).await,
        Figure::Memory => memory::run(ctx).await,
        Figure::Durability => durability::run(ctx).await,
        Figure::Notifications => notify::run(ctx).await,
        Figure::Scale => scale::run(ctx).await,
        Figure::Sandbox => sandbox::run(ctx).await,
        Figure::Compaction => compaction::run(ctx).await,
        Figure::Scaleout => scaleout::run(ctx).await,
        Figure::Limits => limits::run(ctx).await,
        Figure::LimitMatrix => limit_matrix::run(ctx).await,
        Figure::Isolation => isolation::run(ctx).await,
        Figure::Branches => branches::run(ctx).await,
        Figure::Schemas => schemas::run(ctx).await,
        Figure::Traces => traces::run(ctx).await,
        Figure::Faults => faults::run(ctx).await,
        Figure::Uploads => uploads::run(ctx).await,
        Figure::Sandboxload => sandbox_load::run(ctx).await,
        Figure::Webhooks => webhooks::run(ctx).await,
        Figure::Schedules => schedules::run(ctx).await,
        Figure::Hooks => hooks::run(ctx).await,
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let dir = match &cli.dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir(),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;

    if let Some(point) = &cli.memory_probe {
        let parts: Vec<&str> = point.split(':').collect();
        let [prefix, n, limit] = parts.as_slice() else {
            anyhow::bail!("--memory-probe takes PREFIX:N:LIMIT_SECONDS");
        };
        let limit = std::time::Duration::from_secs(limit.parse()?);
        let probe = memory::probe(&dir, prefix.parse()?, n.parse()?, limit).await?;
        println!("{}", serde_json::to_string(&probe)?);
        return Ok(());
    }

    let ctx = common::Ctx {
        quick: cli.quick,
        dir,
    };
    let figures: Vec<Figure> = if cli.only.is_empty() {
        Figure::value_variants().to_vec()
    } else {
        cli.only.clone()
    };
    let machine = machine();
    let started = Instant::now();
    let mut sections = Vec::new();
    for figure in figures {
        eprintln!("{figure:?}…");
        let section = run_figure(figure, &ctx)
            .await
            .with_context(|| format!("figure {figure:?}"))?;
        eprintln!("{figure:?} done in {:.1} s", section.seconds);
        sections.push(section);
    }
    let seconds = started.elapsed().as_secs_f64();

    let mode = if cli.quick { "quick" } else { "full" };
    println!("## forkd benchmarks ({mode} run)\n");
    println!(
        "Machine: {} CPUs ({}), {:.0} GiB; load average {} when the run started. Run time {:.0} s \
         (build not included). Sim: `SimProvider`, o200k_base token counts; model {} prices.\n",
        machine["cpus"],
        machine["cpu_model"].as_str().unwrap_or(""),
        machine["memory_gib"].as_f64().unwrap_or(0.0),
        machine["load_average_1m"].as_str().unwrap_or("?"),
        seconds,
        forkd_core::pricing::DEFAULT_MODEL,
    );
    for s in &sections {
        println!("{}", s.markdown());
    }
    println!("### Against the targets\n");
    println!("{}", report::checks_markdown(&sections));

    if let Some(path) = &cli.json {
        let out = json!({
            "mode": mode,
            "machine": machine,
            "seconds": seconds,
            "figures": sections,
        });
        std::fs::write(path, serde_json::to_string_pretty(&out)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("JSON written to {}", path.display());
    }
    Ok(())
}
