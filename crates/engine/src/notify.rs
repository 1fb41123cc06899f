//! Notification subscriptions: the stored notifications after a sequence number, then live ones,
//! with no gap and no duplicate at the seam.
//!
//! The live receiver is created before the replay starts, so a notification committed during the
//! replay is either read from the store or received live; anything at or below the last seq sent
//! is dropped. A subscriber that falls behind the bounded live buffer catches up from the store.

use forkd_core::Notification;
use forkd_core::store::NotificationFilter;
use futures::stream::BoxStream;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::Engine;
use crate::error::EngineError;

/// A stream of notifications in sequence order.
pub type NotificationStream = BoxStream<'static, Result<Notification, EngineError>>;

/// Notifications read from the store per query during a replay.
const REPLAY_PAGE: u32 = 500;
/// How far a subscriber's own queue may run ahead of its reader.
const SUBSCRIBER_QUEUE: usize = 256;

impl Engine {
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
