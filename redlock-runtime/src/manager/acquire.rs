//! The acquire/wait algorithm: one attempt at the backend, and this process's queue
//! for a key with its head contending until acquired or out of time.

use std::pin::{pin, Pin};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::futures::Notified;
use tracing::Instrument;

use super::LockManager;
use crate::backend::{jitter, Attempt, Claim, Intent, Together};
use crate::engine::{Armed, Job};
use crate::error::chain;
use crate::key::LockKey;
use crate::kind::Mode;
use crate::lease::{self, Lease};
use crate::options::Resolved;
use crate::stats;
use crate::token::Token;
use crate::waiters::{KeyQueue, Subscription};
use crate::wire::{LeaseRef, ReplicaWait};
use crate::{LockError, LockGuard, LockKind, MultiGuard};

/// How often a head polls while it cannot hear releases.
const POLL_UNSUBSCRIBED: Duration = Duration::from_millis(100);
/// How long a head lets a key's channel go unheard before subscribing again.
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(1);
/// The longest pause between attempts that failed.
const MAX_RETRY_BACKOFF: Duration = Duration::from_millis(500);

/// Whether `lock` tries again after this error while it has wait budget left: a failed
/// request, or too few Redlock nodes answering in time (with a short ttl their timeout
/// is a few milliseconds, which one slow moment can miss). Anything else is the
/// answer.
fn retried_while_waiting(e: &LockError) -> bool {
    matches!(
        e,
        LockError::Backend { .. } | LockError::QuorumUnavailable { .. }
    )
}

/// One acquisition: what is asked for, and how.
#[derive(Clone, Copy)]
struct Request<'a> {
    key: &'a LockKey,
    mode: Mode,
    opts: &'a Resolved,
    replicas: Option<ReplicaWait>,
}

/// How an attempt ended when it did not fail.
enum Outcome {
    Acquired(LockGuard),
    Held(Option<Duration>),
}

impl LockManager {
    /// Acquires an already prefixed and validated key.
    pub(crate) async fn acquire(
        &self,
        key: LockKey,
        mode: Mode,
        opts: Resolved,
    ) -> Result<LockGuard, LockError> {
        self.check_runtime()?;
        let span = tracing::debug_span!(target: "redlock", "redlock.acquire");
        let started = Instant::now();
        let result = async {
            let replicas = (opts.min_replicas > 0).then(|| ReplicaWait {
                replicas: opts.min_replicas,
                timeout: opts.replica_wait(),
            });
            let request = Request {
                key: &key,
                mode,
                opts: &opts,
                replicas,
            };
            let mut first_error = None;
            if opts.wait.is_zero() || !self.0.shared.waiters.is_queued(key.full()) {
                match self.bounded_attempt(&request, None).await {
                    Ok(Outcome::Acquired(guard)) => return Ok(guard),
                    Ok(Outcome::Held(_)) if opts.wait.is_zero() => {
                        return Err(LockError::Timeout {
                            key: key.full().to_owned(),
                        })
                    }
                    // With time to wait, the wait loop tries again.
                    Ok(Outcome::Held(_)) => {}
                    Err(e) if retried_while_waiting(&e) && !opts.wait.is_zero() => {
                        first_error = Some(e);
                    }
                    Err(e) => return Err(e),
                }
            }
            let wait = tracing::debug_span!(target: "redlock", "redlock.wait");
            self.wait_for(&request, first_error).instrument(wait).await
        }
        .instrument(span.clone())
        .await;
        stats::acquisition(
            &result,
            mode.kind(),
            self.backend_name(),
            (&opts.name, opts.wait),
            started,
        );
        let waited = started.elapsed();
        let outcome = stats::outcome(&result, opts.wait.is_zero());
        match &result {
            Ok(guard) => {
                tracing::debug!(
                    target: "redlock",
                    parent: &span,
                    key = key.full(),
                    kind = %mode.kind(),
                    backend = self.backend_name(),
                    fencing_token = guard.fencing_token(),
                    outcome,
                    ?waited,
                    "lock acquired"
                );
                if waited > self.0.slow_acquisition {
                    tracing::info!(
                        target: "redlock",
                        parent: &span,
                        key = key.full(),
                        kind = %mode.kind(),
                        backend = self.backend_name(),
                        fencing_token = guard.fencing_token(),
                        ?waited,
                        "slow lock acquisition"
                    );
                }
            }
            Err(e) => tracing::debug!(
                target: "redlock",
                parent: &span,
                key = key.full(),
                kind = %mode.kind(),
                backend = self.backend_name(),
                outcome,
                error = %e,
                ?waited,
                "lock not acquired"
            ),
        }
        // Granted while `shutdown` ran: given back at once (in the background).
        match result {
            Ok(_) if self.0.shared.is_closed() => Err(LockError::ShutDown),
            result => result,
        }
    }

    /// Takes every key (sorted, distinct) exclusively: in one step where the backend
    /// can, else in rounds ([`acquire_rounds`](Self::acquire_rounds)) that never hold a
    /// key while waiting for another.
    pub(crate) async fn acquire_all(
        &self,
        keys: Vec<LockKey>,
        opts: Resolved,
    ) -> Result<MultiGuard, LockError> {
        self.check_runtime()?;
        // `WAIT` is sent per key, by the one-by-one path.
        if keys.len() > 1 && opts.min_replicas == 0 {
            let started = Instant::now();
            let together = self.acquire_together(&keys, &opts).await;
            // Counted per key granted, as the one-by-one path does; a failure once.
            match &together {
                Ok(Some(_)) => {
                    for _ in &keys {
                        let granted: Result<(), LockError> = Ok(());
                        stats::acquisition(
                            &granted,
                            LockKind::Exclusive,
                            self.backend_name(),
                            (&opts.name, opts.wait),
                            started,
                        );
                    }
                }
                Ok(None) => {}
                Err(_) if opts.wait.is_zero() => {
                    stats::acquisition(
                        &together,
                        LockKind::Exclusive,
                        self.backend_name(),
                        (&opts.name, opts.wait),
                        started,
                    );
                }
                Err(_) => {}
            }
            match together {
                Ok(Some(_)) if self.0.shared.is_closed() => return Err(LockError::ShutDown),
                Ok(Some(guards)) => return Ok(guards),
                Ok(None) => {}
                Err(e) if opts.wait.is_zero() => return Err(e),
                // Taken one by one below, with waiting; a failed request is tried
                // again there.
                Err(_) => {}
            }
        }
        let guards = self.acquire_rounds(&keys, &opts).await?;
        let granted = lease::now();
        for guard in &guards {
            guard.lease().hold_from(granted, opts.hold_at_least);
        }
        if self.0.shared.is_closed() {
            return Err(LockError::ShutDown);
        }
        Ok(MultiGuard::new(guards))
    }

    /// Release-all-and-retry: each round waits (within the one deadline) for the key
    /// the last round missed, holding nothing else, then makes one attempt at every
    /// other key in sorted order. A miss gives back every key of the round and names
    /// the key the next round waits for. So a `lock_all` never holds a key while it
    /// waits: a caller of a single key it holds is delayed by one round at most, and
    /// no two callers can each hold a key the other waits for.
    async fn acquire_rounds(
        &self,
        keys: &[LockKey],
        opts: &Resolved,
    ) -> Result<Vec<LockGuard>, LockError> {
        // `hold_at_least` only for keys a granted guard holds: the keys of a round that
        // missed (or was cancelled) are freed at once when given back.
        let waiting = Resolved {
            hold_at_least: Duration::ZERO,
            ..opts.clone()
        };
        let once = Resolved {
            wait: Duration::ZERO,
            ..waiting.clone()
        };
        let mut blocked: Option<usize> = None;
        // Bounded by the deadline: a round that starts past it waits for nothing.
        loop {
            let mut guards = Vec::with_capacity(keys.len());
            if let Some(b) = blocked {
                if Instant::now() >= opts.deadline {
                    return Err(LockError::Timeout {
                        key: keys[b].full().to_owned(),
                    });
                }
                guards.push(
                    self.acquire(keys[b].clone(), Mode::Exclusive, waiting.clone())
                        .await?,
                );
            }
            let mut missed = None;
            for (i, key) in keys.iter().enumerate().filter(|&(i, _)| Some(i) != blocked) {
                match self
                    .acquire(key.clone(), Mode::Exclusive, once.clone())
                    .await
                {
                    Ok(guard) => guards.push(guard),
                    Err(e) if e.is_retryable() && !opts.wait.is_zero() => {
                        missed = Some(i);
                        break;
                    }
                    Err(e) => {
                        // Released whatever happens: a guard dropped (this future
                        // cancelled mid-way) releases in the background.
                        let _ = MultiGuard::new(guards).release().await;
                        return Err(e);
                    }
                }
            }
            let Some(missed) = missed else {
                // In key order (the key waited for was taken first).
                guards.sort_by(|a, b| a.key().cmp(b.key()));
                return Ok(guards);
            };
            let _ = MultiGuard::new(guards).release().await;
            blocked = Some(missed);
        }
    }

    /// One attempt at every key in one step, where the backend can (see
    /// [`crate::backend::Backend::acquire_together`]): `Ok(None)` when it cannot or a key is held and
    /// the wait allows taking the keys one by one; `Err(Timeout)` when a key is held
    /// and the wait is zero. As for any attempt, what a cut-short or failed request may
    /// have taken is released in the background.
    async fn acquire_together(
        &self,
        keys: &[LockKey],
        opts: &Resolved,
    ) -> Result<Option<MultiGuard>, LockError> {
        let shared = &self.0.shared;
        let token = Token::random();
        let sent = lease::now();
        let mut pending: Vec<_> = keys
            .iter()
            .map(|key| self.abandon_on_drop(key, token, Mode::Exclusive))
            .collect();
        let refs: Vec<&LockKey> = keys.iter().collect();
        let bound = shared.backend.request_timeout(opts.ttl, Mode::Exclusive);
        let attempt = shared.backend.acquire_together(&refs, token, opts.ttl);
        // A failed request may have been applied: released in the background, unless
        // the backend undoes its failed attempts itself (Redlock, silently: a release
        // from here would do it again, with a wake-up). An attempt cut short by the
        // bound was undone by nobody: released from here.
        let outcome = match tokio::time::timeout(bound, attempt).await {
            Ok(outcome) => {
                if outcome.is_ok() || shared.backend.undoes_failed_attempts() {
                    pending.iter_mut().for_each(Armed::disarm);
                }
                outcome?
            }
            Err(_) => return Err(LockError::timed_out("acquire", bound)),
        };
        let fences = match outcome {
            None => return Ok(None),
            Some(Together::Held(_)) if opts.wait.is_zero() => {
                return Err(LockError::Timeout {
                    key: keys
                        .first()
                        .map(|k| k.full().to_owned())
                        .unwrap_or_default(),
                })
            }
            Some(Together::Held(_)) => return Ok(None),
            Some(Together::Acquired(fences)) => fences,
        };
        let guards = keys
            .iter()
            .zip(fences)
            .map(|(key, fence)| {
                let id = self.0.next_id.fetch_add(1, Ordering::Relaxed);
                let lease = Lease::new(id, key.clone(), token, fence, opts.ttl, sent)
                    .held_at_least(opts.hold_at_least)
                    .observed(
                        shared.backend.name(),
                        stats::Hold::start(LockKind::Exclusive, &opts.name),
                    );
                let lease = Arc::new(lease);
                if opts.watchdog {
                    shared.watch(&lease);
                }
                LockGuard::new(lease, self.clone())
            })
            .collect();
        Ok(Some(MultiGuard::new(guards)))
    }

    /// One round trip: acquired, or held (with the holder's remaining ttl).
    ///
    /// Every attempt draws a fresh token. What an earlier attempt may have left on the
    /// server (a request applied after its reply was lost, a Redlock undo that did not
    /// arrive) carries an older token, so it can never be counted as part of this
    /// attempt's grant, and its background release can never delete this attempt's lock.
    async fn attempt(
        &self,
        request: &Request<'_>,
        intent: Option<Intent>,
    ) -> Result<Outcome, LockError> {
        let Request {
            key,
            mode,
            opts,
            replicas,
        } = *request;
        #[cfg(test)]
        self.0.attempts.fetch_add(1, Ordering::Relaxed);
        let shared = &self.0.shared;
        let token = Token::random();
        let sent = lease::now();
        let mut pending = self.abandon_on_drop(key, token, mode);
        let attempt = shared
            .backend
            .acquire(&Claim {
                key,
                token,
                ttl: opts.ttl,
                replicas,
                mode,
                intent,
            })
            .await;
        // A backend that undoes its own failed attempts does so without waking anyone
        // (the waiters include this caller); a release from here would do it again,
        // with a wake-up.
        if attempt.is_ok() || shared.backend.undoes_failed_attempts() {
            pending.disarm();
        }
        let attempt = attempt?;
        let fence = match attempt {
            Attempt::Held { remaining, .. } => return Ok(Outcome::Held(remaining)),
            Attempt::Acquired {
                fence,
                replicas: acked,
            } => {
                if let (Some(want), Some(acked)) = (replicas, acked) {
                    if acked < want.replicas {
                        pending.arm();
                        let lease = LeaseRef::new(key, token, mode);
                        shared.backend.release(lease, Duration::ZERO).await?;
                        pending.disarm();
                        return Err(LockError::ReplicasUnavailable {
                            key: key.full().to_owned(),
                            acked,
                            wanted: want.replicas,
                        });
                    }
                }
                fence
            }
        };
        let id = self.0.next_id.fetch_add(1, Ordering::Relaxed);
        let lease = Lease::new(id, key.clone(), token, fence, opts.ttl, sent)
            .with_mode(mode)
            .with_replicas(replicas)
            .held_at_least(opts.hold_at_least)
            .observed(
                shared.backend.name(),
                stats::Hold::start(mode.kind(), &opts.name),
            );
        let lease = Arc::new(lease);
        if opts.watchdog {
            shared.watch(&lease);
        }
        Ok(Outcome::Acquired(LockGuard::new(lease, self.clone())))
    }

    /// Releases in the background what an attempt with `token` may have taken, unless
    /// disarmed: the request may have been applied even when its future was dropped or
    /// its reply lost.
    fn abandon_on_drop<'a>(
        &'a self,
        key: &'a LockKey,
        token: Token,
        mode: Mode,
    ) -> Armed<impl FnOnce() + 'a> {
        Armed::new(move || self.send_job(Job::Abandon(key.clone(), token, mode)))
    }

    /// [`attempt`](Self::attempt), cut short once both the wait's deadline and one
    /// request timeout (its `WAIT` included) from now have passed: whatever hangs (a
    /// frozen server, a connection being opened or re-established), `lock` returns
    /// within its wait plus one request timeout. What a cut-short attempt may have
    /// taken is released in the background, as for any dropped attempt.
    async fn bounded_attempt(
        &self,
        request: &Request<'_>,
        intent: Option<Intent>,
    ) -> Result<Outcome, LockError> {
        let one = (self.0.shared.backend).request_timeout(request.opts.ttl, request.mode)
            + request.replicas.map_or(Duration::ZERO, |r| r.timeout);
        let now = tokio::time::Instant::now();
        let bound = (now + one).max(tokio::time::Instant::from_std(request.opts.deadline));
        tokio::time::timeout_at(bound, self.attempt(request, intent))
            .await
            .unwrap_or_else(|_| Err(LockError::timed_out("acquire", bound - now)))
    }

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
    async fn wait_for(
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
    /// Registers an interest of the queue's own, even in a channel listened to.
    register: bool,
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
        Some(Ask {
            register: unregistered,
            again,
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LockOptions;

    /// Regression (review of `liveness`, finding 5): when the initial attempt ended past
    /// the wait's deadline and the key's channel was listened to, the wait loop made a
    /// second full attempt (on a hung server, `lock` returned after its wait plus two
    /// request timeouts). The in-memory backend always listens; a 1 ns wait has passed
    /// by the time the initial attempt returns.
    #[tokio::test]
    async fn no_attempt_starts_after_the_deadline() {
        let locks = LockManager::builder().in_memory().build().await.unwrap();
        let held = locks.lock("k").await.unwrap();
        let before = locks.0.attempts.load(Ordering::Relaxed);
        let err = locks
            .lock_with("k", LockOptions::new().wait(Duration::from_nanos(1)))
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }), "{err}");
        let made = locks.0.attempts.load(Ordering::Relaxed) - before;
        assert_eq!(made, 1, "{made} attempts for a wait already over");
        held.release().await.unwrap();
    }
}
