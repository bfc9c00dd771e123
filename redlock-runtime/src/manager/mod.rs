//! [`LockManager`]: the handle every lock goes through, and its public API.
//!
//! Split by concept: [`builder`] configures one; [`connect`] gets one (and the global
//! the macro uses); [`exclusive`] the exclusive lock; [`kinds`] the read/write, permit
//! and several-keys API; [`operations`] what operators and a process's exit ask of it
//! (inspect, list, force-unlock, shutdown); [`acquire`] is the attempt every kind goes
//! through and [`wait`] the wait for a held key; [`guard`] the guard and its operations
//! on a held lease, which go through the engine's one path per lease
//! (`engine::path`); [`multi_guard`] the guard of several keys; [`leader`] leader
//! election on the exclusive lock and [`leader_watch`] who leads now.
//!
//! The public methods live in the submodules `connect`, `exclusive`, `kinds`, `leader`,
//! `leader_watch` and `operations`, none in this file: rustdoc lists a type's methods module by module,
//! submodules in the order they are declared (alphabetical, as rustfmt keeps them),
//! which is the order a user learns them in (`tests/doc_conventions.rs` checks it).

mod acquire;
mod builder;
mod guard;
mod multi_guard;

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::engine::{Job, Shared};
use crate::options::Resolved;
use crate::{LockError, LockOptions};

pub use builder::{
    LockManagerBuilder, DEFAULT_MAX_WAITERS_PER_KEY, DEFAULT_PREFIX, DEFAULT_SLOW_ACQUISITION,
    DEFAULT_TTL, DEFAULT_WAIT,
};
pub use guard::LockGuard;
pub use leader::Leadership;
pub use leader_watch::{LeaderInfo, LeaderWatch};
pub use multi_guard::MultiGuard;

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

impl LockManager {
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

// The order the manager's documentation lists its methods in: see the module docs.
mod connect;
mod exclusive;
mod fair;
mod kinds;
mod leader;
mod leader_watch;
mod operations;
mod wait;

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
