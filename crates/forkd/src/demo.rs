//! `forkd demo`: a self-contained fork batch on the embedded defaults.
//!
//! It starts a daemon on a temporary `FORKD_HOME`, drives it through the real gRPC client like any
//! other client would, forks 5 directives from a ~48.5k-token shared context, and prints each
//! child's notification, the per-child cache figures, and the batch cost against 5 independent
//! agents and against the calculator's prediction.

use std::time::Duration;

use anyhow::{Context, bail};
use forkd_proto::v1 as pb;
use forkd_proto::v1::forkd_client::ForkdClient;
use tonic::transport::Channel;

use forkd_engine::{ContextFile, context_block};

use crate::daemon::{self, DaemonConfig};

mod report;

use report::DemoReport;

/// The shared context's size the demo aims for, in tokens (the seed document's example).
pub const TARGET_PREFIX_TOKENS: u64 = 48_500;

/// Tokens of the shared prefix outside the context files, measured on this build.
const NON_CONTEXT_TOKENS: u64 = 1_500;

/// Pairs each path (relative to the repository root) with the file's text, embedded at build time.
macro_rules! corpus {
    ($($path:literal),* $(,)?) => {
        &[$(($path, include_str!(concat!("../../../", $path)))),*]
    };
}

/// Real text for the shared context: forkd's own documents and sources, in a fixed order (the
/// demo takes as much of them as its budget allows).
const CORPUS: &[(&str, &str)] = corpus![
    "README.md",
    "ARCHITECTURE.md",
    "proto/forkd/v1/forkd.proto",
    "migrations/0001_initial.sql",
    "crates/core/src/fork.rs",
    "crates/core/src/request.rs",
    "crates/core/src/message.rs",
    "crates/core/src/session.rs",
    "crates/core/src/report.rs",
    "crates/core/src/calc.rs",
    "crates/core/src/agent.rs",
    "crates/core/src/json.rs",
    "crates/core/src/ids.rs",
    "crates/core/src/pricing.rs",
    "crates/core/src/usage.rs",
    "crates/core/src/tools.rs",
    "crates/engine/src/lib.rs",
    "crates/engine/src/run.rs",
    "crates/engine/src/batch.rs",
    "crates/engine/src/notify.rs",
    "crates/engine/src/stats.rs",
    "crates/engine/src/session.rs",
    "crates/engine/src/agents.rs",
    "crates/engine/src/run/tools.rs",
    "crates/engine/src/config.rs",
    "crates/engine/src/error.rs",
    "crates/store/src/lib.rs",
    "crates/store/src/sqlite.rs",
    "crates/store/src/shared/agents.rs",
    "crates/store/src/shared/notifications.rs",
    "crates/store/src/shared/batches.rs",
    "crates/store/src/shared/sessions.rs",
    "crates/store/src/shared/requests.rs",
    "crates/store/src/rows/convert.rs",
    "crates/provider/src/lib.rs",
    "crates/provider/src/accumulate.rs",
    "crates/provider/src/tokens.rs",
    "crates/provider/src/sim/cache.rs",
    "crates/provider/src/sim/script.rs",
    "crates/provider/src/sim/request.rs",
    "crates/provider/src/sim/reply.rs",
    "crates/provider/src/sim/stream.rs",
    "crates/server/src/lib.rs",
    "crates/server/src/convert.rs",
    "crates/server/src/status.rs",
    "crates/server/src/service/mod.rs",
    "crates/server/src/service/sessions.rs",
    "crates/server/src/service/agents.rs",
    "crates/server/src/service/notifications.rs",
    "crates/server/src/service/cache.rs",
    "crates/forkd/src/daemon.rs",
];

/// The demo's system prompt and its directives, as data: the engine's golden test of the demo's
/// children (`crates/engine/tests/golden.rs`) reads the same file.
const SCENARIO: &str = include_str!("demo/scenario.json");

#[derive(Debug, serde::Deserialize)]
struct Scenario {
    system_prompt: String,
    directives: Vec<ScenarioDirective>,
}

#[derive(Debug, serde::Deserialize)]
struct ScenarioDirective {
    description: String,
    prompt: String,
}

impl Scenario {
    fn embedded() -> anyhow::Result<Self> {
        serde_json::from_str(SCENARIO).context("the demo's embedded scenario.json does not parse")
    }
}

/// Tokens of a context file as the session will send it.
fn context_tokens(path: &str, content: &str) -> u64 {
    let file = ContextFile {
        path: path.to_owned(),
        content: content.to_owned(),
    };
    forkd_provider::tokens::block_tokens(context_block(&file).raw().as_str())
}

/// Builds the context files: the corpus in order, the last one cut at a line so that the files
/// come to at most `budget` tokens as sent.
fn context_files(budget: u64) -> Vec<pb::ContextFile> {
    let mut files = Vec::new();
    let mut used = 0u64;
    for (path, text) in CORPUS {
        let whole = context_tokens(path, text);
        let content = if used + whole <= budget {
            used += whole;
            (*text).to_owned()
        } else {
            // The longest prefix of whole lines that fits: binary search over the line count.
            let lines: Vec<&str> = text.split_inclusive('\n').collect();
            let (mut lo, mut hi) = (0, lines.len());
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                if used + context_tokens(path, &lines[..mid].concat()) <= budget {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            let content = lines[..lo].concat();
            used += context_tokens(path, &content);
            content
        };
        if content.is_empty() {
            break;
        }
        files.push(pb::ContextFile {
            path: (*path).to_owned(),
            content,
        });
    }
    files
}

/// How the demo runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub json: bool,
    pub sim_speed: f64,
    pub warmup_gating: bool,
}

/// The demo's temporary home, made as `forkd serve` makes a missing one: mode 0700, so that
/// the daemon has nothing to warn about.
fn demo_home() -> anyhow::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    tempfile::Builder::new()
        .prefix("forkd-demo-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .context("cannot create a temporary FORKD_HOME")
}

/// Runs the demo on a temporary home and prints its report. The temporary directory holds the
/// home, the session's workspace and `workspaces_dir` side by side: the home is never a
/// workspace.
pub async fn run(opts: DemoOptions) -> anyhow::Result<()> {
    let scratch = demo_home()?;
    let (home, workspace) = (
        scratch.path().join("home"),
        scratch.path().join("workspace"),
    );
    std::fs::create_dir(&workspace).context("cannot create the demo's workspace")?;
    let mut config = DaemonConfig::new(home);
    config.workspaces_dir = Some(scratch.path().join("workspaces"));
    config.sim_speed = opts.sim_speed;
    let daemon = daemon::start(config).await?;
    let outcome = drive(&daemon.addr(), &workspace, &opts).await;
    daemon.shutdown(Duration::from_secs(5)).await?;
    let report = outcome?;
    if opts.json {
        println!("{}", serde_json::to_string(&report.to_json())?);
    } else {
        report.print();
    }
    Ok(())
}

async fn connect(addr: &str) -> anyhow::Result<ForkdClient<Channel>> {
    let channel = tonic::transport::Endpoint::from_shared(addr.to_owned())
        .with_context(|| format!("bad address {addr}"))?
        .connect()
        .await
        .with_context(|| format!("cannot connect to the demo daemon at {addr}"))?;
    Ok(ForkdClient::new(channel))
}

async fn drive(
    addr: &str,
    workspace: &std::path::Path,
    opts: &DemoOptions,
) -> anyhow::Result<DemoReport> {
    let scenario = Scenario::embedded()?;
    let mut client = connect(addr).await?;
    // The rest of the shared prefix (system prompt, tools, first-message framing, the fork
    // message, placeholders and boilerplate) is about 1.5k tokens; the demo prints the prefix it
    // measured.
    let session = client
        .create_session(pb::CreateSessionRequest {
            system_prompt: scenario.system_prompt.clone(),
            context_files: context_files(TARGET_PREFIX_TOKENS - NON_CONTEXT_TOKENS),
            workspace: workspace.display().to_string(),
            permission_mode: "dontAsk".to_owned(),
            ..Default::default()
        })
        .await
        .context("CreateSession failed")?
        .into_inner()
        .session
        .context("daemon returned no session")?;
    let batch = client
        .fork_batch(pb::ForkBatchRequest {
            session_id: session.session_id.clone(),
            directives: scenario
                .directives
                .iter()
                .map(|d| pb::Directive {
                    description: d.description.clone(),
                    prompt: d.prompt.clone(),
                    limits: None,
                })
                .collect(),
            warmup_gating: Some(opts.warmup_gating),
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut stream = client
        .subscribe_notifications(pb::SubscribeNotificationsRequest {
            batch_id: batch.batch_id.clone(),
            follow: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut children: Vec<Option<pb::Notification>> = vec![None; batch.agent_ids.len()];
    while children.iter().any(Option::is_none) {
        let Some(n) = stream.message().await? else {
            bail!("the notification stream ended before every child did");
        };
        if let Some(i) = batch.agent_ids.iter().position(|a| *a == n.agent_id) {
            children[i] = Some(n);
        }
    }
    let children: Vec<pb::Notification> = children.into_iter().flatten().collect();
    let stats = client
        .get_cache_stats(pb::GetCacheStatsRequest {
            scope: Some(pb::get_cache_stats_request::Scope::BatchId(
                batch.batch_id.clone(),
            )),
        })
        .await?
        .into_inner();
    let n = children.len() as u64;
    let total_input: u64 = children
        .iter()
        .filter_map(|c| c.usage.as_ref())
        .map(|u| u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens)
        .sum();
    let directive_tokens =
        (total_input.saturating_sub(n * stats.shared_prefix_tokens) + n / 2) / n.max(1);
    let estimate = client
        .estimate_fork_cost(pb::EstimateForkCostRequest {
            prefix_tokens: stats.shared_prefix_tokens,
            directive_tokens,
            children: n as u32,
            model: session.model.clone(),
            one_hour_cache: false,
        })
        .await?
        .into_inner();
    Ok(DemoReport {
        model: session.model,
        session_id: session.session_id,
        batch_id: batch.batch_id,
        children,
        stats,
        estimate,
        directive_tokens,
        labels: scenario
            .directives
            .into_iter()
            .map(|d| d.description)
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_scenario_parses_with_five_directives() {
        let scenario = super::Scenario::embedded().unwrap();
        assert!(
            scenario
                .system_prompt
                .starts_with("You are the lead engineer of forkd")
        );
        assert_eq!(scenario.directives.len(), 5);
    }

    #[test]
    fn the_demo_home_is_its_owner_s_alone() {
        let home = super::demo_home().unwrap();
        let mode = std::fs::metadata(home.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    }
}
