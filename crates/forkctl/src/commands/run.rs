//! `forkctl run BATCH.yaml`: the CI form. One file describes the session, the directives and an
//! idempotency key; `run` creates the session and forks the batch under keys derived from it, so
//! running the same file again (after a lost connection, or a retried CI job) attaches to the
//! same session and batch instead of starting others. `--wait` follows the children to the end,
//! `--junit` writes one test case per child; the exit code is 0 only when every child completed.

mod batch_file;
mod junit;
mod progress;
mod summary;

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Args;
use forkd_proto::v1::{Agent, ForkBatchResponse, ListAgentsRequest, Notification};
use serde_json::json;
use tonic::Code;

use crate::client::Client;
use crate::commands::fork::{self, Follower, Tally};
use crate::commands::ps;
use crate::exit;
use crate::output::{Printer, human};
pub(crate) use batch_file::{BatchFile, SessionSource};
use progress::Progress;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The batch file (YAML): `key`, `session`, `directives` and optional budgets; relative
    /// paths in it resolve against its directory.
    #[arg(value_name = "BATCH.yaml")]
    pub file: PathBuf,

    /// Follow the children until all have ended, then print a summary; exit 1 unless every
    /// child completed.
    #[arg(long)]
    pub wait: bool,

    /// Write a JUnit XML report to FILE, one test case per child (implies --wait).
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,

    /// List every child, however many: its id at submission, its notification as it ends and
    /// its row in the summary. By default a batch of more than 20 children lists only those
    /// that did not complete, then the totals.
    #[arg(long)]
    pub all: bool,
}

/// Submits (or re-attaches to) the file's batch; `loaded` is the file when the caller has read
/// it already.
pub async fn run(
    args: RunArgs,
    loaded: Option<BatchFile>,
    client: &mut Client,
    out: &Printer,
) -> anyhow::Result<u8> {
    let file = match loaded {
        Some(file) => file,
        None => BatchFile::load(&args.file)?,
    };
    let (session_id, batch) = submit(&file, &args.file, client).await?;
    let every = fork::lists_every_child(batch.agent_ids.len(), args.all);
    if out.is_json() {
        out.value(&json!({
            "session_id": session_id,
            "batch_id": batch.batch_id,
            "agent_ids": batch.agent_ids,
        }))?;
    } else {
        out.line(format!("session {session_id}"))?;
        fork::print_batch(&batch, every, out)?;
    }
    if !args.wait && args.junit.is_none() {
        return Ok(exit::OK);
    }

    let (notifications, tally) = follow(&batch, client, out, every).await?;
    let mut agents: Vec<Agent> = Vec::new();
    let filter = ListAgentsRequest {
        batch_id: batch.batch_id.clone(),
        include_ended: true,
        ..Default::default()
    };
    ps::list_agents(client, filter, |page| {
        agents.extend(page);
        Ok(())
    })
    .await
    .context("cannot list the batch's children")?;
    let descriptions: Vec<String> = file
        .fork
        .directives
        .iter()
        .map(|d| d.description.clone())
        .collect();
    let children = summary::children(&batch, &notifications, &agents, &descriptions);

    if out.is_json() {
        out.value(&summary::summary_json(&batch.batch_id, &tally))?;
    } else {
        let listed: Vec<summary::Child> = children
            .iter()
            .filter(|c| every || !c.completed())
            .cloned()
            .collect();
        if !listed.is_empty() {
            out.line(summary::table(&listed))?;
        }
        let unlisted = children.len() - listed.len();
        if unlisted > 0 {
            out.line(format!(
                "{unlisted} completed children not listed (--all lists every child)"
            ))?;
        }
        out.line(tally.summary(&batch.batch_id))?;
        out.line(format!(
            "cache-read share {} of input tokens",
            human::percent(summary::cache_read_share(&tally.usage))
        ))?;
    }
    if let Some(path) = &args.junit {
        let report = junit::report(&file.key, &session_id, &batch.batch_id, &children);
        junit::write(path, &report)?;
    }
    Ok(tally.exit_code())
}

/// Creates the session and forks the batch, both under the file's keys: a retry gets the first
/// call's ids back.
async fn submit(
    file: &BatchFile,
    path: &Path,
    client: &mut Client,
) -> anyhow::Result<(String, ForkBatchResponse)> {
    let session_id = match &file.session {
        SessionSource::Existing(id) => id.clone(),
        SessionSource::Create(request) => {
            let session = client
                .create_session(request.as_ref().clone())
                .await
                .map_err(|status| {
                    refused(status, path, "create the session", &request.idempotency_key)
                })?
                .into_inner();
            session.session.map(|s| s.session_id).unwrap_or_default()
        }
    };
    if session_id.is_empty() {
        anyhow::bail!(
            "the daemon created the session of {} without an id",
            path.display()
        );
    }
    let request = forkd_proto::v1::ForkBatchRequest {
        session_id: session_id.clone(),
        ..file.fork.clone()
    };
    let batch = client
        .fork_batch(request)
        .await
        .map_err(|status| refused(status, path, "fork the batch", &file.fork.idempotency_key))?
        .into_inner();
    Ok((session_id, batch))
}

/// Says which file and key a refused call came from; a key reused with other settings (the
/// daemon's FAILED_PRECONDITION) gets told what to do about it.
fn refused(status: tonic::Status, path: &Path, what: &str, key: &str) -> anyhow::Error {
    let reused = if status.code() == Code::FailedPrecondition {
        ", used before with other settings: restore the file, or change `key` for a new batch"
    } else {
        ""
    };
    let context = format!(
        "{}: cannot {what} (idempotency key `{key}`{reused})",
        path.display()
    );
    anyhow::Error::from(status).context(context)
}

/// Follows the batch until every child has reported: the notifications as they come (one JSON
/// object or one line each), under a live progress bar when people watch stderr.
async fn follow(
    batch: &ForkBatchResponse,
    client: &mut Client,
    out: &Printer,
    every: bool,
) -> anyhow::Result<(Vec<Notification>, Tally)> {
    let live = !out.is_json() && std::io::stderr().is_terminal();
    let mut follower = Follower::subscribe(batch, client, out).await?;
    let mut progress = Progress::new(batch.agent_ids.len(), &batch.batch_id, client, live);
    let mut notifications = Vec::with_capacity(batch.agent_ids.len());
    let mut ticker = tokio::time::interval(progress::POLL_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            next = follower.next() => {
                let Some(notification) = next? else { break };
                // The progress line counts every child, listed or not.
                if fork::shows(&notification, every, out) {
                    progress.suspend(|| out.notification(&notification))?;
                }
                notifications.push(notification);
                progress.refresh(notifications.len()).await;
            }
            _ = ticker.tick(), if progress.is_live() => progress.refresh(notifications.len()).await,
        }
    }
    progress.finish();
    Ok((notifications, follower.into_tally()))
}
