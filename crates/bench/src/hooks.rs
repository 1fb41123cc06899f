//! Figure 20, hooks: what a PreToolUse hook adds to a tool call — a child making 40 Bash `true`
//! calls in one reply (run one after another, no model request between them), with and without
//! a `true` hook on Bash; the gap between consecutive calls' ends is one call with its hooks.

use std::time::{Duration, Instant};

use forkd::daemon::{self, DaemonConfig};
use forkd_proto::v1 as pb;
use serde_json::json;

use crate::common::{self, Ctx};
use crate::overhead::connect;
use crate::report::{Section, Table};

/// Bash calls per child.
const CALLS: usize = 40;

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    let children = if ctx.quick { 2 } else { 5 };
    let plain = gaps(ctx, None, children).await?;
    let hooks = json!({"hooks": {"PreToolUse": [
        {"matcher": "Bash", "hooks": [{"type": "command", "command": "true"}]}
    ]}});
    let hooked = gaps(ctx, Some(hooks.to_string()), children).await?;
    let (p50_plain, p50_hooked) = (
        common::quantile(&plain, 0.5),
        common::quantile(&hooked, 0.5),
    );
    let mut table = Table::new(
        format!("{children} children × {CALLS} Bash `true` calls, sandboxed, sim speed 0"),
        &["calls", "p50 per call", "p99 per call"],
    );
    table.row(vec![
        "no hooks".into(),
        format!("{p50_plain:.0} ms"),
        format!("{:.0} ms", common::quantile(&plain, 0.99)),
    ]);
    table.row(vec![
        "a PreToolUse hook `true` on Bash".into(),
        format!("{p50_hooked:.0} ms"),
        format!("{:.0} ms", common::quantile(&hooked, 0.99)),
    ]);
    Ok(Section {
        id: "hooks",
        title: "20. Hooks: what a hook adds to a tool call".into(),
        compared_with: "the same calls without hooks".into(),
        tables: vec![table],
        notes: vec![format!(
            "Added per call (p50): {:.0} ms. A hook runs as a Bash command does: in the \
             session's sandbox view, its own process group, its event on stdin.",
            p50_hooked - p50_plain
        )],
        checks: Vec::new(),
        data: json!({ "plain_ms": plain, "hooked_ms": hooked }),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The gaps (ms) between consecutive Bash calls' ends, over `children` children.
async fn gaps(ctx: &Ctx, hooks: Option<String>, children: usize) -> anyhow::Result<Vec<f64>> {
    let home = ctx.tempdir("forkd-bench-hooks-")?;
    let ws = ctx.tempdir("forkd-bench-ws-")?;
    let mut config = DaemonConfig::new(home.path().to_path_buf());
    config.sim_speed = 0.0;
    if let Some(text) = &hooks {
        std::fs::write(home.path().join("hooks.json"), text)?;
    }
    let daemon = daemon::start(config).await?;
    let outcome = async {
        let mut client = connect(&daemon.addr()).await?;
        let session = client
            .create_session(pb::CreateSessionRequest {
                system_prompt: common::SYSTEM_PROMPT.into(),
                workspace: ws.path().display().to_string(),
                permission_mode: "bypassPermissions".into(),
                ..Default::default()
            })
            .await?
            .into_inner()
            .session
            .ok_or_else(|| anyhow::anyhow!("no session"))?;
        let script = format!(
            "Run.\n{}@sim say done",
            "@sim tool Bash {\"command\":\"true\"}\n".repeat(CALLS)
        );
        let batch = client
            .fork_batch(pb::ForkBatchRequest {
                session_id: session.session_id,
                directives: (0..children)
                    .map(|i| pb::Directive {
                        description: format!("child {i}"),
                        prompt: script.clone(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .await?
            .into_inner();
        let engine = &daemon.engine;
        let filter = forkd_store::NotificationFilter {
            batch_id: Some(batch.batch_id.parse()?),
            ..Default::default()
        };
        common::wait_notifications(engine, 0, filter, children).await?;
        let mut gaps = Vec::new();
        for id in &batch.agent_ids {
            let mut ends: Vec<i64> = engine
                .store()
                .tool_calls(id.parse()?)
                .await?
                .iter()
                .filter_map(|c| c.finished_at_ms)
                .collect();
            ends.sort_unstable();
            gaps.extend(ends.windows(2).map(|w| (w[1] - w[0]) as f64));
        }
        anyhow::Ok(gaps)
    }
    .await;
    daemon.shutdown(Duration::from_secs(5)).await?;
    outcome
}
