//! [`LockGuard`]: proof of holding a lock, released when dropped.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::lease::{self, Lease};
use crate::{LockError, LockKind, LockManager};

/// A held lock. Dropping it releases the lock in the background (without blocking and
/// without spawning a task); [`release`](Self::release) does it now and reports the
/// outcome. While it lives, the manager's watchdog renews the lock (unless the options
/// turned that off).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), redlock_runtime::LockError> {
/// use redlock_runtime::LockManager;
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
    pub fn fencing_token(&self) -> u64 {
        self.lease.fence
    }

    /// What this guard holds: the key alone, a reader's place or a permit.
    ///
    /// ```
    /// # async fn demo() -> Result<(), redlock_runtime::LockError> {
    /// use redlock_runtime::{LockKind, LockManager};
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// assert_eq!(locks.lock("k").await?.kind(), LockKind::Exclusive);
    /// assert_eq!(locks.permit("p", 3).await?.kind(), LockKind::Permit);
    /// # Ok(()) }
    /// ```
    pub fn kind(&self) -> LockKind {
        self.lease.mode.kind()
    }

    /// The full key, prefix included (`"lock:buy_{42}"`).
    pub fn key(&self) -> &str {
        self.lease.key.full()
    }

    /// Whether the lock is still ours: not released, not reported lost, and the local
    /// lease deadline has not passed (so a process resumed after a long pause sees
    /// `false` at once, before any renewal reply).
    pub fn is_held(&self) -> bool {
        self.lease.is_held()
    }

    /// The last instant the lock is known to be ours, unless renewed before then.
    pub fn valid_until(&self) -> Instant {
        lease::instant(self.lease.deadline())
    }

    /// Resolves when the lock is lost: the server no longer has our token, or the lease
    /// deadline passed without a successful renewal. Never resolves while renewals
    /// succeed. Loss is terminal.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future changes nothing.
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
    /// for a ttl outside 1 ms ..= 30 days, [`LockError::Backend`] when Redis failed (the
    /// lock is then kept with the shorter deadline, and the watchdog renews it with the
    /// new ttl).
    ///
    /// # Cancel safety
    /// Dropping the future does not cancel the request: it completes in the background,
    /// and its outcome is booked before any other extend or renewal of this lock is sent.
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
    /// last resort).
    ///
    /// # Cancel safety
    /// If the future is dropped before it completes, the release still happens in the
    /// background.
    pub async fn release(mut self) -> Result<(), LockError> {
        if !std::mem::replace(&mut self.owner, false) {
            return Err(LockError::NotHeld {
                key: self.key().to_owned(),
            });
        }
        self.manager.release_lease(&self.lease).await
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
