//! The acquire/wait algorithm: one attempt at the backend, and this process's queue
//! for a key with its head contending until acquired or out of time.

use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::LockManager;
use crate::backend::{jitter, Attempt, Claim, Intent, Together};
use crate::engine::Job;
use crate::error::chain;
use crate::key::LockKey;
use crate::kind::Mode;
use crate::lease::{self, Lease};
use crate::options::Resolved;
use crate::stats;
use crate::token::Token;
use crate::waiters::Subscription;
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

/// Releases in the background what an attempt may have taken, unless disarmed: the
/// request may have been applied even when its future was dropped or its reply lost.
struct PendingAttempt<'a> {
    manager: &'a LockManager,
    key: &'a LockKey,
    token: Token,
    mode: Mode,
    armed: bool,
}

impl Drop for PendingAttempt<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.manager
                .send_job(Job::Abandon(self.key.clone(), self.token, self.mode));
        }
    }
}

/// Withdraws in the background the intent of a writer that stops waiting without the
/// lock (out of time, an error, its future dropped), unless disarmed: left registered,
/// it would keep new readers out for the rest of the writer's wait.
struct PendingIntent<'a> {
    manager: &'a LockManager,
    key: &'a LockKey,
    waiter: u64,
    armed: bool,
}

impl Drop for PendingIntent<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.manager
                .send_job(Job::Withdraw(self.key.clone(), self.waiter));
        }
    }
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
        let mut pending: Vec<PendingAttempt<'_>> = keys
            .iter()
            .map(|key| PendingAttempt {
                manager: self,
                key,
                token,
                mode: Mode::Exclusive,
                armed: true,
            })
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
                    for p in &mut pending {
                        p.armed = false;
                    }
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
        let mut pending = PendingAttempt {
            manager: self,
            key,
            token,
            mode,
            armed: true,
        };
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
            pending.armed = false;
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
                        pending.armed = true;
                        let lease = LeaseRef::new(key, token, mode);
                        shared.backend.release(lease, Duration::ZERO).await?;
                        pending.armed = false;
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
    async fn wait_for(
        &self,
        request: &Request<'_>,
        mut last_error: Option<LockError>,
    ) -> Result<LockGuard, LockError> {
        let Request {
            key, mode, opts, ..
        } = *request;
        let shared = &self.0.shared;
        // A writer's intent keeps new readers out while it waits for the readers it
        // found (one id for the whole wait; see `Intent`).
        let mut intent = (mode == Mode::Exclusive).then(|| Intent {
            waiter: getrandom::u64().unwrap_or_else(|_| lease::now()),
            until: Duration::ZERO,
        });
        // Armed once an attempt carrying the intent is sent (it may register it, even
        // when its reply is lost); a grant withdraws it itself.
        let mut withdrawal = intent.map(|i| PendingIntent {
            manager: self,
            key,
            waiter: i.waiter,
            armed: false,
        });
        let timeout = || LockError::Timeout {
            key: key.full().to_owned(),
        };
        let place = shared
            .waiters
            .join(key.full())
            .ok_or_else(|| LockError::QueueFull {
                key: key.full().to_owned(),
            })?;
        let deadline = tokio::time::Instant::from_std(opts.deadline);
        let Ok(Ok(_turn)) = tokio::time::timeout_at(deadline, place.queue.turn.acquire()).await
        else {
            return Err(last_error.unwrap_or_else(timeout));
        };
        let mut backoff = Duration::from_millis(10);
        // When this head first saw the key's channel not listened to (or last asked).
        let mut unheard_since: Option<Instant> = None;
        let mut asked = false;
        // Each round ends in a wake-up, a timer or the deadline; the deadline ends the loop.
        loop {
            // No attempt starts once the wait is over: the initial attempt (or the turn)
            // may have run past the deadline already, and another one would take `lock`
            // beyond its wait plus one request timeout.
            if tokio::time::Instant::now() >= deadline {
                return Err(last_error.unwrap_or_else(timeout));
            }
            // Subscribed before the next attempt, so no release after it goes unnoticed.
            // The queue owns its interest from before the request is sent: if this
            // future is dropped or cut short mid-way, the channel is still unsubscribed
            // when the queue empties. The wait bounds the subscription too. A channel
            // unheard for a while (a subscription that failed, or one lost with its
            // connection and not restored by the connection's own resubscription) is
            // asked for again; meanwhile the head polls.
            //
            // A queue without an interest of its own registers one even when the
            // channel is listened to: that may be an earlier queue's interest, about to
            // be dropped (and the channel unsubscribed). On a confirmed channel this
            // only counts the interest, without a round trip.
            let unregistered =
                place.queue.subscription() == Subscription::None && shared.backend.has_channels();
            if shared.backend.listening(key.full()) && !unregistered {
                unheard_since = None;
            } else {
                let now = Instant::now();
                let since = *unheard_since.get_or_insert(now);
                if unregistered || !asked || now.duration_since(since) >= RESUBSCRIBE_AFTER {
                    let again = std::mem::replace(&mut asked, true);
                    unheard_since = Some(now);
                    let register = unregistered;
                    place.queue.set_subscription(Subscription::Asked);
                    let subscribe = shared.backend.subscribe(key.full(), register);
                    match tokio::time::timeout_at(deadline, subscribe).await {
                        Err(_) => return Err(last_error.unwrap_or_else(timeout)),
                        Ok(Ok(())) => {
                            place.queue.set_subscription(Subscription::Confirmed);
                            // Heard from now on: a later loss (a reconnect) starts its own
                            // grace period, in which the connection's resubscription can
                            // restore the channel before this head asks again.
                            unheard_since = None;
                        }
                        Ok(Err(e)) if again => {
                            tracing::debug!(
                                target: "redlock",
                                key = key.full(),
                                backend = self.backend_name(),
                                error = %chain(&e),
                                "subscribing again failed; polling"
                            );
                        }
                        Ok(Err(e)) => {
                            tracing::warn!(
                                target: "redlock",
                                key = key.full(),
                                backend = self.backend_name(),
                                error = %chain(&e),
                                "no release notifications; polling"
                            );
                        }
                    }
                }
            }
            let mut notified = pin!(place.queue.wake.notified());
            notified.as_mut().enable();
            if let Some(intent) = &mut intent {
                intent.until = deadline
                    .saturating_duration_since(tokio::time::Instant::now())
                    .max(Duration::from_millis(1));
            }
            if let Some(w) = &mut withdrawal {
                w.armed = true;
            }
            let attempt = self.bounded_attempt(request, intent).await;
            let pause = match attempt {
                Ok(Outcome::Acquired(guard)) => {
                    if let Some(w) = &mut withdrawal {
                        w.armed = false;
                    }
                    return Ok(guard);
                }
                Ok(Outcome::Held(remaining)) => {
                    last_error = None;
                    let fallback =
                        remaining.unwrap_or(Duration::from_secs(1)) + Duration::from_millis(1);
                    // Not listening (no subscription, or its connection dropped and it
                    // is not restored yet): a release would go unheard, so poll.
                    if shared.backend.listening(key.full()) {
                        fallback
                    } else {
                        fallback.min(POLL_UNSUBSCRIBED)
                    }
                }
                Err(e) if retried_while_waiting(&e) => {
                    tracing::debug!(
                        target: "redlock",
                        key = key.full(),
                        backend = self.backend_name(),
                        error = %chain(&e),
                        "acquire attempt failed; retrying"
                    );
                    last_error = Some(e);
                    backoff = (backoff * 2).min(MAX_RETRY_BACKOFF);
                    // Jittered, so managers that failed together do not retry together.
                    backoff / 2 + jitter(backoff / 2)
                }
                Err(e) => return Err(e),
            };
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(last_error.unwrap_or_else(timeout));
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until((now + pause).min(deadline)) => {}
            }
        }
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
