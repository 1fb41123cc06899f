//! A tenant's view of the engine: every call that names an id checks, once, that the tenant owns
//! it, and answers another tenant's id exactly as a missing one (`NotFound`), so ids leak nothing.
//!
//! The server holds no other way in: it builds a [`TenantEngine`] per call from the tenant the
//! authentication layer established, so a handler cannot forget the check.

mod webhooks;

use forkd_core::fork::ForkBatch;
use forkd_core::query::{AgentFilter, NotificationFilter, RequestFilter, RequestRecord};
use forkd_core::session::Session;
use forkd_core::{Agent, AgentId, BatchId, Directive, RequestId, SessionId, Tenant};

use crate::error::{EngineError, Result};
use crate::{
    AgentEventStream, Applied, BatchOptions, CacheExplanation, CacheStats, CopyTargets, Engine,
    NewSession, NotificationStream, ParentEventStream, PermissionAnswer, PromptStream, StatsScope,
    SubmittedBatch, TranscriptEntry,
};

/// The engine as one tenant sees it. Cheap: a borrowed engine and the tenant.
pub struct TenantEngine<'e> {
    engine: &'e Engine,
    tenant: Tenant,
}

/// What a caller may ask of this daemon before it submits: its running slots and its budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunCapacity {
    /// The running slots: taken, the cap, the caller's own queue.
    pub slots: crate::supervisor::Slots,
    /// What the caller's tenant may still spend; `None` without a budget.
    pub budget_left: Option<forkd_core::store::Budget>,
}

/// A session with the number of messages in its transcript.
#[derive(Debug, Clone)]
pub struct SessionView {
    pub session: Session,
    pub message_count: u64,
    /// The sandbox layers its commands get on this daemon (`forkctl session get`).
    pub sandbox_layers: String,
    /// Its turns: where each one's message sits (turn `K` at `turns.starts[K - 1]`).
    pub turns: forkd_core::branch::TurnIndex,
    /// The branches made from it, in creation order.
    pub branches: Vec<SessionId>,
    /// Where its files came from, when it was made from an upload.
    pub origin: Option<forkd_core::upload::Origin>,
}

impl Engine {
    /// The engine as `tenant` sees it.
    pub fn for_tenant(&self, tenant: Tenant) -> TenantEngine<'_> {
        TenantEngine {
            engine: self,
            tenant,
        }
    }
}

impl TenantEngine<'_> {
    pub fn tenant(&self) -> &Tenant {
        &self.tenant
    }

    /// The tenant's session, read once.
    async fn own_session(&self, id: SessionId) -> Result<Session> {
        let session = self.engine.get_session(id).await?;
        self.owns(&session.tenant, "session", id.to_string())?;
        Ok(session)
    }

    /// Checks that the tenant owns `session` (through the engine's cache of owners).
    async fn own_session_id(&self, id: SessionId) -> Result<()> {
        let owner = self.engine.inner.tenancy.session_owner(id).await?;
        self.owns(&owner, "session", id.to_string())
    }

    async fn own_agent(&self, id: AgentId) -> Result<Agent> {
        let agent = self.engine.get_agent(id).await?;
        let owner = self
            .engine
            .inner
            .tenancy
            .session_owner(agent.session_id)
            .await?;
        self.owns(&owner, "agent", id.to_string())?;
        Ok(agent)
    }

    async fn own_batch(&self, id: BatchId) -> Result<ForkBatch> {
        let batch = self.engine.get_batch(id).await?;
        let owner = self
            .engine
            .inner
            .tenancy
            .session_owner(batch.session_id)
            .await?;
        self.owns(&owner, "batch", id.to_string())?;
        Ok(batch)
    }

    async fn own_request(&self, id: RequestId) -> Result<RequestRecord> {
        let record = self.engine.get_request(id).await?;
        let owner = self
            .engine
            .inner
            .tenancy
            .session_owner(record.session_id)
            .await?;
        self.owns(&owner, "request", id.to_string())?;
        Ok(record)
    }

    fn owns(&self, owner: &str, kind: &'static str, id: String) -> Result<()> {
        if self.tenant.owns(owner) {
            Ok(())
        } else {
            Err(EngineError::NotFound { kind, id })
        }
    }

    /// The ids a filter names must be the tenant's; lists are filtered by tenant besides.
    async fn own_scope(
        &self,
        session: Option<SessionId>,
        batch: Option<BatchId>,
        agent: Option<AgentId>,
    ) -> Result<()> {
        if let Some(id) = session {
            self.own_session_id(id).await?;
        }
        if let Some(id) = batch {
            self.own_batch(id).await?;
        }
        if let Some(id) = agent {
            self.own_agent(id).await?;
        }
        Ok(())
    }

    async fn view(&self, session: Session) -> Result<SessionView> {
        let turns = self.engine.session_turns(session.id).await?;
        let branches = self
            .engine
            .branches_of(session.id)
            .await?
            .iter()
            .map(|b| b.id)
            .collect();
        let sandbox_layers =
            forkd_tools::sandbox::layers(session.sandbox, &self.engine.config().sandbox.limits);
        let origin = self.engine.store().session_origin(session.id).await?;
        Ok(SessionView {
            origin,
            session,
            message_count: turns.len,
            sandbox_layers,
            turns,
            branches,
        })
    }

    /// The branches made from one of the tenant's sessions, in creation order.
    pub async fn branches(&self, id: SessionId) -> Result<Vec<Session>> {
        self.own_session_id(id).await?;
        self.engine.branches_of(id).await
    }

    /// Brings one of the tenant's branches back to its origin.
    pub async fn merge_branch(
        &self,
        id: SessionId,
        summary: bool,
        idempotency_key: Option<String>,
    ) -> Result<crate::Merged> {
        let branch = self.own_session(id).await?;
        self.engine
            .merge_branch(branch, summary, idempotency_key)
            .await
    }

    /// Branches one of the tenant's sessions (another tenant's is `NotFound`).
    pub async fn branch_session(&self, req: crate::NewBranch) -> Result<SessionView> {
        let origin = self.own_session(req.origin).await?;
        let branch = self.engine.branch_session(origin, req).await?;
        self.view(branch).await
    }

    /// Creates a session owned by this tenant (whatever `new.tenant` said).
    pub async fn create_session(&self, mut new: NewSession) -> Result<SessionView> {
        new.tenant = self.tenant.name().to_owned();
        let session = self.engine.create_session(new).await?;
        self.view(session).await
    }

    /// Of `hashes` (blobs' SHA-256), those the tenant lacks: never a word of another tenant's.
    pub async fn missing_blobs(&self, hashes: &[String]) -> Result<Vec<String>> {
        self.engine.missing_blobs(self.tenant.name(), hashes).await
    }

    /// Starts receiving the tenant's uploaded tree (see [`Engine::receive_upload`]).
    pub async fn receive_upload(
        &self,
        manifest: forkd_core::upload::Manifest,
    ) -> Result<crate::Receiver> {
        self.engine
            .receive_upload(self.tenant.name(), manifest)
            .await
    }

    /// What one of the tenant's uploaded sessions changed in its workspace since its upload.
    pub async fn session_changes(
        &self,
        id: SessionId,
    ) -> Result<(forkd_core::UploadId, forkd_tools::isolation::Changes)> {
        let session = self.own_session(id).await?;
        self.engine
            .session_changes(self.tenant.name(), &session)
            .await
    }

    pub async fn session(&self, id: SessionId) -> Result<SessionView> {
        let session = self.own_session(id).await?;
        self.view(session).await
    }

    /// The tenant's sessions in creation order after the cursor.
    pub async fn list_sessions(
        &self,
        after: Option<SessionId>,
        limit: u32,
    ) -> Result<Vec<SessionView>> {
        let sessions = self
            .engine
            .list_sessions(Some(self.tenant.name()), after, limit)
            .await?;
        let mut out = Vec::with_capacity(sessions.len());
        for session in sessions {
            out.push(self.view(session).await?);
        }
        Ok(out)
    }

    /// Runs one parent turn on `text`; see [`Engine::send_message`].
    pub async fn send_message(
        &self,
        id: SessionId,
        text: String,
        idempotency_key: Option<String>,
    ) -> Result<ParentEventStream> {
        let session = self.own_session(id).await?;
        self.engine.inner.faults.check_space()?;
        self.engine
            .inner
            .turns
            .send_message_in(session, text, idempotency_key)
            .await
    }

    /// Compacts the session now; see [`Engine::compact_session`].
    pub async fn compact_session(
        &self,
        id: SessionId,
        instructions: Option<String>,
    ) -> Result<forkd_core::compaction::Compaction> {
        self.own_session_id(id).await?;
        self.engine.compact_session(id, instructions).await
    }

    pub async fn fork_batch(
        &self,
        id: SessionId,
        directives: Vec<Directive>,
        options: BatchOptions,
    ) -> Result<SubmittedBatch> {
        let session = self.own_session(id).await?;
        self.engine.inner.faults.check_space()?;
        if let Some(webhook) = options.webhook {
            self.webhook(webhook).await?;
        }
        self.engine
            .inner
            .batches
            .fork_batch_in(session, directives, options)
            .await
    }

    /// Checks a batch as [`TenantEngine::fork_batch`] would, and says what it would cost and
    /// wait for; nothing is stored or started.
    pub async fn dry_run(
        &self,
        id: SessionId,
        directives: Vec<Directive>,
        options: BatchOptions,
    ) -> Result<crate::DryRun> {
        let session = self.own_session(id).await?;
        if let Some(webhook) = options.webhook {
            self.webhook(webhook).await?;
        }
        let keys = self.engine.capacity();
        let limiter = keys.iter().find(|k| k.model == session.params.model);
        self.engine
            .inner
            .batches
            .dry_run(&session, &directives, &options, limiter)
            .await
    }

    pub async fn spawn_typed(
        &self,
        id: SessionId,
        subagent_type: &str,
        directive: Directive,
        options: &crate::TypedOptions,
    ) -> Result<AgentId> {
        self.own_session_id(id).await?;
        self.engine
            .spawn_typed(id, subagent_type, directive, options)
            .await
    }

    /// The tenant's agents that pass `filter`.
    pub async fn list_agents(&self, mut filter: AgentFilter) -> Result<Vec<Agent>> {
        self.own_scope(filter.session_id, filter.batch_id, None)
            .await?;
        filter.tenant = Some(self.tenant.clone());
        self.engine.list_agents(&filter).await
    }

    pub async fn agent(&self, id: AgentId) -> Result<Agent> {
        self.own_agent(id).await
    }

    pub async fn transcript(
        &self,
        id: AgentId,
        include_shared: bool,
    ) -> Result<Vec<TranscriptEntry>> {
        self.own_agent(id).await?;
        self.engine.transcript(id, include_shared).await
    }

    /// An agent's hooks' runs (what each decided and said), in the order they ended.
    pub async fn hook_runs(
        &self,
        id: AgentId,
    ) -> Result<Vec<forkd_core::hooks::runs::HookRunRecord>> {
        self.own_agent(id).await?;
        Ok(self.engine.store().hook_runs(id).await?)
    }

    pub async fn attach(&self, id: AgentId, since_seq: u64) -> Result<AgentEventStream> {
        self.own_agent(id).await?;
        self.engine.attach(id, since_seq).await
    }

    pub async fn background(&self, id: AgentId) -> Result<()> {
        self.own_agent(id).await?;
        self.engine.background(id).await
    }

    pub async fn kill(&self, id: AgentId) -> Result<()> {
        self.own_agent(id).await?;
        self.engine.kill(id).await
    }

    /// An ended isolated child's changes.
    pub async fn changes(&self, id: AgentId) -> Result<forkd_core::isolation::AgentChanges> {
        self.own_agent(id).await?;
        self.engine.changes(id).await
    }

    /// The copies of those of `agents` (the tenant's, as listed) that worked in one, by agent.
    pub async fn copies_of(
        &self,
        agents: &[Agent],
    ) -> Result<std::collections::HashMap<AgentId, forkd_core::isolation::AgentChanges>> {
        self.engine.copies_of_agents(agents).await
    }

    /// Checks that the tenant owns what `targets` names.
    async fn own_targets(&self, targets: &CopyTargets) -> Result<()> {
        match targets {
            CopyTargets::Agents(ids) => {
                for id in ids {
                    self.own_agent(*id).await?;
                }
            }
            CopyTargets::Batch(batch) => {
                self.own_batch(*batch).await?;
            }
        }
        Ok(())
    }

    pub async fn apply_changes(&self, targets: &CopyTargets) -> Result<Vec<Applied>> {
        self.own_targets(targets).await?;
        self.engine.apply_changes(targets).await
    }

    pub async fn discard_changes(&self, targets: &CopyTargets) -> Result<Vec<AgentId>> {
        self.own_targets(targets).await?;
        self.engine.discard_changes(targets).await
    }

    /// The tenant's notifications that pass `filter`. The ids it names are read once, to check
    /// their owner, which also proves they exist.
    pub async fn subscribe(
        &self,
        since_seq: u64,
        mut filter: NotificationFilter,
        follow: bool,
    ) -> Result<NotificationStream> {
        self.own_scope(filter.session_id, filter.batch_id, filter.agent_id)
            .await?;
        filter.tenant = Some(self.tenant.clone());
        Ok(self
            .engine
            .inner
            .notifications
            .subscribe(since_seq, filter, follow))
    }

    pub async fn subscribe_prompts(&self, session: SessionId) -> Result<PromptStream> {
        self.own_session_id(session).await?;
        self.engine.inner.permissions.subscribe(session).await
    }

    /// Answers a pending permission prompt of one of the tenant's sessions.
    pub async fn answer_prompt(&self, prompt_id: &str, answer: PermissionAnswer) -> Result<()> {
        let unknown = || EngineError::NotFound {
            kind: "permission prompt",
            id: prompt_id.chars().take(64).collect(),
        };
        let id = crate::permissions::parse_prompt_id(prompt_id)?;
        let session = self
            .engine
            .inner
            .permissions
            .prompt_session(id)
            .await?
            .ok_or_else(unknown)?;
        self.own_session_id(session).await.map_err(|_| unknown())?;
        self.engine.inner.permissions.answer(id, answer).await
    }

    /// This daemon's running slots (totals: nothing of other tenants' own), the caller's runs
    /// queued for one, and what its tenant's budget has left.
    pub async fn run_capacity(&self) -> Result<RunCapacity> {
        let inner = &self.engine.inner;
        Ok(RunCapacity {
            slots: inner.supervisor.slots(self.tenant.name()),
            budget_left: inner.tenancy.budget_left(self.tenant.name()).await?,
        })
    }

    /// The daemon's provider limiter ([`Engine::capacity`]); a token tenant is not told the
    /// providers' endpoints, which are the operator's.
    pub fn capacity(&self) -> Vec<crate::KeyCapacity> {
        let mut keys = self.engine.capacity();
        if !self.tenant.is_local() {
            for key in &mut keys {
                key.endpoint.clear();
            }
        }
        keys
    }

    pub async fn cache_stats(&self, scope: StatsScope) -> Result<CacheStats> {
        match scope {
            StatsScope::Batch(id) => self.own_scope(None, Some(id), None).await?,
            StatsScope::Session(id) => self.own_scope(Some(id), None, None).await?,
        }
        self.engine.cache_stats(scope).await
    }

    /// The request records of one of the tenant's agents, batches or sessions.
    pub async fn list_requests(&self, filter: RequestFilter) -> Result<Vec<RequestRecord>> {
        if filter.session_id.is_none() && filter.batch_id.is_none() && filter.agent_id.is_none() {
            return Err(EngineError::InvalidRequest(
                "give an agent_id, a batch_id or a session_id".into(),
            ));
        }
        self.own_scope(filter.session_id, filter.batch_id, filter.agent_id)
            .await?;
        self.engine.list_requests(&filter).await
    }

    /// Where two of the tenant's requests part (see [`Engine::explain_cache`]).
    pub async fn explain_cache(
        &self,
        request: RequestId,
        other: Option<RequestId>,
    ) -> Result<CacheExplanation> {
        for id in std::iter::once(request).chain(other) {
            self.own_request(id).await?;
        }
        self.engine.explain_cache(request, other).await
    }
}

/// Reads the web view needs besides the gRPC API's (added beside it, not into it).
impl TenantEngine<'_> {
    /// One of the tenant's batches.
    pub async fn batch(&self, id: BatchId) -> Result<ForkBatch> {
        self.own_batch(id).await
    }

    /// How many messages of an agent's transcript are its own (stored for it, with seqs
    /// `0..n`): the rest of [`TenantEngine::transcript`] with `include_shared`, before them, is
    /// what it inherited or was given. An attach stream from seq `n` continues it.
    pub async fn own_message_count(&self, id: AgentId) -> Result<u64> {
        self.own_agent(id).await?;
        Ok(self.engine.store().agent_messages(id).await?.len() as u64)
    }
}
