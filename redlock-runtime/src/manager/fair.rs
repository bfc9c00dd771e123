//! The fair lock of [`LockManager`]: first come, first served across every process.

use super::kinds::{once, optional};
use super::LockManager;
use crate::kind::Mode;
use crate::{LockError, LockGuard, LockOptions};

impl LockManager {
    /// Takes `key` exclusively, in the order of arrival across every process: the
    /// server keeps the key's waiters in a queue, and each release wakes the first one
    /// alone (one attempt per release, whichever manager it waits in). Waits up to the
    /// default wait, like [`lock`](Self::lock).
    ///
    /// A waiter keeps its place by asking again every second; one that stops (its
    /// process died, its network was cut, its withdrawal never reached the server) is
    /// dropped from the queue by the server's clock 3 s after it last asked, so nobody
    /// waits behind it for longer. A waiter whose wait ends leaves the queue right away (a
    /// withdrawal sent in the background as the call returns).
    ///
    /// The guard is a [`LockGuard`] like any other: fencing token, watchdog,
    /// [`lost`](LockGuard::lost), `hold_at_least`, metrics (kind `fair`) and
    /// [`inspect`](Self::inspect) (with the queue's length, [`LockInfo::queued`]) work as
    /// for [`lock`](Self::lock).
    ///
    /// Use the fair calls for every holder of a key: a plain [`lock`](Self::lock) of
    /// the same key does not queue, and may take it ahead of the queue.
    ///
    /// [`LockInfo::queued`]: crate::LockInfo::queued
    ///
    /// # Errors
    /// As [`lock`](Self::lock); [`LockError::QueueFull`] when the key's queue on the
    /// server holds [`max_waiters_per_key`](crate::LockManagerBuilder::max_waiters_per_key)
    /// waiters already.
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock); a waiter whose future is dropped leaves the queue in the
    /// background.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::{LockKind, LockManager};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let first = locks.fair("report_{7}").await?;
    /// assert_eq!(first.kind(), LockKind::Fair);
    /// let second = tokio::spawn({
    ///     let locks = locks.clone();
    ///     async move { locks.fair("report_{7}").await }
    /// });
    /// first.release().await?; // wakes the first waiter in the queue
    /// let second = second.await.unwrap()?;
    /// assert!(second.fencing_token() > 0);
    /// # Ok(()) }
    /// ```
    pub async fn fair(&self, key: &str) -> Result<LockGuard, LockError> {
        self.fair_with(key, LockOptions::new()).await
    }

    /// One attempt at [`fair`](Self::fair): `Ok(None)` when the key is held or anyone
    /// is queued for it (a fair lock lets nobody ahead of its queue).
    ///
    /// # Errors
    /// As [`try_lock`](Self::try_lock).
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let held = locks.try_fair("report_{7}").await?.expect("free");
    /// assert!(locks.try_fair("report_{7}").await?.is_none());
    /// held.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn try_fair(&self, key: &str) -> Result<Option<LockGuard>, LockError> {
        optional(self.fair_with(key, once(LockOptions::new())).await)
    }

    /// One attempt at [`fair_with`](Self::fair_with) (the options' `wait` is ignored):
    /// `Ok(None)` when the key is held or anyone is queued for it.
    ///
    /// # Errors
    /// As [`fair_with`](Self::fair_with), without `Timeout` and `QueueFull`.
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
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
    /// let short = LockOptions::new().ttl(Duration::from_secs(5));
    /// assert!(locks.try_fair_with("report_{7}", short).await?.is_some());
    /// # Ok(()) }
    /// ```
    pub async fn try_fair_with(
        &self,
        key: &str,
        options: LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        optional(self.fair_with(key, once(options)).await)
    }

    /// [`fair`](Self::fair) with per-call options (ttl, wait, watchdog,
    /// `min_replicas`, `hold_at_least`, as for [`lock_with`](Self::lock_with)).
    ///
    /// # Errors
    /// As [`fair`](Self::fair).
    ///
    /// # Cancel safety
    /// As [`fair`](Self::fair).
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
    /// let guard = locks
    ///     .fair_with("report_{7}", LockOptions::new().wait(Duration::from_secs(1)))
    ///     .await?;
    /// let info = locks.inspect("report_{7}").await?.expect("held");
    /// assert_eq!(info.queued, 0);
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn fair_with(&self, key: &str, options: LockOptions) -> Result<LockGuard, LockError> {
        self.acquire_mode(key, Mode::Fair, options).await
    }
}
