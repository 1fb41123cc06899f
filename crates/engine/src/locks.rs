//! Async locks by key, created on first use and dropped once unused.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};

use tokio::sync::Mutex;

/// Async locks by key (a session, an idempotency key), created on first use and dropped once
/// nobody holds or waits for them, so the map does not grow with every key a process ever saw.
pub(crate) struct LockMap<K> {
    inner: StdMutex<LockMapInner<K>>,
}

struct LockMapInner<K> {
    locks: HashMap<K, Arc<Mutex<()>>>,
    /// The size at which unused locks are next swept out: twice what was left after the last
    /// sweep, so sweeping costs O(1) per call amortized.
    sweep_at: usize,
}

/// The least size worth sweeping at.
const LOCK_SWEEP_MIN: usize = 64;

impl<K> Default for LockMap<K> {
    fn default() -> Self {
        Self {
            inner: StdMutex::new(LockMapInner {
                locks: HashMap::new(),
                sweep_at: LOCK_SWEEP_MIN,
            }),
        }
    }
}

impl<K: std::hash::Hash + Eq> LockMap<K> {
    /// The async lock of `key`, created on first use.
    pub(crate) fn get(&self, key: K) -> Arc<Mutex<()>> {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if inner.locks.len() >= inner.sweep_at {
            // A lock only the map holds has no holder and no waiter (both keep a clone): a
            // later caller may as well get a new one.
            inner.locks.retain(|_, lock| Arc::strong_count(lock) > 1);
            inner.sweep_at = (2 * inner.locks.len()).max(LOCK_SWEEP_MIN);
        }
        inner.locks.entry(key).or_default().clone()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .locks
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unused_locks_are_swept_and_held_ones_kept() {
        let map = LockMap::<u32>::default();
        let held = map.get(0);
        let guard = held.lock().await;
        for key in 1..10_000 {
            drop(map.get(key));
        }
        assert!(map.len() <= 2 * LOCK_SWEEP_MIN, "{} locks", map.len());
        // The held lock survived every sweep: the same key still gives the same lock.
        assert!(Arc::ptr_eq(&held, &map.get(0)));
        drop(guard);
        assert!(map.get(0).try_lock().is_ok());
    }
}
