//! [`eventually`]: wait for a condition, not for a time.
//!
//! A test that sleeps "long enough" for something to happen is slow when the machine is fast and
//! flaky when it is loaded. [`eventually`] polls the condition itself, every few milliseconds,
//! and returns as soon as it holds; only if it never does within the deadline does the test fail,
//! with a message naming what it waited for.
//!
//! This file depends on nothing but `tokio` so that crates which `forkd-test-support` itself
//! depends on (the engine's integration tests) can include it with `#[path]` instead of a
//! dependency cycle.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

/// How often [`eventually`] checks its condition.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// What a check of [`eventually`] returns: `bool` (it holds, or not yet), or `Option<T>` (the
/// value it was waiting for, or not yet).
pub trait Condition {
    /// What `eventually` returns once the condition holds.
    type Value;
    /// `Some` once the condition holds.
    fn holds(self) -> Option<Self::Value>;
}

impl Condition for bool {
    type Value = ();
    fn holds(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Condition for Option<T> {
    type Value = T;
    fn holds(self) -> Option<T> {
        self
    }
}

/// Polls `check` every [`POLL_INTERVAL`] until it holds, and returns its value (`()` for a
/// `bool` check, the `T` of an `Option<T>` check). The first check runs at once.
///
/// # Panics
///
/// When `deadline` passes before the condition holds, with a message that names `what` (what the
/// test waited for: "the child to be running", "the socket to accept calls").
///
/// ```
/// # async fn example(pid_file: &std::path::Path) {
/// use std::time::Duration;
/// use forkd_test_support::eventually;
///
/// // A `bool` check: wait until the file exists.
/// eventually(Duration::from_secs(20), "the command to start", || async { pid_file.exists() }).await;
/// // An `Option` check: wait for a value.
/// let pid = eventually(Duration::from_secs(20), "a pid in the file", || async {
///     std::fs::read_to_string(pid_file).ok()?.trim().parse::<u32>().ok()
/// })
/// .await;
/// # let _ = pid;
/// # }
/// ```
pub async fn eventually<C, F, Check>(
    deadline: Duration,
    what: impl Display,
    mut check: Check,
) -> C::Value
where
    C: Condition,
    F: Future<Output = C>,
    Check: FnMut() -> F,
{
    let start = tokio::time::Instant::now();
    let mut checks = 0_u32;
    loop {
        checks += 1;
        if let Some(value) = check().await.holds() {
            return value;
        }
        if start.elapsed() >= deadline {
            panic!("timed out after {deadline:?} waiting for {what} ({checks} checks)");
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
