//! The in-memory backend: locks in this process's memory, same semantics as Redis.
//!
//! All in-memory managers of a process share one store, the way several managers
//! share one Redis server, so they exclude each other and wake each other's waiters.
//! Expiry is checked on access against the monotonic clock.
//!
//! Nothing grows with the number of distinct keys ever locked: fencing counters are per
//! hash slot as on Redis (at most 16 384 per prefix, see `key.rs`), and expired lock
//! entries nobody released are swept whenever the map has doubled since the last sweep
//! (amortised O(1) per acquisition).

use std::collections::HashMap;
use std::future::{ready, Future};
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::{Attempt, Claim, LeaseRef, Policies, Renewal, Renewed, Store, Wake};
use crate::key::LockKey;
use crate::token::Token;
use crate::LockError;

/// A fencing counter that cannot issue another token.
fn counter_error(key: &LockKey, what: &'static str) -> LockError {
    LockError::Backend {
        operation: "acquire",
        source: redis::RedisError::from((
            redis::ErrorKind::Client,
            "in-memory fencing counter cannot issue a token",
            format!("{}: {what}", key.fence()),
        )),
    }
}

#[derive(Default)]
struct Table {
    locks: HashMap<String, Held>,
    /// Fencing counters, by counter key (one per prefix and hash slot).
    fences: HashMap<String, u64>,
    listeners: Vec<Wake>,
    /// Sweep expired locks once `locks` holds this many entries.
    sweep_at: usize,
}

/// The smallest `sweep_at`: below it, sweeping is not worth it.
const MIN_SWEEP_AT: usize = 1024;

impl Table {
    /// Drops expired locks once the map has doubled since the last sweep.
    fn sweep(&mut self, now: Instant) {
        if self.locks.len() < self.sweep_at.max(MIN_SWEEP_AT) {
            return;
        }
        self.locks.retain(|_, held| held.expires > now);
        self.sweep_at = self.locks.len().saturating_mul(2);
    }
}

struct Held {
    token: Token,
    expires: Instant,
}

static STORE: LazyLock<Mutex<Table>> = LazyLock::new(Mutex::default);

fn store() -> MutexGuard<'static, Table> {
    STORE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A handle on the process-wide store.
pub(crate) struct MemoryBackend(());

impl MemoryBackend {
    /// Connects a manager's waiters to the store's wake-ups.
    pub(crate) fn new(wake: Wake) -> Self {
        let mut s = store();
        s.listeners.retain(|w| !w.is_gone());
        s.listeners.push(wake);
        Self(())
    }

    /// As `acquire.lua`: a grant takes the next value of the slot's counter; a retry
    /// that finds its own token gets the counter's current value and a fresh expiry; a
    /// counter at `u64::MAX` is an error (nothing is taken).
    fn acquire_now(
        &self,
        key: &LockKey,
        token: Token,
        ttl: Duration,
    ) -> Result<Attempt, LockError> {
        let now = Instant::now();
        let expires = now
            .checked_add(ttl)
            .unwrap_or(now + Duration::from_secs(1 << 32));
        let mut s = store();
        if let Some(held) = s.locks.get_mut(key.full()) {
            if held.expires > now {
                if held.token != token {
                    return Ok(Attempt::Held {
                        remaining: Some(held.expires - now),
                        holder: None,
                    });
                }
                held.expires = expires;
                // Every grant set the counter to at least 1; an operator cannot
                // reach it, unlike a Redis key, but a missing one is still no token 0.
                return match s.fences.get(key.fence()) {
                    Some(&fence) => Ok(Attempt::Acquired {
                        fence,
                        replicas: None,
                    }),
                    None => {
                        s.locks.remove(key.full());
                        Err(counter_error(key, "is missing"))
                    }
                };
            }
        }
        let counter = s.fences.get(key.fence()).copied().unwrap_or(0);
        let fence = counter
            .checked_add(1)
            .ok_or_else(|| counter_error(key, "overflows"))?;
        s.fences.insert(key.fence().to_owned(), fence);
        s.sweep(now);
        s.locks
            .insert(key.full().to_owned(), Held { token, expires });
        Ok(Attempt::Acquired {
            fence,
            replicas: None,
        })
    }

    fn release_now(&self, key: &LockKey, token: Token) -> bool {
        let listeners = {
            let mut s = store();
            let ours = s
                .locks
                .get(key.full())
                .is_some_and(|h| h.token == token && h.expires > Instant::now());
            // An expired entry of anyone is garbage either way.
            if ours
                || s.locks
                    .get(key.full())
                    .is_some_and(|h| h.expires <= Instant::now())
            {
                s.locks.remove(key.full());
            }
            if !ours {
                return false;
            }
            s.listeners.clone()
        };
        for w in &listeners {
            w.wake(key.full());
        }
        true
    }

    fn extend_now(&self, key: &LockKey, token: Token, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut s = store();
        match s.locks.get_mut(key.full()) {
            Some(h) if h.token == token && h.expires > now => {
                h.expires = now.checked_add(ttl).unwrap_or(h.expires);
                true
            }
            _ => false,
        }
    }

    /// Deletes a lock whoever holds it; true when a live one was there.
    fn force_unlock_now(&self, key: &LockKey) -> bool {
        let (live, listeners) = {
            let mut s = store();
            let live = s
                .locks
                .remove(key.full())
                .is_some_and(|h| h.expires > Instant::now());
            (live, s.listeners.clone())
        };
        for w in &listeners {
            w.wake(key.full());
        }
        live
    }

    /// Whether anyone holds the lock.
    fn is_locked_now(&self, key: &LockKey) -> bool {
        store()
            .locks
            .get(key.full())
            .is_some_and(|h| h.expires > Instant::now())
    }
}

impl Store for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    /// Never waits on anything; a bound for form's sake.
    fn request_timeout(&self, _ttl: Duration) -> Duration {
        Duration::from_secs(1)
    }

    fn acquire(
        &self,
        claim: &Claim<'_>,
    ) -> impl Future<Output = Result<Attempt, LockError>> + Send {
        ready(self.acquire_now(claim.key, claim.token, claim.ttl))
    }

    fn release(&self, lease: LeaseRef<'_>) -> impl Future<Output = Result<bool, LockError>> + Send {
        ready(Ok(self.release_now(lease.key, lease.token)))
    }

    fn extend(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, LockError>> + Send {
        ready(Ok(self.extend_now(lease.key, lease.token, ttl)))
    }

    fn renew(
        &self,
        batch: &[Renewal<'_>],
    ) -> impl Future<Output = Result<Vec<Renewed>, LockError>> + Send {
        let renewed = batch
            .iter()
            .map(|r| self.extend_now(r.key, r.token, r.ttl).into())
            .collect();
        ready(Ok(renewed))
    }

    fn is_locked(&self, key: &LockKey) -> impl Future<Output = Result<bool, LockError>> + Send {
        ready(Ok(self.is_locked_now(key)))
    }

    fn eviction_policies(&self) -> impl Future<Output = Result<Policies, LockError>> + Send {
        ready(Ok(Vec::new()))
    }

    fn force_unlock(&self, key: &LockKey) -> impl Future<Output = Result<bool, LockError>> + Send {
        ready(Ok(self.force_unlock_now(key)))
    }

    fn subscribe(
        &self,
        _key: &str,
        _register: bool,
    ) -> impl Future<Output = Result<(), LockError>> + Send {
        ready(Ok(()))
    }

    fn unsubscribe(&self, _key: &str) -> impl Future<Output = Result<(), LockError>> + Send {
        ready(Ok(()))
    }

    fn listening(&self, _key: &str) -> bool {
        true
    }

    fn interests(&self) -> usize {
        0
    }

    fn has_channels(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries of the shared store under `prefix`: (lock entries, counters).
    fn count(prefix: &str) -> (usize, usize) {
        let s = store();
        (
            s.locks.keys().filter(|k| k.starts_with(prefix)).count(),
            s.fences.keys().filter(|k| k.starts_with(prefix)).count(),
        )
    }

    fn key(prefix: &str, name: &str) -> LockKey {
        LockKey::prefixed(prefix, name).unwrap()
    }

    fn fence(attempt: Result<Attempt, LockError>) -> u64 {
        match attempt {
            Ok(Attempt::Acquired { fence, .. }) => fence,
            other => panic!("not acquired: {other:?}"),
        }
    }

    /// Regression (issue 11, finding 7): the in-memory counters grew by one per distinct
    /// key ever locked.
    #[test]
    fn fencing_counters_do_not_grow_with_distinct_keys() {
        let prefix = "mem-bound:";
        let b = MemoryBackend(());
        let ttl = Duration::from_secs(30);
        let mut first = Vec::new();
        for i in 0..2000 {
            let k = key(prefix, &format!("order_{{{}}}:{i}", i % 4));
            let token = Token::random();
            first.push(fence(b.acquire_now(&k, token, ttl)));
            assert!(b.release_now(&k, token));
        }
        assert_eq!(count(prefix), (0, 4), "2 000 keys in 4 slots");
        for i in (0..2000).step_by(97) {
            let k = key(prefix, &format!("order_{{{}}}:{i}", i % 4));
            let token = Token::random();
            assert!(fence(b.acquire_now(&k, token, ttl)) > first[i], "key {i}");
            assert!(b.release_now(&k, token));
        }
    }

    /// Regression (issue 11, finding 7): expired entries nobody released stayed in the
    /// map forever; they are swept as the map grows.
    #[test]
    fn expired_locks_do_not_accumulate() {
        let prefix = "mem-expired:";
        let b = MemoryBackend(());
        for batch in 0..10 {
            for i in 0..1000 {
                let k = key(prefix, &format!("{batch}-{i}"));
                fence(b.acquire_now(&k, Token::random(), Duration::from_millis(1)));
            }
            std::thread::sleep(Duration::from_millis(3));
        }
        let (locks, _) = count(prefix);
        assert!(locks <= 3000, "{locks} of 10 000 expired entries left");
    }

    #[test]
    fn a_counter_at_u64_max_is_an_error_and_takes_nothing() {
        let b = MemoryBackend(());
        let k = key("mem-max:", "k");
        store().fences.insert(k.fence().to_owned(), u64::MAX - 1);
        let token = Token::random();
        assert_eq!(
            fence(b.acquire_now(&k, token, Duration::from_secs(5))),
            u64::MAX
        );
        assert!(b.release_now(&k, token));
        let err = b
            .acquire_now(&k, Token::random(), Duration::from_secs(5))
            .unwrap_err();
        assert!(matches!(err, LockError::Backend { .. }), "{err}");
        assert!(!b.is_locked_now(&k));
    }

    /// Finding 3's script half, in memory too: a retry that finds its own token gets a
    /// fresh expiry and the same token, not a new one.
    #[test]
    fn a_retry_with_its_own_token_resets_the_expiry() {
        const TTL: Duration = Duration::from_millis(400);
        let b = MemoryBackend(());
        let k = key("mem-retry:", "k");
        // A check is conclusive only when it runs after the first grant's expiry and
        // before the retry's: a machine too busy to wake up inside that window tries again.
        for _ in 0..5 {
            let token = Token::random();
            let granted = Instant::now();
            let first = fence(b.acquire_now(&k, token, TTL));
            std::thread::sleep(TTL / 2);
            let retried = Instant::now();
            assert_eq!(fence(b.acquire_now(&k, token, TTL)), first);
            std::thread::sleep((granted + TTL * 5 / 4).saturating_duration_since(Instant::now()));
            let locked = b.is_locked_now(&k);
            let conclusive = retried.elapsed() < TTL;
            b.release_now(&k, token);
            if conclusive {
                assert!(locked, "the retry reset the expiry to its ttl");
                return;
            }
        }
        panic!("the machine never woke up inside the window the check needs");
    }
}
