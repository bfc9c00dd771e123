//! [`Shared`]: the manager's core state, shared by its handles, its guards and its
//! background task.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use super::watchdog::Watchdog;
use crate::backend::Backend;
use crate::lease::Lease;
use crate::waiters::Waiters;

/// What the manager's handles, guards and background task share: where locks live, this
/// process's waiters, and the watchdog's schedule.
pub(crate) struct Shared {
    pub(crate) backend: Backend,
    pub(crate) waiters: Arc<Waiters>,
    pub(crate) watchdog: Watchdog,
    /// Every lease a guard of this manager holds (watched or not), for `shutdown`.
    held: Mutex<HashMap<u64, Weak<Lease>>>,
    /// Background releases and withdrawals sent to the task and not finished yet.
    pending: AtomicUsize,
    /// Told when `pending` drops to zero.
    drained: Notify,
    /// Set by `shutdown`: the manager takes no new work.
    closed: AtomicBool,
}

impl Shared {
    /// The state of a manager whose locks default to `default_ttl` (which sets how often
    /// an idle watchdog looks, see [`Watchdog::new`]).
    pub(crate) fn new(backend: Backend, waiters: Arc<Waiters>, default_ttl: Duration) -> Self {
        Self {
            backend,
            waiters,
            watchdog: Watchdog::new(default_ttl),
            held: Mutex::default(),
            pending: AtomicUsize::new(0),
            drained: Notify::new(),
            closed: AtomicBool::new(false),
        }
    }

    fn held(&self) -> MutexGuard<'_, HashMap<u64, Weak<Lease>>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a lease a guard now holds.
    pub(crate) fn hold(&self, lease: &Arc<Lease>) {
        self.held().insert(lease.id, Arc::downgrade(lease));
    }

    /// Forgets a lease released (or handed to the background task).
    pub(crate) fn let_go(&self, id: u64) {
        self.held().remove(&id);
    }

    /// The leases guards still hold.
    pub(crate) fn leases(&self) -> Vec<Arc<Lease>> {
        self.held().values().filter_map(Weak::upgrade).collect()
    }

    /// Counts a background job sent to the task.
    pub(crate) fn job_sent(&self) {
        self.pending.fetch_add(1, Ordering::AcqRel);
    }

    /// Counts a background job finished (or never delivered).
    pub(crate) fn job_done(&self) {
        if self.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.drained.notify_waiters();
        }
    }

    /// Returns once no background job is pending.
    pub(crate) async fn drained(&self) {
        loop {
            let told = self.drained.notified();
            if self.pending.load(Ordering::Acquire) == 0 {
                return;
            }
            told.await;
        }
    }

    /// Takes no new work from now on; whether it was open until now.
    pub(crate) fn close(&self) -> bool {
        !self.closed.swap(true, Ordering::AcqRel)
    }

    /// Whether `shutdown` closed the manager.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Puts a lease under the watchdog.
    pub(crate) fn watch(&self, lease: &Arc<Lease>) {
        self.watchdog.watch(lease);
    }

    /// Files a watched lease again after an `extend` moved its times (see
    /// [`Watchdog::reschedule`]).
    pub(crate) fn reschedule(&self, lease: &Lease) {
        self.watchdog.reschedule(lease);
    }

    /// Takes a lease from the watchdog.
    pub(crate) fn unwatch(&self, id: u64) {
        self.watchdog.unwatch(id);
    }

    /// Number of leases under the watchdog.
    pub(crate) fn watched(&self) -> usize {
        self.watchdog.watched()
    }
}
