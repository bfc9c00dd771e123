//! The shared state of one held lock: what the guard, the manager and the watchdog
//! agree on.
//!
//! Times are nanoseconds on a process-wide monotonic clock. The *deadline* is the last
//! instant the lock is known to be ours: the start of the request that acquired or last
//! renewed it, plus its ttl, minus a clock-drift allowance (1 % of the ttl + 2 ms), so
//! a holder gives the lock up before any server could let someone else take it.

use std::future::Future as _;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::LazyLock;
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::key::LockKey;
use crate::token::Token;

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
    ttl: AtomicU64,
    deadline: AtomicU64,
    next_renewal: AtomicU64,
    state: AtomicU8,
    lost: CancellationToken,
}

impl Lease {
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
            ttl: AtomicU64::new(nanos(ttl)),
            deadline: AtomicU64::new(0),
            next_renewal: AtomicU64::new(0),
            state: AtomicU8::new(HELD),
            lost: CancellationToken::new(),
        };
        lease.renewed(sent);
        lease
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

    /// Records a successful renewal (or extension) whose request was sent at `sent`.
    pub(crate) fn renewed(&self, sent: u64) {
        let ttl = self.ttl();
        let validity = nanos(ttl.saturating_sub(drift(ttl)));
        self.deadline
            .fetch_max(sent.saturating_add(validity), Ordering::AcqRel);
        self.next_renewal
            .store(sent.saturating_add(nanos(ttl / 3)), Ordering::Release);
    }

    /// Records an extension to `ttl`, sent at `sent`: later renewals use the new ttl.
    pub(crate) fn extended(&self, ttl: Duration, sent: u64) {
        self.ttl.store(nanos(ttl), Ordering::Release);
        let validity = nanos(ttl.saturating_sub(drift(ttl)));
        self.deadline
            .store(sent.saturating_add(validity), Ordering::Release);
        self.next_renewal
            .store(sent.saturating_add(nanos(ttl / 3)), Ordering::Release);
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
            self.mark_lost("the lease deadline passed without a renewal");
            return false;
        }
        true
    }

    /// Whether the lease is neither lost nor released (the deadline is not checked).
    pub(crate) fn is_active(&self) -> bool {
        self.state.load(Ordering::Acquire) == HELD
    }

    /// Declares the lock lost (once); wakes `lost()`.
    pub(crate) fn mark_lost(&self, reason: &'static str) {
        if self
            .state
            .compare_exchange(HELD, LOST, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            tracing::warn!(
                key = self.key.full(),
                fencing_token = self.fence,
                reason,
                "lock lost"
            );
            self.lost.cancel();
        }
    }

    /// Marks the lease released; returns whether it was held (`Ok`) or lost (`Err`), or
    /// `None` when it was already released.
    pub(crate) fn mark_released(&self) -> Option<Result<(), ()>> {
        match self.state.swap(RELEASED, Ordering::AcqRel) {
            HELD => Some(Ok(())),
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
                    self.mark_lost("the lease deadline passed without a renewal");
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
