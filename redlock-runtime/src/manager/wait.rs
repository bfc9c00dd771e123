//! Waiting for a held key: this process's queue for the key, and its head contending
//! until acquired or out of time — the subscription to the key's channel kept, a
//! writer's intent or a fair waiter's place carried, each attempt's outcome turned into
//! a pause. A fair lock's waiters are each a head: each keeps a place of its own in the
//! server's queue, and asks when a release names it (or its heartbeat is due).

use std::pin::{pin, Pin};
use std::time::{Duration, Instant};

use tokio::sync::futures::Notified;

use super::acquire::{retried_while_waiting, Carried, Outcome, Request};
use super::LockManager;
use crate::backend::jitter;
use crate::engine::{Armed, Job};
use crate::error::chain;
use crate::kind::Mode;
use crate::lease;
use crate::notify::Register;
use crate::waiters::{KeyQueue, Subscription};
use crate::wire::{Arrival, Intent, Purpose};
use crate::{LockError, LockGuard};

/// How often a head polls while it cannot hear releases.
const POLL_UNSUBSCRIBED: Duration = Duration::from_millis(100);
/// How long a head lets a key's channel go unheard before subscribing again.
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(1);
/// The longest pause between attempts that failed.
const MAX_RETRY_BACKOFF: Duration = Duration::from_millis(500);
/// How long a fair waiter's place in the server's queue lasts without another attempt:
/// the bound on how long a waiter that died, was cut off or was dropped without a word
/// holds up the queue (the server drops its place by its own clock).
pub(crate) const FAIR_PLACE_LASTS: Duration = Duration::from_secs(3);
/// How often a fair waiter asks while not called: its heartbeat, a third of
/// [`FAIR_PLACE_LASTS`], so one late or lost attempt does not cost its place.
const FAIR_HEARTBEAT: Duration = Duration::from_secs(1);

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
        let mut standing = self.standing(request);
        let waiters = &self.0.shared.waiters;
        let place = waiters
            .join(key.full())
            .ok_or_else(|| LockError::QueueFull {
                key: key.full().to_owned(),
            })?;
        let mut head = Head::new(self, *request, &place.queue, last_error);
        // A fair waiter is a head of its own: its place on the server orders it.
        let _turn = match standing.fair_waiter() {
            Some(_) => None,
            None => {
                let turn = place.queue.turn.acquire();
                let Ok(Ok(turn)) = tokio::time::timeout_at(head.deadline, turn).await else {
                    return Err(head.give_up());
                };
                Some(turn)
            }
        };
        // A fair waiter's arrival goes out before any subscription when nobody here
        // listens to the key yet: uncontended, it is granted with no `SUBSCRIBE` at all;
        // queued, it subscribes and asks once more before it pauses (a release in
        // between went unheard).
        let mut arriving =
            standing.fair_waiter().is_some() && !self.0.shared.backend.listening(key.full());
        loop {
            head.before_deadline()?;
            if std::mem::take(&mut arriving) {
                if let Some(guard) = head.arrive(&mut standing).await? {
                    return Ok(guard);
                }
                continue;
            }
            head.keep_subscription().await?;
            // Counted before listening: a call for anyone in between is then told
            // apart (and the attempt below sees what it announced anyway).
            let anyone = place.queue.calls_for_anyone();
            let mut notified = pin!(place.queue.wake.notified());
            notified.as_mut().enable();
            let carried = standing.carry(head.deadline);
            match head.attempt(carried).await? {
                Step::Acquired(guard) => {
                    standing.granted();
                    return Ok(guard);
                }
                Step::Pause(pause) => head.pause(notified, pause).await?,
                Step::Queued { pause, ticket } => {
                    standing.queued(ticket);
                    let called = standing.fair_waiter().map(|w| (w, anyone));
                    head.pause_until_called(notified, pause, called).await?;
                }
            }
        }
    }

    /// What the wait leaves on the server, not yet carried: a writer's intent, a fair
    /// waiter's place, or nothing (the other modes).
    fn standing<'a>(&'a self, request: &Request<'a>) -> Standing<impl FnOnce() + 'a> {
        let key = request.key;
        let waiter = getrandom::u64().unwrap_or_else(|_| lease::now());
        let mut carried = Carried::default();
        match request.mode {
            Mode::Exclusive => {
                carried.intent = Some(Intent {
                    waiter,
                    until: Duration::ZERO,
                });
            }
            Mode::Fair => {
                carried.arrival = Some(Arrival {
                    waiter,
                    ticket: 0,
                    heartbeat: FAIR_PLACE_LASTS,
                    bound: self.0.shared.waiters.max_per_key(),
                    purpose: Purpose::Acquire,
                });
            }
            Mode::Read | Mode::Permit(_) => return Standing::none(),
        }
        let withdraw = move || self.send_job(Job::Withdraw(key.clone(), waiter));
        Standing {
            carried,
            withdrawal: Some(Armed::disarmed(withdraw)),
        }
    }
}

/// How one round of a wait ended, when it did not end the wait with an error.
enum Step {
    /// The lock: the wait is over.
    Acquired(LockGuard),
    /// Held, or a failed request to try again: the longest pause before the next round.
    Pause(Duration),
    /// Not this fair waiter's turn: the longest pause before it asks again, and the
    /// ticket of its place.
    Queued { pause: Duration, ticket: u64 },
}

/// What a wait leaves on the server, one id for the whole wait: a writer's intent (it
/// keeps new readers out while the writer waits for the readers it found; see
/// [`Intent`]), or a fair waiter's place in the key's queue (see [`Arrival`]).
struct Standing<W: FnOnce()> {
    carried: Carried,
    /// Withdraws the intent or the place in the background when the wait ends without
    /// the lock (out of time, an error, its future dropped): left registered, an intent
    /// would keep new readers out for the rest of the writer's wait, and a place would
    /// hold up the queue until its heartbeat ran out. Armed once an attempt carrying it
    /// is sent (it may register it, even when its reply is lost); a grant withdraws it
    /// itself.
    withdrawal: Option<Armed<W>>,
}

impl<W: FnOnce()> Standing<W> {
    /// Nothing to leave on the server (a reader, a permit).
    fn none() -> Self {
        Self {
            carried: Carried::default(),
            withdrawal: None,
        }
    }

    /// A fair waiter's id.
    fn fair_waiter(&self) -> Option<u64> {
        self.carried.arrival.map(|a| a.waiter)
    }

    /// What the next attempt carries, an intent lasting to `deadline` (at least 1 ms);
    /// from now on it may be registered, so it is withdrawn if the wait ends without
    /// the lock.
    fn carry(&mut self, deadline: tokio::time::Instant) -> Carried {
        if let Some(intent) = &mut self.carried.intent {
            intent.until = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .max(Duration::from_millis(1));
        }
        if let Some(w) = &mut self.withdrawal {
            w.arm();
        }
        self.carried
    }

    /// The server gave the fair waiter's place `ticket`: later attempts carry it, so a
    /// place dropped meanwhile (a heartbeat that came late) comes back where it was.
    fn queued(&mut self, ticket: u64) {
        if let Some(arrival) = &mut self.carried.arrival {
            arrival.ticket = arrival.ticket.max(ticket);
        }
    }

    /// The lock was granted: the grant withdrew the intent or the place.
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
        // One head registers the queue's interest, though several fair ones may ask at
        // once; the others poll until it is heard (asking `Again` meanwhile could count
        // a second interest before the first is registered).
        if register == Register::New && !self.queue.claim_subscription() {
            return Ok(());
        }
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

    /// A fair waiter's first attempt, before it listens to the key: the lock, or
    /// `None` to go on at once (subscribing, then asking again) whatever it was told.
    async fn arrive<W: FnOnce()>(
        &mut self,
        standing: &mut Standing<W>,
    ) -> Result<Option<LockGuard>, LockError> {
        let carried = standing.carry(self.deadline);
        match self.attempt(carried).await? {
            Step::Acquired(guard) => {
                standing.granted();
                Ok(Some(guard))
            }
            Step::Queued { ticket, .. } => {
                standing.queued(ticket);
                Ok(None)
            }
            Step::Pause(_) => Ok(None),
        }
    }

    /// One attempt, carrying the writer's intent or the fair waiter's place if any: the
    /// lock, the pause before the next round, or the error that ends the wait.
    async fn attempt(&mut self, carried: Carried) -> Result<Step, LockError> {
        match self.manager.bounded_attempt(&self.request, carried).await {
            Ok(Outcome::Acquired(guard)) => Ok(Step::Acquired(guard)),
            Ok(Outcome::Held(remaining)) => Ok(Step::Pause(self.pause_after_held(remaining))),
            Ok(Outcome::Queued { remaining, ticket }) => {
                // Its heartbeat is due by then, whoever holds the key.
                let pause = self.pause_after_held(remaining).min(FAIR_HEARTBEAT);
                Ok(Step::Queued { pause, ticket })
            }
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

    /// As [`pause`](Self::pause), but for a fair waiter (`called`: its id, and the
    /// count of wake-ups for anyone before the attempt) only a wake-up that calls it
    /// ends the pause early: a fair lock's release names the one waiter whose turn it is.
    async fn pause_until_called(
        &mut self,
        mut notified: Pin<&mut Notified<'a>>,
        pause: Duration,
        called: Option<(u64, u64)>,
    ) -> Result<(), LockError> {
        let Some((waiter, anyone)) = called else {
            return self.pause(notified, pause).await;
        };
        let until = (tokio::time::Instant::now() + pause).min(self.deadline);
        loop {
            let now = tokio::time::Instant::now();
            if now >= self.deadline {
                return Err(self.give_up());
            }
            if now >= until {
                return Ok(());
            }
            tokio::select! {
                () = notified.as_mut() => {}
                () = tokio::time::sleep_until(until) => return Ok(()),
            }
            if self.queue.called(waiter, anyone) {
                return Ok(());
            }
            // Someone else's call: listen again.
            notified.set(self.queue.wake.notified());
            notified.as_mut().enable();
            if self.queue.called(waiter, anyone) {
                return Ok(());
            }
        }
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
