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

mod fair;

use std::collections::HashMap;
use std::future::{ready, Future};
use std::hash::{BuildHasher, RandomState};
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use super::glob::glob_match;
use super::server::{lock_keys, scan_glob};
use super::{Policies, Store};
use crate::info::{self, LockInfo, SharedHolder};
use crate::key::LockKey;
use crate::kind::{LockKind, Mode};
use crate::notify::Register;
use crate::token::Token;
use crate::waiters::{Call, Wake};
use crate::wire::{Attempt, Claim, Purpose, Renewed, Seen, Together};
use crate::wire::{LeaseRef, Renewal};
use crate::LockError;

/// A fencing counter that cannot issue another token.
fn counter_error(key: &LockKey, what: &'static str) -> LockError {
    LockError::Backend {
        operation: "acquire",
        node: None,
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
    /// Writers waiting for a key's readers: waiter id → when the intent runs out.
    intents: HashMap<String, HashMap<u64, Instant>>,
    /// Fair locks' waiters, in the order of arrival.
    queues: fair::Queues,
    /// Whom the operation in progress calls, once the store is unlocked: a fair
    /// waiter whose turn came (the scripts publish its id).
    called: Option<Call>,
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
        self.locks.retain(|_, held| held.live(now));
        self.intents.retain(|_, intents| {
            intents.retain(|_, until| *until > now);
            !intents.is_empty()
        });
        self.queues.sweep(now);
        self.sweep_at = self.locks.len().saturating_mul(2);
    }
}

/// How long a writer's intent outlives the key's expiry it was told (its next attempt
/// comes by then and renews it), as in `acquire.lua`.
const INTENT_SLACK: Duration = Duration::from_secs(2);

/// When a hold of `ttl` taken at `now` runs out; for a `ttl` too long for an
/// `Instant`, 2^32 seconds (about 136 years) from `now`.
fn expiry(now: Instant, ttl: Duration) -> Instant {
    now.checked_add(ttl)
        .unwrap_or(now + Duration::from_secs(1 << 32))
}

/// A refusal: the key is held until `until`.
fn refused(until: Instant, now: Instant) -> Attempt {
    Attempt::Held {
        remaining: Some(until.saturating_duration_since(now)),
        holder: None,
    }
}

/// A grant's fencing token and wall-clock time, for [`LockInfo`].
#[derive(Clone, Copy)]
struct Grant {
    fence: u64,
    at: SystemTime,
}

impl Grant {
    fn new(fence: u64) -> Self {
        Self {
            fence,
            at: SystemTime::now(),
        }
    }
}

/// What the store holds for a key.
enum Held {
    /// One holder: an exclusive lock (or a write lock).
    One {
        token: Token,
        expires: Instant,
        grant: Grant,
        /// Exclusive or fair.
        kind: LockKind,
    },
    /// Shared holders of one kind (readers, or permit holders), each with its expiry;
    /// `latest` is the latest grant.
    Many {
        kind: LockKind,
        holders: HashMap<Token, Instant>,
        latest: Grant,
    },
}

/// A 64-bit name for a holder that reveals nothing of its token (keyed per process).
fn digest(of: impl std::hash::Hash) -> u64 {
    static KEY: LazyLock<RandomState> = LazyLock::new(RandomState::new);
    KEY.hash_one(of)
}

/// The name a holder's token is kept under, and shown by (as `release_shared.lua`
/// derives its kept name from the token: the same before and after the release).
fn kept_digest(token: &Token) -> u64 {
    digest(("~kept", token))
}

/// How `inspect` names a live shared holder: its kept name's digits.
fn shared_name(token: &Token) -> String {
    if token.is_kept_name() {
        String::from_utf8_lossy(token.as_bytes()).into_owned()
    } else {
        format!("{:016x}", kept_digest(token))
    }
}

impl Held {
    /// The digest naming the holder (its token; shared holders: their kind), and the
    /// latest grant.
    fn named(&self) -> (u64, Grant) {
        match self {
            Held::One { token, grant, .. } => (digest(token), *grant),
            Held::Many { kind, latest, .. } => (digest(*kind), *latest),
        }
    }

    /// Drops expired shared holders; whether anyone still holds the key.
    fn live(&mut self, now: Instant) -> bool {
        match self {
            Self::One { expires, .. } => *expires > now,
            Self::Many { holders, .. } => {
                holders.retain(|_, expires| *expires > now);
                !holders.is_empty()
            }
        }
    }

    /// When the last holder's time runs out.
    fn expires(&self, now: Instant) -> Instant {
        match self {
            Self::One { expires, .. } => *expires,
            Self::Many { holders, .. } => holders.values().copied().max().unwrap_or(now),
        }
    }

    /// Moves `token`'s hold to `kept`, held until `until` (a kept `hold_at_least`).
    fn rename(&mut self, token: Token, kept: Token, until: Instant) {
        match self {
            Self::One {
                token: t, expires, ..
            } => {
                *t = kept;
                *expires = until;
            }
            Self::Many { holders, .. } => {
                holders.remove(&token);
                holders.insert(kept, until);
            }
        }
    }

    /// The expiry of `token`'s hold, if it holds the key.
    fn expiry_of(&mut self, token: Token) -> Option<&mut Instant> {
        match self {
            Self::One {
                token: t, expires, ..
            } => (*t == token).then_some(expires),
            Self::Many { holders, .. } => holders.get_mut(&token),
        }
    }
}

impl Table {
    /// The live entry of `key`, after dropping it if nobody holds it any more.
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Held> {
        if !self.locks.get_mut(key)?.live(now) {
            self.locks.remove(key);
            return None;
        }
        self.locks.get_mut(key)
    }

    /// When the earliest live intent of a writer waiting for `key`'s readers runs out.
    fn first_intent(&mut self, key: &str, now: Instant) -> Option<Instant> {
        let intents = self.intents.get_mut(key)?;
        intents.retain(|_, until| *until > now);
        let first = intents.values().copied().min();
        if first.is_none() {
            self.intents.remove(key);
        }
        first
    }

    /// The next fencing token of `key`'s slot, taken.
    fn next_fence(&mut self, key: &LockKey) -> Result<u64, LockError> {
        let counter = self.fences.get(key.fence()).copied().unwrap_or(0);
        let fence = counter
            .checked_add(1)
            .ok_or_else(|| counter_error(key, "overflows"))?;
        self.fences.insert(key.fence().to_owned(), fence);
        Ok(fence)
    }

    /// The fence an exclusive retry finding its own token gets: the counter as it is
    /// (nobody else was granted the key since). Every grant
    /// set the counter to at least 1; an operator cannot reach it, unlike a Redis key,
    /// but a missing one is still no token 0.
    fn current_fence(&mut self, key: &LockKey) -> Result<u64, LockError> {
        match self.fences.get(key.fence()) {
            Some(&fence) => Ok(fence),
            None => {
                self.locks.remove(key.full());
                Err(counter_error(key, "is missing"))
            }
        }
    }

    /// As `acquire.lua` and `acquire_shared.lua`: the claim's own hold renewed, a
    /// refusal, or a grant.
    fn acquire(&mut self, claim: &Claim<'_>, now: Instant) -> Result<Attempt, LockError> {
        let key = claim.key;
        let expires = expiry(now, claim.ttl);
        let shared = match claim.mode {
            Mode::Exclusive => None,
            Mode::Fair => {
                if let Some(queued) = self.wait_turn(claim, now)? {
                    return Ok(queued);
                }
                None
            }
            Mode::Read | Mode::Permit(_) => Some(claim.mode.kind()),
        };
        if let Some(attempt) = self.meet_holders(claim, shared, expires, now) {
            return attempt;
        }
        if shared == Some(LockKind::Read) {
            if let Some(first) = self.first_intent(key.full(), now) {
                return Ok(refused(first, now));
            }
        }
        let fence = self.next_fence(key)?;
        self.sweep(now);
        self.grant(claim, shared, expires, fence);
        Ok(Attempt::Acquired {
            fence,
            replicas: None,
        })
    }

    /// As `acquire_fair.lua`'s gate: `None` when it is the fair claim's turn (its
    /// place, if any, is left: the exclusive grant follows), else how it waits. Expired
    /// places are dropped first; a first place that leaves behind while the key is free
    /// has its waiter called ([`Table::called`]).
    fn wait_turn(&mut self, claim: &Claim<'_>, now: Instant) -> Result<Option<Attempt>, LockError> {
        let key = claim.key.full();
        let first = self.queues.first(key);
        self.queues.reclaim(key, now);
        let (ticket, waiter) = match claim.arrival {
            Some(a) => (self.queues.join(key, a, now)?, Some(a.waiter)),
            None => (0, None),
        };
        let head = self.queues.first(key);
        let held = self.live(key, now).map(|entry| {
            let other = entry.expiry_of(claim.token).is_none();
            (other, entry.expires(now))
        });
        // Its own token (a retry whose reply was lost) is granted again wherever its
        // place is; otherwise it is its turn when first and the key is free.
        let turn = match held {
            Some((other, _)) => !other,
            None => head == waiter,
        };
        let settling = claim.arrival.is_some_and(|a| a.purpose == Purpose::Settle);
        if turn && !settling {
            if let Some(w) = waiter {
                self.queues.leave(key, w);
            }
            return Ok(None);
        }
        if held.is_none() && head != first && head != waiter {
            self.called = head.map(Call::Waiter);
        }
        Ok(Some(Attempt::Queued {
            remaining: held.map(|(_, until)| until.saturating_duration_since(now)),
            holder: None,
            ticket,
        }))
    }

    /// What the key's live holders make of the claim (`shared`: the kind of a shared
    /// claim, `None` for an exclusive one): its own hold renewed until `expires`, a
    /// refusal, or `None` when the claim may join them or the key is free.
    fn meet_holders(
        &mut self,
        claim: &Claim<'_>,
        shared: Option<LockKind>,
        expires: Instant,
        now: Instant,
    ) -> Option<Result<Attempt, LockError>> {
        let key = claim.key;
        let entry = self.live(key.full(), now)?;
        if let Some(own) = entry.expiry_of(claim.token) {
            *own = expires;
            // A shared holder gets a fresh token: others may have been granted since.
            let fence = if shared.is_some() {
                self.next_fence(key)
            } else {
                self.current_fence(key)
            };
            return Some(fence.map(|fence| Attempt::Acquired {
                fence,
                replicas: None,
            }));
        }
        let until = entry.expires(now);
        match (entry, shared) {
            (Held::Many { kind, holders, .. }, Some(want)) if *kind == want => {
                if let Mode::Permit(n) = claim.mode {
                    if holders.len() >= n as usize {
                        let first = holders.values().copied().min().unwrap_or(now);
                        return Some(Ok(refused(first, now)));
                    }
                }
                None
            }
            // A writer refused, whoever holds the key (readers or another writer),
            // registers its intent, as `acquire.lua` does.
            (_, None) => {
                self.register_intent(claim, until, now);
                Some(Ok(refused(until, now)))
            }
            _ => Some(Ok(refused(until, now))),
        }
    }

    /// Registers the intent of a refused writer (if it has one) that was told the
    /// key is held until `until`.
    fn register_intent(&mut self, claim: &Claim<'_>, until: Instant, now: Instant) {
        if let Some(intent) = claim.intent.filter(|i| !i.until.is_zero()) {
            // At most until INTENT_SLACK after the expiry the writer is told.
            let lasts = intent
                .until
                .min(until.saturating_duration_since(now) + INTENT_SLACK);
            let until = now + lasts;
            self.intents
                .entry(claim.key.full().to_owned())
                .or_default()
                .insert(intent.waiter, until);
        }
    }

    /// Records the grant of `fence` to the claim, held until `expires`: the key alone
    /// (withdrawing the writer's intent), or a place among its shared holders.
    fn grant(&mut self, claim: &Claim<'_>, shared: Option<LockKind>, expires: Instant, fence: u64) {
        let key = claim.key;
        match shared {
            None => {
                if let Some(intent) = claim.intent {
                    // Granted: the writer's intent goes, and wakes nobody.
                    let _ = self.withdraw(key.full(), intent.waiter, Instant::now());
                }
                self.locks.insert(
                    key.full().to_owned(),
                    Held::One {
                        token: claim.token,
                        expires,
                        grant: Grant::new(fence),
                        kind: claim.mode.kind(),
                    },
                );
            }
            Some(kind) => {
                let entry = self
                    .locks
                    .entry(key.full().to_owned())
                    .or_insert_with(|| Held::Many {
                        kind,
                        holders: HashMap::new(),
                        latest: Grant::new(fence),
                    });
                if let Held::Many {
                    holders, latest, ..
                } = entry
                {
                    holders.insert(claim.token, expires);
                    *latest = Grant::new(fence);
                }
            }
        }
    }

    /// As `acquire_all.lua`: every key, or none.
    fn acquire_together(
        &mut self,
        keys: &[&LockKey],
        token: Token,
        ttl: Duration,
        now: Instant,
    ) -> Result<Together, LockError> {
        for key in keys {
            if let Some(entry) = self.live(key.full(), now) {
                if entry.expiry_of(token).is_none() {
                    let until = entry.expires(now);
                    return Ok(Together::Held(Some(until.saturating_duration_since(now))));
                }
            }
        }
        let expires = expiry(now, ttl);
        let mut fences = Vec::with_capacity(keys.len());
        for key in keys {
            match self.next_fence(key) {
                Ok(fence) => fences.push(fence),
                Err(e) => {
                    for taken in &keys[..fences.len()] {
                        self.locks.remove(taken.full());
                    }
                    return Err(e);
                }
            }
            self.locks.insert(
                key.full().to_owned(),
                Held::One {
                    token,
                    expires,
                    grant: Grant::new(fences[fences.len() - 1]),
                    kind: LockKind::Exclusive,
                },
            );
        }
        self.sweep(now);
        Ok(Together::Acquired(fences))
    }

    /// Removes a writer's intent, or a fair waiter's place.
    /// As `withdraw.lua`: whom that wakes — every waiter for an intent removed (readers
    /// it kept out), the new first fair waiter for a first place removed while the key
    /// is free, else nobody.
    fn withdraw(&mut self, key: &str, waiter: u64, now: Instant) -> Option<Call> {
        let first = self.queues.first(key);
        let placed = self.queues.leave(key, waiter);
        let intent = self
            .intents
            .get_mut(key)
            .is_some_and(|intents| intents.remove(&waiter).is_some());
        if self.intents.get(key).is_some_and(HashMap::is_empty) {
            self.intents.remove(key);
        }
        if intent {
            return Some(Call::Anyone);
        }
        let free = self.live(key, now).is_none();
        (placed && first == Some(waiter) && free)
            .then(|| self.queues.first(key).map(Call::Waiter))
            .flatten()
    }

    /// As `release.lua` / `release_shared.lua`: whether `lease` held the key (and now
    /// does not, or only until `keep` from now), and whether waiters should be woken
    /// (a fair lock's: its first waiter alone, [`Table::called`]).
    fn release(&mut self, lease: LeaseRef<'_>, keep: Duration, now: Instant) -> (bool, bool) {
        let key = lease.key.full();
        if lease.mode == Mode::Fair {
            self.queues.reclaim(key, now);
            self.called = Some(self.queues.first(key).map_or(Call::Anyone, Call::Waiter));
        }
        let Some(entry) = self.live(key, now) else {
            return (false, false);
        };
        let before = entry.expires(now);
        let Some(own) = entry.expiry_of(lease.token) else {
            return (false, false);
        };
        if !keep.is_zero() {
            // Kept under a token of its own, as the scripts' kept name: nothing sent
            // with the lease's token (an extend or renewal applied after this release)
            // can re-arm it. Waiters told of a later expiry ask again ('kept').
            let until = now.checked_add(keep).unwrap_or(*own);
            entry.rename(
                lease.token,
                Token::kept_name(kept_digest(&lease.token)),
                until,
            );
            return (true, true);
        }
        let (wake, emptied) = match entry {
            Held::One { .. } => (true, true),
            Held::Many { kind, holders, .. } => {
                holders.remove(&lease.token);
                let sooner = holders.values().max().is_none_or(|&last| last < before);
                (*kind == LockKind::Permit || sooner, holders.is_empty())
            }
        };
        if emptied {
            self.locks.remove(key);
        }
        (true, wake)
    }

    /// As `extend.lua` / `renew_shared.lua`: whether `lease` held the key and now
    /// holds it `ttl` longer, and whether that is sooner than before (its waiters,
    /// told the later time, are woken to ask again: 'sooner').
    fn extend(&mut self, lease: LeaseRef<'_>, ttl: Duration, now: Instant) -> (bool, bool) {
        match self
            .live(lease.key.full(), now)
            .and_then(|entry| entry.expiry_of(lease.token))
        {
            Some(own) if *own > now => {
                let until = now.checked_add(ttl).unwrap_or(*own);
                let sooner = until < *own;
                *own = until;
                (true, sooner)
            }
            _ => (false, false),
        }
    }
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

    /// One attempt: see [`Table::acquire`].
    fn acquire_now(&self, claim: &Claim<'_>) -> Result<Attempt, LockError> {
        let (attempt, called) = {
            let mut s = store();
            let attempt = s.acquire(claim, Instant::now());
            let called = s.called.take().map(|call| (call, s.listeners.clone()));
            (attempt, called)
        };
        if let Some((call, listeners)) = called {
            for w in &listeners {
                w.wake_for(claim.key.full(), call);
            }
        }
        attempt
    }

    /// A release: see [`Table::release`].
    fn release_now(&self, lease: LeaseRef<'_>, keep: Duration) -> bool {
        Self::telling(lease.key, |s| s.release(lease, keep, Instant::now()))
    }

    /// An extend or renewal: see [`Table::extend`].
    fn extend_now(&self, lease: LeaseRef<'_>, ttl: Duration) -> bool {
        Self::telling(lease.key, |s| s.extend(lease, ttl, Instant::now()))
    }

    /// Runs `op` on the store; when it says the key's hold ended or got shorter, wakes
    /// every manager's waiters of the key (as the scripts publish), outside the lock.
    fn telling(key: &LockKey, op: impl FnOnce(&mut Table) -> (bool, bool)) -> bool {
        let (done, call, listeners) = {
            let mut s = store();
            let (done, wake) = op(&mut s);
            let call = s.called.take().unwrap_or(Call::Anyone);
            (done, call, wake.then(|| s.listeners.clone()))
        };
        for w in listeners.iter().flatten() {
            w.wake_for(key.full(), call);
        }
        done
    }

    /// Deletes a lock whoever holds it, or with `seen` only while that grant holds it;
    /// true when a live one was deleted.
    fn force_unlock_now(&self, key: &LockKey, seen: Option<Seen<'_>>) -> bool {
        let (live, listeners) = {
            let mut s = store();
            let live = s.live(key.full(), Instant::now()).map(|h| h.named());
            if let Some(seen) = seen {
                match live {
                    Some((holder, grant))
                        if seen.admits(&format!("{holder:016x}"), Some(grant.fence)) => {}
                    _ => return false,
                }
            }
            let live = live.is_some();
            s.locks.remove(key.full());
            s.intents.remove(key.full());
            (live, s.listeners.clone())
        };
        for w in &listeners {
            w.wake(key.full());
        }
        live
    }

    /// What is known of the lock: see [`Store::inspect`].
    fn inspect_now(&self, key: &LockKey) -> Option<LockInfo> {
        let now = Instant::now();
        let mut s = store();
        let entry = s.live(key.full(), now)?;
        let ttl = entry.expires(now).saturating_duration_since(now);
        let (holder, grant) = entry.named();
        let (kind, holding) = match entry {
            Held::One { token, kind, .. } => (*kind, (token.is_kept_name(), Vec::new())),
            Held::Many { kind, holders, .. } => {
                let mut shared: Vec<_> = holders
                    .iter()
                    .map(|(token, expires)| SharedHolder {
                        name: shared_name(token),
                        ttl: Some(expires.saturating_duration_since(now)),
                        kept: token.is_kept_name(),
                        fencing_token: None,
                    })
                    .collect();
                info::soonest_to_expire_first(&mut shared);
                (*kind, (false, shared))
            }
        };
        let queued = s.queues.len(key.full(), now);
        let mut info = info::local(
            key.full(),
            kind,
            holding,
            ttl,
            grant.fence,
            grant.at,
            holder,
        );
        info.queued = u32::try_from(queued).unwrap_or(u32::MAX);
        Some(info)
    }

    /// Every live lock under `prefix` matching the glob: see [`Store::list`].
    fn list_now(&self, prefix: &str, pattern: &str) -> Vec<LockInfo> {
        let glob = scan_glob(prefix, pattern);
        let names: Vec<Vec<u8>> = store()
            .locks
            .keys()
            .filter(|k| glob_match(glob.as_bytes(), k.as_bytes()))
            .map(|k| k.as_bytes().to_vec())
            .collect();
        lock_keys(prefix, names)
            .iter()
            .filter_map(|key| self.inspect_now(key))
            .collect()
    }

    /// Whether anyone holds the lock.
    fn is_locked_now(&self, key: &LockKey) -> bool {
        store().live(key.full(), Instant::now()).is_some()
    }
}

impl Store for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    /// Never waits on anything; a bound for form's sake.
    fn request_timeout(&self, _ttl: Duration, _mode: Mode) -> Duration {
        Duration::from_secs(1)
    }

    fn acquire(
        &self,
        claim: &Claim<'_>,
    ) -> impl Future<Output = Result<Attempt, LockError>> + Send {
        ready(self.acquire_now(claim))
    }

    fn acquire_together(
        &self,
        keys: &[&LockKey],
        token: Token,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Together>, LockError>> + Send {
        let taken = store().acquire_together(keys, token, ttl, Instant::now());
        ready(taken.map(Some))
    }

    fn release(
        &self,
        lease: LeaseRef<'_>,
        keep: Duration,
    ) -> impl Future<Output = Result<bool, LockError>> + Send {
        ready(Ok(self.release_now(lease, keep)))
    }

    fn extend(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, LockError>> + Send {
        ready(Ok(self.extend_now(lease, ttl)))
    }

    fn renew(
        &self,
        batch: &[Renewal<'_>],
    ) -> impl Future<Output = Result<Vec<Renewed>, LockError>> + Send {
        let renewed = batch
            .iter()
            .map(|r| {
                let lease = LeaseRef::new(r.key, r.token, r.mode);
                self.extend_now(lease, r.ttl).into()
            })
            .collect();
        ready(Ok(renewed))
    }

    fn inspect(
        &self,
        key: &LockKey,
    ) -> impl Future<Output = Result<Option<LockInfo>, LockError>> + Send {
        ready(Ok(self.inspect_now(key)))
    }

    fn list(
        &self,
        prefix: &str,
        pattern: &str,
    ) -> impl Future<Output = Result<Vec<LockInfo>, LockError>> + Send {
        ready(Ok(self.list_now(prefix, pattern)))
    }

    fn is_locked(&self, key: &LockKey) -> impl Future<Output = Result<bool, LockError>> + Send {
        ready(Ok(self.is_locked_now(key)))
    }

    fn eviction_policies(&self) -> impl Future<Output = Result<Policies, LockError>> + Send {
        ready(Ok(Vec::new()))
    }

    fn force_unlock(
        &self,
        key: &LockKey,
        seen: Option<Seen<'_>>,
    ) -> impl Future<Output = Result<bool, LockError>> + Send {
        ready(Ok(self.force_unlock_now(key, seen)))
    }

    fn withdraw(
        &self,
        key: &LockKey,
        waiter: u64,
    ) -> impl Future<Output = Result<(), LockError>> + Send {
        let called = {
            let mut s = store();
            let call = s.withdraw(key.full(), waiter, Instant::now());
            call.map(|call| (call, s.listeners.clone()))
        };
        if let Some((call, listeners)) = called {
            for w in &listeners {
                w.wake_for(key.full(), call);
            }
        }
        ready(Ok(()))
    }

    fn subscribe(
        &self,
        _key: &str,
        _register: Register,
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
    use crate::wire::Intent;

    /// Entries of the shared store under `prefix`: (lock entries, counters).
    fn count(prefix: &str) -> (usize, usize) {
        let s = store();
        (
            s.locks.keys().filter(|k| k.starts_with(prefix)).count(),
            s.fences.keys().filter(|k| k.starts_with(prefix)).count(),
        )
    }

    fn exclusive(key: &LockKey, token: Token, ttl: Duration) -> Claim<'_> {
        Claim {
            key,
            token,
            ttl,
            replicas: None,
            mode: Mode::Exclusive,
            intent: None,
            arrival: None,
        }
    }

    fn lease(key: &LockKey, token: Token) -> LeaseRef<'_> {
        LeaseRef::new(key, token, Mode::Exclusive)
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
            first.push(fence(b.acquire_now(&exclusive(&k, token, ttl))));
            assert!(b.release_now(lease(&k, token), Duration::ZERO));
        }
        assert_eq!(count(prefix), (0, 4), "2 000 keys in 4 slots");
        for i in (0..2000).step_by(97) {
            let k = key(prefix, &format!("order_{{{}}}:{i}", i % 4));
            let token = Token::random();
            assert!(
                fence(b.acquire_now(&exclusive(&k, token, ttl))) > first[i],
                "key {i}"
            );
            assert!(b.release_now(lease(&k, token), Duration::ZERO));
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
                fence(b.acquire_now(&exclusive(&k, Token::random(), Duration::from_millis(1))));
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
            fence(b.acquire_now(&exclusive(&k, token, Duration::from_secs(5)))),
            u64::MAX
        );
        assert!(b.release_now(lease(&k, token), Duration::ZERO));
        let err = b
            .acquire_now(&exclusive(&k, Token::random(), Duration::from_secs(5)))
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
            let first = fence(b.acquire_now(&exclusive(&k, token, TTL)));
            std::thread::sleep(TTL / 2);
            let retried = Instant::now();
            assert_eq!(fence(b.acquire_now(&exclusive(&k, token, TTL))), first);
            std::thread::sleep((granted + TTL * 5 / 4).saturating_duration_since(Instant::now()));
            let locked = b.is_locked_now(&k);
            let conclusive = retried.elapsed() < TTL;
            b.release_now(lease(&k, token), Duration::ZERO);
            if conclusive {
                assert!(locked, "the retry reset the expiry to its ttl");
                return;
            }
        }
        panic!("the machine never woke up inside the window the check needs");
    }

    /// Regression (kinds review): a writer's intent lasted its whole remaining wait (here
    /// 10 minutes), so a writer that died kept new readers out that long. It runs out 2 s
    /// after the expiry the writer was told, as in `acquire.lua`.
    #[test]
    fn a_writers_intent_runs_out_soon_after_the_expiry_it_was_told() {
        let b = MemoryBackend(());
        let k = key("mem-intent:", "report");
        let reader = Claim {
            mode: Mode::Read,
            ..exclusive(&k, Token::random(), Duration::from_secs(1))
        };
        fence(b.acquire_now(&reader));
        let writer = Claim {
            intent: Some(Intent {
                waiter: 9,
                until: Duration::from_secs(600),
            }),
            ..exclusive(&k, Token::random(), Duration::from_secs(30))
        };
        assert!(matches!(b.acquire_now(&writer), Ok(Attempt::Held { .. })));
        let lasts = store().intents[k.full()][&9].saturating_duration_since(Instant::now());
        assert!(
            lasts > Duration::from_secs(2) && lasts <= Duration::from_secs(3),
            "the intent of a writer told 1 s lasts {lasts:?}"
        );
    }
}
