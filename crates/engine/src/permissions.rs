//! Permission prompts: a tool call that needs a person's approval, in an interactive session,
//! is put to the session's clients; the agent waits for the answer (or its own cancellation).
//!
//! Prompts are stored (`Store::insert_prompt`) while their agent waits, so a client of any
//! daemon sharing the database sees them — replayed when it subscribes, live after — and may
//! answer them; "allow always" is stored with the session. The daemon whose agent waits holds a
//! channel for each of its prompts: an answer given through it arrives at once; one given
//! through another daemon arrives with the database's wake-up ([`Wakeup::Answer`], handled in
//! `notify.rs`), or at the next poll of the stored row when wake-ups were lost.
//!
//! [`Wakeup::Answer`]: forkd_core::store::Wakeup::Answer

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use forkd_core::store::{Lease, Store};
use forkd_core::{PromptId, SessionId};
use futures::stream::BoxStream;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

pub use forkd_core::prompt::{PermissionAnswer, PermissionPrompt};

use crate::error::{EngineError, Result};
use crate::notify::Notifications;

/// How often a wait, and a subscription, read the stored prompts on a database other daemons
/// share: the bound on how late an answer or a prompt is when the database's wake-ups were lost.
const SHARED_POLL: Duration = Duration::from_secs(1);

/// Permission prompts: this daemon's agents' waits, and the prompts its clients are shown.
pub(crate) struct Permissions {
    store: Arc<dyn Store>,
    /// Whether other daemons share the database (then waits and subscriptions also poll it).
    notifications: Arc<Notifications>,
    /// Ends the subscriptions' tasks.
    shutdown: CancellationToken,
    /// The waits of this daemon's agents, by prompt.
    waiting: StdMutex<HashMap<PromptId, oneshot::Sender<PermissionAnswer>>>,
    /// Every prompt this daemon learns of: its own agents', and other daemons' (through the
    /// database's wake-ups).
    bus: broadcast::Sender<PermissionPrompt>,
}

impl Permissions {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        notifications: Arc<Notifications>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            store,
            notifications,
            shutdown,
            waiting: StdMutex::default(),
            bus: broadcast::channel(256).0,
        }
    }

    fn waiting(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<PromptId, oneshot::Sender<PermissionAnswer>>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Ends a wait however it ends, a dropped future (a kill) included: the channel goes, and the
/// stored prompt is removed, so no client is shown a prompt nobody waits on.
struct WaitGuard<'a> {
    permissions: &'a Permissions,
    id: PromptId,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.permissions.waiting().remove(&self.id);
        let (store, id) = (self.permissions.store.clone(), self.id);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = store.close_prompt(id).await {
                    // Harmless: an unanswered prompt of a stopped wait is not open once its
                    // agent's lease moves on; the next start of a SQLite daemon removes it.
                    tracing::warn!(prompt.id = %id, error = %e, "Cannot remove a permission prompt");
                }
            });
        }
    }
}

/// A stream of prompts for one session.
pub type PromptStream = BoxStream<'static, PermissionPrompt>;

impl Permissions {
    /// Whether a session's client said "allow always" for `tool`.
    pub(crate) async fn always_allowed(&self, session: SessionId, tool: &str) -> Result<bool> {
        Ok(self.store.tool_always_allowed(session, tool).await?)
    }

    /// Puts a prompt to the session's clients and waits for the answer; `None` if the agent
    /// was cancelled meanwhile. The prompt is stored under the run's lease.
    pub(crate) async fn ask(
        &self,
        lease: &Lease,
        mut prompt: PermissionPrompt,
        cancel: &CancellationToken,
    ) -> Result<Option<PermissionAnswer>> {
        prompt.id = PromptId::new();
        let (tx, mut rx) = oneshot::channel();
        // The channel before the row: an answer given the moment the row commits finds it.
        self.waiting().insert(prompt.id, tx);
        let _wait = WaitGuard {
            permissions: self,
            id: prompt.id,
        };
        self.store.insert_prompt(lease, &prompt).await?;
        tracing::info!(prompt.id = %prompt.id, tool = %prompt.tool, "Waiting for a permission answer");
        // No subscriber yet is fine: a client that subscribes later reads the stored prompts.
        let _ = self.bus.send(prompt.clone());
        let shared = self.notifications.shared();
        loop {
            tokio::select! {
                answer = &mut rx => return Ok(answer.ok()),
                () = cancel.cancelled() => return Ok(None),
                // Wake-ups from other daemons can be lost with their connection: read the row.
                () = tokio::time::sleep(SHARED_POLL), if shared => {
                    if let Some((_, Some(answer))) = self.store.prompt(prompt.id).await? {
                        return Ok(Some(answer));
                    }
                }
            }
        }
    }

    /// Hands the stored answer of a prompt this daemon's agent waits on to its wait (the
    /// answer was given through another daemon).
    pub(crate) async fn deliver_answer(&self, id: PromptId) {
        if !self.waiting().contains_key(&id) {
            return;
        }
        match self.store.prompt(id).await {
            Ok(Some((_, Some(answer)))) => {
                if let Some(tx) = self.waiting().remove(&id) {
                    let _ = tx.send(answer);
                }
            }
            Ok(_) => {}
            Err(e) => {
                // The wait reads the row itself within a second.
                tracing::warn!(prompt.id = %id, error = %e, "Cannot read a permission answer");
            }
        }
    }

    /// Shows this daemon's clients a prompt another daemon's agent asked.
    pub(crate) async fn relay_prompt(&self, id: PromptId) {
        match self.store.prompt(id).await {
            Ok(Some((prompt, None))) => {
                let _ = self.bus.send(prompt);
            }
            Ok(_) => {}
            // Subscribers read the open prompts themselves within a second.
            Err(e) => {
                tracing::warn!(prompt.id = %id, error = %e, "Cannot read a permission prompt")
            }
        }
    }

    /// The session a stored prompt belongs to.
    pub(crate) async fn prompt_session(&self, id: PromptId) -> Result<Option<SessionId>> {
        Ok(self
            .store
            .prompt(id)
            .await?
            .map(|(prompt, _)| prompt.session_id))
    }

    /// Answers an open prompt, whichever daemon's agent waits on it. `NotFound` when it is not
    /// open (already answered, or its agent stopped waiting).
    pub(crate) async fn answer(&self, id: PromptId, answer: PermissionAnswer) -> Result<()> {
        self.store.answer_prompt(id, &answer).await?;
        // This daemon's own agent: at once. Another daemon's reads it at the wake-up.
        if let Some(tx) = self.waiting().remove(&id) {
            let _ = tx.send(answer);
        }
        Ok(())
    }

    /// The session's prompts: those open now, then new ones as they come.
    pub(crate) async fn subscribe(self: &Arc<Self>, session_id: SessionId) -> Result<PromptStream> {
        let mut live = self.bus.subscribe();
        let open = self.store.open_prompts(session_id).await?;
        let (tx, rx) = mpsc::channel(64);
        let shutdown = self.shutdown.clone();
        let this = Arc::clone(self);
        let shared = self.notifications.shared();
        tokio::spawn(async move {
            let mut seen: HashSet<PromptId> = HashSet::new();
            let mut open = open;
            loop {
                for p in open {
                    if seen.insert(p.id) && tx.send(p).await.is_err() {
                        return;
                    }
                }
                open = loop {
                    let next = tokio::select! {
                        next = live.recv() => next,
                        () = shutdown.cancelled() => return,
                        () = tx.closed() => return,
                        () = tokio::time::sleep(SHARED_POLL), if shared => {
                            break this.open_prompts_or_none(session_id).await;
                        }
                    };
                    match next {
                        Ok(p) if p.session_id == session_id && seen.insert(p.id) => {
                            if tx.send(p).await.is_err() {
                                return;
                            }
                        }
                        Ok(_) => {}
                        // Fell behind: send whatever is open and was not seen yet.
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            break this.open_prompts_or_none(session_id).await;
                        }
                        Err(broadcast::error::RecvError::Closed) => return,
                    }
                };
            }
        });
        Ok(Box::pin(ReceiverStream::new(rx)))
    }

    /// The session's open prompts; none (logged) when the store cannot say.
    async fn open_prompts_or_none(&self, session: SessionId) -> Vec<PermissionPrompt> {
        self.store
            .open_prompts(session)
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(session.id = %session, error = %e, "Cannot read open permission prompts");
                Vec::new()
            })
    }
}

/// A prompt id as a client sent it; one that does not parse names no prompt.
pub fn parse_prompt_id(id: &str) -> Result<PromptId> {
    id.parse().map_err(|_| EngineError::NotFound {
        kind: "permission prompt",
        id: id.chars().take(64).collect(),
    })
}
