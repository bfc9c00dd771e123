//! The manager's one background task: the watchdog and the background releases.
//!
//! It renews every held lock at about ttl/3, batching all renewals that are due within
//! the next ttl/6 into one backend call (one round trip per node, whatever the number
//! of locks), and declares a lock lost when the server no longer has its token or its
//! deadline passes without a successful renewal. It also performs the releases handed
//! over by dropped guards and cancelled acquisitions, and drops channel interest when a
//! key's local queue empties. It ends when the manager and every guard are gone.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, Notify, OwnedMutexGuard};
use tracing::Instrument;

use crate::backend::{Backend, Renewal, Renewed};
use crate::key::LockKey;
use crate::lease::{self, Lease};
use crate::token::Token;
use crate::waiters::Waiters;

/// Work handed to the task.
pub(crate) enum Job {
    /// Release a lock whose guard was dropped.
    Release(Arc<Lease>),
    /// Release whatever an abandoned or failed acquisition may have taken.
    Abandon(LockKey, Token),
    /// The local queue of this key emptied: drop its channel interest.
    Unsubscribe(String),
}

/// What the manager and its task share.
pub(crate) struct Shared {
    pub(crate) backend: Backend,
    pub(crate) waiters: Arc<Waiters>,
    leases: Mutex<HashMap<u64, Arc<Lease>>>,
    changed: Notify,
    planned_wake: AtomicU64,
    /// The longest the task sleeps with nothing due.
    idle: Duration,
}

/// Bounds of [`Shared::idle`].
const MIN_IDLE: Duration = Duration::from_secs(1);
const MAX_IDLE: Duration = Duration::from_secs(3600);

impl Shared {
    /// With nothing due the task still wakes every renewal period of a lock with the
    /// manager's default ttl (at least 1 s apart): a lock with that ttl or longer is then
    /// always renewed in time without waking the task when it is taken. (Waking it on
    /// every acquisition costs a cross-thread wake-up, a third of the client's CPU time
    /// per uncontended lock.)
    pub(crate) fn new(backend: Backend, waiters: Arc<Waiters>, default_ttl: Duration) -> Self {
        Self {
            backend,
            waiters,
            leases: Mutex::new(HashMap::new()),
            changed: Notify::new(),
            planned_wake: AtomicU64::new(u64::MAX),
            idle: (default_ttl / 3).clamp(MIN_IDLE, MAX_IDLE),
        }
    }

    fn leases(&self) -> MutexGuard<'_, HashMap<u64, Arc<Lease>>> {
        self.leases.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts a lease under the watchdog.
    pub(crate) fn watch(&self, lease: &Arc<Lease>) {
        self.leases().insert(lease.id, lease.clone());
        self.reschedule(lease.next_renewal());
    }

    /// Wakes the task if something is due at `at`, before it planned to wake (or while
    /// it is scanning, when its plan is not known yet).
    pub(crate) fn reschedule(&self, at: u64) {
        if at < self.planned_wake.load(Ordering::Acquire) {
            self.changed.notify_one();
        }
    }

    /// Takes a lease from the watchdog.
    pub(crate) fn unwatch(&self, id: u64) {
        self.leases().remove(&id);
    }

    /// Number of leases under the watchdog.
    pub(crate) fn watched(&self) -> usize {
        self.leases().len()
    }

    /// Marks overdue leases lost, picks those due for renewal (unless a batch is in
    /// flight), each with its operation lock taken, and returns when to look again.
    ///
    /// While it scans, the planned wake-up reads as "unknown" (`u64::MAX`), so a lease
    /// [`watch`](Self::watch)ed meanwhile always wakes the task for another look.
    fn scan(&self, now: u64, pick: bool) -> (Vec<Due>, u64) {
        self.planned_wake.store(u64::MAX, Ordering::Release);
        let mut due = Vec::new();
        let mut next = now.saturating_add(lease::nanos(self.idle));
        self.leases().retain(|_, l| {
            if !l.is_active() {
                return false;
            }
            if now >= l.deadline() {
                l.mark_lost("the lease deadline passed without a successful renewal");
                return false;
            }
            next = next.min(l.deadline());
            // While a batch is in flight only deadlines matter.
            if !pick {
                return true;
            }
            let slack = lease::nanos(l.ttl() / 6);
            if l.next_renewal() > now.saturating_add(slack) {
                next = next.min(l.next_renewal());
            } else if let Ok(op) = l.op.clone().try_lock_owned() {
                due.push(Due {
                    ttl: l.ttl(),
                    lease: l.clone(),
                    _op: op,
                });
            }
            // else: an extend is in flight; it reschedules the task when it is booked.
            true
        });
        (due, next)
    }
}

/// A lease picked for renewal: the ttl the renewal carries, read with its operation lock
/// held, and that lock, held until the outcome is booked.
struct Due {
    lease: Arc<Lease>,
    ttl: Duration,
    _op: OwnedMutexGuard<()>,
}

type Work = Pin<Box<dyn Future<Output = bool> + Send>>;

/// The task body. `true` from a work item means "a renewal batch finished".
pub(crate) async fn run(shared: Arc<Shared>, mut jobs: mpsc::UnboundedReceiver<Job>) {
    let mut work: FuturesUnordered<Work> = FuturesUnordered::new();
    let mut renewing = false;
    let mut open = true;
    // Bounded by the manager's lifetime: ends once every sender is gone and work drained.
    while open || !work.is_empty() {
        let (due, next) = shared.scan(lease::now(), !renewing);
        if !due.is_empty() {
            renewing = true;
            work.push(Box::pin(renew(shared.clone(), due)));
            continue;
        }
        shared.planned_wake.store(next, Ordering::Release);
        tokio::select! {
            job = jobs.recv(), if open => match job {
                Some(job) => work.push(Box::pin(handle(shared.clone(), job))),
                None => open = false,
            },
            Some(renewed) = work.next(), if !work.is_empty() => {
                if renewed {
                    renewing = false;
                }
            }
            () = tokio::time::sleep_until(lease::instant(next).into()) => {}
            () = shared.changed.notified() => {}
        }
    }
}

async fn handle(shared: Arc<Shared>, job: Job) -> bool {
    match job {
        Job::Release(lease) => release(&shared, &lease.key, lease.token).await,
        Job::Abandon(key, token) => release(&shared, &key, token).await,
        Job::Unsubscribe(key) => {
            if let Err(e) = shared.backend.unsubscribe(&key).await {
                tracing::debug!(key, error = %e, "unsubscribe failed");
            }
        }
    }
    false
}

/// Pauses between background release attempts: a dropped connection or a failover gets
/// a few seconds to recover before the ttl is left to free the lock.
const RELEASE_RETRIES: [Duration; 3] = [
    Duration::from_millis(200),
    Duration::from_millis(800),
    Duration::from_secs(2),
];

async fn release(shared: &Shared, key: &LockKey, token: Token) {
    for pause in std::iter::once(None).chain(RELEASE_RETRIES.map(Some)) {
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        let span = tracing::debug_span!(
            "redlock.release",
            key = key.full(),
            backend = shared.backend.name()
        );
        match shared.backend.release(key, token).instrument(span).await {
            Ok(true) => return shared.waiters.wake(key.full()),
            Ok(false) => return,
            Err(e) => tracing::debug!(key = key.full(), error = %e, "background release failed"),
        }
    }
    tracing::warn!(
        key = key.full(),
        "background release failed; the ttl will free the lock"
    );
}

async fn renew(shared: Arc<Shared>, due: Vec<Due>) -> bool {
    let sent = lease::now();
    let batch: Vec<Renewal<'_>> = due
        .iter()
        .map(|d| Renewal {
            key: &d.lease.key,
            token: d.lease.token,
            ttl: d.ttl,
        })
        .collect();
    let span = tracing::debug_span!(
        "redlock.renew",
        backend = shared.backend.name(),
        locks = batch.len()
    );
    let outcomes = match shared.backend.renew(&batch).instrument(span).await {
        Ok(outcomes) => outcomes,
        Err(e) => {
            tracing::warn!(locks = due.len(), error = %e, "lock renewal failed; retrying");
            vec![Renewed::Unknown; due.len()]
        }
    };
    let now = lease::now();
    // A missing outcome is unknown, like a failed call: retried soon.
    let outcomes = outcomes
        .into_iter()
        .chain(std::iter::repeat(Renewed::Unknown));
    for (d, outcome) in due.iter().zip(outcomes) {
        match outcome {
            Renewed::Yes => d.lease.confirmed(sent, d.ttl),
            Renewed::Lost => d
                .lease
                .mark_lost("the server no longer holds this lock's token"),
            Renewed::Unknown => {
                let retry = (d.ttl / 10).min(Duration::from_millis(500));
                d.lease.retry_at(now.saturating_add(lease::nanos(retry)));
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use std::sync::Weak;

    use futures_util::FutureExt;

    use super::*;
    use crate::backend::MemoryBackend;

    fn shared() -> Shared {
        let waiters = Arc::new(Waiters::new(1, Box::new(|_| {})));
        let backend = Backend::Memory(MemoryBackend::new(Weak::new()));
        Shared::new(backend, waiters, Duration::from_secs(30))
    }

    #[test]
    fn lease_watched_while_a_batch_is_built_keeps_its_first_renewal() {
        let shared = shared();
        let now = lease::now();
        // The previous round planned to wake now; this round scans and finds nothing...
        shared.planned_wake.store(now, Ordering::Release);
        let (due, _next) = shared.scan(now, true);
        assert!(due.is_empty());
        // ...while a lock whose first renewal is due long before the idle wake-up is
        // watched, before the round stores its plan.
        let key = LockKey::prefixed("lock:", "scan_race").unwrap();
        let lease = Arc::new(Lease::new(
            1,
            key,
            Token::random(),
            1,
            Duration::from_secs(3),
            now,
        ));
        shared.watch(&lease);
        assert!(
            shared.changed.notified().now_or_never().is_some(),
            "the task must look again before sleeping past the new lease's renewal"
        );
    }
}
