//! One agent run: model ↔ tools until the model ends its turn, then a task notification.
//!
//! A fork child's state is its transcript: the run rebuilds the conversation from the store (the
//! parent's history up to the fork point, the batch's shared blocks, the child's directive and its
//! own messages), so any later run of the same agent id continues where the last one stopped.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use forkd_core::fork::ForkBatch;
use forkd_core::pricing::{self, CacheTtl};
use forkd_core::report::Report;
use forkd_core::request::{self, BlockPos};
use forkd_core::session::Session;
use forkd_core::{Agent, AgentId, AgentState, BatchId, Message, NotificationStatus, RequestId};
use forkd_provider::{Accumulator, Completion, ModelRequest, ProviderError, StreamEvent};
use forkd_store::{NewNotification, RequestRecord};
use futures::StreamExt;
use tokio::sync::watch;
use tracing::Instrument;

use crate::batch::WarmupGate;
use crate::error::EngineError;
use crate::{Engine, now_ms};

/// What the children of one batch share, loaded once and held by reference: the prefix is
/// neither read from the store nor held in memory once per child.
pub(crate) struct BatchContext {
    pub session: Session,
    pub batch: ForkBatch,
    pub history: Vec<Message>,
}

/// How often an agent's end is attempted before giving up (about a minute in all).
const FINISH_ATTEMPTS: u32 = 16;

/// Live batch contexts; entries die with the last child that holds them.
#[derive(Default)]
pub(crate) struct BatchCache(std::sync::Mutex<HashMap<BatchId, Weak<BatchContext>>>);

/// Why a run ended without completing.
#[derive(Debug, thiserror::Error)]
enum RunFailure {
    #[error("model request failed: {0}")]
    Provider(#[from] ProviderError),
    #[error("no final answer after {0} turns")]
    TurnLimit(u32),
    #[error("{0}")]
    Engine(#[from] EngineError),
}

impl From<forkd_store::StoreError> for RunFailure {
    fn from(e: forkd_store::StoreError) -> Self {
        RunFailure::Engine(e.into())
    }
}

impl Engine {
    /// Spawns an agent's run on the engine's tracker. `gate` is held by a batch's first child;
    /// `wait` makes a sibling wait for that gate.
    pub(crate) fn spawn_agent(
        &self,
        id: AgentId,
        gate: Option<WarmupGate>,
        wait: Option<watch::Receiver<bool>>,
    ) {
        let engine = self.clone();
        let token = self.inner.shutdown.child_token();
        let span = tracing::info_span!("agent", agent.id = %id);
        self.inner.tasks.spawn(
            async move {
                tokio::select! {
                    // Shutdown first: a run released at the same moment must not start writing.
                    biased;
                    // On shutdown the agent stays `running` in the store: a later start resumes it.
                    () = token.cancelled() => tracing::debug!("Agent run stopped by shutdown"),
                    () = engine.run_agent(id, gate, wait) => {}
                }
            }
            .instrument(span),
        );
    }

    async fn run_agent(
        &self,
        id: AgentId,
        mut gate: Option<WarmupGate>,
        wait: Option<watch::Receiver<bool>>,
    ) {
        if let Some(mut rx) = wait {
            // A closed gate (its sender dropped) releases the sibling too.
            let _ = rx.wait_for(|open| *open).await;
        }
        let outcome = self.drive(id, &mut gate).await;
        if let Some(g) = gate.as_mut() {
            g.open();
        }
        let (status, text, error) = match outcome {
            Ok(text) => (NotificationStatus::Completed, Some(text), None),
            Err(failure) => {
                tracing::warn!(error = %failure, "Agent failed");
                (NotificationStatus::Failed, None, Some(failure.to_string()))
            }
        };
        self.finish_with_retries(id, status, text, error).await;
    }

    /// Records an agent's end, retrying a store that is briefly unavailable (a busy database):
    /// an agent whose end is never recorded would keep its subscribers waiting forever.
    pub(crate) async fn finish_with_retries(
        &self,
        id: AgentId,
        status: NotificationStatus,
        text: Option<String>,
        error: Option<String>,
    ) {
        let mut delay = Duration::from_millis(100);
        for attempt in 1..=FINISH_ATTEMPTS {
            match self.finish(id, status, text.clone(), error.clone()).await {
                Ok(()) => return,
                // Already ended (by an earlier attempt that committed, or a kill): nothing to do.
                Err(EngineError::Store(forkd_store::StoreError::Conflict(_))) => return,
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
    }

    async fn batch_context(&self, agent: &Agent) -> Result<Arc<BatchContext>, RunFailure> {
        let Some(batch_id) = agent.batch_id else {
            return Err(EngineError::FailedPrecondition(format!(
                "agent {} is not a fork child; only fork children run in this build",
                agent.id
            ))
            .into());
        };
        if let Some(ctx) = self.cached_batch(batch_id) {
            return Ok(ctx);
        }
        let store = &self.inner.store;
        let batch = store
            .get_batch(batch_id)
            .await?
            .ok_or_else(|| EngineError::NotFound {
                kind: "batch",
                id: batch_id.to_string(),
            })?;
        let session = self.get_session(agent.session_id).await?;
        let history = store
            .session_messages(agent.session_id, Some(batch.fork_point))
            .await?
            .into_iter()
            .map(|m| m.message)
            .collect();
        let ctx = Arc::new(BatchContext {
            session,
            batch,
            history,
        });
        let mut cache = self
            .inner
            .batches
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Another sibling may have loaded it meanwhile: keep theirs, so all share one copy.
        if let Some(existing) = cache.get(&batch_id).and_then(Weak::upgrade) {
            return Ok(existing);
        }
        cache.retain(|_, weak| weak.strong_count() > 0);
        cache.insert(batch_id, Arc::downgrade(&ctx));
        Ok(ctx)
    }

    fn cached_batch(&self, id: BatchId) -> Option<Arc<BatchContext>> {
        let cache = self
            .inner
            .batches
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        cache.get(&id).and_then(Weak::upgrade)
    }

    /// Runs the agent's turns; returns its final text.
    async fn drive(
        &self,
        id: AgentId,
        gate: &mut Option<WarmupGate>,
    ) -> Result<String, RunFailure> {
        let store = self.inner.store.clone();
        let agent = store
            .get_agent(id)
            .await?
            .ok_or_else(|| EngineError::NotFound {
                kind: "agent",
                id: id.to_string(),
            })?;
        store.set_agent_state(id, AgentState::Running, None).await?;
        let ctx = self.batch_context(&agent).await?;
        let directive =
            store
                .agent_directive_block(id)
                .await?
                .ok_or_else(|| EngineError::NotFound {
                    kind: "directive of agent",
                    id: id.to_string(),
                })?;
        let mut own: Vec<Message> = store
            .agent_messages(id)
            .await?
            .into_iter()
            .map(|m| m.message)
            .collect();
        let params = &ctx.session.params;
        let directive_pos = BlockPos {
            message: ctx.history.len() + 1,
            block: ctx.batch.shared_user_blocks.len(),
        };
        let max_turns = self.config().max_turns;
        for turn in 0..max_turns {
            let conv = ctx.batch.child_conversation(&ctx.history, &directive, &own);
            let body = request::serialize(params, &conv, true);
            let fingerprint = body.prefix_fingerprint(directive_pos).unwrap_or_default();
            let body_bytes = body.body.len() as u64;
            let req = ModelRequest {
                model: params.model.clone(),
                body: body.body.into(),
            };
            let completion = self.request_with_retries(req, gate).await?;
            store.append_agent_message(id, &completion.message).await?;
            self.record(
                &agent,
                turn,
                &ctx.session,
                &completion,
                fingerprint,
                body_bytes,
            )
            .await?;
            let wants_tools = completion.message.tool_uses().next().is_some();
            own.push(completion.message);
            if !wants_tools {
                return Ok(own.last().map(Message::text).unwrap_or_default());
            }
            let mut all = conv.messages;
            all.extend(own.last().cloned());
            let results = self.run_tools(&agent, &all, own.last());
            store.append_agent_message(id, &results).await?;
            own.push(results);
        }
        Err(RunFailure::TurnLimit(max_turns))
    }

    async fn record(
        &self,
        agent: &Agent,
        turn: u32,
        session: &Session,
        completion: &Completion,
        prefix_fingerprint: String,
        body_bytes: u64,
    ) -> Result<(), RunFailure> {
        let cost_usd = pricing::model(&session.params.model)
            .map(|m| completion.usage.cost_usd(m, CacheTtl::FiveMinutes))
            .unwrap_or(0.0);
        let record = RequestRecord {
            id: RequestId::new(),
            agent_id: agent.id,
            session_id: agent.session_id,
            batch_id: agent.batch_id,
            turn,
            model: session.params.model.clone(),
            usage: completion.usage,
            cost_usd,
            prefix_fingerprint,
            body_bytes,
            stop_reason: completion.stop_reason.clone(),
            created_at_ms: now_ms(),
        };
        self.inner.store.record_request(&record).await?;
        Ok(())
    }

    /// Sends a request, retrying what may succeed on a second try (429, 529, 5xx, dropped
    /// streams) with jittered exponential backoff that honours `retry-after`.
    async fn request_with_retries(
        &self,
        req: ModelRequest,
        gate: &mut Option<WarmupGate>,
    ) -> Result<Completion, ProviderError> {
        let policy = &self.config().retry;
        let mut attempt = 1;
        loop {
            match self.request_once(req.clone(), gate).await {
                Ok(c) => return Ok(c),
                Err(e) if e.is_retryable() && attempt < policy.max_attempts => {
                    let delay = backoff(policy, attempt, &e);
                    tracing::info!(attempt, error = %e, ?delay, "Retrying model request");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn request_once(
        &self,
        req: ModelRequest,
        gate: &mut Option<WarmupGate>,
    ) -> Result<Completion, ProviderError> {
        let mut stream = self.inner.provider.stream(req);
        let mut acc = Accumulator::default();
        while let Some(event) = stream.next().await {
            let event = event?;
            if matches!(event, StreamEvent::MessageStart { .. })
                && let Some(g) = gate.as_mut()
            {
                g.open();
            }
            acc.push(&event)?;
        }
        acc.finish()
    }

    /// Records the agent's end: its state, its notification (stored, appended to the parent's
    /// transcript, then pushed to subscribers, in that order).
    async fn finish(
        &self,
        id: AgentId,
        status: NotificationStatus,
        final_text: Option<String>,
        error: Option<String>,
    ) -> Result<(), EngineError> {
        let store = &self.inner.store;
        let agent = store
            .get_agent(id)
            .await?
            .ok_or_else(|| EngineError::NotFound {
                kind: "agent",
                id: id.to_string(),
            })?;
        let report = match (&final_text, &error) {
            (Some(text), _) => Report::parse(text),
            (None, Some(err)) => Report {
                scope: agent
                    .directive
                    .as_ref()
                    .map(|d| d.description.clone())
                    .unwrap_or_default(),
                result: format!("Failed: {err}"),
                issues: err.clone(),
                ..Report::default()
            },
            (None, None) => Report::default(),
        };
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
        let lock = self.session_lock(agent.session_id);
        let _session = lock.lock().await;
        // Commit and broadcast under one lock, so subscribers see notifications in seq order.
        let _order = self.inner.notify_order.lock().await;
        let stored = store.finish_agent(&notification, error.as_deref()).await?;
        tracing::info!(
            status = status.as_str(),
            seq = stored.seq,
            cost_usd = stored.cost_usd,
            "Agent ended"
        );
        // No receiver is fine: subscribers replay from the store.
        let _ = self.inner.notifications.send(stored);
        Ok(())
    }
}

fn backoff(policy: &crate::RetryPolicy, attempt: u32, err: &ProviderError) -> Duration {
    if let ProviderError::Status {
        retry_after: Some(after),
        ..
    } = err
    {
        return (*after).min(policy.max_delay);
    }
    let exp = policy
        .base_delay
        .saturating_mul(1 << attempt.saturating_sub(1).min(16));
    let capped = exp.min(policy.max_delay);
    // Jitter between half and all of the delay: retries of many children must not line up.
    let fraction = 0.5 + fastrand::f64() / 2.0;
    capped.mul_f64(fraction)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RetryPolicy;

    fn status(retry_after: Option<Duration>) -> ProviderError {
        ProviderError::Status {
            status: 529,
            message: "overloaded".into(),
            retry_after,
        }
    }

    #[test]
    fn backoff_grows_with_jitter_caps_and_honours_retry_after() {
        let policy = RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        };
        for attempt in 1..=3u32 {
            let full = Duration::from_millis(100 * (1 << (attempt - 1)));
            let d = backoff(&policy, attempt, &status(None));
            assert!(d >= full / 2 && d <= full, "attempt {attempt}: {d:?}");
        }
        assert!(backoff(&policy, 9, &status(None)) <= Duration::from_secs(1));
        let after = backoff(&policy, 1, &status(Some(Duration::from_millis(700))));
        assert_eq!(after, Duration::from_millis(700));
        let capped = backoff(&policy, 1, &status(Some(Duration::from_secs(60))));
        assert_eq!(capped, Duration::from_secs(1));
    }
}
