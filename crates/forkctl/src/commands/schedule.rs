//! `forkctl schedule`: the tenant's batches on a clock (docs/operations.md, "Webhooks and
//! schedules"). `add` resolves a run file (its system prompt and context files read, its tree
//! uploaded, its directives, schema and options) into one spec the daemon keeps; each firing
//! then creates its own session and batch from it.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use forkd_proto::v1::{
    CreateScheduleRequest, ListSchedulesRequest, Schedule, ScheduleFiring, ScheduleNameRequest,
    ScheduleSpec,
};
use serde_json::{Value, json};

use crate::client::Client;
use crate::commands::run::{BatchFile, SessionSource};
use crate::commands::upload;
use crate::exit;
use crate::output::{Printer, human};

#[derive(Debug, Args)]
pub struct ScheduleArgs {
    #[command(subcommand)]
    pub command: ScheduleCommand,
}

#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Fork a run file's batch on a clock: each firing creates its own session and batch.
    Add(AddArgs),
    /// Your schedules.
    List,
    /// A schedule: its next firing times, and its latest firings with their batches' results.
    Get(NameArgs),
    /// Stop firing until resumed.
    Pause(NameArgs),
    /// Fire again from now (what was due while paused is not caught up).
    Resume(NameArgs),
    /// Remove a schedule and its record of firings (their batches stay).
    Delete(NameArgs),
    /// Fire now, outside the clock, and print the firing (exit 1 when it failed).
    Trigger(NameArgs),
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// Unique among your schedules: letters, digits, `.`, `_`, `-`.
    pub name: String,
    /// Standard 5 fields (`0 3 * * 1-5`: 03:00 on weekdays), or 6 with seconds first.
    #[arg(long)]
    pub cron: String,
    /// The time zone the expression is read in (IANA: `Europe/Berlin`); default UTC.
    #[arg(long, value_name = "ZONE")]
    pub tz: Option<String>,
    /// The run file (`forkctl run`'s format) whose session and batch each firing creates. Its
    /// `session` must be a map (a session per firing), not an existing session's id.
    #[arg(long)]
    pub file: PathBuf,
    /// `skip` (default): a firing while the previous firing's batch runs is recorded as
    /// skipped; `allow`: it forks anyway.
    #[arg(long, value_name = "skip|allow")]
    pub overlap: Option<String>,
    /// After downtime, `once` (default): the missed firings run once; `none`: none runs.
    #[arg(long, value_name = "once|none")]
    pub catch_up: Option<String>,
}

#[derive(Debug, Args)]
pub struct NameArgs {
    pub name: String,
}

pub async fn run(args: ScheduleArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let name_req = |n: &NameArgs| ScheduleNameRequest {
        name: n.name.clone(),
    };
    let schedule = match args.command {
        ScheduleCommand::Add(add) => {
            let spec = spec(&add, client, out).await?;
            client
                .create_schedule(CreateScheduleRequest {
                    name: add.name,
                    cron: add.cron,
                    timezone: add.tz.unwrap_or_default(),
                    overlap: add.overlap.unwrap_or_default(),
                    catch_up: add.catch_up.unwrap_or_default(),
                    spec: Some(spec),
                })
                .await?
                .into_inner()
                .schedule
        }
        ScheduleCommand::List => {
            let list = client
                .list_schedules(ListSchedulesRequest {})
                .await?
                .into_inner();
            for s in &list.schedules {
                if out.is_json() {
                    out.value(&schedule_json(s))?;
                } else {
                    out.line(schedule_line(s))?;
                }
            }
            return Ok(exit::OK);
        }
        ScheduleCommand::Get(n) => {
            client
                .get_schedule(name_req(&n))
                .await?
                .into_inner()
                .schedule
        }
        ScheduleCommand::Pause(n) => {
            client
                .pause_schedule(name_req(&n))
                .await?
                .into_inner()
                .schedule
        }
        ScheduleCommand::Resume(n) => {
            client
                .resume_schedule(name_req(&n))
                .await?
                .into_inner()
                .schedule
        }
        ScheduleCommand::Delete(n) => {
            client.delete_schedule(name_req(&n)).await?;
            if out.is_json() {
                out.value(&json!({ "name": n.name, "deleted": true }))?;
            } else {
                out.line(format!("schedule {} deleted", n.name))?;
            }
            return Ok(exit::OK);
        }
        ScheduleCommand::Trigger(n) => {
            let firing = client
                .trigger_schedule(name_req(&n))
                .await?
                .into_inner()
                .firing
                .unwrap_or_default();
            if out.is_json() {
                out.value(&firing_json(&firing))?;
            } else {
                out.line(firing_line(&firing))?;
            }
            return Ok(if firing.state == "failed" {
                exit::NOT_DELIVERED
            } else {
                exit::OK
            });
        }
    };
    let schedule = schedule.unwrap_or_default();
    if out.is_json() {
        out.value(&schedule_json(&schedule))?;
    } else {
        out.line(schedule_line(&schedule))?;
        for at in &schedule.next_fires {
            out.line(format!("  next: {at}"))?;
        }
        for f in &schedule.firings {
            out.line(format!("  {}", firing_line(f)))?;
        }
    }
    Ok(exit::OK)
}

/// The run file resolved into the spec the daemon keeps: its tree uploaded now (once; each
/// firing's session starts from that upload).
async fn spec(add: &AddArgs, client: &mut Client, out: &Printer) -> anyhow::Result<ScheduleSpec> {
    let file = BatchFile::load(&add.file)?;
    let SessionSource::Create(new) = file.session else {
        anyhow::bail!(
            "{}: a schedule's run file defines its session (a map): each firing gets a session \
             of its own, so an existing session's id cannot be used",
            add.file.display()
        );
    };
    let mut session = new.request;
    // Each firing's own key replaces the file's.
    session.idempotency_key.clear();
    if let Some(dir) = &new.upload {
        let done = upload::upload(client, dir, &[]).await?;
        if !out.is_json() {
            eprintln!("forkctl: {}", done.summary(dir));
        }
        session.upload_id = done.upload_id;
    }
    let mut batch = file.fork;
    batch.idempotency_key.clear();
    Ok(ScheduleSpec {
        session: Some(session),
        batch: Some(batch),
    })
}

/// `{"name", "cron", "timezone", "overlap", "catch_up", "paused", "created_at", "directives",
/// "webhook_id", "next_fires", "firings"}`.
pub fn schedule_json(s: &Schedule) -> Value {
    json!({
        "name": s.name,
        "cron": s.cron,
        "timezone": s.timezone,
        "overlap": s.overlap,
        "catch_up": s.catch_up,
        "paused": s.paused,
        "created_at": s.created_at.map(|t| t.to_string()),
        "directives": s.directives,
        "webhook_id": (!s.webhook_id.is_empty()).then_some(&s.webhook_id),
        "next_fires": s.next_fires.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "firings": s.firings.iter().map(firing_json).collect::<Vec<_>>(),
    })
}

/// `{"fire_time", "state", "manual", "session_id", "batch_id", "reason", "children",
/// "completed", "failed", "cost_usd"}`.
pub fn firing_json(f: &ScheduleFiring) -> Value {
    let id = |s: &String| (!s.is_empty()).then(|| s.clone());
    json!({
        "fire_time": f.fire_time.map(|t| t.to_string()),
        "state": f.state,
        "manual": f.manual,
        "session_id": id(&f.session_id),
        "batch_id": id(&f.batch_id),
        "reason": id(&f.reason),
        "children": f.children,
        "completed": f.completed,
        "failed": f.failed,
        "cost_usd": f.cost_usd,
    })
}

/// `nightly  0 3 * * 1-5 (Europe/Berlin)  3 directives  overlap skip · catch-up once`.
fn schedule_line(s: &Schedule) -> String {
    let mut line = format!(
        "{}  {} ({})  {} directive{}  overlap {} · catch-up {}",
        s.name,
        s.cron,
        s.timezone,
        s.directives,
        if s.directives == 1 { "" } else { "s" },
        s.overlap,
        s.catch_up
    );
    if s.paused {
        line.push_str(" · PAUSED");
    }
    line
}

/// `2026-… fired  batch 0193…: 3 children, 3 completed, 0 failed ($0.0123)`.
fn firing_line(f: &ScheduleFiring) -> String {
    let at = f.fire_time.map(|t| t.to_string()).unwrap_or_default();
    let manual = if f.manual { " (triggered)" } else { "" };
    let mut line = format!("{at}  {}{manual}", f.state);
    if !f.batch_id.is_empty() {
        line.push_str(&format!("  batch {}", f.batch_id));
        if f.children > 0 {
            line.push_str(&format!(
                ": {} children, {} completed, {} failed ({})",
                f.children,
                f.completed,
                f.failed,
                human::usd(f.cost_usd)
            ));
        }
    }
    if !f.reason.is_empty() {
        line.push_str(&format!(": {}", f.reason));
    }
    line
}
