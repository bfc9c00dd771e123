//! [`Shared`]: the manager's core state, shared by its handles, its guards and its
//! background task.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::Backend;
use crate::lease::Lease;
use crate::waiters::Waiters;
use crate::watchdog::Watchdog;

/// What the manager's handles, guards and background task share: where locks live, this
/// process's waiters, and the watchdog's schedule.
pub(crate) struct Shared {
    pub(crate) backend: Backend,
    pub(crate) waiters: Arc<Waiters>,
    pub(crate) watchdog: Watchdog,
}

impl Shared {
    /// The state of a manager whose locks default to `default_ttl` (which sets how often
    /// an idle watchdog looks, see [`Watchdog::new`]).
    pub(crate) fn new(backend: Backend, waiters: Arc<Waiters>, default_ttl: Duration) -> Self {
        Self {
            backend,
            waiters,
            watchdog: Watchdog::new(default_ttl),
        }
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
