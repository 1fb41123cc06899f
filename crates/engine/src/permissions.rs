//! Permission prompts: a tool call that needs a person's approval, in an interactive session,
//! is put to the session's clients; the agent waits for the answer (or its own cancellation).
//!
//! Prompts live in memory: an agent waiting on one is a running agent, and a daemon that stops
//! stops the wait too. A client that subscribes late still receives every prompt still pending.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex as StdMutex;

use forkd_core::{AgentId, SessionId};
use futures::stream::BoxStream;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::Engine;
use crate::error::{EngineError, Result};

/// A question put to a session's interactive clients.
#[derive(Debug, Clone, PartialEq)]
pub struct PermissionPrompt {
    pub id: String,
    pub session_id: SessionId,
    pub agent_id: AgentId,
    pub tool: String,
    pub input_json: String,
    /// What is asked, in words.
    pub question: String,
}

/// A client's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PermissionAnswer {
    AllowOnce,
    /// Allow this call, and this tool for the rest of the session without asking.
    AllowAlways,
    Deny(Option<String>),
}

/// Prompts waiting for an answer, and the tools a session always allows.
pub(crate) struct Prompts {
    state: StdMutex<PromptState>,
    bus: broadcast::Sender<PermissionPrompt>,
}

#[derive(Default)]
struct PromptState {
    pending: HashMap<String, (PermissionPrompt, oneshot::Sender<PermissionAnswer>)>,
    always: HashMap<SessionId, HashSet<String>>,
}

impl Default for Prompts {
    fn default() -> Self {
        Self {
            state: StdMutex::default(),
            bus: broadcast::channel(256).0,
        }
    }
}

impl Prompts {
    fn state(&self) -> std::sync::MutexGuard<'_, PromptState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct PendingGuard<'a> {
    prompts: &'a Prompts,
    id: String,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.prompts.state().pending.remove(&self.id);
    }
}

/// A stream of prompts for one session.
pub type PromptStream = BoxStream<'static, PermissionPrompt>;

impl Engine {
    /// Whether a session's client said "allow always" for `tool`.
    pub(crate) fn always_allowed(&self, session: SessionId, tool: &str) -> bool {
        self.inner
            .prompts
            .state()
            .always
            .get(&session)
            .is_some_and(|tools| tools.contains(tool))
    }

    /// Puts a prompt to the session's clients and waits for the answer; `None` if the agent
    /// was cancelled meanwhile.
    pub(crate) async fn ask(
        &self,
        mut prompt: PermissionPrompt,
        cancel: &CancellationToken,
    ) -> Option<PermissionAnswer> {
        prompt.id = forkd_core::RequestId::new().to_string();
        let (tx, rx) = oneshot::channel();
        let prompts = &self.inner.prompts;
        prompts
            .state()
            .pending
            .insert(prompt.id.clone(), (prompt.clone(), tx));
        tracing::info!(prompt.id = %prompt.id, tool = %prompt.tool, "Waiting for a permission answer");
        // No subscriber yet is fine: a client that subscribes later gets the pending prompts.
        let _ = prompts.bus.send(prompt.clone());
        // Removes the prompt however the wait ends, a dropped future (a kill) included, so no
        // stale prompt is shown to clients that subscribe later.
        let _pending = PendingGuard {
            prompts,
            id: prompt.id.clone(),
        };
        let answer = tokio::select! {
            answer = rx => answer.ok(),
            () = cancel.cancelled() => None,
        };
        if answer == Some(PermissionAnswer::AllowAlways) {
            prompts
                .state()
                .always
                .entry(prompt.session_id)
                .or_default()
                .insert(prompt.tool.clone());
        }
        answer
    }

    /// The session a pending prompt belongs to.
    pub fn prompt_session(&self, id: &str) -> Option<SessionId> {
        self.inner
            .prompts
            .state()
            .pending
            .get(id)
            .map(|(prompt, _)| prompt.session_id)
    }

    /// Answers a pending prompt. `NotFound` when there is none by that id (already answered,
    /// or its agent stopped waiting).
    pub fn answer_prompt(&self, id: &str, answer: PermissionAnswer) -> Result<()> {
        let pending = self.inner.prompts.state().pending.remove(id);
        let Some((_, tx)) = pending else {
            return Err(EngineError::NotFound {
                kind: "permission prompt",
                id: id.chars().take(64).collect(),
            });
        };
        tx.send(answer).map_err(|_| EngineError::NotFound {
            kind: "permission prompt",
            id: id.to_owned(),
        })
    }

    fn pending_prompts(&self, session_id: SessionId) -> Vec<PermissionPrompt> {
        self.inner
            .prompts
            .state()
            .pending
            .values()
            .map(|(p, _)| p.clone())
            .filter(|p| p.session_id == session_id)
            .collect()
    }

    /// The session's prompts: those pending now, then new ones as they come.
    pub async fn subscribe_prompts(&self, session_id: SessionId) -> Result<PromptStream> {
        self.get_session(session_id).await?;
        let mut live = self.inner.prompts.bus.subscribe();
        let pending = self.pending_prompts(session_id);
        let (tx, rx) = mpsc::channel(64);
        let shutdown = self.inner.shutdown.clone();
        let engine = self.clone();
        tokio::spawn(async move {
            let mut seen: HashSet<String> = HashSet::new();
            for p in pending {
                seen.insert(p.id.clone());
                if tx.send(p).await.is_err() {
                    return;
                }
            }
            loop {
                let next = tokio::select! {
                    next = live.recv() => next,
                    () = shutdown.cancelled() => return,
                    () = tx.closed() => return,
                };
                match next {
                    Ok(p) if p.session_id == session_id && seen.insert(p.id.clone()) => {
                        if tx.send(p).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    // Fell behind: send whatever is still pending and was not seen yet.
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        for p in engine.pending_prompts(session_id) {
                            if seen.insert(p.id.clone()) && tx.send(p).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Ok(Box::pin(ReceiverStream::new(rx)))
    }
}
