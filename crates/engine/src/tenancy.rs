//! Who owns what, retries that must not create twice, and what may be spent.
//!
//! - **Tenants.** Every session belongs to a tenant; its agents, batches, transcripts and
//!   notifications belong to the session's tenant. [`Tenancy::session_owner`] answers "whose is
//!   this" from a cache (a session's tenant never changes); the tenant-scoped handle
//!   ([`crate::TenantEngine`]) checks every id it is given against it.
//! - **Idempotency keys.** A key names the first call made with it. A retry with the same
//!   parameters gets that call's result — while the first is still running (retries of one key
//!   queue on a per-key lock), and after a restart (the key is stored in the same transaction as
//!   what it created). The same key with other parameters is refused.
//! - **Budgets.** A batch may carry a budget, and a tenant may have one in the daemon's
//!   configuration; an agent checks both before each model request and fails, saying which
//!   budget ran out, once one is spent.

use std::collections::HashMap;
use std::sync::Arc;

use forkd_core::store::{
    Budget, IdempotencyRecord, IdempotentCall, Spend, SpendScope, Store, StoreError,
};
use forkd_core::{BatchId, SessionId};

use crate::clock::now_ms;
use crate::error::{EngineError, Result};
use crate::locks::LockMap;

/// Session owners (cached), the per-key locks of idempotent calls, and the budgets.
pub(crate) struct Tenancy {
    store: Arc<dyn Store>,
    /// Tenants' budgets from the configuration.
    budgets: HashMap<String, Budget>,
    owners: std::sync::Mutex<HashMap<SessionId, Arc<str>>>,
    keys: LockMap<(String, String)>,
}

/// How an idempotent call ended: it created its resource, or an earlier call with the same key
/// and parameters had (its resource id).
pub(crate) enum Idempotent<T> {
    Created(T),
    Earlier(String),
}

/// What a key lookup found: a new key (create, and store this record with it), or the resource
/// an earlier call with the same key and parameters created.
enum Keyed {
    New(IdempotencyRecord),
    Existing(String),
}

impl Tenancy {
    pub(crate) fn new(store: Arc<dyn Store>, budgets: HashMap<String, Budget>) -> Self {
        Self {
            store,
            budgets,
            owners: std::sync::Mutex::default(),
            keys: LockMap::default(),
        }
    }

    /// The tenant that owns a session.
    pub(crate) async fn session_owner(&self, id: SessionId) -> Result<Arc<str>> {
        if let Some(owner) = self.cached_owner(id) {
            return Ok(owner);
        }
        let session = self
            .store
            .get_session(id)
            .await?
            .ok_or_else(|| EngineError::NotFound {
                kind: "session",
                id: id.to_string(),
            })?;
        let owner: Arc<str> = session.tenant.into();
        self.owners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, owner.clone());
        Ok(owner)
    }

    fn cached_owner(&self, id: SessionId) -> Option<Arc<str>> {
        self.owners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    /// Whether a live notification of `session` may reach a subscriber scoped to `tenant`.
    pub(crate) async fn visible_to(&self, tenant: Option<&str>, session: SessionId) -> bool {
        match tenant {
            None => true,
            Some(tenant) => self
                .session_owner(session)
                .await
                .is_ok_and(|owner| &*owner == tenant),
        }
    }

    /// Runs an idempotent call: `create` gets the record to store with what it creates, unless
    /// the key was used before — then the earlier resource's id comes back (same parameters) or
    /// the call is refused (other parameters). Calls with one key run one at a time.
    pub(crate) async fn idempotent<T, F, Fut>(
        &self,
        tenant: &str,
        key: &str,
        call: IdempotentCall,
        request_sha256: String,
        resource_id: String,
        create: F,
    ) -> Result<Idempotent<T>>
    where
        F: FnOnce(IdempotencyRecord) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        if key.len() > MAX_KEY_BYTES {
            return Err(EngineError::InvalidRequest(format!(
                "the idempotency key is {} bytes; the limit is {MAX_KEY_BYTES}",
                key.len()
            )));
        }
        let lock = self.keys.get((tenant.to_owned(), key.to_owned()));
        let _one_at_a_time = lock.lock().await;
        let keyed = self
            .lookup_key(tenant, key, call, request_sha256, resource_id)
            .await?;
        let record = match keyed {
            Keyed::Existing(id) => return Ok(Idempotent::Earlier(id)),
            Keyed::New(record) => record,
        };
        let (sha, id) = (record.request_sha256.clone(), record.resource_id.clone());
        match create(record).await {
            Ok(created) => Ok(Idempotent::Created(created)),
            // Another daemon on the same database took the key in between: answer as a retry.
            Err(EngineError::Store(StoreError::Conflict(_))) => {
                match self.lookup_key(tenant, key, call, sha, id).await? {
                    Keyed::Existing(id) => Ok(Idempotent::Earlier(id)),
                    Keyed::New(_) => Err(EngineError::Invariant(format!(
                        "idempotency key {key:?} conflicted but is not stored"
                    ))),
                }
            }
            Err(e) => Err(e),
        }
    }

    async fn lookup_key(
        &self,
        tenant: &str,
        key: &str,
        call: IdempotentCall,
        request_sha256: String,
        resource_id: String,
    ) -> Result<Keyed> {
        match self.store.idempotency_key(tenant, key).await? {
            Some(prior) if prior.kind == call && prior.request_sha256 == request_sha256 => {
                tracing::info!(key, resource.id = %prior.resource_id, "Idempotent retry");
                Ok(Keyed::Existing(prior.resource_id))
            }
            Some(prior) => Err(EngineError::KeyReused {
                key: key.to_owned(),
                call: prior.kind.as_str(),
            }),
            None => Ok(Keyed::New(IdempotencyRecord {
                tenant: tenant.to_owned(),
                key: key.to_owned(),
                kind: call,
                request_sha256,
                resource_id,
                created_at_ms: now_ms(),
            })),
        }
    }

    /// What `tenant` may still spend under its budget (dollars, tokens; each `None` where the
    /// budget sets none); `None` without a budget.
    pub(crate) async fn budget_left(&self, tenant: &str) -> Result<Option<Budget>> {
        let Some(budget) = self.budgets.get(tenant) else {
            return Ok(None);
        };
        let spent = self.store.spend(SpendScope::Tenant(tenant)).await?;
        Ok(Some(Budget {
            usd: budget.usd.map(|usd| (usd - spent.usd).max(0.0)),
            tokens: budget.tokens.map(|t| t.saturating_sub(spent.tokens)),
        }))
    }

    /// Fails when the agent's batch or its tenant has spent its budget.
    pub(crate) async fn check_budgets(
        &self,
        session: SessionId,
        batch: Option<BatchId>,
    ) -> Result<()> {
        let store = &self.store;
        if let Some(batch) = batch {
            let budget = store.batch_budget(batch).await?;
            if budget != Budget::default() {
                let spent = store.spend(SpendScope::Batch(batch)).await?;
                over(&budget, &spent, &format!("batch {batch}"))?;
            }
        }
        let tenant = self.session_owner(session).await?;
        if let Some(budget) = self.budgets.get(&*tenant) {
            let spent = store.spend(SpendScope::Tenant(&tenant)).await?;
            over(budget, &spent, &format!("tenant {tenant}"))?;
        }
        Ok(())
    }
}

/// The longest idempotency key accepted.
const MAX_KEY_BYTES: usize = 256;

fn over(budget: &Budget, spent: &Spend, whose: &str) -> Result<()> {
    if let Some(usd) = budget.usd
        && spent.usd >= usd
    {
        return Err(EngineError::BudgetSpent {
            what: "budget",
            whose: whose.to_owned(),
            spent: format!("${:.4}", spent.usd),
            limit: format!("${usd:.4}"),
        });
    }
    if let Some(tokens) = budget.tokens
        && spent.tokens >= tokens
    {
        return Err(EngineError::BudgetSpent {
            what: "token budget",
            whose: whose.to_owned(),
            spent: spent.tokens.to_string(),
            limit: format!("{tokens} tokens"),
        });
    }
    Ok(())
}
