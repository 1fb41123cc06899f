//! `forkctl diff`, `apply` and `discard`: an isolated child's changes (a batch forked with
//! `--isolation copy`), shown, applied to the session's workspace, or thrown away.

use clap::Args;
use forkd_core::isolation::{quote_path, without_binary_patches};
use forkd_proto::v1::{
    AppliedChanges, ApplyChangesRequest, DiscardChangesRequest, GetChangesRequest,
    GetChangesResponse,
};
use serde_json::{Value, json};

use crate::client::Client;
use crate::exit;
use crate::output::Printer;

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The isolated child's id.
    #[arg(required_unless_present = "batch", conflicts_with = "batch")]
    pub agent_id: Option<String>,

    /// Every child of this batch, in its order, each led by a `# agent …` line.
    #[arg(long, value_name = "BATCH")]
    pub batch: Option<String>,

    /// List the changed files with their line counts instead of the diff.
    #[arg(long)]
    pub stat: bool,

    /// `diff` (binary patches' bodies left out) or `patch`: what `git apply` takes as is,
    /// binary files included.
    #[arg(long, value_enum, default_value_t = Format::Diff)]
    pub format: Format,
}

/// How `forkctl diff` prints the changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Diff,
    Patch,
}

/// The children an apply or a discard names.
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// Children's ids, applied in this order.
    #[arg(
        value_name = "AGENT",
        required_unless_present = "batch",
        conflicts_with = "batch"
    )]
    pub agent_ids: Vec<String>,

    /// Every child of this batch, in its order.
    #[arg(long, value_name = "BATCH")]
    pub batch: Option<String>,
}

pub async fn diff(args: DiffArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let Some(batch) = &args.batch else {
        let agent_id = args.agent_id.clone().unwrap_or_default();
        let changes = client
            .get_changes(GetChangesRequest { agent_id })
            .await?
            .into_inner();
        show(&args, &changes, out)?;
        return Ok(exit::OK);
    };
    for child in super::apply_to::children(client, batch.clone()).await? {
        let changes = client
            .get_changes(GetChangesRequest { agent_id: child })
            .await?
            .into_inner();
        if !out.is_json() {
            // A comment line to `git apply`: the children's patches stay one stream.
            out.line(format!(
                "# agent {}: {} ({})",
                changes.agent_id,
                summary(&changes),
                changes.state
            ))?;
        }
        show(&args, &changes, out)?;
    }
    Ok(exit::OK)
}

/// `forkctl session diff`: an uploaded session's workspace against its upload.
pub async fn session_diff(
    session_id: &str,
    stat: bool,
    format: Format,
    client: &mut Client,
    out: &Printer,
) -> anyhow::Result<u8> {
    let reply = client
        .get_session_changes(forkd_proto::v1::GetSessionChangesRequest {
            session_id: session_id.to_owned(),
        })
        .await?
        .into_inner();
    // Shown as a child's changes are: the same files, the same patch.
    let changes = GetChangesResponse {
        agent_id: reply.session_id.clone(),
        files: reply.files,
        diff: reply.diff,
        state: format!("against upload {}", reply.upload_id),
        ..Default::default()
    };
    if out.is_json() {
        let mut value = changes_json(&changes);
        if let Some(map) = value.as_object_mut() {
            for key in [
                "agent_id",
                "batch_id",
                "state",
                "conflicts",
                "outside_possible",
            ] {
                map.remove(key);
            }
            map.insert("session_id".into(), json!(reply.session_id));
            map.insert("upload_id".into(), json!(reply.upload_id));
        }
        out.value(&value)?;
        return Ok(exit::OK);
    }
    let args = DiffArgs {
        agent_id: None,
        batch: None,
        stat,
        format,
    };
    show(&args, &changes, out)?;
    Ok(exit::OK)
}

/// One child's changes, as `args` asks.
fn show(args: &DiffArgs, changes: &GetChangesResponse, out: &Printer) -> anyhow::Result<()> {
    if out.is_json() {
        out.value(&changes_json(changes))?;
    } else if args.stat {
        for f in &changes.files {
            out.line(format!(
                "{:<8} +{:<5} -{:<5} {}",
                f.kind,
                f.added_lines,
                f.removed_lines,
                quote_path(&f.path)
            ))?;
        }
        out.line(format!("{} ({})", summary(changes), changes.state))?;
    } else if changes.diff.is_empty() {
        if args.format == Format::Diff && args.batch.is_none() {
            out.line("no changes")?;
        }
    } else {
        let diff = match args.format {
            Format::Diff => without_binary_patches(&changes.diff),
            Format::Patch => changes.diff.as_str().into(),
        };
        // Its last newline is the line's own; any before it stay (a binary patch ends with an
        // empty line, which git needs before whatever follows).
        out.line(diff.strip_suffix('\n').unwrap_or(&diff))?;
    }
    if changes.outside_possible && !out.is_json() {
        eprintln!(
            "note: {} called an MCP tool not marked read-only; it may have changed things \
             outside its copy that no diff shows",
            changes.agent_id
        );
    }
    Ok(())
}

/// What `forkctl apply` applies, and where.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub target: TargetArgs,

    /// Apply to this directory (a checkout of the snapshot's files, on this machine) instead of
    /// the session's workspace on the daemon's: each child's patch, all of its files or none.
    #[arg(long, value_name = "DIR")]
    pub to: Option<std::path::PathBuf>,
}

pub async fn apply(args: ApplyArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    if let Some(dir) = &args.to {
        let results = super::apply_to::run(args.target, dir, client).await?;
        return report(&results, out);
    }
    let reply = client
        .apply_changes(ApplyChangesRequest {
            agent_ids: args.target.agent_ids,
            batch_id: args.target.batch.unwrap_or_default(),
        })
        .await?
        .into_inner();
    report(&reply.results, out)
}

/// Prints each child's outcome; exit 1 when any had a conflict.
fn report(results: &[AppliedChanges], out: &Printer) -> anyhow::Result<u8> {
    let conflicted = results.iter().any(|r| !r.conflicts.is_empty());
    if out.is_json() {
        let results: Vec<Value> = results.iter().map(applied_json).collect();
        out.value(&json!({ "results": results }))?;
    } else {
        for r in results {
            if r.conflicts.is_empty() {
                out.line(format!(
                    "applied {} ({} file{})",
                    r.agent_id,
                    r.applied.len(),
                    if r.applied.len() == 1 { "" } else { "s" }
                ))?;
            } else {
                out.line(format!(
                    "not applied {}: {} conflict{}",
                    r.agent_id,
                    r.conflicts.len(),
                    if r.conflicts.len() == 1 { "" } else { "s" }
                ))?;
                for c in &r.conflicts {
                    out.line(format!("  {}: {}", quote_path(&c.path), c.reason))?;
                }
            }
        }
    }
    Ok(if conflicted {
        exit::CHILD_FAILED
    } else {
        exit::OK
    })
}

pub async fn discard(args: TargetArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let reply = client
        .discard_changes(DiscardChangesRequest {
            agent_ids: args.agent_ids,
            batch_id: args.batch.unwrap_or_default(),
        })
        .await?
        .into_inner();
    if out.is_json() {
        out.value(&json!({ "discarded": reply.agent_ids }))?;
    } else if reply.agent_ids.is_empty() {
        out.line("nothing to discard")?;
    } else {
        for id in &reply.agent_ids {
            out.line(format!("discarded {id}"))?;
        }
    }
    Ok(exit::OK)
}

fn summary(changes: &GetChangesResponse) -> String {
    let files = changes.files.len();
    if files == 0 {
        return "no changes".to_owned();
    }
    let added: u64 = changes.files.iter().map(|f| f.added_lines).sum();
    let removed: u64 = changes.files.iter().map(|f| f.removed_lines).sum();
    format!(
        "{files} file{} (+{added} -{removed})",
        if files == 1 { "" } else { "s" }
    )
}

fn changes_json(c: &GetChangesResponse) -> Value {
    json!({
        "agent_id": c.agent_id,
        "batch_id": c.batch_id,
        "state": c.state,
        "files": c.files.iter().map(|f| json!({
            "path": f.path,
            "kind": f.kind,
            "added_lines": f.added_lines,
            "removed_lines": f.removed_lines,
            "binary": f.binary,
            "special": f.special,
        })).collect::<Vec<_>>(),
        "diff": c.diff,
        "conflicts": c.conflicts.iter().map(|x| json!({"path": x.path, "reason": x.reason})).collect::<Vec<_>>(),
        "outside_possible": c.outside_possible,
    })
}

fn applied_json(r: &AppliedChanges) -> Value {
    json!({
        "agent_id": r.agent_id,
        "applied": r.applied,
        "conflicts": r.conflicts.iter().map(|x| json!({"path": x.path, "reason": x.reason})).collect::<Vec<_>>(),
    })
}
