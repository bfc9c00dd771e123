//! The seam between the manager and where locks live.
//!
//! A backend does four things, each one round trip: acquire (set-if-absent plus the
//! fencing counter), release (compare-token delete plus a wake-up), extend
//! (compare-token expire) and renew a batch (many extends at once, for the watchdog).
//! It also turns the manager's interest in a key's wake-up channel into a subscription.
//! The manager owns everything else: queuing, waiting, the watchdog and guards.

mod cluster;
mod memory;
mod redlock;
mod single;

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

pub(crate) use cluster::ClusterBackend;
pub(crate) use memory::MemoryBackend;
pub(crate) use redlock::{RedlockBackend, DEFAULT_NODE_TIMEOUT};
pub(crate) use single::SingleBackend;

use redis::aio::ConnectionLike;

use crate::key::LockKey;
use crate::scripts::RELEASE;
use crate::token::Token;
use crate::LockError;

/// The outcome of one acquisition attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The lock is ours, with this fencing token; `replicas` is the `WAIT` count when
    /// replicas were asked for.
    Acquired { fence: u64, replicas: Option<u32> },
    /// Someone else holds it for about this long (`None`: no expiry was set). `holder`
    /// names the holder when the server said who (a digest of its token, the same on
    /// every node that holder holds; Redis backends only).
    Held {
        remaining: Option<Duration>,
        holder: Option<u64>,
    },
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

/// The longest `WAIT` a lock asks for (min(ttl/10, 1 s)).
pub(crate) const MAX_REPLICA_WAIT: Duration = Duration::from_secs(1);

/// Idle `WAIT` connections kept for reuse, per backend.
const IDLE_WAIT_CONNECTIONS: usize = 8;

/// Connections for `WAIT`, which blocks the connection it is sent on.
///
/// Each acquisition with `min_replicas` takes a connection of its own for its
/// `acquire` + `WAIT` pipeline (an idle one, or a new one), so concurrent acquisitions
/// never queue behind each other's `WAIT`; up to [`IDLE_WAIT_CONNECTIONS`] are kept for
/// reuse. Only a connection whose pipeline completed is given back: one whose request
/// was cancelled or failed may still have a reply (or a blocked `WAIT`) in flight, so it
/// is dropped.
pub(crate) struct WaitPool<C> {
    idle: Mutex<Vec<C>>,
}

impl<C> WaitPool<C> {
    pub(crate) fn new() -> Self {
        Self {
            idle: Mutex::new(Vec::new()),
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<C>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An idle connection, if any.
    pub(crate) fn take(&self) -> Option<C> {
        self.idle().pop()
    }

    /// Gives back a connection whose pipeline completed.
    pub(crate) fn put(&self, con: C) {
        let mut idle = self.idle();
        if idle.len() < IDLE_WAIT_CONNECTIONS {
            idle.push(con);
        }
    }

    /// Drops every idle connection (the server went away: they are all broken).
    pub(crate) fn clear(&self) {
        self.idle().clear();
    }
}

/// Pauses before the fallback releases of a [`WaitAttempt`] undone after its
/// connection failed.
const UNDO_RETRIES: [Duration; 3] = [
    Duration::from_millis(200),
    Duration::from_millis(800),
    Duration::from_secs(2),
];

/// The `WAIT` connection of an acquire pipeline in flight, which undoes the attempt on
/// that same connection when it is dropped before the pipeline's reply was read.
///
/// The manager releases the token of an attempt that was cut short, cancelled or
/// failed ([`Job::Abandon`](crate::watchdog::Job::Abandon)), on the command connection. Requests
/// on two connections are not ordered: after a server freeze (or a retransmission on
/// one connection) that release may be applied before the acquire, find nothing, and
/// leave the key to nobody for its whole ttl. So an attempt whose reply was not read
/// sends its release on the pipeline's own connection, where the server applies it
/// after the acquire whatever happened to the acquire, and the connection is not given
/// back to the pool. If that release fails (the connection broke, which settles the
/// acquire's fate), it is retried on `fallback` after a pause, a few times.
pub(crate) struct WaitAttempt<C, F>
where
    C: ConnectionLike + Clone + Send + 'static,
    F: ConnectionLike + Clone + Send + 'static,
{
    con: Option<C>,
    fallback: F,
    key: LockKey,
    token: Token,
    publish: &'static str,
}

impl<C, F> WaitAttempt<C, F>
where
    C: ConnectionLike + Clone + Send + 'static,
    F: ConnectionLike + Clone + Send + 'static,
{
    /// Arms the undo of `token`'s acquire about to be sent on `con`; `publish` is the
    /// release's wake-up command (`PUBLISH` or `SPUBLISH`).
    pub(crate) fn new(
        con: C,
        fallback: F,
        key: &LockKey,
        token: Token,
        publish: &'static str,
    ) -> Self {
        Self {
            con: Some(con),
            fallback,
            key: key.clone(),
            token,
            publish,
        }
    }

    /// The connection to send the pipeline on.
    pub(crate) fn con(&mut self) -> &mut C {
        self.con.as_mut().expect("armed until finished")
    }

    /// Moves the pipeline to another connection (the first one broke: the acquire sent
    /// on it was settled when it closed).
    pub(crate) fn replace(&mut self, con: C) {
        self.con = Some(con);
    }

    /// The pipeline's reply was read: disarms, and gives the connection back.
    pub(crate) fn finish(mut self) -> C {
        self.con.take().expect("armed until finished")
    }
}

impl<C, F> Drop for WaitAttempt<C, F>
where
    C: ConnectionLike + Clone + Send + 'static,
    F: ConnectionLike + Clone + Send + 'static,
{
    fn drop(&mut self) {
        let Some(mut con) = self.con.take() else {
            return;
        };
        // No runtime: it is shutting down, and the ttl frees the lock.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (mut fallback, key, token, publish) = (
            self.fallback.clone(),
            self.key.clone(),
            self.token,
            self.publish,
        );
        // Self-contained EVAL: no NOSCRIPT, applied whenever it is delivered.
        let release = RELEASE.eval(&[key.full()], (token.as_bytes(), publish));
        runtime.spawn(async move {
            let mut outcome = release.query_async::<i64>(&mut con).await;
            drop(con);
            for pause in UNDO_RETRIES {
                let Err(e) = &outcome else {
                    return;
                };
                tracing::debug!(key = key.full(), error = %e, "undo of a WAIT acquire failed");
                tokio::time::sleep(pause).await;
                outcome = release.query_async::<i64>(&mut fallback).await;
            }
            if outcome.is_err() {
                tracing::debug!(
                    key = key.full(),
                    "undo of a WAIT acquire failed; the ttl will free the lock"
                );
            }
        });
    }
}

/// A uniformly random duration in `0..=max`.
pub(crate) fn jitter(max: Duration) -> Duration {
    let span = u64::try_from(max.as_micros()).unwrap_or(u64::MAX).max(1);
    let r = getrandom::u64().unwrap_or(0);
    Duration::from_micros(r % span.saturating_add(1))
}

/// One lock the watchdog renews.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewal<'a> {
    pub(crate) key: &'a LockKey,
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
}

/// What one renewal of a batch found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewed {
    /// The lock lives another ttl.
    Yes,
    /// The server (or a Redlock majority) no longer has our token.
    Lost,
    /// No answer for this lock (its node or slot failed): retry soon.
    Unknown,
}

impl From<bool> for Renewed {
    fn from(renewed: bool) -> Self {
        if renewed {
            Self::Yes
        } else {
            Self::Lost
        }
    }
}

/// The outcomes of one `renew.lua` call over `len` locks, from its reply (`None`: the
/// call failed). A reply without exactly one integer per lock cannot be matched to the
/// locks, so all of them are unknown (retried soon), never credited to a neighbour.
pub(crate) fn chunk_outcomes(len: usize, reply: Option<Vec<i64>>) -> Vec<Renewed> {
    match reply {
        Some(flags) if flags.len() == len => flags
            .into_iter()
            .map(|flag| Renewed::from(flag == 1))
            .collect(),
        Some(flags) => {
            tracing::warn!(
                locks = len,
                answers = flags.len(),
                "renewal reply does not match its locks; retrying them"
            );
            vec![Renewed::Unknown; len]
        }
        None => vec![Renewed::Unknown; len],
    }
}

/// Where locks live.
// One value per manager, behind an `Arc`: boxing the larger variants would buy nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Backend {
    /// Process memory.
    Memory(MemoryBackend),
    /// One Redis server.
    Single(SingleBackend),
    /// A Redis Cluster.
    Cluster(ClusterBackend),
    /// N independent masters with a quorum.
    Redlock(RedlockBackend),
}

impl Backend {
    /// The backend's name, for tracing.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Memory(_) => "memory",
            Self::Single(_) => "single",
            Self::Cluster(_) => "cluster",
            Self::Redlock(_) => "redlock",
        }
    }

    /// How long one acquisition attempt may take when nothing hangs: one request with
    /// its retries (every Redlock round of an attempt), not counting a `WAIT`.
    pub(crate) fn request_timeout(&self, ttl: Duration) -> Duration {
        match self {
            // Never waits on anything; a bound for form's sake.
            Self::Memory(_) => Duration::from_secs(1),
            Self::Single(b) => b.request_timeout(),
            Self::Cluster(b) => b.request_timeout(),
            Self::Redlock(b) => b.request_timeout(ttl),
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
            Self::Memory(b) => b.acquire(key, token, ttl),
            Self::Single(b) => b.acquire(key, token, ttl, replicas).await,
            Self::Cluster(b) => b.acquire(key, token, ttl, replicas).await,
            Self::Redlock(b) => b.acquire(key, token, ttl, replicas).await,
        }
    }

    /// True when the lock was ours and is now deleted.
    pub(crate) async fn release(&self, key: &LockKey, token: Token) -> Result<bool, LockError> {
        match self {
            Self::Memory(b) => Ok(b.release(key, token)),
            Self::Single(b) => b.release(key, token).await,
            Self::Cluster(b) => b.release(key, token).await,
            Self::Redlock(b) => b.release(key, token).await,
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
            Self::Cluster(b) => b.extend(key, token, ttl).await,
            Self::Redlock(b) => b.extend(key, token, ttl).await,
        }
    }

    /// Renews every lock of the batch; one outcome per lock, in batch order. `Err` when
    /// nothing could be renewed at all.
    pub(crate) async fn renew(&self, batch: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        match self {
            Self::Memory(b) => Ok(batch
                .iter()
                .map(|r| b.extend(r.key, r.token, r.ttl).into())
                .collect()),
            Self::Single(b) => b.renew(batch).await,
            Self::Cluster(b) => b.renew(batch).await,
            Self::Redlock(b) => b.renew(batch).await,
        }
    }

    /// Whether anyone holds the lock.
    pub(crate) async fn is_locked(&self, key: &LockKey) -> Result<bool, LockError> {
        match self {
            Self::Memory(b) => Ok(b.is_locked(key)),
            Self::Single(b) => b.is_locked(key).await,
            Self::Cluster(b) => b.is_locked(key).await,
            Self::Redlock(b) => b.is_locked(key).await,
        }
    }

    /// The `maxmemory-policy` of every node locks are written to (every master), by
    /// node address; `Err` when the nodes could not even be asked.
    pub(crate) async fn eviction_policies(
        &self,
    ) -> Result<Vec<(String, Result<String, LockError>)>, LockError> {
        match self {
            Self::Memory(_) => Ok(Vec::new()),
            Self::Single(b) => Ok(vec![(b.addr(), b.eviction_policy().await)]),
            Self::Cluster(b) => b.eviction_policies().await,
            Self::Redlock(b) => Ok(b.eviction_policies().await),
        }
    }

    /// Deletes the lock whoever holds it and wakes its waiters; true when it was held.
    pub(crate) async fn force_unlock(&self, key: &LockKey) -> Result<bool, LockError> {
        match self {
            Self::Memory(b) => Ok(b.force_unlock(key)),
            Self::Single(b) => b.force_unlock(key).await,
            Self::Cluster(b) => b.force_unlock(key).await,
            Self::Redlock(b) => b.force_unlock(key).await,
        }
    }

    /// Starts receiving wake-ups for `key`: adds one interest when `register` (interests
    /// are counted per key, before the request is sent), and subscribes unless the
    /// server already confirmed the channel.
    pub(crate) async fn subscribe(&self, key: &str, register: bool) -> Result<(), LockError> {
        match self {
            Self::Memory(_) => Ok(()),
            Self::Single(b) => b.subscriber().subscribe(key, register).await,
            Self::Cluster(b) => b.subscriber().subscribe(key, register).await,
            Self::Redlock(b) => b.subscribe(key, register).await,
        }
    }

    /// Whether a release of `key` would be heard now: the server confirmed its channel
    /// (on enough nodes to hear every successful release, for Redlock) and no
    /// connection carrying it dropped since. The in-memory backend always hears its
    /// releases.
    pub(crate) fn listening(&self, key: &str) -> bool {
        match self {
            Self::Memory(_) => true,
            Self::Single(b) => b.subscriber().listening(key),
            Self::Cluster(b) => b.subscriber().listening(key),
            Self::Redlock(b) => b.listening(key),
        }
    }

    /// Whether a failed [`acquire`](Self::acquire) (an `Err` returned, not a future
    /// dropped) has already arranged the undo of whatever it may have taken on the
    /// server: Redlock undoes every node that granted, whose request failed or is still
    /// in flight, without a wake-up (see `RedlockBackend::acquire`). Otherwise the
    /// manager releases the attempt's token itself.
    pub(crate) fn undoes_failed_attempts(&self) -> bool {
        matches!(self, Self::Redlock(_))
    }

    /// Whether waiters count interests in wake-up channels (the in-memory backend wakes
    /// its waiters directly).
    pub(crate) fn has_channels(&self) -> bool {
        !matches!(self, Self::Memory(_))
    }

    /// Drops one interest in `key`'s wake-ups.
    pub(crate) async fn unsubscribe(&self, key: &str) -> Result<(), LockError> {
        match self {
            Self::Memory(_) => Ok(()),
            Self::Single(b) => {
                b.subscriber().unsubscribe(key);
                Ok(())
            }
            Self::Cluster(b) => b.subscriber().unsubscribe(key).await,
            Self::Redlock(b) => {
                b.unsubscribe(key);
                Ok(())
            }
        }
    }

    /// The number of wake-up channels with an interest, summed over the subscriber
    /// connections (0 for the in-memory backend).
    pub(crate) fn interests(&self) -> usize {
        match self {
            Self::Memory(_) => 0,
            Self::Single(b) => b.subscriber().interests(),
            Self::Cluster(b) => b.subscriber().interests(),
            Self::Redlock(b) => b.interests(),
        }
    }
}
