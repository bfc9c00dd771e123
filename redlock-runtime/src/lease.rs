//! The shared state of one held lock: what the guard, the manager and the watchdog
//! agree on.
//!
//! Times are nanoseconds on a process-wide monotonic clock. The *deadline* is the last
//! instant the lock is known to be ours: the start of the request that acquired or last
//! renewed it, plus the ttl *that request carried*, minus a clock-drift allowance (1 % of
//! the ttl + 2 ms), so a holder gives the lock up before any server could let someone
//! else take it.
//!
//! # Keeping the deadline at or before the server's expiry
//! Each request that sets the expiry (acquire, extend, renewal) makes the server's expiry
//! `applied + ttl`, where `applied` is some instant after `sent`. The rules:
//! - **One request in flight per lease.** Extends and renewals of a lease take its
//!   [`Lease::op`] lock and hold it until their outcome is booked or given up, so the
//!   server applies them in the order they were booked: a renewal built before an
//!   extend can never land after it unnoticed. (On one connection requests are applied
//!   in the order they were sent, so a request given up on, whose reply was lost, is
//!   still applied before any later one.) Redlock's extend returns once a quorum
//!   decided, releasing the lock while other nodes' requests may still be written; the
//!   backend keeps those in order itself (the next extend waits for them, and renewals,
//!   carrying the same ttl, are harmless): see `RedlockBackend::settle`.
//! - **Book what was sent.** A confirmed request moves the deadline to
//!   `sent + ttl_sent − drift`, computed from the ttl in that request, never from the
//!   lease's current ttl.
//! - **Lower before sending, raise only on success.** An extend first makes its ttl the
//!   lease's ttl (later renewals carry it) and lowers the deadline to
//!   `min(deadline, sent + ttl − drift)`; only its confirmation may raise it. A shrinking
//!   extend that fails, times out or is cancelled therefore never leaves a long deadline
//!   behind, and if it is applied late, the expiry it sets is still after the booked one.

use std::future::Future as _;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::key::LockKey;
use crate::kind::Mode;
use crate::stats::{self, Hold, Loss, Release};
use crate::token::Token;
use crate::wire::{LeaseRef, Renewal, ReplicaWait};

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Now, in nanoseconds since the process-wide epoch.
pub(crate) fn now() -> u64 {
    nanos(EPOCH.elapsed())
}

/// The `Instant` of a clock reading.
pub(crate) fn instant(at: u64) -> Instant {
    *EPOCH + Duration::from_nanos(at)
}

pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// How much earlier than its ttl a holder considers its lock gone.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The last instant a lock is ours after a request that carried `ttl` was sent at `sent`.
fn valid_until(sent: u64, ttl: Duration) -> u64 {
    sent.saturating_add(nanos(ttl.saturating_sub(drift(ttl))))
}

const HELD: u8 = 0;
const LOST: u8 = 1;
const RELEASED: u8 = 2;

/// One acquired lock.
#[derive(Debug)]
pub(crate) struct Lease {
    pub(crate) id: u64,
    pub(crate) key: LockKey,
    pub(crate) token: Token,
    pub(crate) fence: u64,
    /// What was acquired: the key alone, or a reader's or permit holder's place.
    pub(crate) mode: Mode,
    /// The replicas every expiry-setting request of the lease waits for
    /// (`min_replicas`): carried by [`lease_ref`](Self::lease_ref), so by every request.
    pub(crate) replicas: Option<ReplicaWait>,
    /// Until when the key is kept after a release (`hold_at_least`), in [`now`]'s
    /// nanoseconds; 0 for none.
    hold_until: AtomicU64,
    ttl: AtomicU64,
    deadline: AtomicU64,
    next_renewal: AtomicU64,
    state: AtomicU8,
    lost: CancellationToken,
    /// Held by the one extend or renewal of this lease in flight.
    pub(crate) op: Arc<Mutex<()>>,
    /// The backend's name, for logs.
    pub(crate) backend: &'static str,
    /// The metrics of this grant (nothing without the feature).
    hold: Hold,
}

impl Lease {
    /// Books how a release of this lease ended: the metrics' count, and a debug line
    /// with the key, kind, fencing token and outcome.
    pub(crate) fn book_release(&self, backend: &'static str, outcome: Release) {
        stats::release(outcome);
        tracing::debug!(
            target: "redlock",
            key = self.key.full(),
            kind = %self.mode.kind(),
            backend,
            fencing_token = self.fence,
            outcome = outcome.name(),
            "lock released"
        );
    }

    /// A lease acquired by a request sent at `sent`.
    pub(crate) fn new(
        id: u64,
        key: LockKey,
        token: Token,
        fence: u64,
        ttl: Duration,
        sent: u64,
    ) -> Self {
        let lease = Self {
            id,
            key,
            token,
            fence,
            mode: Mode::Exclusive,
            replicas: None,
            hold_until: AtomicU64::new(0),
            ttl: AtomicU64::new(nanos(ttl)),
            deadline: AtomicU64::new(0),
            next_renewal: AtomicU64::new(0),
            state: AtomicU8::new(HELD),
            lost: CancellationToken::new(),
            op: Arc::new(Mutex::new(())),
            backend: "",
            hold: Hold::none(),
        };
        lease.confirmed(sent, ttl);
        lease
    }

    /// The lock as the backend's release and extends name it.
    pub(crate) fn lease_ref(&self) -> LeaseRef<'_> {
        LeaseRef {
            key: &self.key,
            token: self.token,
            mode: self.mode,
            replicas: self.replicas,
        }
    }

    /// The renewal of the lease carrying `ttl` (the watchdog's).
    pub(crate) fn renewal(&self, ttl: Duration) -> Renewal<'_> {
        let LeaseRef {
            key,
            token,
            mode,
            replicas,
        } = self.lease_ref();
        Renewal {
            key,
            token,
            ttl,
            mode,
            replicas,
        }
    }

    /// The lease of a grant whose expiry-setting requests wait for `replicas`.
    pub(crate) fn with_replicas(mut self, replicas: Option<ReplicaWait>) -> Self {
        self.replicas = replicas;
        self
    }

    /// A lease granted by `backend`, with the grant's metrics.
    pub(crate) fn observed(mut self, backend: &'static str, hold: Hold) -> Self {
        self.backend = backend;
        self.hold = hold;
        self
    }

    /// The lease of a grant in `mode`.
    pub(crate) fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Keeps the key until `hold` after now, when the grant's reply was just read: the
    /// server granted it before, so the key is kept at least `hold` after the grant.
    pub(crate) fn held_at_least(self, hold: Duration) -> Self {
        if !hold.is_zero() {
            self.hold_from(now(), hold);
        }
        self
    }

    /// [`held_at_least`](Self::held_at_least) on a lease already shared: `lock_all`
    /// sets it once every key is granted, so that the keys a failed call gives back are
    /// freed at once.
    pub(crate) fn hold_from(&self, received: u64, hold: Duration) {
        if !hold.is_zero() {
            self.hold_until
                .store(received.saturating_add(nanos(hold)), Ordering::Release);
        }
    }

    /// How much longer a release now must keep the key (`hold_at_least`).
    pub(crate) fn keep(&self) -> Duration {
        let until = self.hold_until.load(Ordering::Acquire);
        if until == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(until.saturating_sub(now()))
    }

    pub(crate) fn ttl(&self) -> Duration {
        Duration::from_nanos(self.ttl.load(Ordering::Acquire))
    }

    /// The last instant the lock is known to be ours.
    pub(crate) fn deadline(&self) -> u64 {
        self.deadline.load(Ordering::Acquire)
    }

    /// When the watchdog should renew next.
    pub(crate) fn next_renewal(&self) -> u64 {
        self.next_renewal.load(Ordering::Acquire)
    }

    /// Books a confirmed request (acquire, extend or renewal) that was sent at `sent`
    /// carrying `ttl`. Called with [`op`](Self::op) held (or before the lease is shared),
    /// so the last confirmation is the last request the server applied.
    pub(crate) fn confirmed(&self, sent: u64, ttl: Duration) {
        self.deadline
            .store(valid_until(sent, ttl), Ordering::Release);
        self.next_renewal
            .store(sent.saturating_add(nanos(ttl / 3)), Ordering::Release);
    }

    /// Prepares an extend to `ttl` about to be sent at `sent` (with [`op`](Self::op)
    /// held): later renewals carry the new ttl, and the deadline is lowered to what the
    /// extend alone would allow, so an extend that fails or is cancelled never leaves a
    /// longer deadline than the server's expiry.
    pub(crate) fn extending(&self, sent: u64, ttl: Duration) {
        self.ttl.store(nanos(ttl), Ordering::Release);
        self.deadline
            .fetch_min(valid_until(sent, ttl), Ordering::AcqRel);
        self.next_renewal
            .fetch_min(sent.saturating_add(nanos(ttl / 3)), Ordering::AcqRel);
    }

    /// Asks the watchdog to retry a failed renewal at `at`.
    pub(crate) fn retry_at(&self, at: u64) {
        self.next_renewal.store(at, Ordering::Release);
    }

    /// Held and within the deadline. Crossing the deadline marks the lease lost.
    pub(crate) fn is_held(&self) -> bool {
        if self.state.load(Ordering::Acquire) != HELD {
            return false;
        }
        if now() >= self.deadline() {
            self.mark_lost(Loss::Expired);
            return false;
        }
        true
    }

    /// Whether the lease is neither lost nor released (the deadline is not checked).
    pub(crate) fn is_active(&self) -> bool {
        self.state.load(Ordering::Acquire) == HELD
    }

    /// Declares the lock lost (once); wakes `lost()`.
    pub(crate) fn mark_lost(&self, loss: Loss) {
        if self
            .state
            .compare_exchange(HELD, LOST, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.hold.end();
            stats::lost(loss);
            tracing::warn!(
                target: "redlock",
                key = self.key.full(),
                backend = self.backend,
                fencing_token = self.fence,
                reason = loss.message(),
                "lock lost"
            );
            self.lost.cancel();
        }
    }

    /// Whether the lease was declared lost (before or after being released).
    pub(crate) fn was_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Marks the lease released; returns whether it was held (`Ok`) or lost (`Err`), or
    /// `None` when it was already released.
    pub(crate) fn mark_released(&self) -> Option<Result<(), ()>> {
        match self.state.swap(RELEASED, Ordering::AcqRel) {
            HELD => {
                self.hold.end();
                Some(Ok(()))
            }
            LOST => Some(Err(())),
            _ => None,
        }
    }

    /// Resolves once the lease is lost: the watchdog or a server said so, or the
    /// deadline passed.
    pub(crate) async fn lost(&self) {
        // Each round sleeps until the current deadline, which only moves forward. The
        // clock is also read at every poll: a task resumed after a pause (SIGSTOP, a
        // stalled runtime) sees the loss at its first poll, even before the expired timer
        // has been fired, so `select!`ing on this stops the other branch at its next await.
        loop {
            let mut sleep = pin!(tokio::time::sleep_until(instant(self.deadline()).into()));
            let mut cancelled = pin!(self.lost.cancelled());
            let over = std::future::poll_fn(|cx| {
                if cancelled.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(true);
                }
                if now() >= self.deadline() {
                    self.mark_lost(Loss::Expired);
                    return Poll::Ready(true);
                }
                sleep.as_mut().poll(cx).map(|()| false)
            })
            .await;
            if over {
                return;
            }
        }
    }
}

/// A lease still held when its last handle goes (the manager shut down before its
/// release) ends its hold for the metrics all the same.
impl Drop for Lease {
    fn drop(&mut self) {
        if *self.state.get_mut() == HELD {
            self.hold.end();
        }
    }
}

/// The deadline bookkeeping against a model of the server, under arbitrary interleavings.
///
/// The model follows the protocol of the `manager` and `watchdog` modules: one extend or
/// renewal of a lease in flight at a time (the [`Lease::op`] lock, held until the reply
/// is booked or the request given up), `extending` before an extend is sent, and
/// `confirmed` with the ttl the request carried. The server applies requests in the
/// order they were sent (one connection), each at any instant after it was sent; replies
/// may be lost and requests given up (a timeout, a cancelled caller) before or after the
/// server applied them. Whatever happens, a lease still held never has a deadline past
/// the server's expiry.
#[cfg(test)]
mod model {
    use std::collections::VecDeque;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Event {
        /// Time passes (milliseconds).
        Wait(u64),
        /// The user calls `extend` (ttl in milliseconds).
        Extend(u64),
        /// The watchdog renews.
        Renew,
        /// The server applies the oldest request not yet applied.
        Apply,
        /// The reply of the request in flight arrives (if it was applied).
        Reply,
        /// The client gives the request in flight up: timeout or cancellation.
        GiveUp,
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (1u64..700).prop_map(Event::Wait),
            (1u64..3000).prop_map(Event::Extend),
            Just(Event::Renew),
            Just(Event::Apply),
            Just(Event::Reply),
            Just(Event::GiveUp),
        ]
    }

    #[derive(Clone, Copy)]
    struct Request {
        id: u64,
        sent: u64,
        ttl: Duration,
    }

    const MS: u64 = 1_000_000;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        #[test]
        fn deadline_never_exceeds_the_server_expiry(
            ttl in 5u64..3000,
            events in prop::collection::vec(event(), 1..120),
        ) {
            let key = LockKey::prefixed("lock:", "model").unwrap();
            let ttl = Duration::from_millis(ttl);
            let mut now = 1_000 * MS;
            // The acquire was sent at `now` and applied at once.
            let lease = Lease::new(1, key, Token::random(), 1, ttl, now);
            let mut expiry = now + nanos(ttl);
            // Sent, not applied yet, in order.
            let mut wire: VecDeque<Request> = VecDeque::new();
            // Requests whose reply the client still awaits (the op lock allows one), and
            // the server's answer to every applied request.
            let mut flights: VecDeque<Request> = VecDeque::new();
            let mut answers: Vec<(u64, bool)> = Vec::new();
            let mut next_id = 0;
            for event in events {
                match event {
                    Event::Wait(ms) => now += ms * MS,
                    Event::Extend(_) | Event::Renew if !flights.is_empty() => {}
                    Event::Extend(ms) => {
                        let ttl = Duration::from_millis(ms);
                        lease.extending(now, ttl);
                        next_id += 1;
                        let r = Request { id: next_id, sent: now, ttl };
                        wire.push_back(r);
                        flights.push_back(r);
                    }
                    Event::Renew => {
                        next_id += 1;
                        let r = Request { id: next_id, sent: now, ttl: lease.ttl() };
                        wire.push_back(r);
                        flights.push_back(r);
                    }
                    Event::Apply => {
                        if let Some(r) = wire.pop_front() {
                            // Compare-token PEXPIRE: only while the key still exists.
                            let ours = now < expiry;
                            if ours {
                                expiry = now + nanos(r.ttl);
                            }
                            answers.push((r.id, ours));
                        }
                    }
                    Event::Reply => {
                        let answered = flights.front().and_then(|r| {
                            answers.iter().find(|(id, _)| *id == r.id).map(|&(_, ours)| (*r, ours))
                        });
                        if let Some((r, ours)) = answered {
                            if ours {
                                lease.confirmed(r.sent, r.ttl);
                            } else {
                                lease.mark_lost(Loss::Taken);
                            }
                            flights.pop_front();
                        }
                    }
                    Event::GiveUp => {
                        flights.pop_front();
                    }
                }
                if lease.is_active() {
                    prop_assert!(
                        lease.deadline() <= expiry,
                        "deadline {} ms past the server's expiry",
                        (lease.deadline() - expiry) / MS
                    );
                }
                // The watchdog's view: the deadline passing means lost.
                if now >= lease.deadline() {
                    lease.mark_lost(Loss::Expired);
                }
            }
        }
    }
}
