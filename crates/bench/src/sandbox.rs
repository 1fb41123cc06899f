//! Figure 7, the sandbox's cost: a `Bash` call of `true`, sandboxed (`workspace-write`, no
//! network: the view's user, mount and network namespaces with the covers over hidden paths, a
//! PID namespace of its own, Landlock, seccomp) against unsandboxed (`full-access`), through the
//! same tool call path the engine uses.

use std::time::Instant;

use forkd_tools::sandbox::{Sandbox, SandboxMode, SandboxPaths};
use forkd_tools::{SandboxSpec, ToolContext, Workspace, run_tool};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::common::{self, Ctx};
use crate::report::{Check, Section, Table};

/// `calls` Bash calls of `true` in `ctx`, each timed, in milliseconds.
async fn time_calls(ctx: &ToolContext, calls: usize) -> anyhow::Result<Vec<f64>> {
    let input = json!({ "command": "true" });
    let mut samples = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        let out = run_tool("Bash", &input, ctx).await;
        samples.push(common::ms(started.elapsed()));
        anyhow::ensure!(!out.is_error, "a Bash call failed: {}", out.content);
    }
    Ok(samples)
}

/// Issue 26's target for the second wall: at most this much slower than an unsandboxed call.
const RATIO_TARGET: f64 = 1.3;

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    let dir = ctx.tempdir("forkd-bench-sandbox-")?;
    let ws = dir.path().join("ws");
    let home = dir.path().join("home");
    for d in [&ws, &home] {
        std::fs::create_dir_all(d)?;
    }
    std::fs::write(home.join("forkd.db"), "secret")?;
    let plain = ToolContext::new(Workspace::new(&ws)?, CancellationToken::new());
    let deny = forkd_tools::sandbox::DEFAULT_DENY.map(|p| dir.path().join(p));
    let sandboxed = plain.clone().with_sandbox(SandboxSpec {
        sandbox: Sandbox {
            mode: SandboxMode::WorkspaceWrite,
            allow_network: false,
            unix_sockets: false,
        },
        paths: SandboxPaths {
            hidden: std::iter::once(home.clone()).chain(deny).collect(),
            tmp: dir.path().join("tmp"),
            // The daemon user's real home, covered as `forkd serve` covers it.
            home: std::env::var_os("HOME").map(|h| {
                let dir = std::path::PathBuf::from(h);
                forkd_tools::sandbox::HomeView {
                    allow: forkd_tools::sandbox::default_read_allow(
                        &dir,
                        std::env::var_os("PATH").as_deref(),
                    ),
                    dir,
                }
            }),
            limits: forkd_tools::sandbox::ResourceLimits::default(),
            // As a session's commands do, where the daemon may make cgroups.
            group: Some("bench".to_owned()),
        },
    });
    let calls = if ctx.quick { 50 } else { 100 };
    // Warm-up, unmeasured: the first calls page in bash and the libraries.
    time_calls(&plain, 5).await?;
    time_calls(&sandboxed, 5).await?;
    let (mut open, mut confined) = (Vec::new(), Vec::new());
    // Interleaved in rounds, so a noisy moment of the machine falls on both.
    for _ in 0..calls / 10 {
        open.extend(time_calls(&plain, 10).await?);
        confined.extend(time_calls(&sandboxed, 10).await?);
    }
    let (open_p50, confined_p50) = (
        common::quantile(&open, 0.5),
        common::quantile(&confined, 0.5),
    );
    let ratio = confined_p50 / open_p50;
    let mut table = Table::new(
        format!(
            "`Bash {{\"command\": \"true\"}}` through the tool layer, {calls} calls each, interleaved in rounds of 10"
        ),
        &["sandbox", "p50 ms", "p90 ms", "max ms"],
    );
    for (name, samples) in [
        ("full-access (none)", &open),
        ("workspace-write, no network", &confined),
    ] {
        table.row(vec![
            name.to_owned(),
            format!("{:.2}", common::quantile(samples, 0.5)),
            format!("{:.2}", common::quantile(samples, 0.9)),
            format!("{:.2}", common::quantile(samples, 1.0)),
        ]);
    }
    Ok(Section {
        id: "sandbox",
        title: "7. The sandbox's cost per Bash call".into(),
        compared_with: "the same call unsandboxed (full-access).".into(),
        tables: vec![table],
        notes: vec![
            "A call is the whole tool call: the Bash group with its sentinel, the output pipe, the \
             timeout, the group's kill at the end. The sandbox adds, in the daemon, the Landlock \
             ruleset, the view's key (a stat of each hidden and allowed path) and the session's \
             cgroup (where the daemon may make one); in the child: setns into the view's user, \
             mount and network namespaces (made once by a holder process, with the home's tmpfs \
             and the covers in them), its own mount and PID namespaces under forkd's init (a \
             CLONE_VM clone and a fresh /proc), one fork for the command, rlimits, Landlock and \
             the seccomp filters. The first call of a view also makes it."
                .into(),
        ],
        checks: vec![Check::judge(
            "sandbox: p50 per Bash call, sandboxed ÷ unsandboxed",
            format!("≤ {RATIO_TARGET}×"),
            format!("{ratio:.2}× ({confined_p50:.2} ms against {open_p50:.2} ms)"),
            ratio <= RATIO_TARGET,
            || format!("{:.2}× over", ratio - RATIO_TARGET),
        )],
        data: json!({"calls": calls, "unsandboxed_ms": open, "sandboxed_ms": confined}),
        seconds: started.elapsed().as_secs_f64(),
    })
}
