//! Branches (docs/contracts.md, "Branches"): a new session whose history is an existing
//! session's transcript up to a point between turns. The branch stores none of that history, nor
//! the system prompt and tools it keeps: the store reads them through its origin. Its requests
//! therefore carry the origin's bytes up to the point, and its first one reads the cache the
//! origin's requests wrote.

use std::path::PathBuf;
use std::sync::Arc;

use forkd_core::SessionId;
use forkd_core::branch::{At, Branch, TurnIndex};
use forkd_core::request::fingerprint;
use forkd_core::session::Session;
use forkd_core::store::{IdempotencyRecord, IdempotentCall, Store};

use crate::batch::Batches;
use crate::clock::now_ms;
use crate::compact::Compactor;
use crate::error::{EngineError, Result};
use crate::mcp::McpServers;
use crate::session::Sessions;
use crate::tenancy::{Idempotent, Tenancy};
use crate::workspaces;

/// What a client asks for when it branches a session.
#[derive(Debug, Clone)]
pub struct NewBranch {
    /// The session branched from.
    pub origin: SessionId,
    /// Where the branch starts.
    pub at: At,
    /// Another workspace for the branch; the origin's when `None`. The system prompt names the
    /// workspace, so a branch given another one shares no cache with its origin.
    pub workspace: Option<PathBuf>,
    /// A retry with the same key and parameters returns the first call's branch.
    pub idempotency_key: Option<String>,
}

impl NewBranch {
    /// A digest of everything that shapes the branch: a retry under one key must ask for the
    /// same one.
    fn digest(&self) -> String {
        let at = match self.at {
            At::Latest => serde_json::json!("latest"),
            At::AfterTurn(k) => serde_json::json!({ "at_turn": k }),
            At::Before(seq) => serde_json::json!({ "before": seq }),
        };
        let canonical = serde_json::json!([
            "branch",
            self.origin.to_string(),
            at,
            self.workspace.as_ref().map(|w| w.to_string_lossy()),
        ]);
        fingerprint(canonical.to_string().as_bytes())
    }
}

/// Branching sessions.
pub(crate) struct Branches {
    store: Arc<dyn Store>,
    sessions: Arc<Sessions>,
    tenancy: Arc<Tenancy>,
    mcp: Arc<McpServers>,
    compaction: Arc<Compactor>,
    /// Turns (where each session's turn in flight began: a branch never starts inside it).
    batches: Arc<Batches>,
}

impl Branches {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        sessions: Arc<Sessions>,
        tenancy: Arc<Tenancy>,
        mcp: Arc<McpServers>,
        compaction: Arc<Compactor>,
        batches: Arc<Batches>,
    ) -> Self {
        Self {
            store,
            sessions,
            tenancy,
            mcp,
            compaction,
            batches,
        }
    }

    /// The session's turns: where each began, its length, and the turn in flight.
    pub(crate) async fn turns(&self, session: SessionId) -> Result<TurnIndex> {
        self.batches.turns(session).await
    }

    /// Creates a branch of `origin` (read, and its owner checked, by the caller). With an
    /// idempotency key, a retry returns the branch the key first created.
    pub(crate) async fn branch(&self, origin: Session, req: NewBranch) -> Result<Session> {
        let Some(key) = req.idempotency_key.clone().filter(|k| !k.is_empty()) else {
            return self.new_branch(origin, &req, SessionId::new(), None).await;
        };
        let id = SessionId::new();
        let tenant = origin.tenant.clone();
        let outcome = self
            .tenancy
            .idempotent(
                &tenant,
                &key,
                // A branch is a session: one key names one session, however it was made.
                IdempotentCall::CreateSession,
                req.digest(),
                id.to_string(),
                |record| self.new_branch(origin, &req, id, Some(record)),
            )
            .await?;
        match outcome {
            Idempotent::Created(session) => Ok(session),
            Idempotent::Earlier(id) => self.sessions.get_stored(&id).await,
        }
    }

    async fn new_branch(
        &self,
        origin: Session,
        req: &NewBranch,
        id: SessionId,
        record: Option<IdempotencyRecord>,
    ) -> Result<Session> {
        let turns = self.turns(origin.id).await?;
        let point = turns.point(req.at).map_err(|e| {
            EngineError::InvalidRequest(format!("cannot branch session {}: {e}", origin.id))
        })?;
        // What the origin's requests saw at the point, whatever it compacts later.
        let compacted_to = self
            .compaction
            .compaction_before(origin.id, point)
            .await?
            .map(|c| c.to_seq);
        let mut params = origin.params.clone();
        let workspace = match &req.workspace {
            None => origin.workspace.clone(),
            Some(dir) => {
                let workspace = workspaces::allow(
                    self.sessions.workspaces_config(),
                    self.store.as_ref(),
                    workspaces::Asked {
                        tenant: &origin.tenant,
                        dir: Some(dir),
                        session: id,
                    },
                )
                .await?
                .path;
                if workspace != origin.workspace {
                    let (from, to) = (
                        origin.workspace.display().to_string(),
                        workspace.display().to_string(),
                    );
                    if let Some(system) = params.system.with_workspace(&from, &to) {
                        params.system = system;
                    }
                }
                workspace
            }
        };
        let mut mcp = origin.mcp.clone();
        mcp.sealed_config = self.mcp.reseal_for_branch(&origin, id)?;
        let hooks = self.sessions.hooks().reseal_for_branch(&origin, id)?;
        let session = Session {
            id,
            params,
            workspace,
            mcp,
            hooks,
            created_at_ms: now_ms(),
            branch: Some(Branch {
                origin: origin.id,
                point,
                compacted_to,
            }),
            ..origin.clone()
        };
        self.store.create_branch(&session, record.as_ref()).await?;
        self.mcp.keep_for_branch(&origin, id);
        tracing::info!(
            session.id = %session.id,
            origin = %session.branch.map(|b| b.origin.to_string()).unwrap_or_default(),
            point,
            "Session branched"
        );
        Ok(session)
    }
}
