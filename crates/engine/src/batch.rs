//! Fork batches: one assistant message of `Agent` tool_uses, N children, and warm-up gating.

mod dry_run;
mod key;

pub use dry_run::DryRun;

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};

use forkd_core::agent::FORK_QUERY_SOURCE;
use forkd_core::branch::{At, TurnIndex};
use forkd_core::fork::{ForkBatch, ForkError};
use forkd_core::isolation::{BatchSnapshot, Isolation};
use forkd_core::output::OutputSchema;
use forkd_core::plan::{self, ForkLimits, Forker, Refusal};
use forkd_core::request;
use forkd_core::session::Session;
use forkd_core::store::{
    AgentFilter, BatchExtras, Budget, IdempotencyRecord, IdempotentCall, NewChild, Store,
};
use forkd_core::{Agent, AgentId, AgentKind, AgentState, BatchId, Directive, SessionId};

use crate::clock::now_ms;
use crate::compact::Compactor;
use crate::config::EngineConfig;
use crate::copies::Copies;
use crate::error::{EngineError, Result};
use crate::locks::LockMap;
use crate::run::Runs;
use crate::session::Sessions;
use crate::supervisor::Supervisor;
use crate::tenancy::{Idempotent, Tenancy};
use crate::window::{Window, block_tokens};
use tracing::Instrument as _;
use tracing::field::Empty;

/// How a client's batch is submitted, besides its session and directives.
#[derive(Debug, Clone, Default)]
pub struct BatchOptions {
    /// `None`: the daemon's setting.
    pub warmup_gating: Option<bool>,
    /// A retry with the same key and parameters returns the first call's batch.
    pub idempotency_key: Option<String>,
    pub budget: Budget,
    /// Each child in its own copy of the workspace (`copy`), or all in the session's (`none`).
    pub isolation: Isolation,
    /// Fork after this turn instead of the last finished one (docs/contracts.md, "Branches").
    pub at_turn: Option<u32>,
    /// Fork where this earlier batch of the session forked: its children's history, and so
    /// their cached prefix (a rerun of that batch's failed children).
    pub fork_point_of: Option<BatchId>,
    /// The JSON Schema the children's final replies must match.
    pub output_schema: Option<OutputSchema>,
    /// The children's limits, over their tenant's and the daemon's (docs/contracts.md,
    /// "Limits").
    pub limits: forkd_core::Limits,
    /// Each child's own limits over the batch's, by directive (shorter than the directives, or
    /// empty: the rest have none of their own).
    pub child_limits: Vec<forkd_core::Limits>,
    /// The webhook the batch's notifications go to (one of the tenant's).
    pub webhook: Option<forkd_core::WebhookId>,
    /// The schedule whose firing forks it (set by the schedules' clock, never by a caller): its
    /// notifications carry the name.
    pub schedule: Option<String>,
}

/// A submitted batch: its id and its children in directive order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmittedBatch {
    pub batch_id: BatchId,
    pub agent_ids: Vec<AgentId>,
    /// How many of the session's messages its children inherit.
    pub fork_point: u64,
    /// Whether an idempotency key returned an earlier call's batch (nothing was forked now).
    pub existing: bool,
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
    /// Which children work in copies, one per fork in order (a model's calls each say; a
    /// client's batch says for all): the snapshot is taken before the batch is stored.
    pub isolated: Vec<bool>,
    /// Where a client's batch forks, when it asked for an earlier turn than the last finished.
    pub fork_point: Option<u64>,
    /// A client's batch's output schema.
    pub output_schema: Option<OutputSchema>,
    /// Each child's limits as asked (its own over its batch's), one per fork in order; resolved
    /// over its tenant's and the daemon's when stored.
    pub limits: Vec<forkd_core::Limits>,
    /// Whether this daemon starts the children: `false` when the session's workspace is on
    /// another daemon's machine, whose heartbeat adopts them ([`crate::workspaces::here`]).
    pub start_here: bool,
    /// The webhook a client's batch named.
    pub webhook: Option<forkd_core::WebhookId>,
    /// The schedule that forks it.
    pub schedule: Option<String>,
}

/// Fork batches: a client's through the fork plan, checked against the window at submission;
/// every batch (a client's or a model's) stored and its children started.
pub(crate) struct Batches {
    store: Arc<dyn Store>,
    /// Batch limits, warm-up gating's default.
    config: Arc<EngineConfig>,
    tenancy: Arc<Tenancy>,
    window: Arc<Window>,
    compaction: Arc<Compactor>,
    sessions: Arc<Sessions>,
    /// Starts the children.
    runs: Arc<Runs>,
    /// Isolated batches' snapshots.
    copies: Arc<Copies>,
    /// Stores and starts a batch in a task of its own.
    supervisor: Arc<Supervisor>,
    session_locks: Arc<LockMap<SessionId>>,
    turn_starts: Arc<TurnStarts>,
}

/// What batches are made of.
pub(crate) struct BatchParts {
    pub store: Arc<dyn Store>,
    pub config: Arc<EngineConfig>,
    pub tenancy: Arc<Tenancy>,
    pub window: Arc<Window>,
    pub compaction: Arc<Compactor>,
    pub sessions: Arc<Sessions>,
    pub runs: Arc<Runs>,
    pub copies: Arc<Copies>,
    pub supervisor: Arc<Supervisor>,
    pub session_locks: Arc<LockMap<SessionId>>,
    pub turn_starts: Arc<TurnStarts>,
}

impl Batches {
    pub(crate) fn new(parts: BatchParts) -> Self {
        Self {
            store: parts.store,
            config: parts.config,
            tenancy: parts.tenancy,
            window: parts.window,
            compaction: parts.compaction,
            sessions: parts.sessions,
            runs: parts.runs,
            copies: parts.copies,
            supervisor: parts.supervisor,
            session_locks: parts.session_locks,
            turn_starts: parts.turn_starts,
        }
    }
}

/// Where each turn in flight began in its session's transcript: a client's batch forks before
/// it (the end of the last finished turn). Turns write it, batches read it.
#[derive(Debug, Default)]
pub(crate) struct TurnStarts(StdMutex<HashMap<SessionId, u64>>);

impl TurnStarts {
    fn starts(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, u64>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A turn of the session began at message `seq`.
    pub(crate) fn begin(&self, session: SessionId, seq: u64) {
        self.starts().insert(session, seq);
    }

    /// The session's turn ended.
    pub(crate) fn end(&self, session: SessionId) {
        self.starts().remove(&session);
    }

    /// The end of the session's last finished turn when a turn is in flight (where that turn
    /// began); `None` when none is.
    pub(crate) fn finished_turns_end(&self, session: SessionId) -> Option<u64> {
        self.starts().get(&session).copied()
    }
}

/// What every child of a batch shares before its directive, and where it was read.
pub(crate) struct SharedPrefix {
    /// The history's and the boilerplate's tokens.
    pub tokens: u64,
    /// A batch with the boilerplate, to build a child's first request on.
    pub probe: ForkBatch,
    /// The fork point.
    pub point: u64,
    /// The compaction in force there, if any.
    pub compaction: Option<forkd_core::compaction::Compaction>,
}

/// A client's batch that passed every check, ready to be stored.
pub(crate) struct Checked {
    pub batch_id: BatchId,
    /// Each child's tool_use id and directive, in order.
    pub forks: Vec<(String, Directive)>,
    /// Where it forks when it asked for an earlier point than the last finished turn.
    pub fork_point: Option<u64>,
    pub gating: bool,
    /// Whether this daemon starts the children ([`crate::workspaces::here`]).
    pub start_here: bool,
}

fn invalid_fork(err: ForkError) -> EngineError {
    EngineError::ForkRefused(Refusal::Directive(err))
}

fn child(
    session_id: SessionId,
    batch_id: BatchId,
    (index, directive, limits): (usize, Directive, forkd_core::Limits),
    now: i64,
) -> NewChild {
    NewChild {
        directive_block: ForkBatch::directive_block(&directive),
        agent: Agent {
            limits: Some(limits),
            batch_id: Some(batch_id),
            index: index as u32,
            directive: Some(directive),
            query_source: Some(FORK_QUERY_SOURCE.to_owned()),
            ..Agent::new(
                AgentId::new(),
                session_id,
                AgentKind::Fork,
                AgentState::Pending,
                now,
            )
        },
    }
}

impl Batches {
    /// What every child's first request shares, in tokens as the window counts them: the
    /// parent's history up to the fork point (`None`: all of it) and the fork boilerplate.
    pub(crate) async fn shared_prefix(
        &self,
        session: &Session,
        fork_point: Option<u64>,
        schema: Option<&OutputSchema>,
    ) -> Result<SharedPrefix> {
        let probe =
            ForkBatch::client(BatchId::new(), session.id, 0, 0).with_output_schema(schema.cloned());
        let shared: u64 = probe.shared_user_blocks.iter().map(block_tokens).sum();
        let point = match fork_point {
            Some(point) => point,
            None => self.store.session_message_count(session.id).await?,
        };
        let compaction = self.compaction.compaction_before(session.id, point).await?;
        let history = self
            .window
            .inherited_tokens(
                session,
                Some(point),
                compaction.as_ref().map(|c| (c.to_seq, &c.summary)),
            )
            .await?;
        Ok(SharedPrefix {
            tokens: history + shared,
            probe,
            point,
            compaction,
        })
    }

    /// Refuses a client's batch whose children would not fit their model's window, before any
    /// request is made. A child's first request is the parent's history up to the fork point
    /// (`None`: all of it), the boilerplate and its directive: the longest directive stands for
    /// every child.
    pub(crate) async fn check_children_fit(
        self: &Arc<Self>,
        session: &Session,
        (fork_point, schema): (Option<u64>, Option<&OutputSchema>),
        directives: &[&Directive],
    ) -> Result<()> {
        let Some(longest) = directives.iter().max_by_key(|d| d.prompt.len()) else {
            return Ok(());
        };
        let Some(room) = self.window.room(&session.params) else {
            return Ok(());
        };
        let SharedPrefix {
            tokens,
            probe,
            point,
            compaction,
        } = self.shared_prefix(session, fork_point, schema).await?;
        let directive = ForkBatch::directive_block(longest);
        let estimate = tokens + block_tokens(&directive);
        if !room.near_edge(estimate) || !self.window.provider_counts() {
            return room.check_estimate(&session.params.model, estimate);
        }
        // Near the edge: the longest child's first request, built as its run will build it,
        // for the provider to count.
        let mut probe = probe;
        probe.fork_point = point;
        probe.compacted_to = compaction.map(|c| c.to_seq);
        let history = self.compaction.inherited_history(&probe).await?;
        let conversation = probe.child_conversation(&history, &directive, &[]);
        let body = || request::serialize(&session.params, &conversation, true).body;
        self.window
            .check_near_edge(room, &session.params, estimate, body)
            .await
    }

    /// The session's turns: where each began, its length, and the turn in flight — this
    /// daemon's, or another's (its main loop is running there, on its last turn).
    pub(crate) async fn turns(&self, session: SessionId) -> Result<TurnIndex> {
        let starts = self.store.session_turns(session).await?;
        let len = self.store.session_message_count(session).await?;
        let in_flight = match self.turn_starts.finished_turns_end(session) {
            Some(start) => Some(start),
            None => {
                let main_loop = self.store.main_loop_agent(session).await?;
                let running = main_loop.is_some_and(|a| a.state == AgentState::Running);
                running.then(|| starts.last().copied()).flatten()
            }
        };
        Ok(TurnIndex {
            starts,
            len,
            in_flight,
        })
    }

    /// Where a client's batch forks when it asks for turn `k`: after that turn's end. A
    /// branch's batch forks at its own messages (its point or later).
    async fn point_after(&self, session: &Session, k: u32) -> Result<u64> {
        let point = self
            .turns(session.id)
            .await?
            .point(At::AfterTurn(k))
            .map_err(|e| {
                EngineError::InvalidRequest(format!(
                    "cannot fork session {} there: {e}",
                    session.id
                ))
            })?;
        if let Some(branch) = session.branch
            && point < branch.point
        {
            return Err(EngineError::InvalidRequest(format!(
                "session {} is a branch of {} from its message {}: turn {k} ends before that \
                 point; fork {} at turn {k} instead (the same history)",
                session.id, branch.origin, branch.point, branch.origin
            )));
        }
        Ok(point)
    }

    /// The limits every batch is planned under, a client's or a model's.
    pub(crate) fn fork_limits(self: &Arc<Self>) -> ForkLimits {
        ForkLimits {
            max_children: self.config.max_children_per_batch,
            max_directive_bytes: self.config.max_directive_bytes,
        }
    }

    /// Submits a client's fork batch: appends the `Agent` tool_use message to the parent, stores
    /// the batch and its children, and starts them (child 1 first under warm-up gating).
    pub(crate) async fn fork_batch(
        self: &Arc<Self>,
        session_id: SessionId,
        directives: Vec<Directive>,
        options: BatchOptions,
    ) -> Result<SubmittedBatch> {
        let session = self.sessions.get(session_id).await?;
        self.fork_batch_in(session, directives, options).await
    }

    /// [`Batches::fork_batch`] on a session already read.
    pub(crate) async fn fork_batch_in(
        self: &Arc<Self>,
        session: Session,
        directives: Vec<Directive>,
        options: BatchOptions,
    ) -> Result<SubmittedBatch> {
        let Checked {
            batch_id,
            forks,
            fork_point,
            gating,
            start_here,
        } = self.check_batch(&session, &directives, &options).await?;
        let session_id = session.id;
        let key = options.idempotency_key.clone().filter(|k| !k.is_empty());
        let digest = key
            .as_ref()
            .map(|_| key::digest(session_id, &directives, &options));
        let tenant = session.tenant;
        let n = forks.len();
        // Storing and starting happen in a task of their own: if the caller goes away (a client
        // deadline, a reset stream) after the commit, the children still start. A committed
        // batch whose children never run would be work that silently vanished.
        let batches = Arc::clone(self);
        self.supervisor
            .spawn(
                async move {
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
                        isolated: vec![options.isolation == Isolation::Copy; n],
                        fork_point,
                        output_schema: options.output_schema,
                        limits: (0..n)
                            .map(|i| {
                                let own = options.child_limits.get(i).copied().unwrap_or_default();
                                own.over(options.limits)
                            })
                            .collect(),
                        start_here,
                        webhook: options.webhook,
                        schedule: options.schedule,
                    };
                    let (Some(key), Some(digest)) = (key, digest) else {
                        return batches.commit_and_start(start).await;
                    };
                    let outcome = batches
                        .tenancy
                        .idempotent(
                            &tenant,
                            &key,
                            IdempotentCall::ForkBatch,
                            digest,
                            batch_id.to_string(),
                            |record| {
                                batches.commit_and_start(BatchStart {
                                    idempotency: Some(record),
                                    ..start
                                })
                            },
                        )
                        .await?;
                    match outcome {
                        Idempotent::Created(batch) => Ok(batch),
                        Idempotent::Earlier(id) => batches.submitted(&id).await,
                    }
                }
                // In the caller's span: the batch's span is its child, in the caller's trace.
                .instrument(tracing::Span::current()),
            )
            .await
            .map_err(|e| EngineError::Invariant(format!("fork batch task failed: {e}")))?
    }

    /// Everything a client's batch is checked for before it is stored (a dry run stops here):
    /// its plan, its fork point, that its children fit their window, that its workspace can be
    /// isolated, its budgets and its limits.
    pub(crate) async fn check_batch(
        self: &Arc<Self>,
        session: &Session,
        directives: &[Directive],
        options: &BatchOptions,
    ) -> Result<Checked> {
        let cfg = &self.config;
        let batch_id = BatchId::new();
        let forker = Forker {
            coordinator: session.coordinator,
            child: None,
            limits: self.fork_limits(),
        };
        let forks =
            plan::plan_client(batch_id, directives, &forker).map_err(EngineError::ForkRefused)?;
        let children: Vec<&Directive> = forks.iter().map(|(_, d)| d).collect();
        let fork_point = match (options.at_turn, options.fork_point_of) {
            (Some(_), Some(_)) => {
                return Err(EngineError::InvalidRequest(
                    "give at_turn or fork_point_of, not both".into(),
                ));
            }
            (Some(k), None) => Some(self.point_after(session, k).await?),
            (None, Some(earlier)) => Some(self.point_of(session, earlier).await?),
            (None, None) => None,
        };
        self.check_children_fit(
            session,
            (
                fork_point.or_else(|| self.turn_starts.finished_turns_end(session.id)),
                options.output_schema.as_ref(),
            ),
            &children,
        )
        .await?;
        let start_here = crate::workspaces::here(&cfg.workspaces, &*self.store, session).await?;
        if options.isolation == Isolation::Copy {
            if !start_here {
                // The snapshot is taken now, of the files, which are not here.
                return Err(crate::workspaces::elsewhere(session, "an isolated batch"));
            }
            Copies::check(session)?;
        }
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
        options
            .limits
            .check()
            .map_err(|e| EngineError::InvalidRequest(format!("the batch's limits: {e}")))?;
        for (i, own) in options.child_limits.iter().enumerate() {
            own.check().map_err(|e| {
                EngineError::InvalidRequest(format!("directive {}'s limits: {e}", i + 1))
            })?;
        }
        Ok(Checked {
            batch_id,
            forks,
            fork_point,
            gating: options.warmup_gating.unwrap_or(cfg.warmup_gating),
            start_here,
        })
    }

    /// Where the session's earlier batch `earlier` forked: a point in the session's own
    /// transcript (transcripts only grow, so it is still there, with the same history).
    async fn point_of(&self, session: &Session, earlier: BatchId) -> Result<u64> {
        let batch = self
            .store
            .get_batch(earlier)
            .await?
            .filter(|b| b.session_id == session.id)
            .ok_or_else(|| {
                EngineError::InvalidRequest(format!(
                    "fork_point_of: session {} has no batch {earlier}",
                    session.id
                ))
            })?;
        Ok(batch.fork_point)
    }

    /// The batch an earlier call submitted, by its stored id.
    async fn submitted(self: &Arc<Self>, id: &str) -> Result<SubmittedBatch> {
        let batch_id: BatchId = id.parse().map_err(|e| {
            EngineError::Invariant(format!("stored batch id {id:?} does not parse: {e}"))
        })?;
        let fork_point = crate::lookup::batch(&*self.store, batch_id)
            .await?
            .fork_point;
        let agent_ids = self
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
            fork_point,
            existing: true,
        })
    }

    /// Appends what the batch gives its parent (a model's fork message and its results, or a
    /// client's launch note) to the session, stores the batch and its children, and starts them.
    /// One code path for client and model batches.
    pub(crate) async fn commit_and_start(
        self: &Arc<Self>,
        start: BatchStart,
    ) -> Result<SubmittedBatch> {
        // The batch's span: its children's spans nest under it (they are started inside it), and
        // its trace context is stored with it for their later runs (docs/operations.md,
        // "Tracing").
        let span = tracing::info_span!(
            "fork_batch",
            otel.name = "fork_batch",
            otel.status_code = Empty,
            forkd.batch.id = %start.batch_id,
            forkd.session.id = %start.session_id,
            forkd.batch.children = crate::trace::int(start.forks.len() as u64),
            forkd.batch.shape = if start.assistant.is_some() { "model" } else { "client" },
            forkd.batch.output_schema = start.output_schema.is_some(),
            forkd.batch.gating = start.gating,
        );
        let committed = self
            .commit_and_start_in(start)
            .instrument(span.clone())
            .await;
        if let Err(e) = &committed {
            span.record("otel.status_code", "ERROR");
            span.in_scope(|| tracing::warn!(error = %e, "The fork batch was not stored"));
        }
        committed
    }

    async fn commit_and_start_in(self: &Arc<Self>, start: BatchStart) -> Result<SubmittedBatch> {
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
            isolated,
            fork_point: asked_point,
            output_schema,
            limits,
            start_here,
            webhook,
            schedule,
        } = start;
        // Known before the commit: once it is stored, nothing may keep the children from starting.
        let tenant = self.tenancy.session_owner(session_id).await?;
        // The workspace as it is when the batch is forked; the children's copies lie over it.
        let snapshot = if isolated.iter().any(|i| *i) {
            let session = self.sessions.get(session_id).await?;
            Some(self.copies.snapshot(&session, batch_id).await?)
        } else {
            None
        };
        let lock = self.session_locks.get(session_id);
        let guard = lock.lock().await;
        let len = self.store.session_message_count(session_id).await?;
        let now = now_ms();
        let children: Vec<NewChild> = forks
            .iter()
            .enumerate()
            .map(|(i, (_, d))| {
                let given = limits.get(i).copied().unwrap_or_default();
                let resolved = self.config.limits_for(&tenant, given);
                child(session_id, batch_id, (i, d.clone(), resolved), now)
            })
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
                let fork_point = asked_point.unwrap_or_else(|| {
                    self.turn_starts
                        .finished_turns_end(session_id)
                        .unwrap_or(len)
                        .min(len)
                });
                let batch = ForkBatch::client(batch_id, session_id, fork_point, now)
                    .with_output_schema(output_schema);
                let directives: Vec<Directive> = forks.into_iter().map(|(_, d)| d).collect();
                let note = forkd_core::digest::launch_note(batch_id, &directives);
                (batch, vec![note])
            }
        };
        let snapshot = snapshot.map(|snapshot| BatchSnapshot {
            // Every child, or those whose calls asked (NULL keeps "all" short).
            agents: (!isolated.iter().all(|i| *i)).then(|| {
                children
                    .iter()
                    .zip(&isolated)
                    .filter(|(_, i)| **i)
                    .map(|(c, _)| c.agent.id)
                    .collect()
            }),
            ..snapshot
        });
        // Forked after a compaction, the children inherit what the parent's requests saw.
        let mut batch = batch;
        batch.trace_parent = crate::trace::traceparent(&tracing::Span::current());
        batch.compacted_to = self
            .compaction
            .compaction_before(session_id, batch.fork_point)
            .await?
            .map(|c| c.to_seq);
        let created = self
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
                    snapshot: snapshot.as_ref(),
                    unheld: !start_here,
                    webhook,
                    schedule: schedule.as_deref(),
                },
            )
            .await;
        if let Err(err) = created {
            if let Some(snapshot) = &snapshot {
                self.copies.forget(snapshot).await;
            }
            return Err(err.into());
        }
        drop(guard);

        let agent_ids: Vec<AgentId> = children.iter().map(|c| c.agent.id).collect();
        tracing::info!(
            session.id = %session_id,
            batch.id = %batch_id,
            children = agent_ids.len(),
            gating,
            "Fork batch submitted"
        );
        if start_here {
            self.runs.start_batch(batch_id, &tenant, &agent_ids, gating);
        } else {
            // Stored unheld: the daemon that holds the files adopts them at its heartbeat.
            tracing::info!(
                batch.id = %batch_id,
                "The batch's children are left to the daemon that holds the session's workspace"
            );
        }
        Ok(SubmittedBatch {
            batch_id,
            agent_ids,
            fork_point: batch.fork_point,
            existing: false,
        })
    }
}
