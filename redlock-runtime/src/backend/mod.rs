//! The seam between the manager and where locks live.
//!
//! A backend does four things, each one round trip: acquire (set-if-absent plus the
//! fencing counter), release (compare-token delete plus a wake-up), extend
//! (compare-token expire) and renew a batch (many extends at once, for the watchdog).
//! It also turns the manager's interest in a key's wake-up channel into a subscription.
//! The manager owns everything else: queuing, waiting, the watchdog and guards.
//!
//! # Rules every request obeys
//! A rule holds for every request type (acquire, retry, extend, renewal, release, keep,
//! withdraw) × kind (exclusive, read, permit, `lock_all`) × backend (memory, single,
//! Sentinel, Cluster, Redlock) it concerns, so it is applied where all of those pass,
//! never in one request path. Each has a conformance test that runs its matrix
//! (`tests/conformance/rules.rs` unless said otherwise):
//!
//! | rule | requests | where it lives | test |
//! |---|---|---|---|
//! | `min_replicas`: an expiry counts only once `n` replicas acknowledged it | acquire, retry, extend, renewal, keep (exclusive and `lock_all` keys; shared kinds refuse the option; Redlock refuses it) | [`LeaseRef::replicas`] / [`Renewal::replicas`], set from the lease, so every request of a lease carries it; single (and Sentinel through it) and Cluster send the request and `WAIT` as one pipeline | `tests/replicas.rs` `min_replicas_holds_for_every_expiry_setting_request` |
//! | a released lock is renewed by nobody | extend, renewal after a keep | the keep renames the holder (`release.lua`, `release_shared.lua`: the kept name; memory: a fresh token), so no request carrying the token finds it | `kept_hold_is_renewed_by_nobody`, `lua_scripts` |
//! | every hold that ends or shrinks tells the waiters | release (last holder or not), keep, extend shorter, force unlock, withdraw | in each script that sets or deletes the expiry (`release*.lua`, `extend.lua`, `renew_shared.lua`); memory: `MemoryBackend::telling` | `every_shortened_hold_wakes_its_waiters` |
//! | a grant removes its writer's intent | acquire, retry | `acquire.lua` (whatever the caller believes was registered); memory: `Table::acquire` | `lua_scripts` `a_grant_withdraws_its_writers_intent_whatever_it_was_told` |
//! | `lock_all` holds no key while it waits | every round of `lock_all` | `LockManager::acquire_rounds` | `lock_all_holds_no_key_while_it_waits` |
//! | the kinds exclude each other alike | acquire, retry of every kind | each node's own script (Redlock: a permit also holds the key) | `kinds_exclude_each_other`, `kinds::permit_and_exclusive_or_read_holders_exclude_each_other` |

mod batched;
mod cluster;
mod coalesce;
mod glob;
mod memory;
mod redlock;
mod sentinel;
mod server;
mod single;
mod target;

use std::future::Future;
use std::time::Duration;

pub(crate) use cluster::{ClusterBackend, ClusterNodes};
pub(crate) use memory::MemoryBackend;
pub(crate) use redlock::{RedlockBackend, DEFAULT_NODE_TIMEOUT};
pub(crate) use sentinel::SentinelBackend;
pub(crate) use server::{Timeouts, RELEASE_RETRIES};
pub(crate) use single::SingleBackend;
pub(crate) use target::{only, Settings, Target};

use crate::info::LockInfo;
use crate::key::LockKey;
use crate::kind::Mode;
use crate::notify::Register;
use crate::token::Token;
use crate::wire::{Attempt, Claim, LeaseRef, Renewal, Renewed, Seen, Together};
use crate::LockError;

/// A uniformly random duration in `0..=max`.
pub(crate) fn jitter(max: Duration) -> Duration {
    let span = u64::try_from(max.as_micros()).unwrap_or(u64::MAX).max(1);
    let r = getrandom::u64().unwrap_or(0);
    Duration::from_micros(r % span.saturating_add(1))
}

/// What every backend does, one signature per operation (see the module docs).
///
/// Static dispatch only: [`Backend`] is a closed enum whose methods forward to this
/// trait (`dispatch!`); the futures are the backends' own (no boxing).
pub(crate) trait Store {
    /// The backend's name, for tracing.
    fn name(&self) -> &'static str;

    /// How long one acquisition attempt in `mode` may take when nothing hangs: one
    /// request with its retries (every Redlock round of an attempt), not counting a
    /// `WAIT`.
    fn request_timeout(&self, ttl: Duration, mode: Mode) -> Duration;

    /// The shortest ttl the backend can grant: a lock of a shorter ttl would be
    /// refused however free its key (`InvalidOption` before any request instead).
    fn min_ttl(&self) -> Duration {
        crate::options::MIN_TTL
    }

    /// One acquisition attempt.
    fn acquire(&self, claim: &Claim<'_>)
        -> impl Future<Output = Result<Attempt, LockError>> + Send;

    /// One attempt at every key of `keys` (distinct, exclusive, one `token`), all or
    /// nothing in one step, where the backend can (one server; one slot of a
    /// cluster; each Redlock node, decided by a quorum); `Ok(None)` where it cannot,
    /// having sent nothing.
    fn acquire_together(
        &self,
        keys: &[&LockKey],
        token: Token,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Together>, LockError>> + Send {
        let _ = (keys, token, ttl);
        std::future::ready(Ok(None))
    }

    /// True when the lock was ours and is now deleted, or, with a non-zero `keep`
    /// (`hold_at_least`), kept only `keep` longer; either way the key's waiters are
    /// woken (a kept key may expire sooner than they were told).
    fn release(
        &self,
        lease: LeaseRef<'_>,
        keep: Duration,
    ) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// True when the lock was ours and now lives `ttl` longer.
    fn extend(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// Renews every lock of the batch; one outcome per lock, in batch order. `Err` when
    /// nothing could be renewed at all.
    fn renew(
        &self,
        batch: &[Renewal<'_>],
    ) -> impl Future<Output = Result<Vec<Renewed>, LockError>> + Send;

    /// Whether anyone holds the lock.
    fn is_locked(&self, key: &LockKey) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// Every lock held under `prefix` whose full key matches `prefix` + `pattern` (a
    /// Redis glob), in no particular order, without blocking the server (`SCAN`).
    fn list(
        &self,
        prefix: &str,
        pattern: &str,
    ) -> impl Future<Output = Result<Vec<LockInfo>, LockError>> + Send;

    /// What is known of the lock (never its token); `None` when nobody holds it.
    fn inspect(
        &self,
        key: &LockKey,
    ) -> impl Future<Output = Result<Option<LockInfo>, LockError>> + Send;

    /// The `maxmemory-policy` of every node locks are written to (every master), by
    /// node address; `Err` when the nodes could not even be asked.
    fn eviction_policies(&self) -> impl Future<Output = Result<Policies, LockError>> + Send;

    /// Deletes the lock and wakes its waiters: whoever holds it, or with `seen` only
    /// while the grant shown holds it (one request, the check and the delete together).
    /// True when something was deleted.
    fn force_unlock(
        &self,
        key: &LockKey,
        seen: Option<Seen<'_>>,
    ) -> impl Future<Output = Result<bool, LockError>> + Send;

    /// Withdraws the intent of a writer (`waiter`, see [`Intent`](crate::wire::Intent)) that stopped waiting
    /// for `key` without the lock, and wakes the key's waiters: readers it kept out may
    /// enter.
    fn withdraw(
        &self,
        key: &LockKey,
        waiter: u64,
    ) -> impl Future<Output = Result<(), LockError>> + Send;

    /// Starts receiving wake-ups for `key`: adds one interest for [`Register::New`] (interests
    /// are counted per key, before the request is sent), and subscribes unless the
    /// server already confirmed the channel.
    fn subscribe(
        &self,
        key: &str,
        register: Register,
    ) -> impl Future<Output = Result<(), LockError>> + Send;

    /// Drops one interest in `key`'s wake-ups.
    fn unsubscribe(&self, key: &str) -> impl Future<Output = Result<(), LockError>> + Send;

    /// Whether a release of `key` would be heard now: the server confirmed its channel
    /// (on enough nodes to hear every successful release, for Redlock) and no
    /// connection carrying it dropped since. The in-memory backend always hears its
    /// releases.
    fn listening(&self, key: &str) -> bool;

    /// The number of wake-up channels with an interest, summed over the subscriber
    /// connections (0 for the in-memory backend).
    fn interests(&self) -> usize;

    /// Whether a failed [`acquire`](Self::acquire) (an `Err` returned, not a future
    /// dropped) has already arranged the undo of whatever it may have taken on the
    /// server: Redlock undoes every node that granted, whose request failed or is still
    /// in flight, without a wake-up (see `RedlockBackend::acquire`). Otherwise the
    /// manager releases the attempt's token itself.
    fn undoes_failed_attempts(&self) -> bool {
        false
    }

    /// Whether waiters count interests in wake-up channels (the in-memory backend wakes
    /// its waiters directly).
    fn has_channels(&self) -> bool {
        true
    }

    /// Returns once the work the backend does on its own behalf is done: the shared
    /// calls of one server's queued requests, and the releases of grants whose callers
    /// gave up (what `LockManager::shutdown` waits for). Nothing, for the others.
    fn settled(&self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }
}

/// Every node's `maxmemory-policy` (or why it could not be read), by node address.
pub(crate) type Policies = Vec<(String, Result<String, LockError>)>;

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
    /// The master that Redis Sentinels name, followed through failovers.
    Sentinel(SentinelBackend),
}

/// Runs `$e` with `$b` bound to the backend inside `$self`, whichever it is.
macro_rules! dispatch {
    ($self:ident, $b:ident => $e:expr) => {
        match $self {
            Backend::Memory($b) => $e,
            Backend::Single($b) => $e,
            Backend::Cluster($b) => $e,
            Backend::Redlock($b) => $e,
            Backend::Sentinel($b) => $e,
        }
    };
}

/// Each method is the [`Store`] method of the same name.
impl Backend {
    pub(crate) fn name(&self) -> &'static str {
        dispatch!(self, b => b.name())
    }

    pub(crate) fn request_timeout(&self, ttl: Duration, mode: Mode) -> Duration {
        dispatch!(self, b => b.request_timeout(ttl, mode))
    }

    pub(crate) fn min_ttl(&self) -> Duration {
        dispatch!(self, b => b.min_ttl())
    }

    pub(crate) async fn acquire(&self, claim: &Claim<'_>) -> Result<Attempt, LockError> {
        dispatch!(self, b => b.acquire(claim).await)
    }

    pub(crate) async fn acquire_together(
        &self,
        keys: &[&LockKey],
        token: Token,
        ttl: Duration,
    ) -> Result<Option<Together>, LockError> {
        dispatch!(self, b => b.acquire_together(keys, token, ttl).await)
    }

    pub(crate) async fn release(
        &self,
        lease: LeaseRef<'_>,
        keep: Duration,
    ) -> Result<bool, LockError> {
        dispatch!(self, b => b.release(lease, keep).await)
    }

    pub(crate) async fn extend(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
    ) -> Result<bool, LockError> {
        dispatch!(self, b => b.extend(lease, ttl).await)
    }

    pub(crate) async fn renew(&self, batch: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        dispatch!(self, b => b.renew(batch).await)
    }

    pub(crate) async fn is_locked(&self, key: &LockKey) -> Result<bool, LockError> {
        dispatch!(self, b => b.is_locked(key).await)
    }

    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        dispatch!(self, b => b.inspect(key).await)
    }

    pub(crate) async fn list(
        &self,
        prefix: &str,
        pattern: &str,
    ) -> Result<Vec<LockInfo>, LockError> {
        dispatch!(self, b => b.list(prefix, pattern).await)
    }

    pub(crate) async fn eviction_policies(&self) -> Result<Policies, LockError> {
        dispatch!(self, b => b.eviction_policies().await)
    }

    pub(crate) async fn force_unlock(
        &self,
        key: &LockKey,
        seen: Option<Seen<'_>>,
    ) -> Result<bool, LockError> {
        dispatch!(self, b => b.force_unlock(key, seen).await)
    }

    pub(crate) async fn withdraw(&self, key: &LockKey, waiter: u64) -> Result<(), LockError> {
        dispatch!(self, b => b.withdraw(key, waiter).await)
    }

    pub(crate) async fn subscribe(&self, key: &str, register: Register) -> Result<(), LockError> {
        dispatch!(self, b => b.subscribe(key, register).await)
    }

    pub(crate) async fn unsubscribe(&self, key: &str) -> Result<(), LockError> {
        dispatch!(self, b => b.unsubscribe(key).await)
    }

    pub(crate) fn listening(&self, key: &str) -> bool {
        dispatch!(self, b => b.listening(key))
    }

    pub(crate) fn interests(&self) -> usize {
        dispatch!(self, b => b.interests())
    }

    pub(crate) fn undoes_failed_attempts(&self) -> bool {
        dispatch!(self, b => b.undoes_failed_attempts())
    }

    pub(crate) fn has_channels(&self) -> bool {
        dispatch!(self, b => b.has_channels())
    }

    pub(crate) async fn settled(&self) {
        dispatch!(self, b => b.settled().await)
    }
}
