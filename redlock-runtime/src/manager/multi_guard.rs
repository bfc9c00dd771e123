//! [`MultiGuard`]: several keys held together, from
//! [`lock_all`](crate::LockManager::lock_all).

use std::fmt;
use std::time::Duration;

use futures_util::future::{join_all, select_all};

use crate::{LockError, LockGuard};

/// Proof of holding every key of a [`lock_all`](crate::LockManager::lock_all) call, in
/// sorted order; released (every key) when dropped.
///
/// Each key is a lease of its own, renewed by the watchdog: the guard is held while all
/// of them are.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), redlock::LockError> {
/// use redlock::LockManager;
/// let locks = LockManager::builder().in_memory().build().await?;
/// let both = locks.lock_all(["account_{42}", "account_{17}"]).await?;
/// assert_eq!(both.keys(), ["lock:account_{17}", "lock:account_{42}"]);
/// assert!(both.is_held());
/// both.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases every key at once"]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// Holds `guards`, already sorted by key.
    pub(crate) fn new(guards: Vec<LockGuard>) -> Self {
        Self { guards }
    }

    /// The full keys (prefix included), in sorted order.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let both = locks.lock_all(["account_{42}", "account_{17}"]).await?;
    /// assert_eq!(both.keys(), ["lock:account_{17}", "lock:account_{42}"]); // sorted
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn keys(&self) -> Vec<&str> {
        self.guards.iter().map(LockGuard::key).collect()
    }

    /// One fencing token per key, in the order of [`keys`](Self::keys).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let both = locks.lock_all(["account_{42}", "account_{17}"]).await?;
    /// assert_eq!(both.fencing_tokens().len(), 2); // one per key, in the keys' order
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn fencing_tokens(&self) -> Vec<u64> {
        self.guards.iter().map(LockGuard::fencing_token).collect()
    }

    /// Whether every key is still held (see [`LockGuard::is_held`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let both = locks.lock_all(["account_{42}", "account_{17}"]).await?;
    /// assert!(both.is_held());
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// Resolves when any key is lost.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future changes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let both = locks
    ///     .lock_all_with(
    ///         ["account_{17}", "account_{42}"],
    ///         LockOptions::new().ttl(Duration::from_millis(300)),
    ///     )
    ///     .await?;
    /// locks.force_unlock("account_{42}").await?; // one of them is taken away
    /// tokio::select! {
    ///     _ = tokio::time::sleep(Duration::from_secs(10)) => unreachable!("noticed at the next renewal"),
    ///     _ = both.lost() => {}
    /// }
    /// assert!(!both.is_held());
    /// # Ok(()) }
    /// ```
    pub async fn lost(&self) {
        if self.guards.is_empty() {
            return;
        }
        select_all(self.guards.iter().map(|g| Box::pin(g.lost()))).await;
    }

    /// Sets the remaining ttl of every key to `ttl`; `Err` when any key could not be
    /// extended (the first such error).
    ///
    /// # Cancel safety
    /// As [`LockGuard::extend`] for each key: dropping the future does not cancel the
    /// requests, which complete in the background.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::{Duration, Instant};
    ///
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let both = locks.lock_all(["account_{17}", "account_{42}"]).await?;
    /// both.extend(Duration::from_secs(600)).await?;
    /// assert!(both.is_held());
    /// # Ok(()) }
    /// ```
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        join_all(self.guards.iter().map(|g| g.extend(ttl)))
            .await
            .into_iter()
            .collect()
    }

    /// Releases every key; `Err` (the first error) when any was already lost or could
    /// not be released; the others are released all the same.
    ///
    /// # Cancel safety
    /// As [`LockGuard::release`] for each key: a release cut short still happens in the
    /// background.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let both = locks.lock_all(["account_{17}", "account_{42}"]).await?;
    /// both.release().await?;
    /// assert!(!locks.is_locked("account_{17}").await?);
    /// assert!(!locks.is_locked("account_{42}").await?);
    /// # Ok(()) }
    /// ```
    pub async fn release(self) -> Result<(), LockError> {
        join_all(self.guards.into_iter().map(LockGuard::release))
            .await
            .into_iter()
            .collect()
    }
}

impl MultiGuard {
    /// Releases every key, logging each failure (see [`LockGuard::release_or_warn`]).
    pub(crate) async fn release_or_warn(self) {
        join_all(self.guards.into_iter().map(LockGuard::release_or_warn)).await;
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.guards).finish()
    }
}
