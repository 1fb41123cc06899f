//! Notification subscriptions: the stored notifications after a sequence number, then live ones,
//! with no gap and no duplicate at the seam.
//!
//! The live receiver is created before the replay starts, so a notification committed during the
//! replay is either read from the store or received live; anything at or below the last seq sent
//! is dropped. A subscriber that falls behind the bounded live buffer catches up from the store.

use std::sync::{Arc, OnceLock};

use forkd_core::Notification;
use forkd_core::store::{NotificationFilter, Store};
use futures::stream::BoxStream;
use tokio::sync::{Mutex, MutexGuard, Notify, broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::error::EngineError;
use crate::tenancy::Tenancy;

/// A stream of notifications in sequence order.
pub type NotificationStream = BoxStream<'static, Result<Notification, EngineError>>;

/// How often a daemon sharing its database reads the notification table even without a
/// wake-up: the bound on how late a notification is when wake-ups were lost.
pub(crate) const FEED_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// Notifications read from the store per query during a replay.
const REPLAY_PAGE: u32 = 500;
/// How many live notifications a slow subscriber may fall behind before it catches up from the
/// store. Bounded so that no subscriber can hold memory or delay the agents.
const NOTIFICATION_BUFFER: usize = 1024;
/// How far a subscriber's own queue may run ahead of its reader.
const SUBSCRIBER_QUEUE: usize = 256;

/// Notifications after their commit: the live broadcast, the order of commits and broadcasts,
/// and subscriptions (replay, then live).
pub(crate) struct Notifications {
    store: Arc<dyn Store>,
    /// Whose sessions a tenant's subscriber may hear of.
    tenancy: Arc<Tenancy>,
    /// Live notifications, sent after they are committed to the store.
    live: broadcast::Sender<Notification>,
    /// Set on a database several daemons share: the live notifications are then read back from
    /// the store in seq order by one task (see [`Notifications::start_feed`]), which this wakes
    /// after each of this daemon's own commits.
    feed: OnceLock<Arc<Notify>>,
    /// Held across a notification's commit and its broadcast, so live subscribers receive
    /// notifications in sequence order (they drop anything at or below the last seq they saw).
    order: Mutex<()>,
    /// Ends the subscriptions' and the feed's tasks.
    shutdown: CancellationToken,
}

impl Notifications {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        tenancy: Arc<Tenancy>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            store,
            tenancy,
            live: broadcast::channel(NOTIFICATION_BUFFER).0,
            feed: OnceLock::new(),
            order: Mutex::new(()),
            shutdown,
        }
    }

    /// The lock a notification's commit and its broadcast are made under.
    pub(crate) async fn ordered(&self) -> MutexGuard<'_, ()> {
        self.order.lock().await
    }

    /// Live notifications from now on (for a stream that waits for an agent's end).
    pub(crate) fn live(&self) -> broadcast::Receiver<Notification> {
        self.live.subscribe()
    }

    /// Hands a notification this daemon has just committed to live subscribers: at once, or,
    /// when several daemons share the database, by waking the task that reads every daemon's
    /// notifications back from the store in seq order (broadcasting this daemon's own directly
    /// could overtake another daemon's lower seq, which subscribers would then drop).
    pub(crate) fn publish(&self, stored: Notification) {
        match self.feed.get() {
            Some(wake) => wake.notify_one(),
            // No receiver is fine: subscribers replay from the store.
            None => {
                let _ = self.live.send(stored);
            }
        }
    }

    /// On a database several daemons share, reads every daemon's notifications back from the
    /// table in seq order, from the last seq sent, and hands them to this daemon's subscribers:
    /// woken by the returned handle (the database's `LISTEN/NOTIFY` and this daemon's own
    /// commits wake it), and every [`FEED_POLL`] in case wake-ups were lost. Returns `None` when
    /// the feed runs already.
    pub(crate) async fn start_feed(self: &Arc<Self>) -> Result<Option<Arc<Notify>>, EngineError> {
        let wake = Arc::new(Notify::new());
        if self.feed.set(wake.clone()).is_err() {
            return Ok(None);
        }
        // Read after the feed is set: whatever committed before is in the store for replays;
        // whatever commits after wakes the feed.
        let mut last = self.store.last_notification_seq().await?;
        let this = Arc::clone(self);
        let woken = wake.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = this.shutdown.cancelled() => return,
                    () = woken.notified() => {}
                    () = tokio::time::sleep(FEED_POLL) => {}
                }
                this.broadcast_stored(&mut last).await;
            }
        });
        Ok(Some(wake))
    }

    /// Whether other daemons may share the database (and run agents this one is asked about).
    pub(crate) fn shared(&self) -> bool {
        self.feed.get().is_some()
    }

    /// Broadcasts the stored notifications after `last`, in seq order.
    async fn broadcast_stored(&self, last: &mut u64) {
        loop {
            let page = match self
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
                let _ = self.live.send(n);
            }
            if !full {
                return;
            }
        }
    }

    /// Subscribes to notifications with `seq > since_seq` that pass `filter` (whose ids are
    /// known to exist). With `follow` the stream stays open for live notifications; without it
    /// the stream ends after the replay.
    pub(crate) fn subscribe(
        self: &Arc<Self>,
        since_seq: u64,
        filter: NotificationFilter,
        follow: bool,
    ) -> NotificationStream {
        let live = self.live.subscribe();
        let (tx, rx) = mpsc::channel(SUBSCRIBER_QUEUE);
        let this = Arc::clone(self);
        // The task ends when the subscriber goes away (its queue closes) or the engine stops.
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = this.feed(since_seq, filter, follow, live, &tx) => {}
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
                    if filter.cursor(&n) <= last
                        || !filter.matches(&n)
                        || !self
                            .tenancy
                            .visible_to(
                                filter.tenant.as_ref().map(forkd_core::Tenant::name),
                                n.session_id,
                            )
                            .await
                    {
                        continue;
                    }
                    last = filter.cursor(&n);
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
            let page = match self.store.notifications(*last, filter, REPLAY_PAGE).await {
                Ok(page) => page,
                Err(e) => {
                    let _ = tx.send(Err(e.into())).await;
                    return false;
                }
            };
            let full = page.len() as u32 == REPLAY_PAGE;
            for n in page {
                *last = filter.cursor(&n);
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
