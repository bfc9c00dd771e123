//! The manager's one background task: the watchdog and the background releases.
//!
//! It renews every held lock at about ttl/3, batching all renewals that are due within
//! the next ttl/6 into one backend call (one round trip per node, whatever the number
//! of locks), and declares a lock lost when the server no longer has its token or its
//! deadline passes without a successful renewal. It also performs the releases handed
//! over by dropped guards and cancelled acquisitions, and drops channel interest when a
//! key's local queue empties. It ends when the manager and every guard are gone.
//!
//! The task works on the manager's [`Shared`] state; the [`Watchdog`] part of it is
//! here. Leases are kept in a [`Schedule`] ordered by when each needs the task, so a tick
//! looks at the leases that are due and no others: taking, releasing and renewing a
//! lock cost O(log n) in the number of locks held, and a tick O(due · log n).

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, Notify, OwnedMutexGuard};
use tracing::Instrument;

use super::{path, Shared};
use crate::error::chain;
use crate::key::LockKey;
use crate::kind::Mode;
use crate::lease::{self, Lease};
use crate::stats::{self, Loss, Renewing};
use crate::token::Token;
use crate::wire::Renewed;
use crate::wire::{LeaseRef, Renewal};

/// Work handed to the task.
pub(crate) enum Job {
    /// Release a lock whose guard was dropped.
    Release(Arc<Lease>),
    /// Release whatever an abandoned or failed acquisition may have taken.
    Abandon(LockKey, Token, Mode),
    /// A writer stopped waiting for the key without the lock: withdraw its intent.
    Withdraw(LockKey, u64),
    /// The local queue of this key emptied: drop its channel interest.
    Unsubscribe(String),
}

impl Job {
    /// Whether the job is counted as pending work that `shutdown` waits for (every job
    /// but an unsubscription, which frees nothing on the server).
    pub(crate) fn is_counted(&self) -> bool {
        !matches!(self, Self::Unsubscribe(_))
    }
}

/// Which of a [`Schedule`]'s two orders to look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    /// By when each lease's renewal may start.
    Ready,
    /// By when each lease needs the task (its deadline, or its renewal while a batch is
    /// in flight).
    Wake,
}

/// Whether a scan picks the leases due for renewal, or leaves them (a batch is in
/// flight: they wait for it, watched by their deadline).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Renewals {
    Pick,
    Wait,
}

/// The watchdog's schedule of held leases, and how the task is woken for it.
pub(crate) struct Watchdog {
    schedule: Mutex<Schedule>,
    changed: Notify,
    planned_wake: AtomicU64,
    /// The longest the task sleeps with nothing due.
    idle: Duration,
    /// Schedule entries the scans examined (for tests of what a tick costs).
    #[cfg(test)]
    examined: std::sync::atomic::AtomicUsize,
}

/// Bounds of [`Watchdog::idle`].
const MIN_IDLE: Duration = Duration::from_secs(1);
const MAX_IDLE: Duration = Duration::from_secs(3600);

/// The leases under the watchdog, ordered by when each one needs the task, so that a
/// tick examines the leases that are due and no others: every operation costs
/// O(log n) in the number of leases held, never O(n).
///
/// A lease *waiting* for its next renewal has two entries: in `wake` at its next renewal
/// (or its deadline, if earlier), when the task must wake for it, and in `ready` at its
/// next renewal − ttl/6, from when it may join a batch that another lease's renewal
/// starts (so renewals due close together share one round trip; the retry of a failed
/// renewal only from its retry instant). A lease *parked* —
/// in a batch in flight, skipped because an `extend` holds its operation lock, or due
/// while a batch is in flight — has only a `wake` entry, at its deadline. Whoever
/// changes a lease's times re-indexes it: the renewal that booked its outcome, or the
/// `extend` (through [`Shared::reschedule`]). Entries are removed exactly when a lease
/// leaves (released, lost), so nothing accumulates.
#[derive(Default)]
struct Schedule {
    leases: HashMap<u64, Entry>,
    wake: BTreeSet<(u64, u64)>,
    ready: BTreeSet<(u64, u64)>,
}

/// A lease and the times it is filed under.
struct Entry {
    lease: Arc<Lease>,
    wake: u64,
    ready: Option<u64>,
    /// The instant a failed renewal is retried at, while that is still the lease's next
    /// renewal: a retry is not started early to join a batch (see [`Schedule::file`]).
    retry: Option<u64>,
}

/// When a lease waiting for its next renewal may join a batch.
fn ready_at(lease: &Lease) -> u64 {
    lease
        .next_renewal()
        .saturating_sub(lease::nanos(lease.ttl() / 6))
}

impl Schedule {
    /// Adds a lease, waiting for its first renewal.
    fn insert(&mut self, lease: &Arc<Lease>) {
        self.leases.entry(lease.id).or_insert_with(|| Entry {
            lease: lease.clone(),
            wake: u64::MAX,
            ready: None,
            retry: None,
        });
        self.file(lease);
    }

    /// Files a lease as waiting, at its current times (unless it left the schedule).
    ///
    /// A lease whose failed renewal is to be retried ([`retry`](Self::retry)) may join
    /// a batch only from the retry instant itself, not ttl/6 before it: the retry pause
    /// (at most ttl/10) is shorter than that slack, so the retry would otherwise be
    /// ready at once and a fast-failing backend renewed back to back.
    fn file(&mut self, lease: &Lease) {
        let Some(entry) = self.leases.get_mut(&lease.id) else {
            return;
        };
        let next = lease.next_renewal();
        let ready = if entry.retry == Some(next) {
            next
        } else {
            // Confirmed, or moved by an extend, since the retry was booked.
            entry.retry = None;
            ready_at(lease)
        };
        self.set(lease.id, next.min(lease.deadline()), Some(ready));
    }

    /// Files a lease whose renewal failed, to be retried at `at` (its next renewal).
    fn retry(&mut self, lease: &Lease, at: u64) {
        lease.retry_at(at);
        if let Some(entry) = self.leases.get_mut(&lease.id) {
            entry.retry = Some(at);
        }
        self.file(lease);
    }

    /// Files a lease as parked: only its deadline wakes the task.
    fn park(&mut self, lease: &Lease) {
        self.set(lease.id, lease.deadline(), None);
    }

    /// Moves a lease's entries (unless it left the schedule).
    fn set(&mut self, id: u64, wake: u64, ready: Option<u64>) {
        let Some(entry) = self.leases.get_mut(&id) else {
            return;
        };
        if entry.wake != wake {
            self.wake.remove(&(entry.wake, id));
            self.wake.insert((wake, id));
            entry.wake = wake;
        }
        if entry.ready != ready {
            if let Some(at) = entry.ready {
                self.ready.remove(&(at, id));
            }
            if let Some(at) = ready {
                self.ready.insert((at, id));
            }
            entry.ready = ready;
        }
    }

    fn remove(&mut self, id: u64) {
        if let Some(entry) = self.leases.remove(&id) {
            self.wake.remove(&(entry.wake, id));
            if let Some(at) = entry.ready {
                self.ready.remove(&(at, id));
            }
        }
    }

    /// The lease of the first entry of `order` due at `now`. The entry stays until the
    /// caller files, parks or removes the lease.
    fn first_due(&mut self, now: u64, order: Order) -> Option<Arc<Lease>> {
        let set = match order {
            Order::Ready => &mut self.ready,
            Order::Wake => &mut self.wake,
        };
        // Every entry has its lease in `leases`; a stray one is dropped, never spun on.
        while let Some(&(at, id)) = set.first().filter(|&&(at, _)| at <= now) {
            match self.leases.get(&id) {
                Some(entry) => return Some(entry.lease.clone()),
                None => {
                    set.remove(&(at, id));
                }
            }
        }
        None
    }
}

impl Watchdog {
    /// With nothing due the task still wakes every renewal period of a lock with the
    /// manager's default ttl (at least 1 s apart): a lock with that ttl or longer is then
    /// always renewed in time without waking the task when it is taken. (Waking it on
    /// every acquisition costs a cross-thread wake-up, a third of the client's CPU time
    /// per uncontended lock.)
    pub(crate) fn new(default_ttl: Duration) -> Self {
        Self {
            schedule: Mutex::new(Schedule::default()),
            changed: Notify::new(),
            planned_wake: AtomicU64::new(u64::MAX),
            idle: (default_ttl / 3).clamp(MIN_IDLE, MAX_IDLE),
            #[cfg(test)]
            examined: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn schedule(&self) -> MutexGuard<'_, Schedule> {
        self.schedule.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts a lease under the watchdog.
    pub(crate) fn watch(&self, lease: &Arc<Lease>) {
        self.schedule().insert(lease);
        self.wake_for(lease);
    }

    /// Files a watched lease again at its current times, after an `extend` moved them
    /// (its deadline lowered before the request, its renewal moved by the outcome), and
    /// wakes the task if that is earlier than it planned to wake. A lease no longer
    /// watched is left alone.
    pub(crate) fn reschedule(&self, lease: &Lease) {
        self.schedule().file(lease);
        self.wake_for(lease);
    }

    /// Wakes the task if `lease` needs it before it planned to wake (or while it is
    /// scanning, when its plan is not known yet).
    fn wake_for(&self, lease: &Lease) {
        let at = lease.next_renewal().min(lease.deadline());
        if at < self.planned_wake.load(Ordering::Acquire) {
            self.changed.notify_one();
        }
    }

    /// Takes a lease from the watchdog.
    pub(crate) fn unwatch(&self, id: u64) {
        self.schedule().remove(id);
    }

    /// Number of leases under the watchdog.
    pub(crate) fn watched(&self) -> usize {
        self.schedule().leases.len()
    }

    /// Marks overdue leases lost, picks those due for renewal (with [`Renewals::Pick`]:
    /// not while a batch is in flight), each with its operation lock taken, and returns when to look again.
    /// Only the entries due at `now` are examined.
    ///
    /// While it scans, the planned wake-up reads as "unknown" (`u64::MAX`), so a lease
    /// [`watch`](Self::watch)ed meanwhile always wakes the task for another look.
    fn scan(&self, now: u64, renewals: Renewals) -> (Vec<Due>, u64) {
        self.planned_wake.store(u64::MAX, Ordering::Release);
        let mut due = Vec::new();
        let mut schedule = self.schedule();
        // Leases whose renewal may start now (while a batch is in flight, they wait).
        while let Some(l) = (renewals == Renewals::Pick)
            .then(|| schedule.first_due(now, Order::Ready))
            .flatten()
        {
            self.count_examined();
            if !self.still_watched(&mut schedule, &l, now) {
                continue;
            }
            if ready_at(&l) > now {
                // Its renewal moved later (an extend) since it was filed.
                schedule.file(&l);
            } else if let Ok(op) = l.op.clone().try_lock_owned() {
                schedule.park(&l);
                due.push(Due {
                    ttl: l.ttl(),
                    lease: l,
                    _op: op,
                });
            } else {
                // An extend is in flight; it files the lease again when it is booked.
                schedule.park(&l);
            }
        }
        // Leases that need the task: their deadline passed, or their renewal is due
        // while a batch is in flight (they wait in `ready`, watched by their deadline).
        while let Some(l) = schedule.first_due(now, Order::Wake) {
            self.count_examined();
            if !self.still_watched(&mut schedule, &l, now) {
                continue;
            }
            let waiting = schedule.leases.get(&l.id).and_then(|e| e.ready);
            if waiting.is_some() && l.next_renewal() > now {
                // Its renewal moved later (an extend) since it was filed.
                schedule.file(&l);
            } else {
                schedule.set(l.id, l.deadline(), waiting);
            }
        }
        let idle = now.saturating_add(lease::nanos(self.idle));
        let next = schedule.wake.first().map_or(idle, |&(at, _)| at.min(idle));
        (due, next)
    }

    /// Whether a lease taken from the schedule stays: not when it was released or lost,
    /// or its deadline passed (it is then marked lost).
    fn still_watched(&self, schedule: &mut Schedule, l: &Lease, now: u64) -> bool {
        if !l.is_active() {
            schedule.remove(l.id);
            return false;
        }
        if now >= l.deadline() {
            l.mark_lost(Loss::Expired);
            schedule.remove(l.id);
            return false;
        }
        true
    }

    #[cfg(test)]
    fn count_examined(&self) {
        self.examined.fetch_add(1, Ordering::Relaxed);
    }

    #[cfg(not(test))]
    fn count_examined(&self) {}
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
    // `Wait` while a renewal batch is in flight.
    let mut renewals = Renewals::Pick;
    let mut open = true;
    // Bounded by the manager's lifetime: ends once every sender is gone and work drained.
    while open || !work.is_empty() {
        let (due, next) = shared.watchdog.scan(lease::now(), renewals);
        if !due.is_empty() {
            renewals = Renewals::Wait;
            work.push(Box::pin(renew(shared.clone(), due)));
            continue;
        }
        shared.watchdog.planned_wake.store(next, Ordering::Release);
        tokio::select! {
            job = jobs.recv(), if open => match job {
                Some(job) => work.push(Box::pin(handle(shared.clone(), job))),
                None => open = false,
            },
            Some(renewed) = work.next(), if !work.is_empty() => {
                if renewed {
                    renewals = Renewals::Pick;
                }
            }
            () = tokio::time::sleep_until(lease::instant(next).into()) => {}
            () = shared.watchdog.changed.notified() => {}
        }
    }
}

async fn handle(shared: Arc<Shared>, job: Job) -> bool {
    let counted = job.is_counted();
    do_job(&shared, job).await;
    if counted {
        shared.job_done();
    }
    false
}

async fn do_job(shared: &Shared, job: Job) {
    match job {
        Job::Release(lease) => {
            let outcome = path::release_retrying(shared, lease.lease_ref(), || lease.keep()).await;
            path::book_release(shared, &lease, outcome);
        }
        Job::Abandon(key, token, mode) => {
            let lease = LeaseRef::new(&key, token, mode);
            path::release_retrying(shared, lease, || Duration::ZERO).await;
        }
        Job::Withdraw(key, waiter) => {
            if let Err(e) = shared.backend.withdraw(&key, waiter).await {
                tracing::debug!(
                    target: "redlock",
                    key = key.full(),
                    backend = shared.backend.name(),
                    error = %chain(&e),
                    "withdrawing a writer's intent failed; it runs out with the writer's wait"
                );
            }
        }
        Job::Unsubscribe(key) => {
            if let Err(e) = shared.backend.unsubscribe(&key).await {
                tracing::debug!(
                    target: "redlock",
                    key,
                    backend = shared.backend.name(),
                    error = %chain(&e),
                    "unsubscribe failed"
                );
            }
        }
    }
}

/// The keys of a renewal batch, for a log line: the first few, then how many more.
struct Keys<'a>(&'a [Due]);

impl std::fmt::Display for Keys<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const SHOWN: usize = 5;
        for (i, d) in self.0.iter().take(SHOWN).enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{}", d.lease.key.full())?;
        }
        if self.0.len() > SHOWN {
            write!(f, " and {} more", self.0.len() - SHOWN)?;
        }
        Ok(())
    }
}

async fn renew(shared: Arc<Shared>, due: Vec<Due>) -> bool {
    let sent = lease::now();
    let batch: Vec<Renewal<'_>> = due.iter().map(|d| d.lease.renewal(d.ttl)).collect();
    let span = tracing::debug_span!(target: "redlock", "redlock.renew", locks = batch.len());
    let outcomes = match shared.backend.renew(&batch).instrument(span).await {
        Ok(outcomes) => outcomes,
        Err(e) => {
            tracing::warn!(
                target: "redlock",
                keys = %Keys(&due),
                locks = due.len(),
                backend = shared.backend.name(),
                error = %chain(&e),
                "lock renewal failed; retrying"
            );
            vec![Renewed::Unknown; due.len()]
        }
    };
    book(&shared, &due, outcomes, sent, lease::now());
    true
}

/// Books a batch's outcomes (sent at `sent`, answered at `now`) and files each lease
/// again at its new times, with its operation lock still held: a lease released
/// meanwhile stays out, a lost one leaves at its next wake-up.
fn book(shared: &Shared, due: &[Due], outcomes: Vec<Renewed>, sent: u64, now: u64) {
    // A missing outcome is unknown, like a failed call: retried soon.
    let outcomes = outcomes
        .into_iter()
        .chain(std::iter::repeat(Renewed::Unknown));
    let mut schedule = shared.watchdog.schedule();
    for (d, outcome) in due.iter().zip(outcomes) {
        match outcome {
            Renewed::Yes => stats::renewal(Renewing::Renewed),
            Renewed::Lost => stats::renewal(Renewing::Lost),
            Renewed::Unknown => {
                stats::renewal(Renewing::Error);
                let retry = (d.ttl / 10).min(Duration::from_millis(500));
                schedule.retry(&d.lease, now.saturating_add(lease::nanos(retry)));
                continue;
            }
        }
        path::booked(&d.lease, sent, d.ttl, outcome);
        schedule.file(&d.lease);
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;
    use crate::backend::{Backend, MemoryBackend};
    use crate::waiters::Waiters;
    use crate::waiters::Wake;

    fn shared() -> Shared {
        let waiters = Arc::new(Waiters::new(1, Box::new(|_| {})));
        let backend = Backend::Memory(MemoryBackend::new(Wake::default()));
        Shared::new(backend, waiters, Duration::from_secs(30))
    }

    const MS: u64 = 1_000_000;
    /// A clock reading far from the epoch, so leases can be taken "in the past".
    const T0: u64 = 3_600_000 * MS;

    fn lease(id: u64, ttl_ms: u64, sent: u64) -> Arc<Lease> {
        let key = LockKey::prefixed("lock:", &format!("wd_{id}")).unwrap();
        Arc::new(Lease::new(
            id,
            key,
            Token::random(),
            1,
            Duration::from_millis(ttl_ms),
            sent,
        ))
    }

    fn examined(shared: &Shared) -> usize {
        shared.watchdog.examined.swap(0, Ordering::Relaxed)
    }

    fn ids(due: &[Due]) -> Vec<u64> {
        let mut ids: Vec<u64> = due.iter().map(|d| d.lease.id).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn lease_watched_while_a_batch_is_built_keeps_its_first_renewal() {
        let shared = shared();
        let now = lease::now();
        // The previous round planned to wake now; this round scans and finds nothing...
        shared.watchdog.planned_wake.store(now, Ordering::Release);
        let (due, _next) = shared.watchdog.scan(now, Renewals::Pick);
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
            shared.watchdog.changed.notified().now_or_never().is_some(),
            "the task must look again before sleeping past the new lease's renewal"
        );
    }

    /// Issue 12, item 5: every tick (and so every lock + drop, whose release job wakes
    /// the task) scanned every lease held.
    #[test]
    fn watchdog_tick_examines_only_due_leases() {
        let shared = shared();
        // 1 000 locks with a 1 h ttl, renewed in 20 min...
        for id in 0..1000 {
            shared.watch(&lease(id, 3_600_000, T0));
        }
        // ...and 3 with a 3 s ttl taken 2 s ago: due (their renewal was at 1 s).
        for id in 1000..1003 {
            shared.watch(&lease(id, 3000, T0 - 2000 * MS));
        }
        examined(&shared);
        let (due, next) = shared.watchdog.scan(T0, Renewals::Pick);
        assert_eq!(ids(&due), [1000, 1001, 1002]);
        let looked_at = examined(&shared);
        assert!(
            looked_at <= 2 * due.len(),
            "a tick with {} leases due examined {looked_at} of the 1 003 held",
            due.len()
        );
        // Nothing else is due before the in-flight leases' deadlines.
        assert_eq!(
            next,
            T0 - 2000 * MS + lease::nanos(Duration::from_millis(2968))
        );
        // Ticks with nothing due (a release job waking the task) examine nothing.
        for _ in 0..10 {
            let (none, _) = shared.watchdog.scan(T0 + MS, Renewals::Wait);
            assert!(none.is_empty());
        }
        assert_eq!(examined(&shared), 0, "idle ticks examined leases");
        book(&shared, &due, vec![Renewed::Yes; 3], T0, T0);
        assert_eq!(shared.watched(), 1003);
    }

    /// A lease due while its `extend` holds the operation lock is skipped, and renewed
    /// at the times the extend set once it is booked: earlier (a shrinking extend) or
    /// later (a growing one), whether or not the task saw the extend's reschedule.
    #[test]
    fn extend_moving_the_renewal_while_a_batch_is_built() {
        let shared = shared();
        let l = lease(1, 3000, T0);
        shared.watch(&l);
        let first = l.next_renewal();
        // An extend to 60 s is in flight when the renewal falls due: skipped, parked.
        let op = l.op.clone().try_lock_owned().unwrap();
        l.extending(first, Duration::from_secs(60));
        let (due, _) = shared.watchdog.scan(first, Renewals::Pick);
        assert!(due.is_empty(), "renewed while an extend was in flight");
        l.confirmed(first, Duration::from_secs(60));
        drop(op);
        // Until the extend files it again, only its deadline (now 60 s) wakes the task.
        let (due, next) = shared.watchdog.scan(first + 5000 * MS, Renewals::Pick);
        assert!(due.is_empty());
        assert_eq!(
            next,
            l.deadline()
                .min(first + 5000 * MS + lease::nanos(shared.watchdog.idle))
        );
        shared.reschedule(&l);
        // Renewed at ttl/3 (−ttl/6 slack) of the new ttl, not earlier.
        let (due, _) = shared.watchdog.scan(first + 9_000 * MS, Renewals::Pick);
        assert!(
            due.is_empty(),
            "renewed before the extended ttl asked for it"
        );
        let (due, _) = shared.watchdog.scan(first + 10_000 * MS, Renewals::Pick);
        assert_eq!(ids(&due), [1]);
        book(
            &shared,
            &due,
            vec![Renewed::Yes],
            first + 10_000 * MS,
            first + 10_000 * MS,
        );
        drop(due);

        // A shrinking extend moves the renewal earlier: found at the new time.
        let at = first + 10_000 * MS;
        let op = l.op.clone().try_lock_owned().unwrap();
        l.extending(at, Duration::from_millis(300));
        shared.reschedule(&l);
        l.confirmed(at, Duration::from_millis(300));
        drop(op);
        shared.reschedule(&l);
        let (due, next) = shared.watchdog.scan(at + 40 * MS, Renewals::Pick);
        assert!(due.is_empty());
        assert_eq!(next, at + 100 * MS);
        let (due, _) = shared.watchdog.scan(next, Renewals::Pick);
        assert_eq!(ids(&due), [1]);

        // A lease whose renewal moved later without being filed again (the window
        // between the extend's booking and its reschedule) is not renewed early.
        let m = lease(2, 3000, T0);
        shared.watch(&m);
        m.confirmed(T0 + 800 * MS, Duration::from_secs(3));
        let (due, _) = shared.watchdog.scan(T0 + 1000 * MS, Renewals::Pick);
        assert!(
            due.iter().all(|d| d.lease.id != 2),
            "renewed at its old time"
        );
        let (due, _) = shared.watchdog.scan(T0 + 1300 * MS, Renewals::Pick);
        assert!(due.iter().any(|d| d.lease.id == 2));
    }

    /// A lease due while a batch is in flight waits for the next pick, and is declared
    /// lost at its deadline if none comes.
    #[test]
    fn lease_due_while_a_batch_is_in_flight() {
        let shared = shared();
        let l = lease(1, 300, T0);
        shared.watch(&l);
        let (due, next) = shared.watchdog.scan(T0 + 100 * MS, Renewals::Wait);
        assert!(due.is_empty());
        assert_eq!(
            next,
            l.deadline(),
            "only its deadline matters while a batch flies"
        );
        let (due, _) = shared.watchdog.scan(T0 + 150 * MS, Renewals::Pick);
        assert_eq!(ids(&due), [1]);
        drop(due);
        let m = lease(2, 300, T0);
        shared.watch(&m);
        let (due, _) = shared.watchdog.scan(T0 + 100 * MS, Renewals::Wait);
        assert!(due.is_empty());
        let (due, _) = shared.watchdog.scan(m.deadline(), Renewals::Wait);
        assert!(due.is_empty());
        assert!(!m.is_active(), "the deadline passed without a renewal");
    }

    /// A lease released while its renewal is in flight is not filed again by the
    /// renewal's outcome, and leaves nothing behind.
    #[test]
    fn lease_released_while_its_renewal_is_in_flight() {
        let shared = Arc::new(shared());
        let l = lease(1, 3000, T0);
        shared.watch(&l);
        let (due, _) = shared.watchdog.scan(l.next_renewal(), Renewals::Pick);
        assert_eq!(ids(&due), [1]);
        assert!(l.mark_released().is_some());
        shared.unwatch(l.id);
        // The memory backend has no such lock: the outcome is "lost".
        assert!(renew(shared.clone(), due).now_or_never().is_some());
        let schedule = shared.watchdog.schedule();
        assert!(schedule.leases.is_empty() && schedule.wake.is_empty());
        assert!(schedule.ready.is_empty());
    }

    /// Review finding 7: a failed renewal was filed for its retry at
    /// `retry − ttl/6`, which is already past (the retry pause, min(ttl/10, 500 ms), is
    /// shorter than ttl/6), so against a backend that fails at once the watchdog renewed
    /// back to back. Over 1 s of a backend failing every call 1 ms after it is sent, a
    /// lock with a 30 s ttl is renewed about once per 500 ms pause.
    #[test]
    fn watchdog_failed_renewal_waits_for_its_retry_pause() {
        let shared = shared();
        let l = lease(1, 30_000, T0);
        shared.watch(&l);
        let start = l.next_renewal();
        let (mut now, mut calls, mut ticks) = (start, 0usize, 0usize);
        while now < start + 1000 * MS && ticks < 10_000 {
            ticks += 1;
            let (due, next) = shared.watchdog.scan(now, Renewals::Pick);
            if due.is_empty() {
                assert!(next > now);
                now = next;
                continue;
            }
            calls += 1;
            // The call fails 1 ms after it was sent; the task scans again at once.
            now += MS;
            book(
                &shared,
                &due,
                vec![Renewed::Unknown; due.len()],
                now - MS,
                now,
            );
        }
        assert!(l.is_active());
        assert!(
            calls <= 3,
            "{calls} renewals in 1 s of a failing backend (retry pause 500 ms)"
        );
        // The retry does happen, at its instant; once it succeeds the lease is back on
        // the ttl/3 schedule, ready ttl/6 early to join another lease's batch.
        let at = l.next_renewal();
        let (due, _) = shared.watchdog.scan(at, Renewals::Pick);
        assert_eq!(ids(&due), [1]);
        book(&shared, &due, vec![Renewed::Yes], at, at);
        drop(due);
        let m = lease(2, 30_000, at);
        shared.watch(&m);
        let (due, _) = shared.watchdog.scan(at + 5000 * MS, Renewals::Pick);
        assert_eq!(ids(&due), [1, 2]);
    }

    /// 100 000 leases with mixed ttls, simulated over 4 s of ticks at the times the
    /// watchdog plans: none is ever renewed late or lost, and the work is proportional
    /// to the renewals made, not to the leases held.
    #[test]
    fn many_leases_with_mixed_ttls_are_renewed_in_time() {
        let shared = shared();
        let mut leases = Vec::new();
        for id in 0..100_000u64 {
            let ttl_ms = match id % 100 {
                0 => 100,
                1..10 => 1000,
                10..50 => 10_000,
                _ => 3_600_000,
            };
            let sent = T0 - (id * 7919 % (ttl_ms / 4)) * MS;
            let l = lease(id, ttl_ms, sent);
            shared.watch(&l);
            leases.push(l);
        }
        examined(&shared);
        let (mut now, mut renewals, mut ticks) = (T0, 0usize, 0usize);
        while now < T0 + 4000 * MS && ticks < 100_000 {
            ticks += 1;
            let (due, next) = shared.watchdog.scan(now, Renewals::Pick);
            if due.is_empty() {
                assert!(next > now);
                now = next;
                continue;
            }
            for d in &due {
                let l = &d.lease;
                assert!(now <= l.next_renewal(), "lease {} renewed late", l.id);
            }
            renewals += due.len();
            // Answered at once; the task scans again when the batch is booked.
            book(&shared, &due, vec![Renewed::Yes; due.len()], now, now);
        }
        assert!(leases.iter().all(|l| l.is_active()), "a lease was lost");
        assert_eq!(shared.watched(), 100_000);
        let looked_at = examined(&shared);
        assert!(
            renewals > 10_000,
            "only {renewals} renewals in {ticks} ticks"
        );
        assert!(
            looked_at <= 2 * renewals,
            "{looked_at} entries examined for {renewals} renewals in {ticks} ticks"
        );
    }
}
