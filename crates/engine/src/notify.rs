//! Notification subscriptions: the stored notifications after a sequence number, then live ones,
//! with no gap and no duplicate at the seam.
//!
//! The live receiver is created before the replay starts, so a notification committed during the
//! replay is either read from the store or received live; anything at or below the last seq sent
//! is dropped. A subscriber that falls behind the bounded live buffer catches up from the store.

use std::sync::Arc;

use forkd_core::Notification;
use forkd_core::store::{NotificationFilter, Wakeup};
use futures::stream::BoxStream;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::Engine;
use crate::error::EngineError;

/// A stream of notifications in sequence order.
pub type NotificationStream = BoxStream<'static, Result<Notification, EngineError>>;

/// How often a daemon sharing its database reads the notification table even without a
/// wake-up: the bound on how late a notification is when wake-ups were lost.
const FEED_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// Notifications read from the store per query during a replay.
const REPLAY_PAGE: u32 = 500;
/// How far a subscriber's own queue may run ahead of its reader.
const SUBSCRIBER_QUEUE: usize = 256;

impl Engine {
    /// Hands a notification this daemon has just committed to live subscribers: at once, or,
    /// when several daemons share the database, by waking the task that reads every daemon's
    /// notifications back from the store in seq order (broadcasting this daemon's own directly
    /// could overtake another daemon's lower seq, which subscribers would then drop).
    pub(crate) fn publish(&self, stored: Notification) {
        match self.inner.store_feed.get() {
            Some(wake) => wake.notify_one(),
            // No receiver is fine: subscribers replay from the store.
            None => {
                let _ = self.inner.notifications.send(stored);
            }
        }
    }

    /// On a database several daemons share, starts the tasks that bring other daemons' news to
    /// this one: every daemon's notifications, delivered to this daemon's subscribers in seq
    /// order (read back from the table from the last seq sent, when the database wakes it with
    /// `LISTEN/NOTIFY`, after each of this daemon's own commits, and every [`FEED_POLL`] in case
    /// wake-ups were lost to a dropped connection), permission prompts and answers (see
    /// `permissions.rs`), and background signals for clients attached
    /// here. Does nothing on a database only this daemon uses.
    pub async fn start_notification_feed(&self) -> Result<(), EngineError> {
        let Some(mut wakeups) = self.inner.store.listen().await? else {
            return Ok(());
        };
        let wake = Arc::new(tokio::sync::Notify::new());
        if self.inner.store_feed.set(wake.clone()).is_err() {
            return Ok(());
        }
        // Read after the feed is set: whatever committed before is in the store for replays;
        // whatever commits after wakes the feed.
        let mut last = self.inner.store.last_notification_seq().await?;
        let stop = self.inner.shutdown.clone();
        let listening = wake.clone();
        let backgrounds = self.inner.backgrounds.clone();
        let engine = self.clone();
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    () = stop.cancelled() => return,
                    next = wakeups.next() => next,
                };
                match next {
                    Ok(Wakeup::Notifications) => listening.notify_one(),
                    Ok(Wakeup::Background(id)) => {
                        let _ = backgrounds.send(id);
                    }
                    Ok(Wakeup::Prompt(id)) => engine.relay_prompt(id).await,
                    Ok(Wakeup::Answer(id)) => engine.deliver_answer(id).await,
                    Err(e) => {
                        tracing::warn!(error = %e, "Not hearing from the other daemons; reading their notifications every {} s", FEED_POLL.as_secs());
                        tokio::select! {
                            () = stop.cancelled() => return,
                            () = tokio::time::sleep(FEED_POLL) => {}
                        }
                        listening.notify_one();
                    }
                }
            }
        });
        let engine = self.clone();
        let stop = self.inner.shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = wake.notified() => {}
                    () = tokio::time::sleep(FEED_POLL) => {}
                }
                engine.broadcast_stored(&mut last).await;
            }
        });
        Ok(())
    }

    /// Whether other daemons may share the database (and run agents this one is asked about).
    pub(crate) fn shared_store(&self) -> bool {
        self.inner.store_feed.get().is_some()
    }

    /// Broadcasts the stored notifications after `last`, in seq order.
    async fn broadcast_stored(&self, last: &mut u64) {
        loop {
            let page = match self
                .inner
                .store
                .notifications(*last, &NotificationFilter::default(), REPLAY_PAGE)
                .await
            {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(error = %e, "Cannot read new notifications; trying again shortly");
                    return;
                }
            };
            let full = page.len() as u32 == REPLAY_PAGE;
            for n in page {
                *last = n.seq;
                let _ = self.inner.notifications.send(n);
            }
            if !full {
                return;
            }
        }
    }

    /// Subscribes to notifications with `seq > since_seq` that pass `filter`. With `follow` the
    /// stream stays open for live notifications; without it the stream ends after the replay.
    /// A filter naming a session, batch or agent that does not exist is `NotFound`: following
    /// a typo would otherwise wait forever.
    pub async fn subscribe(
        &self,
        since_seq: u64,
        filter: NotificationFilter,
        follow: bool,
    ) -> Result<NotificationStream, EngineError> {
        if let Some(id) = filter.session_id {
            self.get_session(id).await?;
        }
        if let Some(id) = filter.batch_id {
            self.get_batch(id).await?;
        }
        if let Some(id) = filter.agent_id {
            self.get_agent(id).await?;
        }
        Ok(self.subscribe_unchecked(since_seq, filter, follow))
    }

    /// [`Engine::subscribe`] for a filter whose ids are known to exist.
    pub(crate) fn subscribe_unchecked(
        &self,
        since_seq: u64,
        filter: NotificationFilter,
        follow: bool,
    ) -> NotificationStream {
        let live = self.inner.notifications.subscribe();
        let (tx, rx) = mpsc::channel(SUBSCRIBER_QUEUE);
        let engine = self.clone();
        // The task ends when the subscriber goes away (its queue closes) or the engine stops.
        let shutdown = self.inner.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = engine.feed(since_seq, filter, follow, live, &tx) => {}
                () = shutdown.cancelled() => {}
                () = tx.closed() => {}
            }
        });
        Box::pin(ReceiverStream::new(rx))
    }

    async fn feed(
        &self,
        since_seq: u64,
        filter: NotificationFilter,
        follow: bool,
        mut live: broadcast::Receiver<Notification>,
        tx: &mpsc::Sender<Result<Notification, EngineError>>,
    ) {
        let mut last = since_seq;
        if !self.replay(&mut last, &filter, tx).await || !follow {
            return;
        }
        loop {
            match live.recv().await {
                Ok(n) => {
                    if n.seq <= last
                        || !filter.matches(&n)
                        || !self
                            .visible_to(
                                filter.tenant.as_ref().map(forkd_core::Tenant::name),
                                n.session_id,
                            )
                            .await
                    {
                        continue;
                    }
                    last = n.seq;
                    if tx.send(Ok(n)).await.is_err() {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::debug!(missed, "Subscriber fell behind; catching up from the store");
                    if !self.replay(&mut last, &filter, tx).await {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// Sends stored notifications after `last`; false when the subscriber is gone or the store
    /// failed (the error is sent to the subscriber).
    async fn replay(
        &self,
        last: &mut u64,
        filter: &NotificationFilter,
        tx: &mpsc::Sender<Result<Notification, EngineError>>,
    ) -> bool {
        loop {
            let page = match self
                .inner
                .store
                .notifications(*last, filter, REPLAY_PAGE)
                .await
            {
                Ok(page) => page,
                Err(e) => {
                    let _ = tx.send(Err(e.into())).await;
                    return false;
                }
            };
            let full = page.len() as u32 == REPLAY_PAGE;
            for n in page {
                *last = n.seq;
                if tx.send(Ok(n)).await.is_err() {
                    return false;
                }
            }
            if !full {
                return true;
            }
        }
    }
}
