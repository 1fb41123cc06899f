//! Leases between daemons on one database: the heartbeat that keeps this daemon's claims alive
//! and brings it the kills asked through other daemons, and adoption of the agents whose holder
//! stopped renewing (see [`forkd_core::store::Holder`]).
//!
//! On SQLite one daemon uses the database, and the same code runs: its heartbeat renews its own
//! leases, and at start it adopts everything its predecessor left (opening the database ended
//! those leases).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use forkd_core::store::AgentFilter;
use forkd_core::{Agent, AgentId, AgentKind, AgentState, BatchId, SessionId};

use crate::Engine;
use crate::error::Result;

/// How many pending children a daemon without a cap on running agents takes from others per
/// heartbeat.
const TAKE_UNCAPPED: usize = 64;

/// How long a batch's warm-up gate may stay shut before other daemons take its pending children
/// anyway: a gate never waits forever (its first child's daemon may be slow, or gone).
const GATE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a child stays pending after its batch's gate opened before other daemons take it:
/// its own daemon's runs claim it within moments of the gate opening, so one still pending after
/// this waits behind that daemon's cap on running agents. (Taken sooner, it would run wherever a
/// heartbeat happened to fall.)
const QUEUED_FOR: Duration = Duration::from_secs(2);

/// How many heartbeats fit in one lease: a daemon keeps its claims through two missed ones.
const HEARTBEATS_PER_LEASE: u32 = 3;

impl Engine {
    /// Starts the heartbeat: every third of a lease, this daemon renews its leases, stops the
    /// runs that a client killed through another daemon, adopts the agents no live daemon
    /// holds, takes pending children busy daemons hold, and stops idle MCP servers. It beats until shutdown ends (through the drain, so that runs finishing their
    /// last calls keep their claims), adopting nothing once the drain has begun.
    pub fn start_heartbeat(&self) {
        let engine = self.clone();
        let every =
            (self.inner.store.holder().lease / HEARTBEATS_PER_LEASE).max(Duration::from_millis(10));
        let stop = self.inner.shutdown.clone();
        tokio::spawn(async move {
            let mut beat = tokio::time::interval(every);
            beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // The first tick is immediate: the daemon has just adopted at start.
            beat.tick().await;
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = beat.tick() => {}
                }
                engine.heartbeat().await;
            }
        });
    }

    async fn heartbeat(&self) {
        match self.inner.store.renew_leases().await {
            Ok(renewal) => {
                for id in renewal.kills {
                    if self.inner.supervisor.kill_here(id) {
                        tracing::info!(agent.id = %id, "Agent killed through another daemon");
                    }
                }
            }
            // Leases run out if this goes on; another daemon then adopts the agents and fences
            // this one's runs (their next write is refused).
            Err(e) => tracing::warn!(error = %e, "Cannot renew this daemon's leases"),
        }
        if self.draining() {
            return;
        }
        self.inner.mcp.stop_idle_servers().await;
        match self.discard_expired_copies().await {
            Ok(0) => {}
            Ok(swept) => {
                tracing::info!(swept, "Discarded isolated copies kept past their retention")
            }
            Err(e) => {
                tracing::warn!(error = %e, "Cannot discard isolated copies past their retention")
            }
        }
        match self.expire_uploads().await {
            Ok((0, 0)) => {}
            Ok((uploads, blobs)) => {
                tracing::info!(
                    uploads,
                    blobs,
                    "Removed expired uploads and blobs no upload names"
                )
            }
            Err(e) => tracing::warn!(error = %e, "Cannot remove expired uploads"),
        }
        match self.adopt().await {
            Ok(0) => {}
            Ok(adopted) => tracing::info!(adopted, "Adopted agents whose daemon stopped renewing"),
            Err(e) => tracing::warn!(error = %e, "Cannot look for agents to adopt"),
        }
        match self.take_shared_work().await {
            Ok(0) => {}
            Ok(taken) => tracing::info!(taken, "Took pending children another daemon had queued"),
            Err(e) => tracing::warn!(error = %e, "Cannot look for pending children to take"),
        }
    }

    /// Takes pending fork children that other daemons hold but have not started (their own
    /// cap on running agents keeps them queued), as many as this daemon has free slots (up to
    /// [`TAKE_UNCAPPED`] a beat without a cap), and runs them. Only children of batches whose
    /// warm-up gate opened (or timed out): they read the cache their first sibling wrote.
    async fn take_shared_work(&self) -> Result<usize> {
        let running = self.inner.supervisor.running();
        let free = match self.inner.config.max_running_agents {
            Some(cap) => cap.saturating_sub(running),
            None => TAKE_UNCAPPED,
        };
        if free == 0 {
            return Ok(0);
        }
        let limit = u32::try_from(free).unwrap_or(u32::MAX);
        let taken = self
            .inner
            .store
            .take_pending(limit, GATE_TIMEOUT, QUEUED_FOR)
            .await?;
        for id in &taken {
            // Released already: the gate opened where the batch started. One that cannot start
            // now stays pending, and is taken again.
            if let Err(e) = self.inner.runs.start_agent(*id).await {
                tracing::warn!(agent.id = %id, error = %e, "Cannot start a pending child");
            }
        }
        Ok(taken.len())
    }

    /// Starts every agent that no live daemon holds (see [`forkd_core::store::Store::adoptable_agents`])
    /// and that this daemon can run, each under its own id from its stored transcript. Reports a
    /// parent turn was waiting to deliver go to the transcript when that turn is not running any
    /// more (its reply was never stored). Returns how many agents were started.
    pub(crate) async fn adopt(&self) -> Result<usize> {
        let store = &self.inner.store;
        let adoptable: Vec<Agent> = store
            .adoptable_agents()
            .await?
            .into_iter()
            .filter(|a| !self.inner.supervisor.is_running(a.id))
            .collect();
        self.redirect_orphaned_reports(&adoptable).await?;
        let mut runnable = Vec::with_capacity(adoptable.len());
        let mut workspaces: BTreeMap<SessionId, bool> = BTreeMap::new();
        for agent in adoptable {
            let here = match workspaces.get(&agent.session_id) {
                Some(here) => *here,
                None => {
                    let here = self.workspace_is_here(agent.session_id).await?;
                    workspaces.insert(agent.session_id, here);
                    here
                }
            };
            if here {
                runnable.push(agent);
            }
        }
        self.resume_agents(runnable).await
    }

    /// Whether the session's workspace exists on this machine: its agents' tools work in it, so
    /// a daemon that lacks it leaves them to one that has it (a shared volume, the node that
    /// holds it). Says so in the log, once per session.
    async fn workspace_is_here(&self, session: SessionId) -> Result<bool> {
        let session = self.get_session(session).await?;
        let config = &self.inner.config.workspaces;
        if crate::workspaces::here(config, &*self.inner.store, &session).await? {
            return Ok(true);
        }
        let first = self
            .inner
            .missing_workspaces
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(session.id);
        if first {
            tracing::warn!(
                session.id = %session.id,
                workspace = %session.workspace.display(),
                "Leaving the session's agents to another daemon: its workspace is not on this machine"
            );
        }
        Ok(false)
    }

    /// Hands to the transcript the reports that a parent turn was waiting for, when that turn
    /// no longer runs anywhere: its parent is not running a turn, or its turn is being adopted
    /// (it resumes from its transcript, where the reports then are).
    async fn redirect_orphaned_reports(&self, adoptable: &[Agent]) -> Result<()> {
        let store = &self.inner.store;
        let undelivered = store.caller_reports().await?;
        if undelivered.is_empty() {
            return Ok(());
        }
        let adopted: HashSet<AgentId> = adoptable.iter().map(|a| a.id).collect();
        let mut turns: BTreeMap<SessionId, bool> = BTreeMap::new();
        let mut orphaned = Vec::new();
        for id in undelivered {
            let Some(agent) = store.get_agent(id).await? else {
                continue;
            };
            let waited_on = match turns.get(&agent.session_id) {
                Some(live) => *live,
                None => {
                    let live = store
                        .list_agents(&AgentFilter {
                            session_id: Some(agent.session_id),
                            ..AgentFilter::default()
                        })
                        .await?
                        .into_iter()
                        .find(|a| a.kind == AgentKind::Parent)
                        .is_some_and(|parent| {
                            parent.state == AgentState::Running && !adopted.contains(&parent.id)
                        });
                    turns.insert(agent.session_id, live);
                    live
                }
            };
            if !waited_on {
                orphaned.push(id);
            }
        }
        if !orphaned.is_empty() {
            let appended = store.redirect_reports(&orphaned).await?;
            tracing::info!(
                agents = orphaned.len(),
                appended,
                "Reports of an interrupted parent turn go to the transcript"
            );
        }
        Ok(())
    }

    /// Resumes `agents` (live, held by nobody): parent turns continue from their transcripts,
    /// a batch's children start together, behind warm-up gating when its prefix has gone cold,
    /// and any other agent on its own.
    pub(crate) async fn resume_agents(&self, agents: Vec<Agent>) -> Result<usize> {
        let mut resumed = 0;
        let mut batches: BTreeMap<BatchId, Vec<(u32, AgentId)>> = BTreeMap::new();
        for agent in agents {
            if agent.kind == AgentKind::Parent {
                if agent.state == AgentState::Running {
                    let id = agent.id;
                    // One session's broken turn must not keep the others from resuming.
                    match self.inner.turns.resume_turn(agent).await {
                        Ok(()) => resumed += 1,
                        Err(e) => tracing::error!(
                            agent.id = %id,
                            error = %e,
                            "Cannot resume the parent's turn; it stays running for the next start"
                        ),
                    }
                }
                continue;
            }
            tracing::info!(agent.id = %agent.id, state = agent.state.as_str(), "Resuming an agent");
            resumed += 1;
            match (agent.kind, agent.batch_id) {
                (AgentKind::Fork, Some(batch)) => batches
                    .entry(batch)
                    .or_default()
                    .push((agent.index, agent.id)),
                _ => match self.inner.tenancy.session_owner(agent.session_id).await {
                    Ok(tenant) => self.inner.runs.start_run(agent.id, &tenant),
                    Err(e) => tracing::error!(
                        agent.id = %agent.id,
                        error = %e,
                        "Cannot tell whose agent it is; it stays for the next start"
                    ),
                },
            }
        }
        for (batch, children) in batches {
            self.resume_batch(batch, children).await;
        }
        Ok(resumed)
    }
}
