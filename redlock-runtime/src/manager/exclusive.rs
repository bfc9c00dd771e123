//! The exclusive lock, the first thing a user takes: [`lock`](LockManager::lock),
//! [`try_lock`](LockManager::try_lock) and their `_with` forms.

use super::{kinds, LockManager};
use crate::key::LockKey;
use crate::kind::Mode;
use crate::{LockError, LockGuard, LockOptions};

impl LockManager {
    /// Acquires `key` (prefixed), waiting up to the default wait.
    ///
    /// The wait bounds the whole call: it returns within the wait plus at most one
    /// request timeout (the response timeout, or Redlock's per-node timeout, plus the
    /// `WAIT` of `min_replicas`), even when Redis hangs. A failed attempt
    /// ([`LockError::Backend`], [`LockError::QuorumUnavailable`]) is retried, after a
    /// short jittered pause, while wait budget is left.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when the wait ran out with the key still held,
    /// [`LockError::QueueFull`] when this process already has `max_waiters_per_key`
    /// tasks waiting for the key, [`LockError::InvalidKey`] for an empty or too long
    /// key; [`LockError::Backend`] when Redis failed, or
    /// [`LockError::QuorumUnavailable`] when too few Redlock nodes answered, on the last
    /// attempt before the wait ran out (with a zero wait: on the one attempt).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future at any point leaves no lock behind. A lock the
    /// server granted after the future was dropped is released in the background, and
    /// the queue slot is freed.
    ///
    /// # Examples
    ///
    /// Locks like [`tokio::sync::Mutex::lock`], across processes: the guard proves the
    /// holding and releases the lock when dropped.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let guard = locks.lock("buy_{42}").await?;
    /// let first = guard.fencing_token();
    ///
    /// // Another task waits for the key; it gets it once the first holder releases it.
    /// let next = tokio::spawn({
    ///     let locks = locks.clone();
    ///     async move { locks.lock("buy_{42}").await.map(|g| g.fencing_token()) }
    /// });
    /// guard.release().await?;
    /// assert!(next.await.unwrap()? > first);
    /// # Ok(()) }
    /// ```
    pub async fn lock(&self, key: &str) -> Result<LockGuard, LockError> {
        self.lock_with(key, LockOptions::new()).await
    }

    /// One attempt: `Ok(None)` when someone else holds the lock.
    ///
    /// # Errors
    /// As [`lock`](Self::lock), without `Timeout` and `QueueFull`.
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
    /// let held = locks.lock("nightly_report").await?;
    /// assert!(locks.try_lock("nightly_report").await?.is_none()); // held: no waiting
    /// held.release().await?;
    /// assert!(locks.try_lock("nightly_report").await?.is_some());
    /// # Ok(()) }
    /// ```
    pub async fn try_lock(&self, key: &str) -> Result<Option<LockGuard>, LockError> {
        self.try_lock_with(key, LockOptions::new()).await
    }

    /// One attempt with explicit options (their `wait` is ignored): `Ok(None)` when
    /// someone else holds the lock, counted as the metrics outcome `busy`. With
    /// [`hold_at_least`](LockOptions::hold_at_least) it is the "skip if it ran
    /// elsewhere" pattern of scheduled jobs: the first instance runs the job, the others
    /// skip it, and the lock outlives a quick run so that a late instance skips too.
    ///
    /// # Errors
    /// As [`lock_with`](Self::lock_with), without `Timeout` and `QueueFull`.
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
    /// let nightly = LockOptions::new().hold_at_least(Duration::from_secs(60));
    /// if let Some(job) = locks.try_lock_with("nightly_report", nightly.clone()).await? {
    ///     // ... the report runs here, once ...
    ///     job.release().await?; // kept until a minute after it started
    /// }
    /// // Another instance, a second later: skipped.
    /// assert!(locks.try_lock_with("nightly_report", nightly).await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn try_lock_with(
        &self,
        key: &str,
        options: LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        kinds::optional(self.lock_with(key, kinds::once(options)).await)
    }

    /// Acquires `key` with explicit options.
    ///
    /// # Errors
    /// As [`lock`](Self::lock); also [`LockError::InvalidOption`] for a ttl outside
    /// 1 ms ..= 30 days (5 ms ..= 30 days on Redlock) or a wait that overflows, and
    /// [`LockError::ReplicasUnavailable`] when `min_replicas` was not met (the lock is
    /// released again).
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
    /// use redlock::{LockError, LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// // A long job: a 2-minute ttl, renewed by the watchdog while the guard lives.
    /// let job = locks
    ///     .lock_with("export_{7}", LockOptions::new().ttl(Duration::from_secs(120)))
    ///     .await?;
    /// // Someone else waits at most 50 ms.
    /// let other = locks
    ///     .lock_with("export_{7}", LockOptions::new().wait(Duration::from_millis(50)))
    ///     .await;
    /// assert!(matches!(other, Err(LockError::Timeout { .. })));
    /// job.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn lock_with(&self, key: &str, options: LockOptions) -> Result<LockGuard, LockError> {
        let key = LockKey::prefixed(&self.0.prefix, key)?;
        let resolved = self.resolve(&options)?;
        self.acquire(key, Mode::Exclusive, resolved).await
    }
}
