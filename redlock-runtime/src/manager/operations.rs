//! What operators and a process's exit ask of a [`LockManager`]: whether a key is held,
//! who holds what ([`inspect`](LockManager::inspect), [`list`](LockManager::list)),
//! force-unlocking a stuck lock, the watchdog's count, and
//! [`shutdown`](LockManager::shutdown).

use std::time::Duration;

use super::LockManager;
use crate::key::LockKey;
use crate::wire::Seen;
use crate::{LockError, LockInfo};

impl LockManager {
    /// Whether anyone holds `key` now: an exclusive holder, readers or permit holders.
    /// On Redlock a permit is held on places, keys of their own, so a key not held
    /// otherwise costs a `SCAN` of every node for its places, as for
    /// [`inspect`](Self::inspect).
    ///
    /// # Errors
    /// [`LockError::InvalidKey`], [`LockError::Backend`] (or
    /// [`LockError::QuorumUnavailable`] when too few Redlock nodes answered).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// assert!(!locks.is_locked("buy_{42}").await?);
    /// let guard = locks.lock("buy_{42}").await?;
    /// assert!(locks.is_locked("buy_{42}").await?);
    /// guard.release().await?;
    /// assert!(!locks.is_locked("buy_{42}").await?);
    /// # Ok(()) }
    /// ```
    pub async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        self.check_runtime()?;
        let key = LockKey::prefixed(&self.0.prefix, key)?;
        self.0.shared.backend.is_locked(&key).await
    }

    /// Who holds `key` (prefixed, as for [`lock`](Self::lock)) and since when: its kind,
    /// the holder's host and process id, when it was granted, the time left and the
    /// fencing token; `None` when nobody holds it. Never the token: nothing returned can
    /// release or extend the lock. On Redlock, the holder of a quorum of the nodes; a
    /// Redlock permit is held on places, keys of their own, so a key not held otherwise
    /// costs a `SCAN` of every node for its places (about 1 000 keys a round trip).
    ///
    /// # Errors
    /// [`LockError::InvalidKey`], [`LockError::Backend`] (or
    /// [`LockError::QuorumUnavailable`] when too few Redlock nodes answered).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::{LockKind, LockManager};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// assert!(locks.inspect("buy_{42}").await?.is_none());
    /// let guard = locks.lock("buy_{42}").await?;
    /// let info = locks.inspect("buy_{42}").await?.expect("held");
    /// assert_eq!(info.kind, LockKind::Exclusive);
    /// assert_eq!(info.pid, Some(std::process::id()));
    /// assert_eq!(info.fencing_token, Some(guard.fencing_token()));
    /// println!("{info}"); // lock:buy_{42} (exclusive) fencing token 1 held by … pid … for 0ns, 30s left
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        self.check_runtime()?;
        let key = LockKey::prefixed(&self.0.prefix, key)?;
        self.0.shared.backend.inspect(&key).await
    }

    /// Every lock held under this manager's prefix whose key (after the prefix) matches
    /// `pattern`, a Redis glob (`*`, `?`, `[..]`; `""` is `*`), sorted by key, each as
    /// [`inspect`](Self::inspect) describes it, every kind; the fencing counters, holder
    /// sets, writer intents and Redlock's permit places kept beside the locks are left
    /// out (on Redlock a second `SCAN` finds the places, each permit listed once).
    ///
    /// The keyspace is walked with `SCAN ... COUNT 1000` (every master of a cluster, every
    /// node of Redlock), never `KEYS`: each step keeps the server busy well under a
    /// millisecond, and the locks of each step are inspected in one pipelined burst.
    /// Locks taken or released while it runs may or may not be listed.
    ///
    /// # Errors
    /// [`LockError::Backend`] when a node fails (on Redlock, when fewer than a quorum of
    /// nodes could be scanned: [`LockError::QuorumUnavailable`]).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().prefix("list-doc:").build().await?;
    /// let _a = locks.lock("buy_{1}").await?;
    /// let _b = locks.lock("sell_{2}").await?;
    /// let held = locks.list("buy_*").await?;
    /// assert_eq!(held.len(), 1);
    /// assert_eq!(held[0].key, "list-doc:buy_{1}");
    /// assert_eq!(locks.list("").await?.len(), 2);
    /// # Ok(()) }
    /// ```
    pub async fn list(&self, pattern: &str) -> Result<Vec<LockInfo>, LockError> {
        self.check_runtime()?;
        let mut found = self.0.shared.backend.list(&self.0.prefix, pattern).await?;
        found.sort_by(|a, b| a.key.cmp(&b.key));
        found.dedup_by(|a, b| a.key == b.key);
        Ok(found)
    }

    /// Deletes `key`'s lock whoever holds it, and wakes its waiters: an operator's tool
    /// for a stuck lock. The holder finds out at its next renewal (its guard's
    /// [`lost`](crate::LockGuard::lost) resolves). Returns whether a lock was there. Logged as a
    /// `tracing` warning naming the key and this process. Readers and permit holders are
    /// removed too (on Redlock, permits are held on places, keys of their own, found by
    /// a `SCAN` of every node), and permit waiters woken.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`], [`LockError::Backend`].
    ///
    /// # Cancel safety
    /// The request may have been applied when the future is dropped: the lock may be gone
    /// or not. Calling it again is harmless.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let _stuck = locks.lock("import").await?; // a holder that hangs
    /// assert!(locks.force_unlock("import").await?); // an operator removes its lock
    /// assert!(!locks.force_unlock("import").await?); // nothing left
    /// assert!(locks.try_lock("import").await?.is_some());
    /// # Ok(()) }
    /// ```
    pub async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        self.check_runtime()?;
        let key = LockKey::prefixed(&self.0.prefix, key)?;
        self.force_unlock_key(&key, None).await
    }

    /// [`force_unlock`](Self::force_unlock) of the lock `shown` describes (as
    /// [`inspect`](Self::inspect) or [`list`](Self::list) returned it), only while no
    /// later grant holds it: a holder that took the key after it was shown keeps it.
    /// The check and the delete are one script on the server (on Redlock, per node,
    /// after the lock is inspected again). Returns whether the lock was deleted: `false`
    /// when it is gone or is now another grant (inspect it again to see which).
    ///
    /// It tells grants apart by their holder and fencing token: the same holder
    /// renewing or extending is still the lock shown; a reader or permit holder that
    /// joined after it is another grant (nothing is deleted, not even the holders
    /// shown).
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] when `shown.key` is not under this manager's
    /// [`prefix`](Self::prefix); [`LockError::Backend`].
    ///
    /// # Cancel safety
    /// The request may have been applied when the future is dropped: the lock shown may
    /// be gone or not. Calling it again is harmless.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().prefix("shown-doc:").build().await?;
    /// let first = locks.lock("import").await?;
    /// let shown = locks.inspect("import").await?.expect("held");
    /// first.release().await?;
    /// let _second = locks.lock("import").await?; // another holder took it meanwhile
    /// assert!(!locks.force_unlock_if_unchanged(&shown).await?); // it keeps it
    /// let now = locks.inspect("import").await?.expect("held");
    /// assert!(locks.force_unlock_if_unchanged(&now).await?);
    /// # Ok(()) }
    /// ```
    pub async fn force_unlock_if_unchanged(&self, shown: &LockInfo) -> Result<bool, LockError> {
        self.check_runtime()?;
        let Some(user_key) = shown.key.strip_prefix(self.prefix()) else {
            return Err(LockError::InvalidKey {
                reason: format!(
                    "{:?} is not under this manager's prefix {:?}",
                    shown.key,
                    self.prefix()
                ),
            });
        };
        let key = LockKey::prefixed(&self.0.prefix, user_key)?;
        self.force_unlock_key(&key, Some(Seen::of(shown))).await
    }

    async fn force_unlock_key(
        &self,
        key: &LockKey,
        seen: Option<Seen<'_>>,
    ) -> Result<bool, LockError> {
        let held = self.0.shared.backend.force_unlock(key, seen).await?;
        tracing::warn!(
            target: "redlock",
            key = key.full(),
            backend = self.backend_name(),
            held,
            only_shown = seen.is_some(),
            by_host = crate::info::this_host(),
            by_pid = std::process::id(),
            "lock force-released"
        );
        Ok(held)
    }

    /// The number of locks the watchdog is renewing.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let guard = locks.lock("buy_{42}").await?;
    /// assert_eq!(locks.watched_locks(), 1);
    /// guard.release().await?;
    /// assert_eq!(locks.watched_locks(), 0);
    /// # Ok(()) }
    /// ```
    pub fn watched_locks(&self) -> usize {
        self.0.shared.watched()
    }

    /// The number of wake-up channels this manager keeps an interest in (summed over
    /// Redlock's nodes; 0 for the in-memory backend). For tests: it drops
    /// back to 0 once no task waits.
    #[doc(hidden)]
    pub fn subscription_interests(&self) -> usize {
        self.0.shared.backend.interests()
    }

    /// Releases every lock this manager's guards hold and finishes the releases it was
    /// doing in the background (of guards dropped just before, and of locks granted to
    /// callers that had given up, whose requests shared a call), within `within`: what
    /// a process calls on its way out, so that its locks are free at once rather than
    /// at their ttl. A lock taken with
    /// [`hold_at_least`](crate::LockOptions::hold_at_least) is kept until its minimum
    /// hold, as by its own release. Afterwards every guard reports
    /// [`is_held`](crate::LockGuard::is_held)` == false`, and the manager (and every
    /// clone of it) refuses new work with [`LockError::ShutDown`]; a second call does
    /// nothing more.
    ///
    /// # Errors
    /// [`LockError::Backend`] (or another release error) when a release failed, and a
    /// timed-out [`LockError::Backend`] when `within` ran out first: the locks not
    /// released then are freed by their ttl. [`LockError::WrongRuntime`].
    ///
    /// # Cancel safety
    /// Dropping the future leaves the manager shut down; releases cut short go on in the
    /// background, and the ttl frees whatever they do not.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockError, LockManager};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let held = locks.lock("import").await?;
    /// drop(locks.lock("export").await?); // released in the background
    /// locks.shutdown(Duration::from_secs(5)).await?; // on the way out
    /// assert!(!held.is_held());
    /// assert!(matches!(locks.lock("import").await, Err(LockError::ShutDown)));
    /// # Ok(()) }
    /// ```
    pub async fn shutdown(&self, within: Duration) -> Result<(), LockError> {
        self.on_runtime()?;
        let shared = &self.0.shared;
        if !shared.close() {
            return Ok(());
        }
        let leases = shared.leases();
        let released =
            futures_util::future::join_all(leases.iter().map(|lease| self.release_lease(lease)));
        let done = async {
            let results = released.await;
            shared.drained().await;
            shared.backend.settled().await;
            results
        };
        let results = tokio::time::timeout(within, done)
            .await
            .map_err(|_| LockError::timed_out("shutdown", within))?;
        tracing::debug!(
            target: "redlock",
            backend = self.backend_name(),
            locks = leases.len(),
            "lock manager shut down"
        );
        results
            .into_iter()
            .filter_map(Result::err)
            .find(|e| !matches!(e, LockError::NotHeld { .. } | LockError::Lost { .. }))
            .map_or(Ok(()), Err)
    }
}
