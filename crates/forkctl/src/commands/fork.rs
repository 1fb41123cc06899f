//! `forkctl fork`: submit a fork batch and, with `--wait`, follow its children to the end.

use std::collections::HashSet;

use anyhow::Context as _;
use clap::Args;
use forkd_proto::v1::{
    Directive, ForkBatchRequest, ForkBatchResponse, Notification, NotificationStatus,
    SubscribeNotificationsRequest, Usage,
};
use tonic::Streaming;

use crate::client::Client;
use crate::exit::{self, CliError};
use crate::limits::LimitArgs;
use crate::output::{Printer, fork_json, human};
use crate::reconnect::{self, Reconnect, ReconnectArgs};

#[derive(Debug, Args)]
pub struct ForkArgs {
    /// The parent session whose context the children inherit.
    pub session_id: String,

    /// A child's directive; repeat for one child each, in order.
    #[arg(short = 'd', long = "directive", value_name = "TEXT", required = true)]
    pub directives: Vec<String>,

    /// Start every child at once instead of letting child 1 warm the cache first.
    #[arg(long)]
    pub no_gating: bool,

    /// `copy`: each child works in its own copy-on-write copy of the session's workspace (a
    /// snapshot taken now), and its changes wait for `forkctl apply`; `none` (the default): the
    /// children share the workspace.
    #[arg(long, value_name = "copy|none", value_parser = parse_isolation)]
    pub isolation: Option<String>,

    /// Post the batch's notifications to this webhook (`forkctl webhook add`), whatever its
    /// own filter says.
    #[arg(long, value_name = "WEBHOOK_ID")]
    pub webhook: Option<String>,

    /// Fork after turn K (`forkctl session get` lists the turns) instead of the last finished
    /// turn: the children inherit the history up to there.
    #[arg(long, value_name = "K")]
    pub at_turn: Option<u32>,

    /// A JSON Schema (draft 2020-12) file: each child ends with a JSON object valid against it
    /// instead of the five-line report; its notification carries the object as
    /// `report.structured`. The schema goes after the fork boilerplate, so the cache is kept.
    #[arg(long, value_name = "FILE")]
    pub output_schema: Option<std::path::PathBuf>,

    #[command(flatten)]
    pub limits: LimitArgs,

    /// Stream the children's notifications until all have ended; exit 1 if any did not
    /// complete (failed, killed or timed out).
    #[arg(long, conflicts_with = "dry_run")]
    pub wait: bool,

    /// Check the batch as the daemon would on submission, and print what its children's first
    /// requests would cost and the running slots free now; nothing is forked, and no
    /// idempotency key is recorded
    #[arg(long)]
    pub dry_run: bool,

    /// List every child, however many: its id when the batch is submitted and its notification
    /// when it ends. By default a batch of more than 20 children lists only those that did not
    /// complete, then the totals.
    #[arg(long)]
    pub all: bool,

    #[command(flatten)]
    pub reconnect: ReconnectArgs,
}

fn parse_isolation(value: &str) -> Result<String, String> {
    value
        .parse::<forkd_core::isolation::Isolation>()
        .map(|i| i.as_str().to_owned())
}

/// Up to this many children, a batch is listed child by child; past it, only the children that
/// did not complete are (a CI batch may have a thousand).
const LISTED_CHILDREN: usize = 20;

/// Whether a batch of `children` is listed child by child.
pub(crate) fn lists_every_child(children: usize, all: bool) -> bool {
    all || children <= LISTED_CHILDREN
}

/// The label the Agent tool's `description` gets: the directive's first line, kept short.
const DESCRIPTION_CHARS: usize = 40;

/// A directive whose description is derived from its prompt.
pub(crate) fn directive(prompt: String) -> Directive {
    Directive {
        description: human::first_line(&prompt, DESCRIPTION_CHARS),
        prompt,
        limits: None,
    }
}

/// The text of a schema file, checked here so a mistake is named with its file before anything
/// is sent (the daemon checks it again).
pub(crate) fn read_schema(path: &std::path::Path) -> Result<String, CliError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CliError::InvalidInput(format!("cannot read output schema {}: {e}", path.display()))
    })?;
    forkd_core::output::OutputSchema::parse(&text)
        .map(|s| s.as_str().to_owned())
        .map_err(|e| CliError::InvalidInput(format!("{}: {e}", path.display())))
}

mod dry_run;

pub async fn run(args: ForkArgs, client: &mut Client, out: &Printer) -> anyhow::Result<u8> {
    let output_schema = match &args.output_schema {
        Some(path) => read_schema(path)?,
        None => String::new(),
    };
    let request = ForkBatchRequest {
        session_id: args.session_id,
        directives: args.directives.into_iter().map(directive).collect(),
        // Unset leaves the daemon's own setting in force.
        warmup_gating: args.no_gating.then_some(false),
        isolation: args.isolation.unwrap_or_default(),
        at_turn: args.at_turn,
        output_schema,
        limits: args.limits.limits(),
        dry_run: args.dry_run,
        webhook_id: args.webhook.unwrap_or_default(),
        ..Default::default()
    };
    let batch = client.fork_batch(request).await?.into_inner();
    if let Some(dry) = &batch.dry_run {
        if out.is_json() {
            out.value(&dry_run::to_json(dry))?;
        } else {
            out.line(dry_run::text(dry))?;
        }
        return Ok(exit::OK);
    }
    let every = lists_every_child(batch.agent_ids.len(), args.all);
    if out.is_json() {
        out.value(&fork_json(&batch))?;
    } else {
        print_batch(&batch, every, out)?;
    }
    if !args.wait {
        return Ok(exit::OK);
    }
    wait(&batch, every, args.reconnect.reconnect(), client, out).await
}

/// `batch ID`, then `agent ID` for each child (when `every`, else their count): the human form
/// of the reply.
pub(crate) fn print_batch(
    batch: &ForkBatchResponse,
    every: bool,
    out: &Printer,
) -> std::io::Result<()> {
    if !every {
        return out.line(format!(
            "batch {} ({} children; --all lists their ids)",
            batch.batch_id,
            batch.agent_ids.len()
        ));
    }
    out.line(format!("batch {}", batch.batch_id))?;
    for agent_id in &batch.agent_ids {
        out.line(format!("agent {agent_id}"))?;
    }
    Ok(())
}

/// Whether a notification gets its own line: always in `--json` (one notification per line is
/// its contract), and for people when the batch is listed child by child or the child did not
/// complete.
pub(crate) fn shows(notification: &Notification, every: bool, out: &Printer) -> bool {
    every || out.is_json() || notification.status != NotificationStatus::Completed as i32
}

/// Follows the batch's notifications until every child has reported.
async fn wait(
    batch: &ForkBatchResponse,
    every: bool,
    reconnect: Reconnect,
    client: &mut Client,
    out: &Printer,
) -> anyhow::Result<u8> {
    let mut follower = Follower::subscribe(batch, client, out, reconnect).await?;
    let mut unlisted = 0;
    while let Some(notification) = follower.next().await? {
        if shows(&notification, every, out) {
            out.notification(&notification)?;
        } else {
            unlisted += 1;
        }
    }
    if !out.is_json() {
        if unlisted > 0 {
            out.line(format!(
                "{unlisted} completed children not listed (--all lists every child)"
            ))?;
        }
        out.line(follower.tally().summary(&batch.batch_id))?;
    }
    Ok(follower.tally().exit_code())
}

/// A batch's notification stream, read until every child has reported once. A stream whose
/// connection is lost (the daemon restarted) is opened again after the last notification read.
pub(crate) struct Follower {
    /// `None` while the connection is lost.
    stream: Option<Streaming<Notification>>,
    client: Client,
    request: SubscribeNotificationsRequest,
    /// The last notification's sequence number: a new stream resumes after it.
    seq: u64,
    /// How the connection was lost, while it is.
    lost: String,
    reconnect: Reconnect,
    tally: Tally,
}

impl Follower {
    /// Subscribes from seq 0, filtered by batch, so that children that ended before the
    /// subscription opened are not missed. Tells people (not `--json` readers) what it waits for.
    pub(crate) async fn subscribe(
        batch: &ForkBatchResponse,
        client: &mut Client,
        out: &Printer,
        reconnect: Reconnect,
    ) -> anyhow::Result<Self> {
        if !out.is_json() {
            eprintln!(
                "forkctl: waiting for {} children of batch {} (Ctrl-C stops waiting; they keep \
                 running)",
                batch.agent_ids.len(),
                batch.batch_id
            );
        }
        Self::replay(batch, client, reconnect).await
    }

    /// [`Follower::subscribe`] without a word: for a batch already known to have ended.
    pub(crate) async fn replay(
        batch: &ForkBatchResponse,
        client: &mut Client,
        reconnect: Reconnect,
    ) -> anyhow::Result<Self> {
        let request = SubscribeNotificationsRequest {
            since_seq: 0,
            batch_id: batch.batch_id.clone(),
            follow: true,
            ..Default::default()
        };
        let stream = client
            .subscribe_notifications(request.clone())
            .await?
            .into_inner();
        Ok(Self {
            stream: Some(stream),
            client: client.clone(),
            request,
            seq: 0,
            lost: String::new(),
            reconnect,
            tally: Tally::new(&batch.agent_ids),
        })
    }

    /// The next child's notification; `None` once every child has reported. Repeats and other
    /// agents' notifications are skipped. Cancel-safe: a notification is counted only once read,
    /// and a stream is kept only once it is open again.
    pub(crate) async fn next(&mut self) -> anyhow::Result<Option<Notification>> {
        while !self.tally.all_done() {
            let Some(stream) = &mut self.stream else {
                self.reopen().await?;
                continue;
            };
            match stream.message().await {
                Ok(Some(notification)) => {
                    if notification.seq > self.seq {
                        self.seq = notification.seq;
                        self.reconnect.heard();
                    }
                    if self.tally.record(&notification) {
                        return Ok(Some(notification));
                    }
                }
                // A daemon shutting down ends its streams: the next one is asked for.
                Ok(None) => self.lose("the daemon closed the notification stream".into()),
                Err(status) if reconnect::is_lost(&status) => self.lose(reconnect::why(&status)),
                Err(status) => return Err(status.into()),
            }
        }
        Ok(None)
    }

    fn lose(&mut self, why: String) {
        self.stream = None;
        self.lost = why;
    }

    /// Waits, then subscribes again after the last notification read.
    async fn reopen(&mut self) -> anyhow::Result<()> {
        let again = SubscribeNotificationsRequest {
            since_seq: self.seq,
            ..self.request.clone()
        };
        let open = || {
            let (mut client, again) = (self.client.clone(), again.clone());
            async move { client.subscribe_notifications(again).await }
        };
        let resume = format!("after notification {}", self.seq);
        let lost = self.lost.clone();
        let stream = self
            .reconnect
            .reopen(lost, &resume, open)
            .await
            .with_context(|| {
                format!(
                    "{} of {} children still running; follow them with `forkctl watch --batch {} \
                 --since {}`",
                    self.tally.pending(),
                    self.tally.children,
                    self.request.batch_id,
                    self.seq
                )
            })?;
        self.stream = Some(stream);
        Ok(())
    }

    pub(crate) fn tally(&self) -> &Tally {
        &self.tally
    }

    pub(crate) fn into_tally(self) -> Tally {
        self.tally
    }
}

/// Which children have reported, and what they add up to.
#[derive(Debug)]
pub(crate) struct Tally {
    waiting: HashSet<String>,
    pub(crate) children: usize,
    pub(crate) completed: usize,
    pub(crate) failed: usize,
    pub(crate) killed: usize,
    /// Stopped by one of their limits.
    pub(crate) timed_out: usize,
    pub(crate) usage: Usage,
    pub(crate) cost_usd: f64,
}

impl Tally {
    pub(crate) fn new(agent_ids: &[String]) -> Self {
        let waiting: HashSet<String> = agent_ids.iter().cloned().collect();
        Self {
            children: waiting.len(),
            waiting,
            completed: 0,
            failed: 0,
            killed: 0,
            timed_out: 0,
            usage: Usage::default(),
            cost_usd: 0.0,
        }
    }

    /// Counts a notification; false when it is not news (another agent's, or a repeat).
    pub(crate) fn record(&mut self, n: &Notification) -> bool {
        if !self.waiting.remove(&n.agent_id) {
            return false;
        }
        match n.status() {
            NotificationStatus::Completed => self.completed += 1,
            NotificationStatus::Killed => self.killed += 1,
            NotificationStatus::TimedOut => self.timed_out += 1,
            // An unknown status cannot be trusted as a success.
            NotificationStatus::Failed | NotificationStatus::Unspecified => self.failed += 1,
        }
        let u = n.usage.unwrap_or_default();
        self.usage.input_tokens += u.input_tokens;
        self.usage.cache_creation_input_tokens += u.cache_creation_input_tokens;
        self.usage.cache_read_input_tokens += u.cache_read_input_tokens;
        self.usage.output_tokens += u.output_tokens;
        self.cost_usd += n.cost_usd;
        true
    }

    fn all_done(&self) -> bool {
        self.waiting.is_empty()
    }

    fn pending(&self) -> usize {
        self.waiting.len()
    }

    fn any_failed(&self) -> bool {
        self.failed + self.killed + self.timed_out > 0
    }

    /// 0 when every child completed; [`exit::CHILD_FAILED`] when one failed, was killed or
    /// timed out.
    pub(crate) fn exit_code(&self) -> u8 {
        if self.any_failed() {
            exit::CHILD_FAILED
        } else {
            exit::OK
        }
    }

    pub(crate) fn summary(&self, batch_id: &str) -> String {
        format!(
            "batch {batch_id}: {} children, {} completed, {} failed, {} killed, {} timed_out  \
             ({}; {})",
            self.children,
            self.completed,
            self.failed,
            self.killed,
            self.timed_out,
            human::usage_line(Some(&self.usage)),
            human::usd(self.cost_usd),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(agent: &str, status: NotificationStatus, read: u64, cost: f64) -> Notification {
        Notification {
            agent_id: agent.into(),
            status: status as i32,
            usage: Some(Usage {
                cache_read_input_tokens: read,
                ..Default::default()
            }),
            cost_usd: cost,
            ..Default::default()
        }
    }

    #[test]
    fn the_tally_ends_when_every_child_reported_once() {
        let ids = vec!["a".to_owned(), "b".to_owned()];
        let mut tally = Tally::new(&ids);
        assert!(tally.record(&note("a", NotificationStatus::Completed, 100, 0.5)));
        assert!(!tally.record(&note("a", NotificationStatus::Completed, 100, 0.5)));
        assert!(!tally.record(&note("stranger", NotificationStatus::Failed, 1, 1.0)));
        assert!(!tally.all_done());
        assert!(tally.record(&note("b", NotificationStatus::Completed, 50, 0.25)));
        assert!(tally.all_done());
        assert!(!tally.any_failed());
        assert_eq!(
            tally.summary("B"),
            "batch B: 2 children, 2 completed, 0 failed, 0 killed, 0 timed_out  \
             (in 0 · write 0 · read 150 · out 0; $0.7500)"
        );
    }

    #[test]
    fn a_failed_or_killed_child_fails_the_wait() {
        let ids = vec!["a".to_owned(), "b".to_owned()];
        let mut tally = Tally::new(&ids);
        tally.record(&note("a", NotificationStatus::Killed, 0, 0.0));
        tally.record(&note("b", NotificationStatus::Completed, 0, 0.0));
        assert!(tally.any_failed());
        assert_eq!(tally.exit_code(), exit::CHILD_FAILED);
    }

    #[test]
    fn a_timed_out_child_is_counted_apart_and_fails_the_wait() {
        let ids = vec!["a".to_owned(), "b".to_owned()];
        let mut tally = Tally::new(&ids);
        tally.record(&note("a", NotificationStatus::TimedOut, 0, 0.0));
        tally.record(&note("b", NotificationStatus::Completed, 0, 0.0));
        assert_eq!((tally.completed, tally.failed, tally.timed_out), (1, 0, 1));
        assert_eq!(tally.exit_code(), exit::CHILD_FAILED);
        assert!(
            tally.summary("B").starts_with(
                "batch B: 2 children, 1 completed, 0 failed, 0 killed, 1 timed_out  ("
            ),
            "{}",
            tally.summary("B")
        );
        // Listed even in a big batch: it did not complete.
        let timed_out = note("a", NotificationStatus::TimedOut, 0, 0.0);
        assert!(shows(&timed_out, false, &Printer::new(false)));
    }

    #[test]
    fn big_batches_list_only_what_did_not_complete_unless_asked() {
        assert!(lists_every_child(20, false));
        assert!(!lists_every_child(21, false));
        assert!(lists_every_child(1000, true));
        let people = Printer::new(false);
        let done = note("a", NotificationStatus::Completed, 0, 0.0);
        let failed = note("b", NotificationStatus::Failed, 0, 0.0);
        assert!(!shows(&done, false, &people));
        assert!(shows(&failed, false, &people));
        assert!(shows(&done, true, &people));
        assert!(
            shows(&done, false, &Printer::new(true)),
            "--json lists every notification"
        );
    }
}
