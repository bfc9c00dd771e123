//! The seam between the manager and where locks live.
//!
//! A backend does four things, each one round trip: acquire (set-if-absent plus the
//! fencing counter), release (compare-token delete plus a wake-up), extend
//! (compare-token expire) and renew a batch (many extends at once, for the watchdog).
//! It also turns the manager's interest in a key's wake-up channel into a subscription.
//! The manager owns everything else: queuing, waiting, the watchdog and guards.

mod memory;
mod single;

use std::time::Duration;

pub(crate) use memory::MemoryBackend;
pub(crate) use single::SingleBackend;

use crate::key::LockKey;
use crate::token::Token;
use crate::LockError;

/// The outcome of one acquisition attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The lock is ours, with this fencing token; `replicas` is the `WAIT` count when
    /// replicas were asked for.
    Acquired { fence: u64, replicas: Option<u32> },
    /// Someone else holds it for about this long (`None`: no expiry was set).
    Held { remaining: Option<Duration> },
}

/// What to `WAIT` for after acquiring.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplicaWait {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

/// Connection timeouts for Redis backends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    /// Opening a connection, and the whole of `connect`/`build` (default 3 s).
    pub(crate) connect: Duration,
    /// One request's reply (default 1 s).
    pub(crate) response: Duration,
}

/// One lock the watchdog renews.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewal<'a> {
    pub(crate) key: &'a LockKey,
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
}

/// Where locks live.
pub(crate) enum Backend {
    /// Process memory.
    Memory(MemoryBackend),
    /// One Redis server.
    Single(SingleBackend),
}

impl Backend {
    /// The backend's name, for tracing.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Memory(_) => "memory",
            Self::Single(_) => "single",
        }
    }

    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        token: Token,
        ttl: Duration,
        replicas: Option<ReplicaWait>,
    ) -> Result<Attempt, LockError> {
        match self {
            Self::Memory(b) => Ok(b.acquire(key, token, ttl)),
            Self::Single(b) => b.acquire(key, token, ttl, replicas).await,
        }
    }

    /// True when the lock was ours and is now deleted.
    pub(crate) async fn release(&self, key: &LockKey, token: Token) -> Result<bool, LockError> {
        match self {
            Self::Memory(b) => Ok(b.release(key, token)),
            Self::Single(b) => b.release(key, token).await,
        }
    }

    /// True when the lock was ours and now lives `ttl` longer.
    pub(crate) async fn extend(
        &self,
        key: &LockKey,
        token: Token,
        ttl: Duration,
    ) -> Result<bool, LockError> {
        match self {
            Self::Memory(b) => Ok(b.extend(key, token, ttl)),
            Self::Single(b) => b.extend(key, token, ttl).await,
        }
    }

    /// Renews every lock of the batch; one flag per lock, false when it was lost.
    pub(crate) async fn renew(&self, batch: &[Renewal<'_>]) -> Result<Vec<bool>, LockError> {
        match self {
            Self::Memory(b) => Ok(batch
                .iter()
                .map(|r| b.extend(r.key, r.token, r.ttl))
                .collect()),
            Self::Single(b) => b.renew(batch).await,
        }
    }

    /// Whether anyone holds the lock.
    pub(crate) async fn is_locked(&self, key: &LockKey) -> Result<bool, LockError> {
        match self {
            Self::Memory(b) => Ok(b.is_locked(key)),
            Self::Single(b) => b.is_locked(key).await,
        }
    }

    /// Deletes the lock whoever holds it and wakes its waiters; true when it was held.
    pub(crate) async fn force_unlock(&self, key: &LockKey) -> Result<bool, LockError> {
        match self {
            Self::Memory(b) => Ok(b.force_unlock(key)),
            Self::Single(b) => b.force_unlock(key).await,
        }
    }

    /// Starts receiving wake-ups for `key` (reference-counted per key).
    pub(crate) async fn subscribe(&self, key: &str) -> Result<(), LockError> {
        match self {
            Self::Memory(_) => Ok(()),
            Self::Single(b) => b.subscriber().subscribe(key).await,
        }
    }

    /// Drops one interest in `key`'s wake-ups.
    pub(crate) async fn unsubscribe(&self, key: &str) -> Result<(), LockError> {
        match self {
            Self::Memory(_) => Ok(()),
            Self::Single(b) => b.subscriber().unsubscribe(key).await,
        }
    }
}
