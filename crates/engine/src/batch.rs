//! Fork batches: one assistant message of `Agent` tool_uses, N children, and warm-up gating.

use forkd_core::agent::FORK_QUERY_SOURCE;
use forkd_core::fork::{ForkBatch, ForkError};
use forkd_core::plan::{self, ForkLimits, Forker, Refusal};
use forkd_core::session::Session;
use forkd_core::store::{
    AgentFilter, BatchExtras, Budget, IdempotencyRecord, IdempotentCall, NewChild,
};
use forkd_core::{Agent, AgentId, AgentKind, AgentState, BatchId, Directive, SessionId, Usage};
use std::sync::Arc;

use forkd_core::store::Store;
use tokio::sync::watch;

use crate::error::{EngineError, Result};
use crate::tenancy::Idempotent;
use crate::{Engine, now_ms};

/// How a client's batch is submitted, besides its session and directives.
#[derive(Debug, Clone, Default)]
pub struct BatchOptions {
    /// `None`: the daemon's setting.
    pub warmup_gating: Option<bool>,
    /// A retry with the same key and parameters returns the first call's batch.
    pub idempotency_key: Option<String>,
    pub budget: Budget,
}

/// A submitted batch: its id and its children in directive order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmittedBatch {
    pub batch_id: BatchId,
    pub agent_ids: Vec<AgentId>,
}

/// A batch about to be stored: its fork message, the children it forks (tool_use id and
/// directive, in order), and the real results of the message's other tool calls.
pub(crate) struct BatchStart {
    pub session_id: SessionId,
    pub batch_id: BatchId,
    /// The reply that forks, for a model's batch; `None` for a client's, which invents none.
    pub assistant: Option<forkd_core::Message>,
    pub forks: Vec<(String, Directive)>,
    pub others: Vec<(String, forkd_core::Block)>,
    pub gating: bool,
    pub idempotency: Option<IdempotencyRecord>,
    pub budget: Budget,
    /// The parent turn that forks (its lease, checked on commit) and the typed agents whose
    /// reports `others` carries; `None` for a client's batch.
    pub turn: Option<(forkd_core::store::Lease, Vec<AgentId>)>,
}

/// Opens when the first child's response has started (or when the first child ends without
/// one), releasing its siblings. Dropping the sender opens it too, so no sibling waits forever.
/// Opening it is also recorded in the store, where other daemons sharing the database see it
/// before they take any of the batch's pending children.
pub(crate) struct WarmupGate {
    tx: Option<watch::Sender<bool>>,
    store: Arc<dyn Store>,
    batch: BatchId,
}

impl WarmupGate {
    pub(crate) fn open(&mut self) {
        if let Some(tx) = self.tx.take() {
            tx.send_replace(true);
            record_open_gate(&self.store, self.batch);
        }
    }
}

/// Records in the store that `batch`'s gate is open, without holding up the caller (a child's
/// stream): a write that fails only keeps other daemons waiting until the gate's timeout.
fn record_open_gate(store: &Arc<dyn Store>, batch: BatchId) {
    let store = Arc::clone(store);
    tokio::spawn(async move {
        if let Err(e) = store.open_gate(batch).await {
            tracing::warn!(batch.id = %batch, error = %e, "Cannot record that the batch's gate opened");
        }
    });
}

fn invalid_fork(err: ForkError) -> EngineError {
    EngineError::ForkRefused(Refusal::Directive(err))
}

fn child(
    session_id: SessionId,
    batch_id: BatchId,
    index: usize,
    directive: Directive,
    now: i64,
) -> NewChild {
    NewChild {
        directive_block: ForkBatch::directive_block(&directive),
        agent: Agent {
            id: AgentId::new(),
            session_id,
            batch_id: Some(batch_id),
            kind: AgentKind::Fork,
            index: index as u32,
            state: AgentState::Pending,
            directive: Some(directive),
            query_source: Some(FORK_QUERY_SOURCE.to_owned()),
            report_to: forkd_core::ReportTo::Transcript,
            usage: Usage::default(),
            cost_usd: 0.0,
            error: None,
            created_at_ms: now,
            updated_at_ms: now,
            held_by: None,
            throttled_since_ms: None,
        },
    }
}

impl Engine {
    /// The limits every batch is planned under, a client's or a model's.
    pub(crate) fn fork_limits(&self) -> ForkLimits {
        ForkLimits {
            max_children: self.config().max_children_per_batch,
            max_directive_bytes: self.config().max_directive_bytes,
        }
    }

    /// Submits a client's fork batch: appends the `Agent` tool_use message to the parent, stores
    /// the batch and its children, and starts them (child 1 first under warm-up gating).
    pub async fn fork_batch(
        &self,
        session_id: SessionId,
        directives: Vec<Directive>,
        options: BatchOptions,
    ) -> Result<SubmittedBatch> {
        let session = self.get_session(session_id).await?;
        self.fork_batch_in(session, directives, options).await
    }

    /// [`Engine::fork_batch`] on a session already read.
    pub(crate) async fn fork_batch_in(
        &self,
        session: Session,
        directives: Vec<Directive>,
        options: BatchOptions,
    ) -> Result<SubmittedBatch> {
        let cfg = self.config();
        let session_id = session.id;
        let batch_id = BatchId::new();
        let forker = Forker {
            coordinator: session.coordinator,
            child: None,
            limits: self.fork_limits(),
        };
        let forks =
            plan::plan_client(batch_id, &directives, &forker).map_err(EngineError::ForkRefused)?;
        let children: Vec<&Directive> = forks.iter().map(|(_, d)| d).collect();
        self.check_children_fit(&session, self.finished_turns_end(session.id), &children)
            .await?;
        let gating = options.warmup_gating.unwrap_or(cfg.warmup_gating);
        for (what, bad) in [
            (
                "budget_usd",
                options
                    .budget
                    .usd
                    .is_some_and(|u| !(u > 0.0 && u.is_finite())),
            ),
            ("budget_tokens", options.budget.tokens == Some(0)),
        ] {
            if bad {
                return Err(EngineError::InvalidRequest(format!(
                    "{what} must be positive when set"
                )));
            }
        }
        let key = options.idempotency_key.clone().filter(|k| !k.is_empty());
        let digest = key.as_ref().map(|_| {
            let canonical = serde_json::json!([
                session_id.to_string(),
                directives
                    .iter()
                    .map(|d| (&d.description, &d.prompt))
                    .collect::<Vec<_>>(),
                options.warmup_gating,
                options.budget.usd,
                options.budget.tokens,
            ]);
            forkd_core::request::fingerprint(canonical.to_string().as_bytes())
        });
        let tenant = session.tenant;
        // Storing and starting happen in a task of their own: if the caller goes away (a client
        // deadline, a reset stream) after the commit, the children still start. A committed
        // batch whose children never run would be work that silently vanished.
        let engine = self.clone();
        self.inner
            .tasks
            .spawn(async move {
                let start = BatchStart {
                    session_id,
                    batch_id,
                    assistant: None,
                    forks,
                    others: Vec::new(),
                    gating,
                    idempotency: None,
                    budget: options.budget,
                    turn: None,
                };
                let (Some(key), Some(digest)) = (key, digest) else {
                    return engine.commit_and_start(start).await;
                };
                let outcome = engine
                    .idempotent(
                        &tenant,
                        &key,
                        IdempotentCall::ForkBatch,
                        digest,
                        batch_id.to_string(),
                        |record| {
                            engine.commit_and_start(BatchStart {
                                idempotency: Some(record),
                                ..start
                            })
                        },
                    )
                    .await?;
                match outcome {
                    Idempotent::Created(batch) => Ok(batch),
                    Idempotent::Earlier(id) => engine.submitted(&id).await,
                }
            })
            .await
            .map_err(|e| EngineError::Invariant(format!("fork batch task failed: {e}")))?
    }

    /// The batch an earlier call submitted, by its stored id.
    async fn submitted(&self, id: &str) -> Result<SubmittedBatch> {
        let batch_id: BatchId = id.parse().map_err(|e| {
            EngineError::Invariant(format!("stored batch id {id:?} does not parse: {e}"))
        })?;
        let agent_ids = self
            .inner
            .store
            .list_agents(&AgentFilter {
                batch_id: Some(batch_id),
                include_ended: true,
                ..AgentFilter::default()
            })
            .await?
            .into_iter()
            .map(|a| a.id)
            .collect();
        Ok(SubmittedBatch {
            batch_id,
            agent_ids,
        })
    }

    /// Appends what the batch gives its parent (a model's fork message and its results, or a
    /// client's launch note) to the session, stores the batch and its children, and starts them.
    /// One code path for client and model batches.
    pub(crate) async fn commit_and_start(&self, start: BatchStart) -> Result<SubmittedBatch> {
        let BatchStart {
            session_id,
            batch_id,
            assistant,
            forks,
            others,
            gating,
            idempotency,
            budget,
            turn,
        } = start;
        // Known before the commit: once it is stored, nothing may keep the children from starting.
        let tenant = self.session_owner(session_id).await?;
        let lock = self.session_lock(session_id);
        let guard = lock.lock().await;
        let len = self.inner.store.session_message_count(session_id).await?;
        let now = now_ms();
        let children: Vec<NewChild> = forks
            .iter()
            .enumerate()
            .map(|(i, (_, d))| child(session_id, batch_id, i, d.clone(), now))
            .collect();
        let (batch, parent_messages) = match assistant {
            Some(assistant) => {
                let batch = ForkBatch::new(batch_id, session_id, len, assistant, now)
                    .map_err(invalid_fork)?;
                let pairs: Vec<(String, AgentId)> = forks
                    .into_iter()
                    .zip(&children)
                    .map(|((tool_use_id, _), c)| (tool_use_id, c.agent.id))
                    .collect();
                let results = batch.parent_results_with(&pairs, &others);
                (batch, vec![results])
            }
            None => {
                // A client's batch forks at the end of the parent's last finished turn: a turn
                // in flight is not part of what its children inherit.
                let fork_point = self.finished_turns_end(session_id).unwrap_or(len).min(len);
                let batch = ForkBatch::client(batch_id, session_id, fork_point, now);
                let directives: Vec<Directive> = forks.into_iter().map(|(_, d)| d).collect();
                let note = forkd_core::digest::launch_note(batch_id, &directives);
                (batch, vec![note])
            }
        };
        // Forked after a compaction, the children inherit what the parent's requests saw.
        let mut batch = batch;
        batch.compacted_to = self
            .compaction_before(session_id, batch.fork_point)
            .await?
            .map(|c| c.to_seq);
        self.inner
            .store
            .create_fork_batch(
                &batch,
                &parent_messages,
                &children,
                &BatchExtras {
                    turn: turn
                        .as_ref()
                        .map(|(lease, delivered)| (lease, delivered.as_slice())),
                    idempotency: idempotency.as_ref(),
                    budget,
                },
            )
            .await?;
        drop(guard);

        let agent_ids: Vec<AgentId> = children.iter().map(|c| c.agent.id).collect();
        tracing::info!(
            session.id = %session_id,
            batch.id = %batch_id,
            children = agent_ids.len(),
            gating,
            "Fork batch submitted"
        );
        self.start_batch(batch_id, &tenant, &agent_ids, gating);
        Ok(SubmittedBatch {
            batch_id,
            agent_ids,
        })
    }

    /// Starts a batch's children. Under gating the first child goes alone; the others wait for
    /// its response to start, so they find the shared prefix already cached.
    pub(crate) fn start_batch(
        &self,
        batch: BatchId,
        tenant: &Arc<str>,
        agent_ids: &[AgentId],
        gating: bool,
    ) {
        let open = !gating || agent_ids.len() < 2;
        if open {
            record_open_gate(&self.inner.store, batch);
        }
        let (tx, rx) = watch::channel(open);
        let mut gate = Some(WarmupGate {
            tx: (!open).then_some(tx),
            store: Arc::clone(&self.inner.store),
            batch,
        });
        for (i, id) in agent_ids.iter().enumerate() {
            let own_gate = if i == 0 { gate.take() } else { None };
            let wait = (i > 0).then(|| rx.clone());
            self.spawn_agent(*id, tenant, own_gate, wait);
        }
    }
}
