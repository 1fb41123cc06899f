//! Figure 16, clients on other machines bring their files: the 10,000-file tree of figure 11
//! (each file's content made its own), a git checkout, uploaded with the real `forkctl upload` to
//! a real `forkd serve`; uploaded again with 3 files changed; a session started from that upload,
//! and another on a second daemon sharing the database (PostgreSQL); and `forkctl apply --batch
//! --to` of 100 isolated children's changes into a copy of the checkout.
//!
//! Needs `forkd` and `forkctl` beside this binary (`scripts/bench.sh` builds them). The second
//! daemon's row needs `FORKD_BENCH_DATABASE_URL` (as figure 9); without it that row says so.

use std::path::Path;
use std::time::Instant;

use anyhow::Context as _;
use forkd_proto::v1 as pb;
use serde_json::{Value, json};

use crate::common::{self, Ctx};
use crate::report::{Check, Section, Table, Verdict};
use crate::scaleout::{self, DATABASE_VAR};

/// Children whose changes are applied to the checkout.
const CHILDREN: usize = 100;

/// `forkctl --json ARGS` against the daemon whose home is `home`: its JSON lines, or its error.
fn forkctl(forkctl: &Path, home: &Path, args: &[&str]) -> anyhow::Result<Vec<Value>> {
    let out = std::process::Command::new(forkctl)
        .arg("--json")
        .args(args)
        .env("FORKD_HOME", home)
        .env_remove("FORKD_ADDR")
        .env_remove("FORKD_TOKEN")
        .output()
        .context("cannot run forkctl")?;
    anyhow::ensure!(
        out.status.success() || out.status.code() == Some(1),
        "forkctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("forkctl printed {l:?}")))
        .collect()
}

fn git(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let status = std::process::Command::new("git")
        .args([
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@example.invalid",
        ])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdout(std::process::Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "git {args:?} failed");
    Ok(())
}

/// The upload object `forkctl upload` printed, and the wall time it took.
fn upload(bin: &Path, home: &Path, tree: &Path) -> anyhow::Result<(Value, f64)> {
    let started = Instant::now();
    let printed = forkctl(bin, home, &["upload", &tree.display().to_string()])?;
    let ms = common::ms(started.elapsed());
    let first = printed
        .into_iter()
        .next()
        .context("forkctl printed nothing")?;
    Ok((first["upload"].clone(), ms))
}

/// A session from `upload_id` on `daemon`, and how long creating it took (the tree written out).
async fn session_from(
    daemon: &mut scaleout::Daemon,
    upload_id: &str,
    mode: &str,
) -> anyhow::Result<(String, f64)> {
    let started = Instant::now();
    let session = daemon
        .client
        .create_session(pb::CreateSessionRequest {
            system_prompt: common::SYSTEM_PROMPT.into(),
            upload_id: upload_id.to_owned(),
            permission_mode: mode.into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .session
        .context("no session")?;
    Ok((session.session_id, common::ms(started.elapsed())))
}

/// A share as a percentage precise enough for small ones.
fn share_of(x: f64) -> String {
    format!("{:.3} %", x * 100.0)
}

fn verdict(met: bool, missed: &str) -> Verdict {
    if met {
        Verdict::Met
    } else {
        Verdict::Missed(missed.to_owned())
    }
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Section> {
    let started = Instant::now();
    let forkd = scaleout::forkd_binary()?;
    let bin = forkd.with_file_name("forkctl");
    anyhow::ensure!(
        bin.exists(),
        "{} is missing: build it with `cargo build --release -p forkctl` (scripts/bench.sh does)",
        bin.display()
    );
    let sim = scaleout::sim_server().await?;
    let files = if ctx.quick { 2_000 } else { 10_000 };
    let size = 10_000;
    let dir = ctx.tempdir("forkd-bench-uploads-")?;
    let tree = dir.path().join("checkout");
    crate::isolation::generate(&tree, files, size)?;
    // Each file its own content (figure 11's are alike, which would upload as one blob).
    for i in 0..files {
        let path = tree.join(format!("src/d{:02}/f{i:05}.txt", i % 100));
        let mut text = std::fs::read_to_string(&path)?;
        text.replace_range(..16, &format!("file {i:05} -----"));
        std::fs::write(path, text)?;
    }
    git(&tree, &["init", "-q"])?;
    git(&tree, &["add", "-A"])?;
    git(&tree, &["commit", "-q", "-m", "the tree"])?;
    let tree_bytes = (files * size) as f64;

    let server = std::env::var(DATABASE_VAR)
        .ok()
        .filter(|u| !u.trim().is_empty());
    let database = match &server {
        Some(server) => Some(scaleout::scratch_database(server).await?),
        None => None,
    };
    let count = if database.is_some() { 2 } else { 1 };
    let mut setup = scaleout::start(ctx, &forkd, &sim, count, database).await?;
    let home = setup.homes[0].path().to_path_buf();

    eprintln!("  uploads: the first upload…");
    let (first, first_ms) = upload(&bin, &home, &tree)?;
    for i in 0..3 {
        let path = tree.join(format!("src/d{:02}/f{i:05}.txt", i % 100));
        let mut text = std::fs::read_to_string(&path)?;
        text.push_str("changed on the runner\n");
        std::fs::write(path, text)?;
    }
    eprintln!("  uploads: again, 3 files changed…");
    let (second, second_ms) = upload(&bin, &home, &tree)?;
    let sent = |v: &Value| v["bytes_sent"].as_f64().unwrap_or(f64::NAN);
    let upload_id = second["upload_id"]
        .as_str()
        .context("no upload id")?
        .to_owned();
    let (session, here_ms) =
        session_from(&mut setup.daemons[0], &upload_id, "bypassPermissions").await?;
    // Another session from the same upload: over the tree the daemon keeps now (a layer, where
    // /forkd/workspaces is here; else another copy).
    let (_, again_ms) =
        session_from(&mut setup.daemons[0], &upload_id, "bypassPermissions").await?;
    let on_second = if setup.daemons.len() > 1 {
        Some(
            session_from(&mut setup.daemons[1], &upload_id, "dontAsk")
                .await?
                .1,
        )
    } else {
        None
    };

    eprintln!("  uploads: {CHILDREN} isolated children, then apply --to…");
    let mut args: Vec<String> = vec![
        "fork".into(),
        session.clone(),
        "--isolation".into(),
        "copy".into(),
        "--wait".into(),
    ];
    for i in 0..CHILDREN {
        let path = format!("src/d{:02}/f{:05}.txt", i % 100, i + 100);
        args.push("-d".into());
        args.push(format!(
            "Mark it.\n@sim tool Bash {}\n@sim say marked",
            json!({ "command": format!("echo reviewed by child {i} >> {path}") })
        ));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let forked = forkctl(&bin, &home, &args)?;
    let batch = forked
        .first()
        .and_then(|v| v["batch_id"].as_str())
        .context("the fork printed no batch")?
        .to_owned();
    let checkout = dir.path().join("runner-checkout");
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(&tree)
        .arg(&checkout)
        .status()?;
    anyhow::ensure!(copied.success(), "cannot copy the checkout");
    let applying = Instant::now();
    let applied = forkctl(
        &bin,
        &home,
        &[
            "apply",
            "--batch",
            &batch,
            "--to",
            &checkout.display().to_string(),
        ],
    )?;
    let apply_ms = common::ms(applying.elapsed());
    let results = applied
        .first()
        .and_then(|v| v["results"].as_array().cloned())
        .unwrap_or_default();
    let clean = results
        .iter()
        .filter(|r| r["conflicts"].as_array().is_some_and(Vec::is_empty))
        .count();

    let database = setup.database.take();
    drop(setup);
    if let (Some((server, name)), true) = (database, server.is_some()) {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        scaleout::drop_database(&server, &name).await?;
    }

    let share = sent(&second) / tree_bytes;
    let mut table = Table::new(
        format!(
            "A git checkout of {files} files ({}), uploaded with `forkctl upload` to `forkd \
             serve` on this machine (a Unix socket: the network's cost is not in it), its \
             database {}",
            common::bytes(tree_bytes),
            if server.is_some() {
                "PostgreSQL (two daemons share it)"
            } else {
                "SQLite"
            }
        ),
        &["step", "wall ms", "bytes sent", "of the tree"],
    );
    table.row(vec![
        "first upload".into(),
        format!("{first_ms:.0}"),
        common::bytes(sent(&first)),
        share_of(sent(&first) / tree_bytes),
    ]);
    table.row(vec![
        "again, 3 files changed".into(),
        format!("{second_ms:.0}"),
        common::bytes(sent(&second)),
        share_of(share),
    ]);
    table.row(vec![
        "a session from it (its tree written out: kept, or a copy)".into(),
        format!("{here_ms:.0}"),
        "0 B".into(),
        "—".into(),
    ]);
    table.row(vec![
        "another session from it (a layer over the kept tree)".into(),
        format!("{again_ms:.0}"),
        "0 B".into(),
        "—".into(),
    ]);
    table.row(vec![
        "the same on a second daemon (PostgreSQL)".into(),
        on_second.map_or_else(
            || format!("not run: {DATABASE_VAR} unset"),
            |ms| format!("{ms:.0}"),
        ),
        "0 B".into(),
        "—".into(),
    ]);
    table.row(vec![
        format!("apply --to of {CHILDREN} children ({clean} applied)"),
        format!("{apply_ms:.0}"),
        "—".into(),
        "—".into(),
    ]);
    let checks = vec![
        Check::new(
            "uploads: a re-upload with 3 files changed, bytes sent ÷ the tree's",
            "< 1 %",
            share_of(share),
            verdict(share < 0.01, "more than 1 % was sent"),
        ),
        Check::new(
            "uploads: a re-upload with 3 files changed, wall",
            "< 1 s",
            format!("{second_ms:.0} ms"),
            verdict(second_ms < 1000.0, "it took a second or more"),
        ),
        Check::new(
            "uploads: children applied by apply --to",
            format!("{CHILDREN}"),
            format!("{clean}"),
            verdict(clean == CHILDREN, "some children were not applied"),
        ),
    ];
    Ok(Section {
        id: "uploads",
        title: "16. Uploaded workspaces and patches back".into(),
        compared_with: "the tree's own size (what a client without dedupe sends every time)".into(),
        tables: vec![table],
        notes: vec![
            "The re-upload hashes every file again (the client keeps no cache) and sends only \
             the blobs its tenant lacks. `apply --to` reads each child's recorded patch and \
             writes the files into the checkout."
                .into(),
        ],
        checks,
        data: json!({
            "files": files,
            "tree_bytes": tree_bytes,
            "first": { "ms": first_ms, "bytes_sent": sent(&first) },
            "again": { "ms": second_ms, "bytes_sent": sent(&second) },
            "session_ms": here_ms,
            "another_session_ms": again_ms,
            "second_daemon_ms": on_second,
            "apply": { "ms": apply_ms, "children": CHILDREN, "applied": clean },
        }),
        seconds: started.elapsed().as_secs_f64(),
    })
}
