//! Attaching to an agent: its stored transcript from a sequence number, then its messages as
//! they are stored, until it ends or the client is handed to the background.
//!
//! A run never depends on an attached client: handing a client to the background ends the
//! client's stream with `AsyncLaunched`, and the agent carries on under the same id (the same
//! run, which rebuilds nothing because it never stopped; a later run after a restart rebuilds
//! from the store). Every attach stream subscribes to the live channels before it replays the
//! store, and drops what it has already sent, so nothing falls in the seam.

use std::sync::Arc;
use std::time::Duration;

use forkd_core::store::{NotificationFilter, Store};
use forkd_core::{AgentId, Message, Notification};
use futures::stream::BoxStream;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::faults::{Faults, Pause};
use crate::notify::Notifications;

/// One event of an attached agent.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentEvent {
    /// A message of the agent's own transcript, with its position.
    Message { seq: u64, message: Message },
    /// The agent ended; its notification.
    Ended(Box<Notification>),
    /// The client was handed to the background (by a request, or after the auto-background
    /// delay); the agent goes on.
    AsyncLaunched,
    /// The database refused the agent's write (its disk is full, its server out of reach): the
    /// agent stopped where it stood, and resumes by itself once writes succeed again.
    Interrupted { reason: String },
    /// The database takes writes again: the interrupted agent runs again.
    Resumed,
}

pub type AgentEventStream = BoxStream<'static, Result<AgentEvent>>;

/// A message stored for an agent, as published to attached clients.
#[derive(Debug, Clone)]
pub(crate) struct Published {
    pub agent: AgentId,
    pub seq: u64,
    pub message: Message,
}

type Events = mpsc::Sender<Result<AgentEvent>>;

/// How often a client attached through a daemon that shares its database reads the agent's new
/// messages from the store (the agent may run on another daemon).
const REMOTE_POLL: Duration = Duration::from_millis(250);

/// How many messages (and background requests) a slow attached client may fall behind before
/// it catches up from the store.
const CHANNEL_BUFFER: usize = 1024;

/// Agents' own transcripts as they grow: appends published to attached clients, attach
/// streams, and hand-offs of attached clients to the background.
pub(crate) struct Attach {
    store: Arc<dyn Store>,
    /// An agent's end, and whether other daemons share the database.
    notifications: Arc<Notifications>,
    /// Agents stopped by a database fault, and resumed.
    faults: Arc<Faults>,
    /// Messages as they are stored, for attached clients.
    messages: broadcast::Sender<Published>,
    /// Requests to hand an agent's attached clients (or its turn's client) to the background.
    backgrounds: broadcast::Sender<AgentId>,
    /// After how long an attached client is handed to the background by itself.
    auto_background: Option<Duration>,
    /// Ends the streams' tasks.
    shutdown: CancellationToken,
}

impl Attach {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        notifications: Arc<Notifications>,
        faults: Arc<Faults>,
        auto_background: Option<Duration>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            store,
            notifications,
            faults,
            messages: broadcast::channel(CHANNEL_BUFFER).0,
            backgrounds: broadcast::channel(CHANNEL_BUFFER).0,
            auto_background,
            shutdown,
        }
    }

    /// Requests to hand a client to the background, from now on.
    pub(crate) fn backgrounds(&self) -> broadcast::Receiver<AgentId> {
        self.backgrounds.subscribe()
    }

    /// Hands the agent's attached clients (or its turn's client) to the background, here and,
    /// through the store, on the other daemons sharing it.
    pub(crate) async fn background(&self, id: AgentId) -> Result<()> {
        self.signal_background(id);
        // Clients attached through other daemons sharing the database hear it from there.
        self.store.signal_background(id).await?;
        Ok(())
    }

    /// Hands the agent's clients attached to this daemon to the background.
    pub(crate) fn signal_background(&self, id: AgentId) {
        let _ = self.backgrounds.send(id);
    }

    /// Appends a message to an agent's transcript and publishes it to attached clients.
    pub(crate) async fn append_own(
        &self,
        lease: &forkd_core::store::Lease,
        message: &Message,
    ) -> Result<u64> {
        let seq = self.store.append_agent_message(lease, message).await?;
        let _ = self.messages.send(Published {
            agent: lease.agent_id,
            seq,
            message: message.clone(),
        });
        Ok(seq)
    }

    /// Streams the agent's messages with `seq >= since_seq`, then live ones, then its end.
    pub(crate) fn follow(self: &Arc<Self>, id: AgentId, since_seq: u64) -> AgentEventStream {
        // Live channels first, so nothing stored during the replay is missed.
        let live = Live {
            messages: self.messages.subscribe(),
            ended: self.notifications.live(),
            backgrounds: self.backgrounds.subscribe(),
            pauses: self.faults.pauses(),
        };
        let (tx, rx) = mpsc::channel(256);
        let this = Arc::clone(self);
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = this.feed_attached(id, since_seq, live, &tx) => {}
                () = shutdown.cancelled() => {}
                () = tx.closed() => {}
            }
        });
        Box::pin(ReceiverStream::new(rx))
    }

    async fn feed_attached(&self, id: AgentId, since_seq: u64, mut live: Live, tx: &Events) {
        let mut next = since_seq;
        if !self.replay_messages(id, &mut next, tx).await {
            return;
        }
        if self.send_end_if_ended(id, &mut next, tx).await {
            return;
        }
        let deadline = after(self.auto_background);
        tokio::pin!(deadline);
        // An agent another daemon runs stores its messages there: on a shared database they are
        // read from the store as they come (its end arrives with its notification).
        let mut remote = tokio::time::interval(REMOTE_POLL);
        remote.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let shared = self.notifications.shared();
        loop {
            tokio::select! {
                _ = remote.tick(), if shared => {
                    if !self.replay_messages(id, &mut next, tx).await {
                        return;
                    }
                }
                msg = live.messages.recv() => match msg {
                    Ok(p) if p.agent == id && p.seq >= next => {
                        next = p.seq + 1;
                        if tx.send(Ok(AgentEvent::Message { seq: p.seq, message: p.message })).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        if !self.replay_messages(id, &mut next, tx).await {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                note = live.ended.recv() => match note {
                    Ok(n) if n.agent_id == id => {
                        let _ = self.send_end_if_ended(id, &mut next, tx).await;
                        return;
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        if self.send_end_if_ended(id, &mut next, tx).await {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                pause = live.pauses.recv() => match pause {
                    Ok((agent, pause)) if agent == id => {
                        let event = match pause {
                            Pause::Interrupted(reason) => AgentEvent::Interrupted { reason },
                            Pause::Resumed => AgentEvent::Resumed,
                        };
                        if tx.send(Ok(event)).await.is_err() {
                            return;
                        }
                    }
                    // A missed pause changes nothing stored: the messages and the end follow.
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                bg = live.backgrounds.recv() => {
                    if matches!(bg, Ok(agent) if agent == id) {
                        let _ = tx.send(Ok(AgentEvent::AsyncLaunched)).await;
                        return;
                    }
                }
                () = &mut deadline => {
                    let _ = tx.send(Ok(AgentEvent::AsyncLaunched)).await;
                    return;
                }
            }
        }
    }

    /// Sends stored messages from `next` on; false when the client is gone or the store failed.
    async fn replay_messages(&self, id: AgentId, next: &mut u64, tx: &Events) -> bool {
        let stored = match self.store.agent_messages(id).await {
            Ok(stored) => stored,
            Err(e) => {
                let _ = tx.send(Err(e.into())).await;
                return false;
            }
        };
        let from = *next;
        for m in stored.into_iter().filter(|m| m.seq >= from) {
            *next = m.seq + 1;
            let event = AgentEvent::Message {
                seq: m.seq,
                message: m.message,
            };
            if tx.send(Ok(event)).await.is_err() {
                return false;
            }
        }
        true
    }

    /// If the agent has ended: sends what is left of its transcript and its notification, and
    /// returns true.
    async fn send_end_if_ended(&self, id: AgentId, next: &mut u64, tx: &Events) -> bool {
        let filter = NotificationFilter {
            agent_id: Some(id),
            ..NotificationFilter::default()
        };
        let ended = match self.store.notifications(0, &filter, 1).await {
            Ok(mut found) => found.pop(),
            Err(e) => {
                let _ = tx.send(Err(e.into())).await;
                return true;
            }
        };
        let Some(note) = ended else { return false };
        if self.replay_messages(id, next, tx).await {
            let _ = tx.send(Ok(AgentEvent::Ended(Box::new(note)))).await;
        }
        true
    }
}

/// The live channels an attach stream follows.
struct Live {
    messages: broadcast::Receiver<Published>,
    ended: broadcast::Receiver<Notification>,
    backgrounds: broadcast::Receiver<AgentId>,
    pauses: broadcast::Receiver<(AgentId, Pause)>,
}

/// Resolves after `delay`, or never when there is none: the auto-background deadline.
pub(crate) async fn after(delay: Option<Duration>) {
    match delay {
        Some(delay) => tokio::time::sleep(delay).await,
        None => std::future::pending().await,
    }
}

/// The auto-background delay from a number of seconds; 0 means never.
pub fn auto_background(secs: u64) -> Option<Duration> {
    (secs > 0).then(|| Duration::from_secs(secs))
}
