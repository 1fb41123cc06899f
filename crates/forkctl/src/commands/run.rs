//! `forkctl run BATCH.yaml`: the CI form. One file describes the session, the directives and an
//! idempotency key; `run` creates the session and forks the batch under keys derived from it, so
//! running the same file again (after a lost connection, or a retried CI job) attaches to the
//! same session and batch instead of starting others. `--wait` follows the children to the end,
//! `--junit` writes one test case per child; the exit code is 0 only when every child completed
//! (a child that failed, was killed or timed out fails the run).

mod batch_file;
mod fail_when;
mod junit;
mod progress;
mod rerun;
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
use crate::commands::upload::{self, Uploaded};
use crate::exit;
use crate::output::{Printer, human};
use crate::reconnect::ReconnectArgs;
pub(crate) use batch_file::{BatchFile, SessionSource};
use progress::Progress;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The batch file (YAML): `key`, `session`, `directives`, and optional budgets and limits
    /// (`timeout: 10m`, `max_turns: 30`, … for the batch or one directive); relative paths in it
    /// resolve against its directory.
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

    /// Fail the case (and exit 1) of a child whose structured report (see `output_schema`) has
    /// VALUE at JSONPATH, e.g. `$.verdict=fail`; VALUE is JSON, or else text. Repeatable: any
    /// rule fails the case. Implies --wait.
    #[arg(long, value_name = "JSONPATH=VALUE", value_parser = parse_fail_when)]
    pub junit_fail_when: Vec<fail_when::FailWhen>,

    /// Submit, as a new batch, the children of the file's last batch that did not complete
    /// (failed, killed or timed out), forked where that batch forked. Its key derives from the previous key and the
    /// failed ids: running it again follows the same rerun, and a rerun's own failures can be
    /// rerun. With --junit, the report covers the whole file: earlier successes and the rerun.
    #[arg(long)]
    pub rerun_failed: bool,

    #[command(flatten)]
    pub reconnect: ReconnectArgs,
}

fn parse_fail_when(text: &str) -> Result<fail_when::FailWhen, String> {
    text.parse()
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
    let (session_id, uploaded) = session(&file, &args.file, client, out).await?;
    let request = forkd_proto::v1::ForkBatchRequest {
        session_id: session_id.clone(),
        ..file.fork.clone()
    };
    let (chain, batch) = if args.rerun_failed {
        let (chain, stop) = rerun::walk(&file.key, request, file.fork.directives.len(), client)
            .await
            .map_err(|e| refused_any(e, &args.file, "rerun the failed children", &file.key))?;
        let batch = chain[chain.len() - 1].batch.clone();
        say_rerun(&chain, &stop, out)?;
        (chain, batch)
    } else {
        let batch = client.fork_batch(request).await.map_err(|status| {
            refused(
                status,
                &args.file,
                "fork the batch",
                &file.fork.idempotency_key,
            )
        })?;
        let batch = batch.into_inner();
        (Vec::new(), batch)
    };
    let every = fork::lists_every_child(batch.agent_ids.len(), args.all);
    if out.is_json() {
        let mut value = json!({
            "session_id": session_id,
            "batch_id": batch.batch_id,
            "agent_ids": batch.agent_ids,
        });
        if let (Some(uploaded), Some(map)) = (&uploaded, value.as_object_mut()) {
            map.insert("upload".into(), uploaded.to_json());
        }
        out.value(&value)?;
    } else {
        out.line(format!("session {session_id}"))?;
        fork::print_batch(&batch, every, out)?;
    }
    if !args.wait && args.junit.is_none() && args.junit_fail_when.is_empty() {
        return Ok(exit::OK);
    }

    let (notifications, tally) = follow(&batch, client, out, every, args.reconnect).await?;
    let descriptions: Vec<String> = file
        .fork
        .directives
        .iter()
        .map(|d| d.description.clone())
        .collect();
    let mut children = children_of(&batch, &notifications, client, &descriptions).await?;
    let mut tally = tally;
    if chain.len() > 1 {
        // The whole file: each directive's latest attempt, from the earlier batches and this one.
        let mut runs = Vec::with_capacity(chain.len());
        let mut all_notes = Vec::new();
        for link in &chain[..chain.len() - 1] {
            let notes = replay(&link.batch, client, args.reconnect).await?;
            runs.push(children_of(&link.batch, &notes, client, &[]).await?);
            all_notes.extend(notes);
        }
        runs.push(children);
        all_notes.extend(notifications);
        children = rerun::merge(&chain, runs);
        let ids: Vec<String> = children.iter().map(|c| c.agent_id.clone()).collect();
        tally = fork::Tally::new(&ids);
        for note in &all_notes {
            tally.record(note);
        }
    }
    for child in &mut children {
        child.failed_when = child
            .structured()
            .and_then(|object| fail_when::first_match(&args.junit_fail_when, &object))
            .map(ToString::to_string);
    }
    let failed_when = children.iter().filter(|c| c.failed_when.is_some()).count();

    if out.is_json() {
        let mut value = summary::summary_json(&batch.batch_id, &tally);
        if let Some(map) = value.as_object_mut() {
            if !args.junit_fail_when.is_empty() {
                map.insert("failed_when".into(), failed_when.into());
            }
            if chain.len() > 1 {
                map.insert(
                    "batches".into(),
                    chain.iter().map(|l| l.batch.batch_id.clone()).collect(),
                );
            }
        }
        out.value(&value)?;
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
        if chain.len() > 1 {
            out.line(format!(
                "the file's {} directives as they stand now, over {} batches",
                children.len(),
                chain.len()
            ))?;
        }
        out.line(format!(
            "cache-read share {} of input tokens",
            human::percent(summary::cache_read_share(&tally.usage))
        ))?;
        if failed_when > 0 {
            out.line(format!(
                "{failed_when} completed children failed --junit-fail-when"
            ))?;
        }
    }
    if let Some(path) = &args.junit {
        let report = junit::report(&file.key, &session_id, &batch.batch_id, &children);
        junit::write(path, &report)?;
    }
    Ok(if failed_when > 0 {
        exit::CHILD_FAILED
    } else {
        tally.exit_code()
    })
}

/// Says what `--rerun-failed` found and did.
fn say_rerun(chain: &[rerun::Link], stop: &rerun::Stop, out: &Printer) -> std::io::Result<()> {
    if out.is_json() {
        return Ok(());
    }
    let last = &chain[chain.len() - 1].batch;
    let line = match stop {
        rerun::Stop::FirstRun => format!(
            "the file's batch had not run: forked it now ({}); there is nothing to rerun yet",
            last.batch_id
        ),
        rerun::Stop::Running => format!("batch {} is still running: following it", last.batch_id),
        rerun::Stop::NothingFailed => format!(
            "nothing to rerun: every directive of the file has completed (last batch {})",
            last.batch_id
        ),
        rerun::Stop::Rerun { failed } => {
            let previous = &chain[chain.len() - 2].batch;
            let point = if last.fork_point == previous.fork_point {
                format!(
                    "where {} forked (message {})",
                    previous.batch_id, last.fork_point
                )
            } else {
                format!(
                    "at the session's last finished turn (message {}), not where {} forked \
                     (message {})",
                    last.fork_point, previous.batch_id, previous.fork_point
                )
            };
            format!(
                "rerunning {failed} failed, killed or timed-out children of batch {} as batch {}, \
                 forked {point}",
                previous.batch_id, last.batch_id
            )
        }
    };
    eprintln!("forkctl: {line}");
    Ok(())
}

/// The notifications of a batch whose children have all ended, replayed.
async fn replay(
    batch: &ForkBatchResponse,
    client: &mut Client,
    reconnect: ReconnectArgs,
) -> anyhow::Result<Vec<Notification>> {
    let mut follower = Follower::replay(batch, client, reconnect.reconnect()).await?;
    let mut notes = Vec::with_capacity(batch.agent_ids.len());
    while let Some(note) = follower.next().await? {
        notes.push(note);
    }
    Ok(notes)
}

/// A batch's children joined with their notifications.
async fn children_of(
    batch: &ForkBatchResponse,
    notifications: &[Notification],
    client: &mut Client,
    descriptions: &[String],
) -> anyhow::Result<Vec<summary::Child>> {
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
    Ok(summary::children(
        batch,
        notifications,
        &agents,
        descriptions,
    ))
}

/// Creates the file's session under its key (a retry gets the first call's id back), after
/// uploading its tree when it names one; or takes the existing session it names.
async fn session(
    file: &BatchFile,
    path: &Path,
    client: &mut Client,
    out: &Printer,
) -> anyhow::Result<(String, Option<Uploaded>)> {
    let mut uploaded = None;
    let session_id = match &file.session {
        SessionSource::Existing(id) => id.clone(),
        SessionSource::Create(new) => {
            let mut request = new.request.clone();
            if let Some(dir) = &new.upload {
                let done = upload::upload(client, dir, &[])
                    .await
                    .with_context(|| format!("{}: `session.upload`", path.display()))?;
                if !out.is_json() {
                    eprintln!("forkctl: {}", done.summary(dir));
                }
                request.upload_id.clone_from(&done.upload_id);
                uploaded = Some(done);
            }
            let session = client
                .create_session(request)
                .await
                .map_err(|status| {
                    refused(
                        status,
                        path,
                        "create the session",
                        &new.request.idempotency_key,
                    )
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
    Ok((session_id, uploaded))
}

/// [`refused`] for an error that may hold a gRPC status.
fn refused_any(e: anyhow::Error, path: &Path, what: &str, key: &str) -> anyhow::Error {
    match e.downcast::<tonic::Status>() {
        Ok(status) => refused(status, path, what, key),
        Err(e) => e.context(format!("{}: cannot {what}", path.display())),
    }
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
    reconnect: ReconnectArgs,
) -> anyhow::Result<(Vec<Notification>, Tally)> {
    let live = !out.is_json() && std::io::stderr().is_terminal();
    let mut follower = Follower::subscribe(batch, client, out, reconnect.reconnect()).await?;
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
