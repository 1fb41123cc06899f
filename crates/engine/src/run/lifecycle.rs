//! One way to start, queue, kill and end a run — a fork child's or a typed agent's — on the
//! [`Supervisor`](crate::supervisor::Supervisor), which parent turns use too.

use super::Runs;
use std::sync::Arc;
use std::time::Duration;

use forkd_core::report::Report;
use forkd_core::store::{Lease, NewNotification, StoreError};
use forkd_core::{AgentId, AgentKind, NotificationStatus, Role};
use tracing::Instrument;
use tracing::field::Empty;

use super::RunOutcome;
use super::gate::Launch;
use crate::clock::now_ms;
use crate::error::EngineError;
use crate::supervisor::Raced;

/// The error a killed agent ends with.
const KILLED: &str = "killed by a client before it finished";

/// How often an agent's end is attempted before giving up (about a minute in all).
const FINISH_ATTEMPTS: u32 = 16;

/// How an agent ended, as its notification records it.
#[derive(Debug, Clone)]
pub(crate) struct Ending {
    pub status: NotificationStatus,
    /// Its final reply, or what it had said when it was killed.
    pub text: Option<String>,
    /// The object its final reply held, valid against its output schema.
    pub structured: Option<serde_json::Value>,
    pub error: Option<String>,
}

impl Ending {
    /// Killed, with whatever it had said so far.
    pub(crate) fn killed(partial: Option<String>) -> Self {
        Self {
            status: NotificationStatus::Killed,
            text: partial,
            structured: None,
            error: Some(KILLED.to_owned()),
        }
    }

    /// Stopped by `limit`, with whatever it had said so far.
    pub(crate) fn timed_out(partial: Option<String>, limit: forkd_core::Limit) -> Self {
        Self {
            status: NotificationStatus::TimedOut,
            text: partial,
            structured: None,
            error: Some(limit.to_string()),
        }
    }

    pub(crate) fn failed(error: String) -> Self {
        Self {
            status: NotificationStatus::Failed,
            text: None,
            structured: None,
            error: Some(error),
        }
    }
}

impl Runs {
    /// Starts a new run of an existing agent: it rebuilds its conversation from the store and
    /// continues from wherever its transcript stands.
    /// Does nothing if a run of the agent is already in progress: two runs of one agent would
    /// write one transcript twice.
    pub(crate) async fn start_agent(self: &Arc<Self>, id: AgentId) -> crate::error::Result<()> {
        let agent = crate::lookup::agent(&*self.store, id).await?;
        let tenant = self.tenancy.session_owner(agent.session_id).await?;
        let batch = match agent.batch_id {
            Some(batch) => Some(crate::lookup::batch(&*self.store, batch).await?),
            None => None,
        };
        resumed_span(batch.as_ref()).in_scope(|| self.start_run(id, &tenant));
        Ok(())
    }

    /// [`Runs::start_agent`] for a caller that knows the agent's tenant.
    pub(crate) fn start_run(self: &Arc<Self>, id: AgentId, tenant: &Arc<str>) {
        if self.supervisor.is_running(id) {
            tracing::debug!(agent.id = %id, "Agent already running; not starting another run");
            return;
        }
        self.spawn_agent(id, tenant, Launch::default());
    }

    /// Spawns an agent's run on the engine's tracker, started with its siblings as `launch`
    /// says (a batch's warm-up gate, its shared context). Under a cap on running agents the run first
    /// waits for a slot, staying `pending` until then: tenants take turns, and each tenant's
    /// runs go in the order they were started (see [`super::slots`]).
    pub(crate) fn spawn_agent(self: &Arc<Self>, id: AgentId, tenant: &Arc<str>, launch: Launch) {
        let supervisor = &self.supervisor;
        // Registered at once, so a kill reaches an agent still waiting for a slot.
        let token = supervisor.register(id);
        // Queued now, not in the task: the order of the queue is the order of these calls.
        let turn = supervisor.queue(tenant);
        let runs = Arc::clone(self);
        let span = tracing::info_span!(
            "agent",
            otel.name = "agent",
            otel.status_code = Empty,
            otel.status_description = Empty,
            agent.id = %id,
            forkd.agent.id = %id,
            forkd.tenant = %tenant,
            forkd.agent.status = Empty,
            forkd.gate_wait_ms = Empty,
        );
        let ended = span.clone();
        supervisor.spawn(
            async move {
                let _slot = match turn {
                    None => None,
                    Some(turn) => {
                        let draining = runs.supervisor.draining_token().clone();
                        tokio::select! {
                            biased;
                            // Killed (or shut down) while waiting: its run ends at once.
                            () = token.cancelled() => None,
                            // Not started before the drain: it stays pending for the next
                            // start, and does not hold the shutdown up.
                            () = draining.cancelled() => {
                                runs.supervisor.unregister(id);
                                return;
                            }
                            slot = turn => slot.ok(),
                        }
                    }
                };
                let _counted = crate::metrics::RunGauge::start();
                let began = tokio::time::Instant::now();
                let mut interrupted = None;
                match runs
                    .supervisor
                    .race(id, &token, runs.run_agent(id, launch, &token))
                    .await
                {
                    Raced::Done(RunOutcome::Ended(lease, ending)) => {
                        runs.supervisor.ran_for(began.elapsed());
                        ended.record("forkd.agent.status", ending.status.as_str());
                        if let Some(error) = &ending.error {
                            ended.record("otel.status_code", "ERROR");
                            ended.record("otel.status_description", error.as_str());
                        }
                        interrupted = runs
                            .finish_with_retries(&lease, ending)
                            .await
                            .err()
                            .map(|e| e.to_string());
                    }
                    // Paused by the shutdown drain (stays `running` for the next start), or
                    // superseded by a newer run, which records the end.
                    Raced::Done(RunOutcome::Stopped) => {}
                    Raced::Done(RunOutcome::Interrupted(reason)) => interrupted = Some(reason),
                    // Recorded only now that the run (and any process group it started) is
                    // gone, so a killed notification means the agent has stopped.
                    Raced::Killed => runs.record_kill_once_writable(id).await,
                    // Stays `running` for the next start.
                    Raced::Shutdown => tracing::debug!("Agent run stopped by shutdown"),
                }
                // Unregistered last: a kill that arrives while the end is recorded finds the run
                // still registered, and does not claim the agent from under its finish.
                runs.supervisor.unregister(id);
                // Only once unregistered: its resumption must find no run of it in progress.
                if let Some(reason) = interrupted {
                    runs.faults.interrupted(id, reason);
                }
            }
            .instrument(span),
        );
    }

    /// Kills an agent: its run stops at once (its Bash process group with it), and it ends
    /// `killed`, with a notification carrying whatever it had said so far. An agent that another
    /// daemon runs is stopped by that daemon, at its next heartbeat.
    ///
    /// A session's main loop is never killed (the session lives on): killing it cancels the
    /// turn it is running. The turn's stored messages stay; its unfinished reply is dropped.
    pub(crate) async fn kill(self: &Arc<Self>, id: AgentId) -> Result<(), EngineError> {
        let agent = crate::lookup::agent(&*self.store, id).await?;
        if agent.kind == AgentKind::Parent {
            if self.supervisor.kill_here(id) {
                tracing::info!(agent.id = %id, "Parent turn cancelled");
                return Ok(());
            }
            let not_running = || {
                EngineError::WrongState(format!(
                    "session {} is not running a turn; there is nothing to cancel",
                    agent.session_id
                ))
            };
            if agent.state != forkd_core::AgentState::Running {
                return Err(not_running());
            }
            return match self.store.request_kill(id).await? {
                Some(daemon) if daemon != self.store.holder().daemon => {
                    tracing::info!(agent.id = %id, %daemon, "Turn cancel passed to the daemon running it");
                    Ok(())
                }
                _ => Err(not_running()),
            };
        }
        if agent.state.is_terminal() {
            return Err(EngineError::WrongState(format!(
                "agent {id} already ended ({})",
                agent.state.as_str()
            )));
        }
        if self.supervisor.kill_here(id) {
            tracing::info!(agent.id = %id, "Agent killed");
            return Ok(());
        }
        // Not running here: the request is stored with the agent, so that the daemon running it
        // stops it at its next heartbeat, and any run that claims it later sees it.
        match self.store.request_kill(id).await? {
            Some(daemon) if daemon != self.store.holder().daemon => {
                tracing::info!(agent.id = %id, %daemon, "Kill passed to the daemon running the agent");
            }
            // Nothing runs it (it never started, or its daemon died): record the kill here.
            _ => {
                self.record_kill(id).await?;
                tracing::info!(agent.id = %id, "Agent killed");
            }
        }
        Ok(())
    }

    /// Ends a killed agent with its partial result: the text of its last reply, if any. It
    /// claims the agent first, so a run still alive anywhere (another daemon on the same
    /// database) is fenced off before the agent is marked killed.
    async fn record_kill(self: &Arc<Self>, id: AgentId) -> Result<(), StoreError> {
        let lease = match self.store.claim_agent(id).await {
            Ok(lease) => lease,
            // Ended meanwhile: its own end stands.
            Err(StoreError::Conflict(_)) => return Ok(()),
            // Another daemon took it meanwhile: it finds the stored request and kills it.
            Err(StoreError::Held { daemon, .. }) => {
                tracing::info!(%daemon, "The killed agent runs on another daemon, which stops it");
                return Ok(());
            }
            Err(e) if e.is_fault() => return Err(e),
            Err(e) => {
                tracing::error!(error = %e, "Cannot claim the killed agent; it stays live in the store");
                return Ok(());
            }
        };
        // Its run is gone; what its Bash calls started is killed, and now waited for.
        self.stop_cut_off_groups(id).await;
        let partial = self.partial_text(id).await;
        self.finish_with_retries(&lease, Ending::killed(partial))
            .await
    }

    /// [`Runs::record_kill`] for a run a kill stopped: while the database refuses writes, the
    /// kill is recorded once it takes them again (a stopped run must not be resumed: it would
    /// run again). At shutdown it gives up, and the agent stays live for the next start.
    async fn record_kill_once_writable(self: &Arc<Self>, id: AgentId) {
        while let Err(e) = self.record_kill(id).await {
            tracing::warn!(error = %e, "Cannot record the kill while the database refuses writes; recording it once it takes them");
            tokio::select! {
                () = self.faults.writable() => {}
                () = self.supervisor.draining_token().cancelled() => return,
            }
        }
    }

    /// What a killed agent had said so far: the text of its last reply, if any.
    pub(crate) async fn partial_text(self: &Arc<Self>, id: AgentId) -> Option<String> {
        match self.store.agent_messages(id).await {
            Ok(messages) => messages
                .into_iter()
                .rev()
                .map(|m| m.message)
                .find(|m| m.role == Role::Assistant)
                .map(|m| m.text())
                .filter(|t| !t.trim().is_empty()),
            Err(e) => {
                tracing::warn!(error = %e, "Cannot read the killed agent's transcript");
                None
            }
        }
    }

    /// Whether a client asked (through any daemon) for the agent to be killed. Not knowing, it
    /// runs: a kill asked meanwhile reaches it through the heartbeat.
    pub(crate) async fn kill_was_requested(self: &Arc<Self>, id: AgentId) -> bool {
        self.store
            .kill_requested(id)
            .await
            .inspect_err(|e| tracing::warn!(error = %e, "Cannot read whether a kill was asked"))
            .unwrap_or(false)
    }

    /// Records an agent's end, retrying a store that is briefly busy: an agent whose end is
    /// never recorded would keep its subscribers waiting forever. A database fault (a full disk,
    /// a server out of reach) is not waited out here: the run stops as interrupted (`Err`, the
    /// reason), and its resumption ends it again from its transcript once writes succeed.
    pub(crate) async fn finish_with_retries(
        self: &Arc<Self>,
        lease: &Lease,
        ending: Ending,
    ) -> Result<(), StoreError> {
        let mut delay = Duration::from_millis(100);
        for attempt in 1..=FINISH_ATTEMPTS {
            match self.finish(lease, &ending).await {
                Ok(()) => return Ok(()),
                // Already ended (by an earlier attempt that committed, or a kill), or taken over
                // by a newer run, which records its own end: nothing to do.
                Err(EngineError::Store(
                    StoreError::Conflict(_) | StoreError::Superseded { .. },
                )) => return Ok(()),
                Err(EngineError::Store(e)) if e.is_fault() => return Err(e),
                Err(e) if attempt < FINISH_ATTEMPTS => {
                    tracing::warn!(attempt, error = %e, "Could not record the agent's end; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                Err(e) => {
                    tracing::error!(error = %e, "Could not record the agent's end; it stays live in the store")
                }
            }
        }
        Ok(())
    }

    /// Records the agent's end: its state, its notification (stored, appended to the parent's
    /// transcript, then pushed to subscribers, in that order).
    async fn finish(self: &Arc<Self>, lease: &Lease, ending: &Ending) -> Result<(), EngineError> {
        let Ending {
            status,
            text: final_text,
            structured,
            error,
        } = ending;
        let status = *status;
        let store = &self.store;
        let id = lease.agent_id;
        let agent = crate::lookup::agent(&*self.store, id).await?;
        let scope = || {
            agent
                .directive
                .as_ref()
                .map(|d| d.description.clone())
                .unwrap_or_default()
        };
        let report = match (&final_text, &error) {
            // Partial, whatever the text says: the limit, what it said, what was cut off.
            (_, Some(limit)) if status == NotificationStatus::TimedOut => Report {
                scope: scope(),
                result: timed_out_result(limit, final_text.as_deref()),
                files_changed: self.written_paths(id).await?,
                issues: self.cut_off_calls(id, limit).await?,
                ..Report::default()
            },
            // The object is the result; forkd's own facts are set beside it below.
            (Some(_), _) if structured.is_some() => Report {
                scope: scope(),
                result: structured
                    .as_ref()
                    .map(serde_json::Value::to_string)
                    .unwrap_or_default(),
                files_changed: self.written_paths(id).await?,
                structured: structured.clone(),
                ..Report::default()
            },
            (Some(text), _) => Report::parse(text),
            (None, Some(err)) => Report {
                scope: scope(),
                result: match status {
                    NotificationStatus::Killed => format!("Killed: {err}"),
                    _ => format!("Failed: {err}"),
                },
                issues: err.clone(),
                ..Report::default()
            },
            (None, None) => Report::default(),
        };
        let mut report = report;
        // An isolated child's "Files changed" is what its copy holds, whatever it wrote.
        if let Some(snapshot) = self.copies.snapshot_of(&agent).await? {
            let outside = self.may_have_written_outside(&agent).await?;
            let mut notes = Vec::new();
            // The agent's end is recorded whatever its copy holds: a copy that cannot be read is
            // said in its report, never a reason to leave the agent live.
            match self.copies.record(&agent, &snapshot, outside).await {
                Ok(changes) => {
                    // Quoted as git quotes them: no file name can draw a line of the report.
                    report.files_changed = changes
                        .files
                        .iter()
                        .map(|f| forkd_core::isolation::quote_path(&f.path).into_owned())
                        .collect();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "Cannot read an isolated child's changes");
                    report.files_changed = Vec::new();
                    notes.push(format!("forkd could not read the changes in its copy: {e}"));
                }
            }
            if outside {
                notes.push(
                    "changes outside the copy possible: the child called an MCP tool not marked \
                     read-only"
                        .to_owned(),
                );
            }
            for note in notes {
                report.issues = if report.issues.is_empty() || report.issues == "none" {
                    note
                } else {
                    format!("{}; {note}", report.issues)
                };
            }
        }
        let summary = report.summary();
        let notification = NewNotification {
            session_id: agent.session_id,
            batch_id: agent.batch_id,
            agent_id: id,
            status,
            summary,
            report,
            usage: agent.usage,
            cost_usd: agent.cost_usd,
            created_at_ms: now_ms(),
        };
        let lock = self.session_locks.get(agent.session_id);
        let _session = lock.lock().await;
        // Commit and broadcast under one lock, so subscribers see notifications in seq order.
        let _order = self.notifications.ordered().await;
        let committing = std::time::Instant::now();
        let stored = store
            .finish_agent(lease, &notification, error.as_deref())
            .await?;
        tracing::info!(
            status = status.as_str(),
            seq = stored.seq,
            cost_usd = stored.cost_usd,
            "Agent ended"
        );
        self.notifications.publish(stored);
        crate::metrics::notification(status.as_str(), committing.elapsed());
        Ok(())
    }

    /// A timed-out agent's issues: the limit, and the tool calls its run cut off (started,
    /// never answered), their processes killed.
    async fn cut_off_calls(
        &self,
        id: forkd_core::AgentId,
        limit: &str,
    ) -> Result<String, EngineError> {
        let cut: Vec<String> = self
            .store
            .tool_calls(id)
            .await?
            .iter()
            .filter(|c| c.result.is_none())
            .map(|c| call_line(&c.name, &c.input_json))
            .collect();
        Ok(match cut.as_slice() {
            [] => limit.to_owned(),
            calls => format!("{limit}; tool calls cut off (killed): {}", calls.join(", ")),
        })
    }

    /// The paths an agent's `Write` and `Edit` calls wrote, in the order it first wrote them:
    /// the "Files changed" of a report whose text is an object the agent's schema shaped.
    async fn written_paths(&self, id: forkd_core::AgentId) -> Result<Vec<String>, EngineError> {
        let mut paths: Vec<String> = Vec::new();
        for call in self.store.tool_calls(id).await? {
            let succeeded = call.result.as_ref().is_some_and(|r| {
                r.raw()
                    .value()
                    .get("is_error")
                    .and_then(serde_json::Value::as_bool)
                    != Some(true)
            });
            if !succeeded || !matches!(call.name.as_str(), "Write" | "Edit") {
                continue;
            }
            let path = serde_json::from_str::<serde_json::Value>(&call.input_json)
                .ok()
                .and_then(|input| {
                    let path = input.get("file_path")?.as_str()?;
                    Some(forkd_core::isolation::quote_path(path).into_owned())
                });
            if let Some(path) = path
                && !paths.contains(&path)
            {
                paths.push(path);
            }
        }
        Ok(paths)
    }

    /// Whether `agent` called an MCP tool its session's operator did not mark read-only: such a
    /// tool may change things outside an isolated child's copy, which no diff shows.
    async fn may_have_written_outside(
        &self,
        agent: &forkd_core::Agent,
    ) -> Result<bool, EngineError> {
        let session = self.sessions.get(agent.session_id).await?;
        let read_only = session.mcp.read_only_tools();
        Ok(self
            .store
            .tool_calls(agent.id)
            .await?
            .iter()
            .any(|c| session.mcp.tool(&c.name).is_some() && !read_only.contains(&c.name)))
    }
}

/// The span a batch's children resume in, after a restart or on another daemon: a child of the
/// span that forked the batch, whose trace context is stored with it, so they stay in its trace.
pub(crate) fn resumed_span(batch: Option<&forkd_core::fork::ForkBatch>) -> tracing::Span {
    let Some(batch) = batch else {
        return tracing::Span::current();
    };
    let span = tracing::info_span!(
        "fork_batch",
        otel.name = "fork_batch resumed",
        forkd.batch.id = %batch.id,
        forkd.session.id = %batch.session_id,
        forkd.batch.resumed = true,
    );
    if let Some(parent) = &batch.trace_parent {
        crate::trace::adopt(&span, parent);
    }
    span
}

/// A timed-out agent's result: what stopped it, then what it had said so far.
fn timed_out_result(limit: &str, partial: Option<&str>) -> String {
    let mut limit = limit.to_owned();
    if let Some(first) = limit.get(..1) {
        limit.replace_range(..1, &first.to_uppercase());
    }
    match partial {
        Some(text) => format!("{limit}. Its last reply before that:\n{text}"),
        None => format!("{limit}, before any reply."),
    }
}

/// A cut-off tool call as a report names it: the tool and what it was given (a Bash call's
/// command, a file tool's path), on one line and short.
fn call_line(name: &str, input_json: &str) -> String {
    const MOST: usize = 80;
    let input: serde_json::Value = serde_json::from_str(input_json).unwrap_or_default();
    let what = ["command", "file_path", "pattern", "description"]
        .iter()
        .find_map(|k| input.get(*k).and_then(serde_json::Value::as_str));
    match what {
        None => name.to_owned(),
        Some(what) => {
            let line = what.split_whitespace().collect::<Vec<_>>().join(" ");
            let mut short: String = line.chars().take(MOST).collect();
            if line.chars().count() > MOST {
                short.push('…');
            }
            format!("{name} ({short:?})")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timed_out_result_says_what_stopped_it_first() {
        let limit = "timed out: no final answer after 3 model requests (its max_turns)";
        let with = timed_out_result(limit, Some("Looking at src/"));
        assert!(with.starts_with("Timed out: no final answer"), "{with}");
        assert!(with.ends_with("Its last reply before that:\nLooking at src/"));
        assert_eq!(
            timed_out_result(limit, None),
            format!("T{}, before any reply.", &limit[1..])
        );
    }

    #[test]
    fn a_cut_off_call_is_named_on_one_short_line() {
        assert_eq!(
            call_line("Bash", r#"{"command":"sleep 100\n  && echo done"}"#),
            r#"Bash ("sleep 100 && echo done")"#
        );
        assert_eq!(call_line("Glob", "{}"), "Glob");
        let long = call_line("Bash", &format!(r#"{{"command":"{}"}}"#, "x".repeat(200)));
        assert!(long.chars().count() < 100 && long.contains('…'), "{long}");
    }
}
