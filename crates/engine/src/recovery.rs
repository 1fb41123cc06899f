//! Recovery from the database's faults (see `faults`): the loop that notices a fault, probes the
//! database until it takes writes again, and then resumes the agents the fault stopped.

use std::time::{Duration, Instant};

use forkd_core::Agent;

use crate::Engine;
use crate::faults::StoreHealth;

/// How often the loop looks at the store's fault and the disk's free space.
const TICK: Duration = Duration::from_millis(250);

/// How often a failing database is probed with a write.
const PROBE_EVERY: Duration = Duration::from_millis(500);

impl Engine {
    /// Starts the recovery loop: every [`TICK`] (and at once when an agent stops for a fault)
    /// it sets the daemon's store health, probes a failing database, and resumes the agents a
    /// fault stopped once a probe succeeds. It runs until shutdown.
    pub fn start_recovery(&self) {
        let engine = self.clone();
        let stop = self.inner.shutdown.clone();
        tokio::spawn(async move {
            let mut failing_since: Option<Instant> = None;
            let mut last_probe: Option<Instant> = None;
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(TICK) => {}
                    () = engine.inner.faults.nudged() => {}
                }
                engine.recover(&mut failing_since, &mut last_probe).await;
            }
        });
    }

    /// One look: see [`Engine::start_recovery`].
    async fn recover(&self, failing_since: &mut Option<Instant>, last_probe: &mut Option<Instant>) {
        let faults = &self.inner.faults;
        let store = &self.inner.store;
        let fault = store.fault();
        if fault.is_none() && !faults.any_interrupted() {
            if failing_since.take().is_some() {
                tracing::info!("The database takes writes again");
            }
            faults.set_health(faults.space_health());
            return;
        }
        let since = *failing_since.get_or_insert_with(|| {
            tracing::warn!(
                error = fault.as_deref().unwrap_or("an agent's write failed"),
                "The database refuses writes: agents stop where they stand and resume once it takes writes again"
            );
            Instant::now()
        });
        if let StoreHealth::Healthy | StoreHealth::LowDisk(_) = faults.current() {
            faults.set_health(StoreHealth::Failing(
                fault.unwrap_or_else(|| "an agent's write failed".to_owned()),
            ));
        }
        if last_probe.is_some_and(|at| at.elapsed() < PROBE_EVERY) {
            return;
        }
        *last_probe = Some(Instant::now());
        if let Err(e) = store.probe_write().await {
            tracing::debug!(error = %e, "The database still refuses writes");
            faults.set_health(StoreHealth::Failing(e.to_string()));
            return;
        }
        *failing_since = None;
        tracing::info!(
            after_ms = crate::clock::millis(since.elapsed()),
            "The database takes writes again; resuming the agents it stopped"
        );
        crate::metrics::store_recovered(since.elapsed());
        faults.set_health(faults.space_health());
        self.resume_stopped().await;
    }

    /// Resumes the agents a fault stopped (those still live), as a restart would.
    async fn resume_stopped(&self) {
        let faults = &self.inner.faults;
        let mut agents: Vec<Agent> = Vec::new();
        for id in faults.take_interrupted() {
            match self.inner.store.get_agent(id).await {
                Ok(Some(agent)) if !agent.state.is_terminal() => agents.push(agent),
                Ok(_) => {}
                // Still failing: it waits for the next probe.
                Err(e) => faults.interrupted(id, e.to_string()),
            }
        }
        if agents.is_empty() {
            return;
        }
        let ids: Vec<_> = agents.iter().map(|a| a.id).collect();
        match self.resume_agents(agents).await {
            Ok(resumed) => {
                tracing::info!(resumed, "Resumed the agents the database fault stopped");
                for id in ids {
                    faults.resumed(id);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "Cannot resume the agents the database fault stopped");
                for id in ids {
                    faults.interrupted(id, e.to_string());
                }
            }
        }
    }
}
