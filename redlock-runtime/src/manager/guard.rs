//! [`LockGuard`]: proof of holding a lock, released when dropped, and the manager's
//! operations on a held lease (release, extend).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::{path, Armed, Job};
use crate::error::chain;
use crate::lease::{self, Lease};
use crate::stats::Release;
use crate::{LockError, LockKind, LockManager};

/// A held lock. Dropping it releases the lock in the background (without blocking and
/// without spawning a task); [`release`](Self::release) does it now and reports the
/// outcome. While it lives, the manager's watchdog renews the lock (unless the options
/// turned that off).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), redlock::LockError> {
/// use redlock::LockManager;
///
/// let locks = LockManager::builder().in_memory().build().await?;
/// let guard = locks.lock("report_{7}").await?;
/// assert_eq!(guard.key(), "lock:report_{7}");
/// assert!(guard.is_held());
/// let token = guard.fencing_token(); // pass it to the resource you protect
/// assert!(token >= 1);
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    lease: Arc<Lease>,
    manager: LockManager,
    /// False for the views the macro hands to re-entered calls: they never release.
    owner: bool,
}

impl LockGuard {
    pub(crate) fn new(lease: Arc<Lease>, manager: LockManager) -> Self {
        manager.0.shared.hold(&lease);
        Self {
            lease,
            manager,
            owner: true,
        }
    }

    /// The lease this guard holds.
    pub(crate) fn lease(&self) -> &Lease {
        &self.lease
    }

    /// A non-owning handle on the same lock (dropping it releases nothing).
    pub(crate) fn view(&self) -> Self {
        Self {
            lease: self.lease.clone(),
            manager: self.manager.clone(),
            owner: false,
        }
    }

    /// The fencing token: strictly increasing per key across every acquisition, never 0.
    /// Hand it to the protected resource so it can reject writes from a stale holder.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let first = locks.lock("ledger_{1}").await?;
    /// let token = first.fencing_token();
    /// first.release().await?;
    /// let second = locks.lock("ledger_{1}").await?;
    /// assert!(second.fencing_token() > token); // storage rejects writes under older tokens
    /// second.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> u64 {
        self.lease.fence
    }

    /// What this guard holds: the key alone, a reader's place or a permit.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::{LockKind, LockManager};
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// assert_eq!(locks.lock("k").await?.kind(), LockKind::Exclusive);
    /// assert_eq!(locks.permit("p", 3).await?.kind(), LockKind::Permit);
    /// # Ok(()) }
    /// ```
    pub fn kind(&self) -> LockKind {
        self.lease.mode.kind()
    }

    /// The full key, prefix included (`"lock:buy_{42}"`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let guard = locks.lock("buy_{42}").await?;
    /// assert_eq!(guard.key(), "lock:buy_{42}");
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn key(&self) -> &str {
        self.lease.key.full()
    }

    /// Whether the lock is still ours: not released, not reported lost, and the local
    /// lease deadline has not passed (so a process resumed after a long pause sees
    /// `false` at once, before any renewal reply).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let opts = LockOptions::new().ttl(Duration::from_millis(300));
    /// let guard = locks.lock_with("buy_{42}", opts).await?;
    /// assert!(guard.is_held());
    /// locks.force_unlock("buy_{42}").await?;
    /// guard.lost().await; // noticed at the next renewal (ttl/3)
    /// assert!(!guard.is_held());
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        self.lease.is_held()
    }

    /// The last instant the lock is known to be ours, unless renewed before then.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::{Duration, Instant};
    ///
    /// use redlock::{LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let opts = LockOptions::new().ttl(Duration::from_secs(10));
    /// let guard = locks.lock_with("buy_{42}", opts).await?;
    /// let left = guard.valid_until().saturating_duration_since(Instant::now());
    /// assert!(left <= Duration::from_secs(10));
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn valid_until(&self) -> Instant {
        lease::instant(self.lease.deadline())
    }

    /// Resolves when the lock is lost: the server no longer has our token, or the lease
    /// deadline passed without a successful renewal. Never resolves while renewals
    /// succeed. Loss is terminal.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future changes nothing.
    ///
    /// # Examples
    ///
    /// Race the work against the loss, and stop writing when the lock is gone:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// // A short ttl, so the watchdog renews it, and would notice a loss, every 100 ms.
    /// let guard = locks
    ///     .lock_with("sync", LockOptions::new().ttl(Duration::from_millis(300)))
    ///     .await?;
    /// locks.force_unlock("sync").await?; // an operator removes the lock
    ///
    /// let work = tokio::time::sleep(Duration::from_secs(10)); // the critical section
    /// tokio::select! {
    ///     _ = work => unreachable!("the loss is noticed first"),
    ///     _ = guard.lost() => {} // stop: someone else may hold the key now
    /// }
    /// assert!(!guard.is_held());
    /// # Ok(()) }
    /// ```
    pub async fn lost(&self) {
        self.lease.lost().await;
    }

    /// Sets the lock's remaining ttl to `ttl` (later watchdog renewals use it too).
    ///
    /// From the moment it is called, [`is_held`](Self::is_held) and
    /// [`valid_until`](Self::valid_until) count with the shorter of the old deadline and
    /// `ttl` from now; only a confirmed extend moves the deadline later.
    ///
    /// # Errors
    /// [`LockError::Lost`] when the lock is no longer ours, [`LockError::InvalidOption`]
    /// for a ttl outside 1 ms ..= 30 days (5 ms ..= 30 days on Redlock),
    /// [`LockError::Backend`] when Redis failed (the lock is then kept with the shorter
    /// deadline, and the watchdog renews it with the new ttl),
    /// [`LockError::ReplicasUnavailable`] when the lock was taken with `min_replicas(n)`
    /// and fewer replicas acknowledged the extend (it is not booked: the deadline stays
    /// where the replicas' copy backs it).
    ///
    /// # Cancel safety
    /// Dropping the future does not cancel the request: it completes in the background,
    /// and its outcome is booked before any other extend or renewal of this lock is sent.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::{Duration, Instant};
    ///
    /// use redlock::{LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let guard = locks
    ///     .lock_with("report_{7}", LockOptions::new().ttl(Duration::from_secs(10)))
    ///     .await?;
    /// guard.extend(Duration::from_secs(600)).await?; // a longer job than planned
    /// assert!(guard.valid_until() > Instant::now() + Duration::from_secs(60));
    /// # Ok(()) }
    /// ```
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        self.manager.extend_lease(&self.lease, ttl).await
    }

    /// Releases the lock now.
    ///
    /// # Errors
    /// [`LockError::Lost`] when the lock had expired or been taken over (a key still
    /// holding our token is deleted all the same); [`LockError::NotHeld`] on a re-entered
    /// view of a lock owned by an outer call; [`LockError::Backend`] when Redis failed
    /// (the release is then retried in the background for a few seconds; the ttl is the
    /// last resort); [`LockError::ReplicasUnavailable`] when a release that keeps the key
    /// (`hold_at_least`) of a lock taken with `min_replicas(n)` was not acknowledged by
    /// enough replicas (retried in the background too).
    ///
    /// # Cancel safety
    /// If the future is dropped before it completes, the release still happens in the
    /// background.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::{LockError, LockManager};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let guard = locks.lock("buy_{42}").await?;
    /// guard.release().await?; // now, and the outcome is known (a drop releases in the background)
    /// assert!(!locks.is_locked("buy_{42}").await?);
    ///
    /// // A lock lost meanwhile is reported.
    /// let guard = locks.lock("buy_{42}").await?;
    /// locks.force_unlock("buy_{42}").await?;
    /// assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    /// # Ok(()) }
    /// ```
    pub async fn release(mut self) -> Result<(), LockError> {
        if !std::mem::replace(&mut self.owner, false) {
            return Err(LockError::NotHeld {
                key: self.key().to_owned(),
            });
        }
        self.manager.release_lease(&self.lease).await
    }

    /// [`release`](Self::release) for a caller with nobody to report to (the macro's
    /// expansion): a failure is logged, with the key and the cause.
    pub(crate) async fn release_or_warn(mut self) {
        if !std::mem::replace(&mut self.owner, false) {
            return;
        }
        if let Err(e) = self.manager.release_lease(&self.lease).await {
            tracing::warn!(
                target: "redlock",
                key = self.key(),
                backend = self.lease.backend,
                fencing_token = self.lease.fence,
                error = %chain(&e),
                "release after the call failed"
            );
        }
    }

    /// The name of the backend that granted the lock.
    #[cfg(feature = "tower")]
    pub(crate) fn backend(&self) -> &'static str {
        self.lease.backend
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.owner {
            self.manager.release_in_background(&self.lease);
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.key())
            .field("fencing_token", &self.lease.fence)
            .field("held", &self.lease.is_active())
            .finish()
    }
}

/// The operations of a guard on its lease.
impl LockManager {
    /// Releases a lease now (the guard's `release`).
    pub(crate) async fn release_lease(&self, lease: &Arc<Lease>) -> Result<(), LockError> {
        let shared = &self.0.shared;
        let key = lease.key.full();
        let Some(was) = lease.mark_released() else {
            return Err(LockError::NotHeld {
                key: key.to_owned(),
            });
        };
        shared.unwatch(lease.id);
        shared.let_go(lease.id);
        // A release that fails or is cut short is retried in the background as the
        // lease's own release: with its `hold_at_least` keep, never as an abandoned
        // attempt (which deletes at once).
        let mut pending = Armed::new(move || self.send_job(Job::Release(lease.clone())));
        let released = path::release(shared, lease.lease_ref(), lease.keep()).await;
        // A failed request is retried in the background (compare-token, so harmless).
        if released.is_ok() {
            pending.disarm();
        }
        let outcome = match released {
            Ok(true) => Release::Released,
            Ok(false) => Release::Lost,
            Err(e) => {
                path::book_release(shared, lease, Release::Error);
                return Err(e);
            }
        };
        path::book_release(shared, lease, outcome);
        if outcome == Release::Released {
            path::tell(shared, &lease.key, lease.mode);
        }
        match (outcome, was) {
            (Release::Released, Ok(())) => Ok(()),
            _ => Err(LockError::Lost {
                key: key.to_owned(),
            }),
        }
    }

    /// Hands a dropped guard's release to the background task.
    pub(crate) fn release_in_background(&self, lease: &Arc<Lease>) {
        if lease.mark_released().is_some() {
            self.0.shared.unwatch(lease.id);
            self.0.shared.let_go(lease.id);
            self.send_job(Job::Release(lease.clone()));
        }
    }

    /// Sets a lease's remaining ttl.
    ///
    /// The request runs in a task of its own, holding the lease's operation lock until
    /// its outcome is booked: dropping this future neither cancels the request nor lets
    /// a renewal overtake it (see the `lease` module for the rules).
    pub(crate) async fn extend_lease(
        &self,
        lease: &Arc<Lease>,
        ttl: Duration,
    ) -> Result<(), LockError> {
        self.check_runtime()?;
        self.check_ttl(ttl)?;
        let lost = |lease: &Lease| LockError::Lost {
            key: lease.key.full().to_owned(),
        };
        if !lease.is_held() {
            return Err(lost(lease));
        }
        let op = lease.op.clone().lock_owned().await;
        if !lease.is_held() {
            return Err(lost(lease));
        }
        let manager = self.clone();
        let task_lease = lease.clone();
        let request = tokio::spawn(async move {
            let (lease, shared) = (task_lease, &manager.0.shared);
            let outcome = match path::extend(shared, &lease, ttl).await {
                Ok(true) => Ok(()),
                Ok(false) => Err(lost(&lease)),
                Err(e) => Err(e),
            };
            drop(op);
            // The renewal schedule moved (and renewals were skipped while this ran).
            shared.reschedule(&lease);
            outcome
        });
        match request.await {
            Ok(outcome) => outcome,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Only when the runtime shuts down.
            Err(_) => Err(lost(lease)),
        }
    }
}
