//! Isolated children's copies (docs/contracts.md, "Isolation"): a batch forked with
//! `isolation: copy` gets a snapshot of its session's workspace, and each child a copy-on-write
//! layer over it, mounted at the workspace's own path so that its requests name the same paths
//! as its siblings'. When the child ends its changes are read from its layer and stored; a
//! client then applies them to the session's workspace or discards them.
//!
//! On disk, under the configured root (the daemon's home by default):
//! `ROOT/BATCH/snapshot` (the copy), `ROOT/BATCH/AGENT/{upper,work}` (a child's layer). A copy
//! that was applied or discarded goes at once; the snapshot goes with the batch's last copy.

use std::path::PathBuf;
use std::sync::Arc;

use forkd_core::isolation::{AgentChanges, BatchSnapshot, CopyState};
use forkd_core::session::{Sandbox, SandboxMode, Session};
use forkd_core::store::Store;
use forkd_core::{Agent, AgentId, BatchId, SessionId};
use forkd_tools::isolation::{self, ApplyOutcome, IsolationError, Repo};
use forkd_tools::sandbox::layer::{LayerDirs, LayerView};
use forkd_tools::{SandboxSpec, Workspace};

use crate::clock::now_ms;
use crate::config::EngineConfig;
use crate::error::{EngineError, Result, blocking};
use crate::locks::LockMap;

/// Isolated batches' snapshots and their children's copies.
pub(crate) struct Copies {
    store: Arc<dyn Store>,
    config: Arc<EngineConfig>,
    /// Apply writes the session's workspace under its session's lock.
    session_locks: Arc<LockMap<SessionId>>,
    /// When the retention sweep last ran.
    last_sweep: std::sync::Mutex<Option<std::time::Instant>>,
    /// A layered session's files are reached through its layer.
    trees: Arc<crate::trees::Trees>,
}

/// How often the heartbeat looks for copies past their retention.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(600);
/// The most copies one sweep discards.
const SWEEP_LIMIT: u32 = 256;

/// What applying one child did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub agent_id: AgentId,
    pub outcome: ApplyOutcome,
}

fn isolation_error(err: IsolationError) -> EngineError {
    EngineError::Isolation(err.to_string())
}

impl Copies {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        config: Arc<EngineConfig>,
        session_locks: Arc<LockMap<SessionId>>,
        trees: Arc<crate::trees::Trees>,
    ) -> Self {
        Self {
            store,
            config,
            session_locks,
            last_sweep: std::sync::Mutex::new(None),
            trees,
        }
    }

    fn batch_dir(&self, batch: BatchId) -> PathBuf {
        self.config.isolation.root.join(batch.to_string())
    }

    /// The view forkd's git runs in on `session`'s repository (docs/contracts.md, "Isolation"):
    /// the session's own, so that git reads only what the session's commands can, lent `tmp`,
    /// writing only there and in the workspace (a read-only session's too: the snapshot's
    /// objects and ref go in its repository), without the network. `None` for a `full-access`
    /// session, whose commands already run as the daemon's user.
    async fn git_view(&self, session: &Session, tmp: PathBuf) -> Result<Option<SandboxSpec>> {
        let spec = crate::workspaces::sandbox_spec(&self.config, self.store.as_ref(), session, tmp)
            .await?;
        Ok(spec.map(|spec| SandboxSpec {
            sandbox: Sandbox {
                mode: SandboxMode::WorkspaceWrite,
                allow_network: false,
                unix_sockets: false,
            },
            ..spec
        }))
    }

    /// `session`'s private temporary directory (its commands').
    fn session_tmp(&self, session: &Session) -> PathBuf {
        crate::workspaces::session_tmp(&self.config, session.id)
    }

    /// The directories of `agent`'s layer over `snapshot`.
    pub(crate) fn dirs(&self, snapshot: &BatchSnapshot, agent: AgentId) -> LayerDirs {
        let at = self.batch_dir(snapshot.batch_id).join(agent.to_string());
        LayerDirs {
            lower: PathBuf::from(&snapshot.dir),
            upper: at.join("upper"),
            work: at.join("work"),
        }
    }

    /// Refuses isolation where it cannot work: a `full-access` session's commands run in the
    /// daemon's own view of the files, which no layer covers.
    pub(crate) fn check(session: &Session) -> Result<()> {
        if session.sandbox.mode == SandboxMode::FullAccess {
            return Err(EngineError::InvalidRequest(
                "isolation: copy needs a sandboxed session (read-only or workspace-write); this \
                 session is full-access, whose commands see the daemon's own files"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Takes `batch`'s snapshot of `session`'s workspace.
    pub(crate) async fn snapshot(
        &self,
        session: &Session,
        batch: BatchId,
    ) -> Result<BatchSnapshot> {
        Self::check(session)?;
        // A layered session's files through its layer (kept mounted until the copy is made).
        let files = self.trees.files(session).await?;
        if files.layer.is_none() {
            // Pinned: a workspace replaced by a symlink since is not copied from elsewhere.
            Workspace::pinned(&session.workspace).map_err(EngineError::Workspace)?;
        }
        let workspace = files.path.clone();
        let dir = self.batch_dir(batch).join("snapshot");
        let name = batch.to_string();
        let view = self.git_view(session, self.batch_dir(batch)).await?;
        // What the children's view covers inside the workspace stays out of their copy: their
        // layer is mounted over those covers.
        let hidden: Vec<PathBuf> = view
            .iter()
            .flat_map(|view| &view.paths.hidden)
            .filter_map(|h| {
                let h = std::fs::canonicalize(h).ok()?;
                let rel = h.strip_prefix(&workspace).ok()?;
                (!rel.as_os_str().is_empty()).then(|| rel.to_path_buf())
            })
            .collect();
        let layered = files.layer.is_some();
        let taken = blocking(move || {
            if layered {
                // forkd's git reaches no layer from a view of its own: the files alone.
                return isolation::snapshot::take_files(&workspace, &dir, &hidden);
            }
            let repo = Repo {
                workspace: &workspace,
                view: view.as_ref(),
            };
            isolation::snapshot::take(repo, &dir, &name, &hidden)
        })
        .await?
        .map_err(isolation_error)?;
        drop(files);
        let (git_ref, git_commit) = taken.git.map(|g| (g.reference, g.commit)).unzip();
        crate::metrics::snapshot(taken.took, taken.bytes);
        tracing::info!(
            batch.id = %batch,
            files = taken.files,
            bytes = taken.bytes,
            took_ms = taken.took.as_millis() as u64,
            "Isolated batch: workspace snapshot taken"
        );
        Ok(BatchSnapshot {
            batch_id: batch,
            dir: taken.dir.to_string_lossy().into_owned(),
            agents: None,
            git_ref,
            git_commit,
            files: taken.files,
            bytes: taken.bytes,
            took_ms: taken.took.as_millis() as u64,
            created_at_ms: now_ms(),
        })
    }

    /// Takes and stores the snapshot of typed agent `id`'s own copy, before the agent is stored.
    pub(crate) async fn snapshot_typed(&self, session: &Session, id: AgentId) -> Result<()> {
        let key = forkd_core::isolation::typed_key(id);
        if self.store.batch_snapshot(key).await?.is_some() {
            // The same call answered again: its snapshot is taken.
            return Ok(());
        }
        let snapshot = BatchSnapshot {
            agents: Some(vec![id]),
            ..self.snapshot(session, key).await?
        };
        if let Err(e) = self.store.put_snapshot(&snapshot).await {
            self.forget(&snapshot).await;
            return Err(e.into());
        }
        Ok(())
    }

    /// Removes a snapshot whose batch was not stored.
    pub(crate) async fn forget(&self, snapshot: &BatchSnapshot) {
        let dir = self.batch_dir(snapshot.batch_id);
        let _ = blocking(move || std::fs::remove_dir_all(dir)).await;
    }

    /// The snapshot of `agent`'s batch, when the agent works in a copy.
    pub(crate) async fn snapshot_of(&self, agent: &Agent) -> Result<Option<BatchSnapshot>> {
        let Some(key) = forkd_core::isolation::snapshot_key(agent) else {
            return Ok(None);
        };
        let snapshot = self.store.batch_snapshot(key).await?;
        Ok(snapshot.filter(|s| s.isolates(agent.id)))
    }

    /// Those of `agents` that work in copies, in order, with their snapshots: each snapshot
    /// read once, however many of a batch's children are named.
    pub(crate) async fn isolated(&self, agents: Vec<Agent>) -> Result<Vec<(Agent, BatchSnapshot)>> {
        let mut read: std::collections::HashMap<BatchId, Option<BatchSnapshot>> =
            std::collections::HashMap::new();
        let mut isolated = Vec::with_capacity(agents.len());
        for agent in agents {
            let Some(key) = forkd_core::isolation::snapshot_key(&agent) else {
                continue;
            };
            let snapshot = match read.get(&key) {
                Some(snapshot) => snapshot.clone(),
                None => {
                    let snapshot = self.store.batch_snapshot(key).await?;
                    read.insert(key, snapshot.clone());
                    snapshot
                }
            };
            if let Some(snapshot) = snapshot.filter(|s| s.isolates(agent.id)) {
                isolated.push((agent, snapshot));
            }
        }
        Ok(isolated)
    }

    /// The snapshots of those of `agents` that work in copies, by agent.
    async fn snapshots(
        &self,
        agents: &[Agent],
    ) -> Result<std::collections::HashMap<AgentId, BatchSnapshot>> {
        Ok(self
            .isolated(agents.to_vec())
            .await?
            .into_iter()
            .map(|(agent, snapshot)| (agent.id, snapshot))
            .collect())
    }

    /// The workspace an isolated `agent`'s tools use: its own layer over `snapshot`, made for
    /// this turn over the directories an earlier run left.
    pub(crate) async fn workspace(
        &self,
        agent: &Agent,
        snapshot: &BatchSnapshot,
        session: &Session,
        spec: Option<&SandboxSpec>,
    ) -> Result<Workspace> {
        let Some(spec) = spec.cloned() else {
            return Err(EngineError::Isolation(
                "an isolated child needs its session's sandbox; this session has none".into(),
            ));
        };
        if !std::path::Path::new(&snapshot.dir).is_dir() {
            return Err(EngineError::Isolation(format!(
                "this child's snapshot ({}) is not on this machine: an isolated child runs on \
                 the machine of the daemon that forked its batch",
                snapshot.dir
            )));
        }
        let dirs = self.dirs(snapshot, agent.id);
        if !crate::trees::is_layered(session) {
            Workspace::pinned(&session.workspace).map_err(EngineError::Workspace)?;
        }
        let workspace = session.workspace.clone();
        let view = blocking(move || LayerView::open(spec.sandbox, &spec.paths, &workspace, &dirs))
            .await?
            .map_err(|e| EngineError::Isolation(format!("the child's copy: {e}")))?;
        Ok(Workspace::layered(Arc::new(view)))
    }

    /// Reads what `agent`, a child of the isolated batch of `snapshot`, changed and stores it.
    /// `outside_possible`: it called an MCP tool that may write elsewhere.
    pub(crate) async fn record(
        &self,
        agent: &Agent,
        snapshot: &BatchSnapshot,
        outside_possible: bool,
    ) -> Result<AgentChanges> {
        let dirs = self.dirs(snapshot, agent.id);
        // In a git workspace, a tracked file is reported even where a .gitignore matches it.
        let git = match (
            &snapshot.git_commit,
            self.store.get_session(agent.session_id).await?,
        ) {
            (Some(commit), Some(session)) => {
                let view = self.git_view(&session, self.session_tmp(&session)).await?;
                Some((session.workspace, view, commit.clone()))
            }
            _ => None,
        };
        let changes = blocking(move || {
            // A child that never ran a tool has no layer yet: it changed nothing.
            if !dirs.upper.is_dir() {
                return Ok(isolation::Changes::default());
            }
            let git = git.as_ref().map(|(workspace, view, commit)| {
                let repo = Repo {
                    workspace,
                    view: view.as_ref(),
                };
                (repo, commit.as_str())
            });
            isolation::changes::collect_in(&dirs, git)
        })
        .await?
        .map_err(isolation_error)?;
        let changes = AgentChanges {
            agent_id: agent.id,
            batch_id: snapshot.batch_id,
            files: changes.files,
            diff: changes.diff,
            outside_possible,
            state: CopyState::Kept,
            conflicts: Vec::new(),
            updated_at_ms: now_ms(),
        };
        self.store.put_changes(&changes).await?;
        Ok(changes)
    }

    /// An ended isolated child's changes.
    pub(crate) async fn changes(&self, agent: &Agent) -> Result<AgentChanges> {
        match self.store.agent_changes(agent.id).await? {
            Some(changes) => Ok(changes),
            None if self.snapshot_of(agent).await?.is_some() => {
                Err(EngineError::WrongState(format!(
                    "agent {} has not ended: its changes are read when it ends",
                    agent.id
                )))
            }
            None => Err(EngineError::WrongState(format!(
                "agent {} did not work in an isolated copy (its batch was forked without \
                 isolation: copy); its edits are in the session's workspace already",
                agent.id
            ))),
        }
    }

    /// Applies `agents`' changes to `session`'s workspace, in the order given. A child with a
    /// conflict is left unapplied and reported per file; the others go on.
    pub(crate) async fn apply(&self, session: &Session, agents: &[Agent]) -> Result<Vec<Applied>> {
        // Under the session's lock from the first read of a copy's state to its last write: two
        // applies, or an apply and a discard, never work on one copy at once.
        let lock = self.session_locks.get(session.id);
        let _guard = lock.lock().await;
        let snapshots = self.snapshots(agents).await?;
        let mut ready = Vec::new();
        for agent in agents {
            let changes = self.changes(agent).await?;
            match changes.state {
                CopyState::Applied | CopyState::Discarded => {
                    return Err(EngineError::WrongState(format!(
                        "agent {}'s copy was {} already",
                        agent.id,
                        changes.state.as_str()
                    )));
                }
                CopyState::Kept | CopyState::Conflicted => ready.push((agent, changes)),
            }
        }
        // A layered session's files through its layer, kept mounted while the changes go in.
        let target = self.trees.files(session).await?;
        if target.layer.is_none() {
            // Pinned: changes are never written through a symlink that replaced the workspace.
            Workspace::pinned(&session.workspace).map_err(EngineError::Workspace)?;
        }
        let mut applied = Vec::new();
        let mut touched = std::collections::BTreeMap::new();
        for (agent, mut changes) in ready {
            let Some(snapshot) = snapshots.get(&agent.id).cloned() else {
                continue;
            };
            let dirs = self.dirs(&snapshot, agent.id);
            let (workspace, layered) = (target.path.clone(), target.layer.is_some());
            let files = isolation::Changes {
                files: changes.files.clone(),
                diff: String::new(),
            };
            let outcome = blocking(move || {
                // A layer's path leads through its descriptor: never resolved to the path
                // views see it at, which is not here.
                let workspace = if layered {
                    workspace
                } else {
                    std::fs::canonicalize(&workspace).map_err(|e| IsolationError::Io {
                        what: format!("the session's workspace {}", workspace.display()),
                        source: e,
                    })?
                };
                isolation::apply::apply(&workspace, &dirs, &files)
            })
            .await?
            .map_err(isolation_error)?;
            changes.state = if outcome.conflicts.is_empty() {
                CopyState::Applied
            } else {
                CopyState::Conflicted
            };
            changes.conflicts = outcome.conflicts.clone();
            changes.updated_at_ms = now_ms();
            self.store.put_changes(&changes).await?;
            if changes.state == CopyState::Applied {
                self.remove_layer(&snapshot, agent.id).await?;
                touched.insert(snapshot.batch_id, snapshot);
            }
            tracing::info!(
                agent.id = %agent.id,
                applied = outcome.applied.len(),
                conflicts = outcome.conflicts.len(),
                "Isolated child's changes applied"
            );
            applied.push(Applied {
                agent_id: agent.id,
                outcome,
            });
        }
        for snapshot in touched.values() {
            self.remove_snapshot_if_done(snapshot).await?;
        }
        Ok(applied)
    }

    /// Discards `agents`' copies: their changes stay on record, their files go.
    pub(crate) async fn discard(&self, agents: &[Agent]) -> Result<Vec<AgentId>> {
        let snapshots = self.snapshots(agents).await?;
        let mut discarded = Vec::new();
        let mut touched = std::collections::BTreeMap::new();
        for agent in agents {
            let lock = self.session_locks.get(agent.session_id);
            let _guard = lock.lock().await;
            let mut changes = self.changes(agent).await?;
            if matches!(changes.state, CopyState::Applied | CopyState::Discarded) {
                continue;
            }
            let Some(snapshot) = snapshots.get(&agent.id).cloned() else {
                continue;
            };
            changes.state = CopyState::Discarded;
            changes.updated_at_ms = now_ms();
            self.store.put_changes(&changes).await?;
            self.remove_layer(&snapshot, agent.id).await?;
            discarded.push(agent.id);
            touched.insert(snapshot.batch_id, snapshot);
        }
        for snapshot in touched.values() {
            self.remove_snapshot_if_done(snapshot).await?;
        }
        Ok(discarded)
    }

    /// Discards the copies kept past the retention (neither applied nor discarded since their
    /// child ended), at most every [`SWEEP_EVERY`]; how many.
    pub(crate) async fn sweep(&self) -> Result<usize> {
        {
            let mut last = self.last_sweep.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|at| at.elapsed() < SWEEP_EVERY) {
                return Ok(0);
            }
            *last = Some(std::time::Instant::now());
        }
        let retention =
            i64::try_from(self.config.isolation.retention.as_millis()).unwrap_or(i64::MAX);
        let expired = self
            .store
            .expired_copies(now_ms().saturating_sub(retention), SWEEP_LIMIT)
            .await?;
        let mut agents = Vec::with_capacity(expired.len());
        for id in expired {
            if let Some(agent) = self.store.get_agent(id).await? {
                agents.push(agent);
            }
        }
        Ok(self.discard(&agents).await?.len())
    }

    /// Removes a child's layer.
    async fn remove_layer(&self, snapshot: &BatchSnapshot, agent: AgentId) -> Result<()> {
        let dirs = self.dirs(snapshot, agent);
        if let Some(layer) = dirs.upper.parent().map(PathBuf::from) {
            blocking(move || remove_all(&layer))
                .await?
                .map_err(isolation_error)?;
        }
        Ok(())
    }

    /// Removes the batch's snapshot once every copy over it was applied or discarded.
    async fn remove_snapshot_if_done(&self, snapshot: &BatchSnapshot) -> Result<()> {
        let children = self
            .store
            .list_agents(&forkd_core::query::AgentFilter {
                batch_id: Some(snapshot.batch_id),
                include_ended: true,
                ..Default::default()
            })
            .await?;
        let records = self.store.batch_changes(snapshot.batch_id).await?;
        let all_gone = children
            .iter()
            .filter(|c| snapshot.isolates(c.id))
            .all(|child| {
                records.iter().any(|r| {
                    r.agent_id == child.id
                        && matches!(r.state, CopyState::Applied | CopyState::Discarded)
                })
            });
        if all_gone {
            let dir = self.batch_dir(snapshot.batch_id);
            blocking(move || remove_all(&dir))
                .await?
                .map_err(isolation_error)?;
            if let (Some(reference), Some(child)) = (&snapshot.git_ref, children.first()) {
                // The commit's ref goes with the snapshot; git collects the commit in time.
                if let Some(session) = self.store.get_session(child.session_id).await? {
                    let view = self.git_view(&session, self.session_tmp(&session)).await?;
                    let reference = reference.clone();
                    blocking(move || {
                        let repo = Repo {
                            workspace: &session.workspace,
                            view: view.as_ref(),
                        };
                        isolation::snapshot::drop_ref(repo, &reference)
                    })
                    .await?
                    .map_err(isolation_error)?;
                }
            }
        }
        Ok(())
    }
}

/// Removes `dir` and what it holds. overlayfs leaves directories without permissions for
/// anyone in its work directory (`work/work`, mode 000): each is opened up before it is read.
fn remove_all(dir: &std::path::Path) -> Result<(), IsolationError> {
    fn open_up(dir: &std::path::Path) {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                open_up(&entry.path());
            }
        }
    }
    if std::fs::symlink_metadata(dir).is_err() {
        return Ok(());
    }
    open_up(dir);
    std::fs::remove_dir_all(dir)
        .map_err(|e| IsolationError::io(format!("cannot remove {}", dir.display()), e))
}
