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
use tokio::sync::{mpsc, Notify};
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
        if lease.next_renewal() < self.planned_wake.load(Ordering::Acquire) {
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
    /// flight) and returns when to look again.
    fn scan(&self, now: u64, pick: bool) -> (Vec<Arc<Lease>>, u64) {
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
            // While a batch is in flight only deadlines matter.
            if pick {
                let slack = lease::nanos(l.ttl() / 6);
                if l.next_renewal() <= now.saturating_add(slack) {
                    due.push(l.clone());
                } else {
                    next = next.min(l.next_renewal());
                }
            }
            next = next.min(l.deadline());
            true
        });
        (due, next)
    }
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

async fn renew(shared: Arc<Shared>, due: Vec<Arc<Lease>>) -> bool {
    let sent = lease::now();
    let batch: Vec<Renewal<'_>> = due
        .iter()
        .map(|l| Renewal {
            key: &l.key,
            token: l.token,
            ttl: l.ttl(),
        })
        .collect();
    let span = tracing::debug_span!(
        "redlock.renew",
        backend = shared.backend.name(),
        locks = batch.len()
    );
    match shared.backend.renew(&batch).instrument(span).await {
        Ok(outcomes) => {
            let now = lease::now();
            for (l, outcome) in due
                .iter()
                .zip(outcomes.into_iter().chain(std::iter::repeat(Renewed::Lost)))
            {
                match outcome {
                    Renewed::Yes => l.renewed(sent),
                    Renewed::Lost => l.mark_lost("the server no longer holds this lock's token"),
                    // Its node or slot did not answer: retry soon, like a failed batch.
                    Renewed::Unknown => {
                        let retry = (l.ttl() / 10).min(Duration::from_millis(500));
                        l.retry_at(now.saturating_add(lease::nanos(retry)));
                    }
                }
            }
        }
        Err(e) => {
            tracing::warn!(locks = due.len(), error = %e, "lock renewal failed; retrying");
            let now = lease::now();
            for l in &due {
                let retry = (l.ttl() / 10).min(Duration::from_millis(500));
                l.retry_at(now.saturating_add(lease::nanos(retry)));
            }
        }
    }
    true
}
