//! Waiting for a held key: this process's queue for the key, and its head contending
//! until acquired or out of time — the subscription to the key's channel kept, a
//! writer's intent carried, each attempt's outcome turned into a pause.

use std::pin::{pin, Pin};
use std::time::{Duration, Instant};

use tokio::sync::futures::Notified;

use super::acquire::{retried_while_waiting, Outcome, Request};
use super::LockManager;
use crate::backend::jitter;
use crate::engine::{Armed, Job};
use crate::error::chain;
use crate::kind::Mode;
use crate::lease;
use crate::notify::Register;
use crate::waiters::{KeyQueue, Subscription};
use crate::wire::Intent;
use crate::{LockError, LockGuard};

/// How often a head polls while it cannot hear releases.
const POLL_UNSUBSCRIBED: Duration = Duration::from_millis(100);
/// How long a head lets a key's channel go unheard before subscribing again.
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(1);
/// The longest pause between attempts that failed.
const MAX_RETRY_BACKOFF: Duration = Duration::from_millis(500);

impl LockManager {
    /// Queues locally, then contends as the head until acquired or out of time. When
    /// the wait runs out, the last attempt's error is returned if it failed, else
    /// [`LockError::Timeout`].
    ///
    /// Each round ends in a wake-up, a timer or the deadline; the deadline ends the loop.
    /// Dropped at any `.await`, the wait leaves nothing behind, in this order: what a
    /// cut-short attempt may have taken is released, the head's turn passes on, the queue
    /// is left (the last one out drops the key's channel interest), and a writer's
    /// intent, if an attempt carried it, is withdrawn: the request awaited is dropped
    /// first, then the locals, in the reverse of the order they are declared in.
    pub(super) async fn wait_for(
        &self,
        request: &Request<'_>,
        last_error: Option<LockError>,
    ) -> Result<LockGuard, LockError> {
        let key = request.key;
        // Declared first: dropped (withdrawn, if armed) after the queue is left.
        let mut intent = self.writer_intent(request);
        let waiters = &self.0.shared.waiters;
        let place = waiters
            .join(key.full())
            .ok_or_else(|| LockError::QueueFull {
                key: key.full().to_owned(),
            })?;
        let mut head = Head::new(self, *request, &place.queue, last_error);
        let turn = place.queue.turn.acquire();
        let Ok(Ok(_turn)) = tokio::time::timeout_at(head.deadline, turn).await else {
            return Err(head.give_up());
        };
        loop {
            head.before_deadline()?;
            head.keep_subscription().await?;
            let mut notified = pin!(place.queue.wake.notified());
            notified.as_mut().enable();
            let carried = intent.carry(head.deadline);
            match head.attempt(carried).await? {
                Step::Acquired(guard) => {
                    intent.granted();
                    return Ok(guard);
                }
                Step::Pause(pause) => head.pause(notified, pause).await?,
            }
        }
    }

    /// The intent of a writer's wait (none for the other modes), not yet carried.
    fn writer_intent<'a>(&'a self, request: &Request<'a>) -> WriterIntent<impl FnOnce() + 'a> {
        let key = request.key;
        let intent = (request.mode == Mode::Exclusive).then(|| Intent {
            waiter: getrandom::u64().unwrap_or_else(|_| lease::now()),
            until: Duration::ZERO,
        });
        let withdrawal = intent
            .map(|i| Armed::disarmed(move || self.send_job(Job::Withdraw(key.clone(), i.waiter))));
        WriterIntent { intent, withdrawal }
    }
}

/// How one round of a wait ended, when it did not end the wait with an error.
enum Step {
    /// The lock: the wait is over.
    Acquired(LockGuard),
    /// Held, or a failed request to try again: the longest pause before the next round.
    Pause(Duration),
}

/// A writer's intent: it keeps new readers out while the writer waits for the readers
/// it found (one id for the whole wait; see [`Intent`]).
struct WriterIntent<W: FnOnce()> {
    intent: Option<Intent>,
    /// Withdraws the intent in the background when the wait ends without the lock (out
    /// of time, an error, its future dropped): left registered, it would keep new
    /// readers out for the rest of the writer's wait. Armed once an attempt carrying the
    /// intent is sent (it may register it, even when its reply is lost); a grant
    /// withdraws it itself.
    withdrawal: Option<Armed<W>>,
}

impl<W: FnOnce()> WriterIntent<W> {
    /// The intent the next attempt carries, lasting to `deadline` (at least 1 ms); from
    /// now on it may be registered, so it is withdrawn if the wait ends without the lock.
    fn carry(&mut self, deadline: tokio::time::Instant) -> Option<Intent> {
        if let Some(intent) = &mut self.intent {
            intent.until = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .max(Duration::from_millis(1));
        }
        if let Some(w) = &mut self.withdrawal {
            w.arm();
        }
        self.intent
    }

    /// The lock was granted: the grant withdrew the intent.
    fn granted(&mut self) {
        if let Some(w) = &mut self.withdrawal {
            w.disarm();
        }
    }
}

/// The head of this process's queue for a key, contending: what its rounds share.
struct Head<'a> {
    manager: &'a LockManager,
    request: Request<'a>,
    queue: &'a KeyQueue,
    deadline: tokio::time::Instant,
    /// The last attempt's error, while the last attempt failed.
    last_error: Option<LockError>,
    /// The pause after a failed attempt before its jitter, doubled per failure.
    backoff: Duration,
    /// When this head first saw the key's channel not listened to (or last asked).
    unheard_since: Option<Instant>,
    /// Whether this head asked for the key's channel yet.
    asked: bool,
}

/// A subscription to the key's channel that the head asks for.
struct Ask {
    /// Whether the queue's own interest is new (registered even in a channel listened to).
    register: Register,
    /// Asked before in this wait: a failure is then only logged at debug level.
    again: bool,
}

impl<'a> Head<'a> {
    /// The head of `queue` for `request`, after an initial attempt that ended in
    /// `last_error` (or found the key held).
    fn new(
        manager: &'a LockManager,
        request: Request<'a>,
        queue: &'a KeyQueue,
        last_error: Option<LockError>,
    ) -> Self {
        Self {
            manager,
            request,
            queue,
            deadline: tokio::time::Instant::from_std(request.opts.deadline),
            last_error,
            backoff: Duration::from_millis(10),
            unheard_since: None,
            asked: false,
        }
    }

    /// The error the wait ends with when it runs out: the last attempt's if it failed,
    /// else [`LockError::Timeout`].
    fn give_up(&mut self) -> LockError {
        self.last_error
            .take()
            .unwrap_or_else(|| LockError::Timeout {
                key: self.request.key.full().to_owned(),
            })
    }

    /// `Err` once the wait is over. No attempt starts then: the initial attempt (or the
    /// turn) may have run past the deadline already, and another one would take `lock`
    /// beyond its wait plus one request timeout.
    fn before_deadline(&mut self) -> Result<(), LockError> {
        if tokio::time::Instant::now() >= self.deadline {
            return Err(self.give_up());
        }
        Ok(())
    }

    /// Subscribes before the next attempt, so no release after it goes unnoticed (see
    /// [`ask_due`](Self::ask_due) for when). The queue owns its interest from before
    /// the request is sent: if this future is dropped or cut short mid-way, the channel
    /// is still unsubscribed when the queue empties. The wait bounds the subscription
    /// too. A subscription that fails leaves the head polling.
    async fn keep_subscription(&mut self) -> Result<(), LockError> {
        let Some(Ask { register, again }) = self.ask_due() else {
            return Ok(());
        };
        let (manager, key) = (self.manager, self.request.key.full());
        self.queue.set_subscription(Subscription::Asked);
        let subscribe = manager.0.shared.backend.subscribe(key, register);
        match tokio::time::timeout_at(self.deadline, subscribe).await {
            Err(_) => return Err(self.give_up()),
            Ok(Ok(())) => {
                self.queue.set_subscription(Subscription::Confirmed);
                // Heard from now on: a later loss (a reconnect) starts its own grace
                // period, in which the connection's resubscription can restore the
                // channel before this head asks again.
                self.unheard_since = None;
            }
            Ok(Err(e)) if again => {
                tracing::debug!(
                    target: "redlock",
                    key,
                    backend = manager.backend_name(),
                    error = %chain(&e),
                    "subscribing again failed; polling"
                );
            }
            Ok(Err(e)) => {
                tracing::warn!(
                    target: "redlock",
                    key,
                    backend = manager.backend_name(),
                    error = %chain(&e),
                    "no release notifications; polling"
                );
            }
        }
        Ok(())
    }

    /// Whether to ask for the key's channel now, booked as asked. A channel unheard for
    /// a while (a subscription that failed, or one lost with its connection and not
    /// restored by the connection's own resubscription) is asked for again; meanwhile
    /// the head polls.
    ///
    /// A queue without an interest of its own registers one even when the channel is
    /// listened to: that may be an earlier queue's interest, about to be dropped (and
    /// the channel unsubscribed). On a confirmed channel this only counts the interest,
    /// without a round trip.
    fn ask_due(&mut self) -> Option<Ask> {
        let backend = &self.manager.0.shared.backend;
        let unregistered =
            self.queue.subscription() == Subscription::None && backend.has_channels();
        if backend.listening(self.request.key.full()) && !unregistered {
            self.unheard_since = None;
            return None;
        }
        let now = Instant::now();
        let since = *self.unheard_since.get_or_insert(now);
        let due = unregistered || !self.asked || now.duration_since(since) >= RESUBSCRIBE_AFTER;
        if !due {
            return None;
        }
        let again = std::mem::replace(&mut self.asked, true);
        self.unheard_since = Some(now);
        let register = if unregistered {
            Register::New
        } else {
            Register::Again
        };
        Some(Ask { register, again })
    }

    /// One attempt, carrying the writer's intent if any: the lock, the pause before the
    /// next round, or the error that ends the wait.
    async fn attempt(&mut self, intent: Option<Intent>) -> Result<Step, LockError> {
        match self.manager.bounded_attempt(&self.request, intent).await {
            Ok(Outcome::Acquired(guard)) => Ok(Step::Acquired(guard)),
            Ok(Outcome::Held(remaining)) => Ok(Step::Pause(self.pause_after_held(remaining))),
            Err(e) if retried_while_waiting(&e) => Ok(Step::Pause(self.pause_after_failure(e))),
            Err(e) => Err(e),
        }
    }

    /// The pause after finding the key held: the holder's remaining ttl (1 s when not
    /// known) as the fallback to a wake-up, shorter while a release would go unheard.
    fn pause_after_held(&mut self, remaining: Option<Duration>) -> Duration {
        self.last_error = None;
        let fallback = remaining.unwrap_or(Duration::from_secs(1)) + Duration::from_millis(1);
        // Not listening (no subscription, or its connection dropped and it is not
        // restored yet): a release would go unheard, so poll.
        if (self.manager.0.shared.backend).listening(self.request.key.full()) {
            fallback
        } else {
            fallback.min(POLL_UNSUBSCRIBED)
        }
    }

    /// The pause after a failed request that is tried again: the backoff, doubled per
    /// failure, jittered.
    fn pause_after_failure(&mut self, e: LockError) -> Duration {
        tracing::debug!(
            target: "redlock",
            key = self.request.key.full(),
            backend = self.manager.backend_name(),
            error = %chain(&e),
            "acquire attempt failed; retrying"
        );
        self.last_error = Some(e);
        self.backoff = (self.backoff * 2).min(MAX_RETRY_BACKOFF);
        // Jittered, so managers that failed together do not retry together.
        self.backoff / 2 + jitter(self.backoff / 2)
    }

    /// Sleeps until a release is heard (`notified`, enabled before the attempt, so a
    /// release since then is not missed), `pause` passes or the wait is over; `Err` if
    /// it is over already.
    async fn pause(
        &mut self,
        notified: Pin<&mut Notified<'_>>,
        pause: Duration,
    ) -> Result<(), LockError> {
        let now = tokio::time::Instant::now();
        if now >= self.deadline {
            return Err(self.give_up());
        }
        tokio::select! {
            () = notified => {}
            () = tokio::time::sleep_until((now + pause).min(self.deadline)) => {}
        }
        Ok(())
    }
}
