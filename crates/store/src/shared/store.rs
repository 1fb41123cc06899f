//! The one [`Store`] implementation, for the driver's store (`dialect::DriverStore`): each method
//! runs in one write transaction (the driver's `begin_write`) or reads from the driver's read
//! pool (`readers`).

use async_trait::async_trait;
use forkd_core::compaction::Compaction;
use forkd_core::fork::ForkBatch;
use forkd_core::isolation::{AgentChanges, BatchSnapshot};
use forkd_core::prompt::{PermissionAnswer, PermissionPrompt};
use forkd_core::session::Session;
use forkd_core::store::{Holder, Renewal, Wakeups};
use forkd_core::{
    Agent, AgentId, AgentState, BatchId, Block, DaemonId, Message, Notification, PromptId,
    RequestId, SessionId,
};

use super::dialect::{self, DriverStore};
use super::{
    agent_params, agents, batches, compactions, idempotency, isolation, notifications, pending,
    probes, prompts, requests, sessions, stats, tool_calls, uploads,
};
use crate::rows::agents::NewAgents;
use crate::rows::convert::{from_i64, now_ms};
use crate::rows::sessions::not_found as session_not_found;
use crate::{
    AgentFilter, AgentParams, BatchExtras, Budget, IdempotencyRecord, Lease, NewChild,
    NewNotification, NotificationFilter, ProcessGroup, RequestFilter, RequestRecord, Spend,
    SpendScope, Stats, Store, StoredMessage, ToolCall,
};

use super::tx::{StoreResult, db};

#[async_trait]
impl Store for DriverStore {
    async fn create_session(
        &self,
        session: &Session,
        first_messages: &[Message],
        idempotency: Option<&IdempotencyRecord>,
    ) -> StoreResult<()> {
        write_tx!(self, |tx| {
            sessions::create(&mut tx, session, first_messages).await?;
            if let Some(record) = idempotency {
                idempotency::insert(&mut tx, record).await?;
            }
        })
    }

    async fn create_branch(
        &self,
        session: &Session,
        idempotency: Option<&IdempotencyRecord>,
    ) -> StoreResult<()> {
        write_tx!(self, |tx| {
            sessions::create_branch(&mut tx, session).await?;
            if let Some(record) = idempotency {
                idempotency::insert(&mut tx, record).await?;
            }
        })
    }

    async fn branches(&self, origin: SessionId) -> StoreResult<Vec<Session>> {
        db(sessions::branches(self.readers(), origin).await)
    }

    async fn session_turns(&self, id: SessionId) -> StoreResult<Vec<u64>> {
        db(sessions::turns(self.readers(), id).await)
    }

    async fn set_turn_trace(&self, id: SessionId, trace_parent: &str) -> StoreResult<()> {
        write_tx!(self, |tx| sessions::set_turn_trace(
            &mut tx,
            id,
            trace_parent
        )
        .await?)
    }

    async fn turn_trace(&self, id: SessionId) -> StoreResult<Option<String>> {
        db(sessions::turn_trace(self.readers(), id).await)
    }

    async fn get_session(&self, id: SessionId) -> StoreResult<Option<Session>> {
        db(sessions::get(self.readers(), id).await)
    }

    async fn list_sessions(
        &self,
        tenant: Option<&str>,
        after: Option<SessionId>,
        limit: u32,
    ) -> StoreResult<Vec<Session>> {
        db(sessions::list(self.readers(), tenant, after, limit).await)
    }

    async fn workspaces(&self) -> StoreResult<Vec<(String, std::path::PathBuf)>> {
        db(sessions::workspaces(self.readers()).await)
    }

    async fn idempotency_key(
        &self,
        tenant: &str,
        key: &str,
    ) -> StoreResult<Option<IdempotencyRecord>> {
        db(idempotency::get(self.readers(), tenant, key).await)
    }

    async fn session_message_count(&self, id: SessionId) -> StoreResult<u64> {
        db(sessions::message_count(self.readers(), id).await)
    }

    async fn session_messages_from(
        &self,
        id: SessionId,
        from: u64,
        before: Option<u64>,
    ) -> StoreResult<Vec<StoredMessage>> {
        db(sessions::messages(self.readers(), id, from, before).await)
    }

    async fn session_messages(
        &self,
        id: SessionId,
        before: Option<u64>,
    ) -> StoreResult<Vec<StoredMessage>> {
        db(sessions::messages(self.readers(), id, 0, before).await)
    }

    async fn append_note(
        &self,
        session: SessionId,
        note: &Message,
        idempotency: Option<&IdempotencyRecord>,
        at_ms: i64,
    ) -> StoreResult<u64> {
        let seq = write_tx!(self, |tx| {
            let session_id = session.to_string();
            if !sessions::lock(&mut tx, &session_id).await? {
                return Err(session_not_found(session_id));
            }
            let seq = sessions::len(&mut tx, &session_id).await?;
            if let Some(record) = idempotency {
                let record = IdempotencyRecord {
                    resource_id: format!("{session_id}/{seq}"),
                    ..record.clone()
                };
                idempotency::insert(&mut tx, &record).await?;
            }
            sessions::insert_note(&mut tx, &session_id, seq, note, at_ms).await?;
            seq
        })?;
        db(from_i64(seq, "session message seq"))
    }

    async fn append_user_message(
        &self,
        lease: &Lease,
        session: SessionId,
        message: &Message,
        idempotency: Option<&IdempotencyRecord>,
        at_ms: i64,
    ) -> StoreResult<u64> {
        let seq = write_tx!(self, |tx| {
            dialect::lock_agents(&mut tx, std::iter::once(&lease.agent_id)).await?;
            agents::check_lease(&mut tx, lease).await?;
            let session_id = session.to_string();
            let exists = sessions::lock(&mut tx, &session_id).await?;
            if let Some(record) = idempotency {
                idempotency::insert(&mut tx, record).await?;
            }
            if !exists {
                return Err(session_not_found(session_id));
            }
            let seq = sessions::len(&mut tx, &session_id).await?;
            sessions::insert_user_message(&mut tx, &session_id, seq, message, at_ms).await?;
            pending::clear(&mut tx, &session_id).await?;
            seq
        })?;
        db(from_i64(seq, "session message seq"))
    }

    async fn append_turn(
        &self,
        lease: &Lease,
        session: SessionId,
        messages: &[Message],
        delivered: &[AgentId],
        idempotency: Option<&IdempotencyRecord>,
        at_ms: i64,
    ) -> StoreResult<u64> {
        let first = write_tx!(self, |tx| {
            // The main loop and the agents it delivers, then the session: the lock order.
            dialect::lock_agents(&mut tx, std::iter::once(&lease.agent_id).chain(delivered))
                .await?;
            agents::check_lease(&mut tx, lease).await?;
            let session_id = session.to_string();
            let exists = sessions::lock(&mut tx, &session_id).await?;
            if let Some(record) = idempotency {
                idempotency::insert(&mut tx, record).await?;
            }
            if !exists {
                return Err(session_not_found(session_id));
            }
            let first = sessions::len(&mut tx, &session_id).await?;
            for (seq, message) in (first..).zip(messages) {
                sessions::insert_message(&mut tx, &session_id, seq, message, at_ms).await?;
            }
            agents::mark_delivered(&mut tx, delivered).await?;
            pending::clear(&mut tx, &session_id).await?;
            first
        })?;
        db(from_i64(first, "session message seq"))
    }

    async fn set_pending_reply(
        &self,
        lease: &Lease,
        session: SessionId,
        reply: &Message,
    ) -> StoreResult<()> {
        write_tx!(self, |tx| {
            pending::set(&mut tx, lease, session, reply, now_ms()).await?
        })
    }

    async fn append_compaction(
        &self,
        lease: &Lease,
        session: SessionId,
        compaction: &Compaction,
    ) -> StoreResult<()> {
        write_tx!(self, |tx| {
            compactions::append(&mut tx, lease, session, compaction).await?
        })
    }

    async fn compactions(&self, session: SessionId) -> StoreResult<Vec<Compaction>> {
        db(compactions::list(self.readers(), session).await)
    }

    async fn append_agent_compaction(
        &self,
        lease: &Lease,
        compaction: &Compaction,
    ) -> StoreResult<()> {
        write_tx!(self, |tx| {
            compactions::append_agent(&mut tx, lease, compaction).await?
        })
    }

    async fn agent_compactions(&self, agent: AgentId) -> StoreResult<Vec<Compaction>> {
        db(compactions::list_agent(self.readers(), agent).await)
    }

    async fn pending_reply(&self, session: SessionId) -> StoreResult<Option<Message>> {
        db(pending::get(self.readers(), session).await)
    }

    async fn insert_agent(
        &self,
        agent: &Agent,
        directive_block: Option<&Block>,
        params: Option<&AgentParams>,
    ) -> StoreResult<()> {
        write_tx!(self, |tx| {
            let session_id = agent.session_id.to_string();
            // Sessions are never deleted: one that exists now still does at commit.
            if !sessions::exists(&mut tx, &session_id).await? {
                return Err(session_not_found(session_id));
            }
            agents::insert(&mut tx, agent, directive_block).await?;
            let id = agent.id.to_string();
            agents::hold_new(&mut tx, NewAgents::Agent, &id, &self.holder).await?;
            if let Some(params) = params {
                agent_params::insert(&mut tx, agent.id, params).await?;
            }
        })
    }

    async fn agent_params(&self, id: AgentId) -> StoreResult<Option<AgentParams>> {
        db(agent_params::get(self.readers(), id).await)
    }

    async fn create_fork_batch(
        &self,
        batch: &ForkBatch,
        parent_messages: &[Message],
        children: &[NewChild],
        extras: &BatchExtras<'_>,
    ) -> StoreResult<()> {
        write_tx!(self, |tx| {
            batches::create(&mut tx, batch, parent_messages, children, extras).await?;
            let id = batch.id.to_string();
            if !extras.unheld {
                agents::hold_new(&mut tx, NewAgents::Batch, &id, &self.holder).await?;
            }
            if let Some(record) = extras.idempotency {
                idempotency::insert(&mut tx, record).await?;
            }
            if let Some(snapshot) = extras.snapshot {
                isolation::put_snapshot(&mut tx, snapshot).await?;
            }
        })
    }

    async fn get_batch(&self, id: BatchId) -> StoreResult<Option<ForkBatch>> {
        db(batches::get(self.readers(), id).await)
    }

    async fn batch_budget(&self, id: BatchId) -> StoreResult<Budget> {
        db(batches::budget(self.readers(), id).await)
    }

    async fn put_snapshot(&self, snapshot: &BatchSnapshot) -> StoreResult<()> {
        write_tx!(self, |tx| isolation::put_snapshot(&mut tx, snapshot)
            .await?)
    }

    async fn batch_snapshot(&self, id: BatchId) -> StoreResult<Option<BatchSnapshot>> {
        db(isolation::snapshot(self.readers(), id).await)
    }

    async fn put_changes(&self, changes: &AgentChanges) -> StoreResult<()> {
        write_tx!(self, |tx| isolation::put_changes(&mut tx, changes).await?)
    }

    async fn agent_changes(&self, id: AgentId) -> StoreResult<Option<AgentChanges>> {
        db(isolation::changes(self.readers(), id).await)
    }

    async fn batch_changes(&self, id: BatchId) -> StoreResult<Vec<AgentChanges>> {
        db(isolation::batch_changes(self.readers(), id).await)
    }

    async fn expired_copies(&self, before_ms: i64, limit: u32) -> StoreResult<Vec<AgentId>> {
        db(isolation::expired(self.readers(), before_ms, limit).await)
    }

    async fn spend(&self, scope: SpendScope<'_>) -> StoreResult<Spend> {
        db(idempotency::spend(self.readers(), scope).await)
    }

    async fn get_agent(&self, id: AgentId) -> StoreResult<Option<Agent>> {
        db(agents::get(self.readers(), id).await)
    }

    async fn main_loop_agent(&self, session: SessionId) -> StoreResult<Option<Agent>> {
        db(agents::main_loop(self.readers(), session).await)
    }

    async fn list_agents(&self, filter: &AgentFilter) -> StoreResult<Vec<Agent>> {
        db(agents::list(self.readers(), filter).await)
    }

    async fn agent_directive_block(&self, id: AgentId) -> StoreResult<Option<Block>> {
        db(agents::directive_block(self.readers(), id).await)
    }

    async fn set_agent_state(
        &self,
        id: AgentId,
        state: AgentState,
        error: Option<&str>,
    ) -> StoreResult<()> {
        write_tx!(self, |tx| {
            agents::set_state(&mut tx, id, state, error).await?
        })
    }

    async fn claim_agent(&self, id: AgentId) -> StoreResult<Lease> {
        write_tx!(self, |tx| {
            agents::claim(&mut tx, id, &self.holder).await?
        })
    }

    fn holder(&self) -> Holder {
        self.holder
    }

    async fn renew_leases(&self) -> StoreResult<Renewal> {
        write_tx!(self, |tx| { agents::renew(&mut tx, &self.holder).await? })
    }

    async fn adoptable_agents(&self) -> StoreResult<Vec<Agent>> {
        db(agents::adoptable(self.readers()).await)
    }

    async fn request_kill(&self, id: AgentId) -> StoreResult<Option<DaemonId>> {
        write_tx!(self, |tx| { agents::request_kill(&mut tx, id).await? })
    }

    async fn kill_requested(&self, id: AgentId) -> StoreResult<bool> {
        db(agents::kill_requested(self.readers(), id).await)
    }

    async fn open_gate(&self, batch: BatchId) -> StoreResult<()> {
        write_tx!(self, |tx| { agents::open_gate(&mut tx, batch).await? })
    }

    async fn set_throttled(&self, id: AgentId, since_ms: Option<i64>) -> StoreResult<()> {
        write_tx!(self, |tx| {
            agents::set_throttled(&mut tx, id, since_ms).await?
        })
    }

    async fn take_pending(
        &self,
        limit: u32,
        gate_timeout: std::time::Duration,
        queued_for: std::time::Duration,
    ) -> StoreResult<Vec<AgentId>> {
        let timeout_ms = i64::try_from(gate_timeout.as_millis()).unwrap_or(i64::MAX);
        let queued_ms = i64::try_from(queued_for.as_millis()).unwrap_or(i64::MAX);
        write_tx!(self, |tx| {
            agents::take_pending(&mut tx, &self.holder, limit, timeout_ms, queued_ms).await?
        })
    }

    async fn release_agent(&self, lease: &Lease, state: AgentState) -> StoreResult<()> {
        write_tx!(self, |tx| { agents::release(&mut tx, lease, state).await? })
    }

    async fn append_agent_message(&self, lease: &Lease, message: &Message) -> StoreResult<u64> {
        write_tx!(self, |tx| {
            agents::append_message(&mut tx, lease, message).await?
        })
    }

    async fn agent_messages(&self, id: AgentId) -> StoreResult<Vec<StoredMessage>> {
        db(agents::messages(self.readers(), id).await)
    }

    async fn begin_tool_call(&self, lease: &Lease, call: &ToolCall) -> StoreResult<()> {
        write_tx!(self, |tx| {
            tool_calls::begin(&mut tx, lease, call).await?
        })
    }

    async fn finish_tool_call(
        &self,
        lease: &Lease,
        tool_use_id: &str,
        result: &Block,
        full_output: Option<&str>,
        at_ms: i64,
    ) -> StoreResult<()> {
        write_tx!(self, |tx| {
            tool_calls::finish(&mut tx, lease, tool_use_id, result, full_output, at_ms).await?
        })
    }

    async fn record_tool_process(
        &self,
        lease: &Lease,
        tool_use_id: &str,
        process: &ProcessGroup,
    ) -> StoreResult<()> {
        write_tx!(self, |tx| {
            tool_calls::record_process(&mut tx, lease, tool_use_id, process).await?
        })
    }

    async fn tool_calls(&self, agent: AgentId) -> StoreResult<Vec<ToolCall>> {
        db(tool_calls::list(self.readers(), agent).await)
    }

    async fn record_request(&self, record: &RequestRecord) -> StoreResult<()> {
        write_tx!(self, |tx| { requests::record(&mut tx, record).await? })
    }

    async fn list_requests(&self, filter: &RequestFilter) -> StoreResult<Vec<RequestRecord>> {
        db(requests::list(self.readers(), filter).await)
    }

    async fn get_request(&self, id: RequestId) -> StoreResult<Option<RequestRecord>> {
        db(requests::get(self.readers(), id).await)
    }

    async fn finish_agent(
        &self,
        lease: &Lease,
        notification: &NewNotification,
        error: Option<&str>,
    ) -> StoreResult<Notification> {
        write_tx!(self, |tx| {
            notifications::finish_agent(&mut tx, lease, notification, error).await?
        })
    }

    async fn end_turn(
        &self,
        lease: &Lease,
        notification: Option<&NewNotification>,
    ) -> StoreResult<Option<Notification>> {
        write_tx!(self, |tx| {
            notifications::end_turn(&mut tx, lease, notification).await?
        })
    }

    async fn mark_delivered(&self, delivered: &[AgentId]) -> StoreResult<()> {
        write_tx!(self, |tx| {
            dialect::lock_agents(&mut tx, delivered).await?;
            agents::mark_delivered(&mut tx, delivered).await?;
        })
    }

    async fn caller_reports(&self) -> StoreResult<Vec<AgentId>> {
        db(notifications::caller_reports(self.readers()).await)
    }

    async fn redirect_reports(&self, agents: &[AgentId]) -> StoreResult<usize> {
        write_tx!(self, |tx| {
            notifications::redirect_reports(&mut tx, agents).await?
        })
    }

    async fn notifications(
        &self,
        since_seq: u64,
        filter: &NotificationFilter,
        limit: u32,
    ) -> StoreResult<Vec<Notification>> {
        db(notifications::list(self.readers(), since_seq, filter, limit).await)
    }

    async fn last_notification_seq(&self) -> StoreResult<u64> {
        db(notifications::last_seq(self.readers()).await)
    }

    async fn listen(&self) -> StoreResult<Option<Box<dyn Wakeups>>> {
        db(dialect::listen(self.readers()).await)
    }

    async fn signal_background(&self, id: AgentId) -> StoreResult<()> {
        db(dialect::signal_background(self.readers(), id).await)
    }

    async fn insert_prompt(&self, lease: &Lease, prompt: &PermissionPrompt) -> StoreResult<()> {
        write_tx!(self, |tx| {
            prompts::insert(&mut tx, lease, prompt, self.holder.daemon).await?
        })
    }

    async fn open_prompts(&self, session: SessionId) -> StoreResult<Vec<PermissionPrompt>> {
        db(prompts::open(self.readers(), session).await)
    }

    async fn prompt(
        &self,
        id: PromptId,
    ) -> StoreResult<Option<(PermissionPrompt, Option<PermissionAnswer>)>> {
        db(prompts::get(self.readers(), id).await)
    }

    async fn answer_prompt(
        &self,
        id: PromptId,
        answer: &PermissionAnswer,
    ) -> StoreResult<PermissionPrompt> {
        write_tx!(self, |tx| { prompts::answer(&mut tx, id, answer).await? })
    }

    async fn close_prompt(&self, id: PromptId) -> StoreResult<()> {
        write_tx!(self, |tx| { prompts::close(&mut tx, id).await? })
    }

    async fn tool_always_allowed(&self, session: SessionId, tool: &str) -> StoreResult<bool> {
        db(prompts::always_allowed(self.readers(), session, tool).await)
    }

    async fn stats(&self, batches_since_ms: i64) -> StoreResult<Stats> {
        db(stats::stats(self.readers(), batches_since_ms).await)
    }

    async fn probe_write(&self) -> StoreResult<()> {
        write_tx!(self, |tx| probes::probe(&mut tx).await?)?;
        self.faults.clear();
        Ok(())
    }

    fn disk_space(&self) -> Option<forkd_core::store::DiskSpace> {
        self.filesystem_space()
    }

    fn fault(&self) -> Option<String> {
        self.faults.get()
    }

    async fn missing_blobs(&self, tenant: &str, hashes: &[String]) -> StoreResult<Vec<String>> {
        let mut missing = Vec::new();
        for chunk in hashes.chunks(1000) {
            missing.extend(db(uploads::missing(self.readers(), tenant, chunk).await)?);
        }
        Ok(missing)
    }

    async fn put_blobs(
        &self,
        tenant: &str,
        blobs: &[(&str, &[u8])],
        quota: Option<u64>,
    ) -> StoreResult<forkd_core::upload::BlobsStored> {
        let at_ms = now_ms();
        write_tx!(self, |tx| {
            uploads::put_blobs(&mut tx, tenant, blobs, quota, at_ms).await?
        })
    }

    async fn blob(&self, tenant: &str, sha256: &str) -> StoreResult<Option<Vec<u8>>> {
        db(uploads::blob(self.readers(), tenant, sha256).await)
    }

    async fn create_upload(&self, upload: &forkd_core::upload::Upload) -> StoreResult<()> {
        write_tx!(self, |tx| { uploads::create(&mut tx, upload).await? })
    }

    async fn record_session_origin(
        &self,
        session: SessionId,
        origin: &forkd_core::upload::Origin,
    ) -> StoreResult<()> {
        write_tx!(self, |tx| {
            uploads::record_origin(&mut tx, session, origin).await?
        })
    }

    async fn session_origin(
        &self,
        session: SessionId,
    ) -> StoreResult<Option<forkd_core::upload::Origin>> {
        db(uploads::origin(self.readers(), session).await)
    }

    async fn blob_bytes(&self, tenant: &str) -> StoreResult<u64> {
        db(uploads::held(self.readers(), tenant).await)
    }

    async fn expire_uploads(
        &self,
        uploads_before_ms: i64,
        blobs_before_ms: i64,
    ) -> StoreResult<(u64, u64)> {
        write_tx!(self, |tx| {
            uploads::expire(&mut tx, uploads_before_ms, blobs_before_ms).await?
        })
    }

    async fn get_upload(
        &self,
        tenant: &str,
        id: forkd_core::UploadId,
    ) -> StoreResult<Option<forkd_core::upload::Upload>> {
        db(uploads::get(self.readers(), tenant, id).await)
    }
}
