//! [`LockManager`]: the handle every lock goes through, and its public API.
//!
//! Split by concept: [`builder`] configures and connects one; [`acquire`] is the
//! acquire/wait algorithm; [`kinds`] the read/write, permit and several-keys API;
//! [`guard`] the guard and its operations on a held lease; [`state`] the core state
//! the handles, guards and background task share.

mod acquire;
mod builder;
mod guard;
mod kinds;
mod state;

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::backend::Seen;
use crate::key::LockKey;
use crate::kind::Mode;
use crate::options::Resolved;
use crate::watchdog::Job;
use crate::{LockError, LockInfo, LockOptions};

pub use builder::{
    LockManagerBuilder, DEFAULT_MAX_WAITERS_PER_KEY, DEFAULT_PREFIX, DEFAULT_SLOW_ACQUISITION,
    DEFAULT_TTL, DEFAULT_WAIT,
};
pub use guard::LockGuard;
pub(crate) use state::Shared;

/// Hands out distributed locks over one backend. Cheap to clone (an `Arc` inside); make
/// one per process and share it.
///
/// A manager belongs to the tokio runtime that built it: its background task and its
/// connections live there. Used from another runtime (or outside any), its operations
/// fail with [`LockError::WrongRuntime`]; build one manager per runtime.
///
/// # Behavior
/// - `lock` tries once at once; if the key is held it joins this process's FIFO queue
///   for the key. Only the queue's head contends on the backend; it is woken by the
///   release's notification, or by the holder's remaining ttl as a fallback timer.
/// - A single background task renews every held lock at ttl/3 in batches, performs the
///   releases of dropped guards, and ends with the manager.
/// - Redis connections reconnect by themselves; a failed request is a
///   [`LockError::Backend`] (or is retried within the `wait` budget while waiting).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), redlock::LockError> {
/// use std::time::Duration;
/// use redlock::{LockManager, LockOptions};
///
/// let locks = LockManager::builder()
///     .in_memory()                       // or .single("redis://127.0.0.1:6379")
///     .prefix("lock:")
///     .default_ttl(Duration::from_secs(30))
///     .build()
///     .await?;
/// let guard = locks.lock("buy_{42}").await?;
/// assert!(locks.try_lock("buy_{42}").await?.is_none());
/// drop(guard);
/// let guard = locks
///     .lock_with("buy_{42}", LockOptions::new().wait(Duration::from_secs(1)))
///     .await?;
/// # drop(guard);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockManager(Arc<Inner>);

struct Inner {
    /// The runtime that built the manager, where its task and connections live.
    runtime: tokio::runtime::Id,
    shared: Arc<Shared>,
    jobs: mpsc::UnboundedSender<Job>,
    prefix: String,
    default_ttl: Duration,
    default_wait: Duration,
    next_id: AtomicU64,
    /// Acquisitions slower than this are logged.
    slow_acquisition: Duration,
    /// Backend attempts made (for tests of how many a `lock` makes).
    #[cfg(test)]
    attempts: std::sync::atomic::AtomicUsize,
}

/// The manager `#[distributed_lock]` uses when no `manager =` is given.
static GLOBAL: RwLock<Option<LockManager>> = RwLock::new(None);

impl LockManager {
    /// A builder with the defaults: prefix `"lock:"`, ttl 30 s, wait 10 s, 1024 waiters
    /// per key, connect timeout 3 s.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// assert_eq!(locks.backend_name(), "memory");
    /// # Ok(()) }
    /// ```
    pub fn builder() -> LockManagerBuilder {
        LockManagerBuilder::default()
    }

    /// Connects to one Redis server with the defaults.
    ///
    /// # Errors
    /// As [`LockManagerBuilder::build`].
    ///
    /// # Cancel safety
    /// As [`build`](LockManagerBuilder::build).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::connect("redis://127.0.0.1:6379").await?;
    /// let guard = locks.lock("buy_{42}").await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::builder().single(url).build().await
    }

    /// Makes this the manager `#[distributed_lock]` uses when no `manager =` is given.
    /// A later call replaces it (calls already running keep the one they resolved); the
    /// replaced manager is dropped once nothing else holds it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// locks.clone().install_global();
    /// assert_eq!(LockManager::global().unwrap().backend_name(), "memory");
    /// # Ok(()) }
    /// ```
    pub fn install_global(self) {
        // Replaced under the lock, dropped after it.
        let _replaced = GLOBAL
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(self);
    }

    /// The manager installed by [`install_global`](Self::install_global), if any: a
    /// clone (an `Arc` inside) of the latest one.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// LockManager::builder().in_memory().build().await?.install_global();
    /// let locks = LockManager::global().expect("installed above");
    /// assert_eq!(locks.backend_name(), "memory");
    /// # Ok(()) }
    /// ```
    pub fn global() -> Option<LockManager> {
        GLOBAL
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The prefix put in front of every key.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// assert_eq!(locks.prefix(), "lock:");
    /// # Ok(()) }
    /// ```
    pub fn prefix(&self) -> &str {
        &self.0.prefix
    }

    /// The backend's name: `"memory"`, `"single"`, `"cluster"` or `"redlock"`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// assert_eq!(locks.backend_name(), "memory");
    /// # Ok(()) }
    /// ```
    pub fn backend_name(&self) -> &'static str {
        self.0.shared.backend.name()
    }

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
    /// [`lost`](LockGuard::lost) resolves). Returns whether a lock was there. Logged as a
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

    /// A string that starts with the prefix, for building a key in place.
    pub(crate) fn key_buffer(&self, capacity: usize) -> String {
        let mut s = String::with_capacity(self.0.prefix.len() + capacity);
        s.push_str(&self.0.prefix);
        s
    }

    /// Whether `other` is this manager or a clone of it: two managers built separately
    /// are different, even over the same Redis.
    pub(crate) fn same_as(&self, other: &LockManager) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Hands a job to the background task, counted until it is done (see
    /// [`shutdown`](Self::shutdown)).
    pub(crate) fn send_job(&self, job: Job) {
        let counted = job.is_counted();
        if counted {
            self.0.shared.job_sent();
        }
        if self.0.jobs.send(job).is_err() && counted {
            self.0.shared.job_done();
        }
    }

    /// Releases every lock this manager's guards hold and finishes the releases it was
    /// doing in the background (of guards dropped just before), within `within`: what
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

    /// `Err(ShutDown)` once [`shutdown`](Self::shutdown) ran; `Err(WrongRuntime)` unless
    /// called on the runtime that built the manager.
    pub(crate) fn check_runtime(&self) -> Result<(), LockError> {
        if self.0.shared.is_closed() {
            return Err(LockError::ShutDown);
        }
        self.on_runtime()
    }

    /// `Err(WrongRuntime)` unless called on the runtime that built the manager.
    fn on_runtime(&self) -> Result<(), LockError> {
        match tokio::runtime::Handle::try_current() {
            Ok(handle) if handle.id() == self.0.runtime => Ok(()),
            Ok(_) => Err(LockError::WrongRuntime {
                place: "from another runtime",
            }),
            Err(_) => Err(LockError::WrongRuntime {
                place: "outside any runtime",
            }),
        }
    }

    /// The options of an acquisition with the defaults applied, checked: every
    /// acquisition's options pass here (`lock_with`, the other kinds, `lock_all`, the
    /// macro), and its ttl through [`check_ttl`](Self::check_ttl)'s rule.
    pub(crate) fn resolve(&self, options: &LockOptions) -> Result<Resolved, LockError> {
        let shortest = self.0.shared.backend.min_ttl();
        options.resolve(self.0.default_ttl, self.0.default_wait, shortest)
    }

    /// Checks a ttl a request carries (`extend`) as [`resolve`](Self::resolve) checks an
    /// acquisition's: within the backend's shortest grantable ttl ..= 30 days.
    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<Duration, LockError> {
        crate::options::check_ttl(ttl, self.0.shared.backend.min_ttl())
    }
}

impl fmt::Debug for LockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockManager")
            .field("backend", &self.backend_name())
            .field("prefix", &self.0.prefix)
            .field("default_ttl", &self.0.default_ttl)
            .field("default_wait", &self.0.default_wait)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (issue 13, the seam): `install_global` leaked every manager it
    /// replaced (a `Box` never freed, behind an `AtomicPtr` read with `unsafe`).
    /// The only test of this crate that touches the global.
    #[tokio::test]
    async fn install_global_twice_drops_the_replaced_manager() {
        let first = LockManager::builder().in_memory().build().await.unwrap();
        let second = LockManager::builder().in_memory().build().await.unwrap();
        first.clone().install_global();
        assert!(LockManager::global().unwrap().same_as(&first));
        assert_eq!(
            Arc::strong_count(&first.0),
            2,
            "installed: ours and the global's"
        );
        second.clone().install_global();
        assert!(LockManager::global().unwrap().same_as(&second));
        assert_eq!(
            Arc::strong_count(&first.0),
            1,
            "the replaced manager leaked"
        );
        assert_eq!(Arc::strong_count(&second.0), 2);
        // Installing the installed one again keeps one reference, not two.
        second.clone().install_global();
        assert_eq!(Arc::strong_count(&second.0), 2);
        let guard = LockManager::global().unwrap().lock("k").await.unwrap();
        assert!(second.is_locked("k").await.unwrap());
        guard.release().await.unwrap();
    }
}
