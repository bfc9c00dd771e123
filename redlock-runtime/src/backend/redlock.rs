//! Redlock: the same lock on N independent Redis masters, held by a majority.
//!
//! Every operation goes to all N nodes at once, each request bounded by the per-node
//! timeout (default 200 ms, at most ttl/10), so a frozen or partitioned node never hangs
//! a call. Acquire, release, extend and subscribe return as soon as their outcome is
//! decided, not when the slowest node answers: with one node frozen they cost what the
//! healthy ones cost. Each node is a [`SingleBackend`] (its own command and subscriber
//! connections, reconnecting by themselves).
//!
//! The requests still unanswered when a call returns are never dropped (a dropped request
//! may never be written, and an undo lost that way leaves its key behind): a task of
//! their own drives them to completion and finishes what they did. It owns the node
//! connections, so it completes even when the manager is dropped meanwhile.
//!
//! - **Acquire** runs `acquire.lua` (`SET NX PX` plus the node's fencing `INCR`) on every
//!   node. The lock is ours iff a quorum (N/2+1) said yes *and* the validity
//!   ttl − elapsed − drift (drift = 1 % of the ttl + 2 ms), measured from before the
//!   requests were sent, is still positive once the last counted grant arrived (a ttl too
//!   short for that even when every node answers in time, under 5 ms, is refused before
//!   any request; a quorum that granted too late is a [`LockError::Backend`] error, never
//!   "held": the key was free). Grants landing after that are kept as part of the lock
//!   (renewals and release go to every node), unless the lock was released before they
//!   landed: then they are undone — except a grant of one key sent once that the
//!   release on that node found (it was applied before the release and never again:
//!   see `keep_late_grants`).
//!   A lost attempt returns as soon as a quorum is impossible (and the answers tell a
//!   holder of a quorum from a split vote, see `Tally::decided`): what it won, every
//!   node whose request failed (it may have been applied, its reply lost), and every
//!   node that answers later with a grant or not at all, is undone in the background
//!   (compare-token, without a wake-up: it would wake this caller itself). A node still
//!   in flight also gets one undo at once, queued behind the request, so this manager's
//!   next attempt never finds the attempt's late grants. It is
//!   reported as [`Attempt::Held`] — retried by the manager after a random jitter when no
//!   single holder has a quorum (a split vote), else after the holder's remaining ttl or
//!   at once on its release notification — or as [`LockError::QuorumUnavailable`] when
//!   fewer than a quorum of nodes answered. Either way the undo is this one: the manager
//!   does not release a failed attempt again (it does for one whose future it dropped).
//! - **`lock_all`** (several exclusive keys, one token) is one `acquire_all.lua` call per
//!   node, all keys or none there, decided, kept and undone as one acquisition (above):
//!   won on a quorum within the validity, each key's fencing token the maximum of its
//!   deciding grants vouched for by a quorum (see "Fencing tokens"); a late grant is
//!   kept, or undone for every key when the keys (released together) were released
//!   before it landed; a lost attempt is undone for every key on every node that granted,
//!   failed or is still in flight. The manager then takes the keys one by one.
//! - **Permits** (`permit(k, n)`): a count above one cannot be voted per node, so a
//!   permit is one of the key's `n` *places*, each an exclusive lock won as above, found
//!   by a probe of the places on a quorum (`acquire_place`), and then a shared holder of
//!   the key itself (the permit marker, no limit: `hold_key`), won as a reader is. The
//!   key's own script on each node keeps permits, readers and exclusive holders apart;
//!   two quorums share a node, so no two kinds that exclude each other both win. Its
//!   release, extend and renewals go to both halves.
//! - **Release and extend** go to every node; they succeed when a quorum confirms, report
//!   the lock lost when so many nodes deny it that no quorum can, and fail with
//!   `QuorumUnavailable` when too few answered to tell. A release unconfirmed by a node
//!   is retried in the background for a few seconds.
//! - **Renewal** (the watchdog) extends each lock on every node, one pipelined request
//!   per node and ttl group, each bounded by its group's shortest ttl and its size (see
//!   [`RedlockBackend::renew`]); a lock is lost once a majority no longer confirms it.
//! - **Wake-ups**: a release publishes on every node it reaches, and any node's message
//!   wakes the waiter. A successful release reaches a quorum, which meets every set of
//!   N − quorum + 1 nodes (2 of 3, 3 of 5): a waiter counts as *listening* (it sleeps
//!   until the holder's ttl, trusting the notification) only while that many nodes
//!   confirmed its channel; below that it polls and subscribes again every second (the
//!   manager's wait loop). Waiters subscribe on every node; a node whose `SUBSCRIBE`
//!   fails while the channel is heard anyway is asked again a few times in the
//!   background, to keep the margin. A head is woken when its channel becomes heard
//!   (a release may have gone unheard before) or unheard (it must poll), not when one
//!   more node confirms a channel already heard, nor when a node drops one that stays
//!   heard (see `notify::Hearing`).
//!
//! # Fencing tokens
//! Each node keeps its own fencing counters, one per hash slot, shared by every key of
//! the slot (see `key.rs`). A counter changes in two ways only, both upwards: `INCR` by
//! one in the script of every `SET NX` the node grants for a key of the slot (the script
//! increments first, and takes it back within the same atomic step when someone else
//! holds the key: a refusal leaves the counter as it was; a retry that finds its own
//! grant leaves a gap), and
//! `fence_floor.lua` (a compare-token `counter = max(counter, token)`, run only while the
//! node still holds our lock key). So, as long as the node keeps its data, **a counter
//! never decreases**. Counters and the floor are exact decimal strings on the server
//! and `u64` here, never Lua doubles.
//!
//! The token of an acquisition is the **maximum** counter among the grants that decided
//! it (the first quorum to answer). That maximum must be *vouched for* by a quorum: nodes
//! whose acquire script reported it, plus nodes raised to it by `fence_floor.lua`. When
//! all granting nodes agree (the normal case) this costs nothing; when they disagree (a
//! node was down or restarted, or other keys of the slot were granted by some nodes only)
//! a second round trip raises the lagging ones until a quorum vouches, before the guard
//! is handed out, and an attempt that cannot get a quorum to vouch is undone like any
//! failed attempt. The other lagging nodes, and grants landing after the decision whose
//! counter is behind, are raised in the background while the lock is held.
//!
//! **Guaranteed, whatever the clocks and pauses do**: take two successful acquisitions
//! A and B of a key, and a node *n* that vouched for A's token and granted B. When *n*
//! vouched, A's key was on *n* (the vouch is the reply of A's acquire script, which
//! reads the counter while A's key is there, or a compare-token raise) and *n*'s
//! counter for the slot was at least A's token. B's `SET NX` on *n* succeeded, so A's
//! key was gone from *n* by then: B's `INCR` on *n* came after the vouch. In between
//! the counter may have been raised by other keys of the slot, never lowered, so B's
//! script on *n* reported more than A's token, and B's token (the maximum over B's
//! granting nodes) is at least that. Two quorums always share a
//! node, so as long as no node loses its data, the tokens of any two acquisitions of a
//! key differ, and the one that took the shared node later has the larger token. With
//! non-overlapping holds (Redlock's mutual exclusion working) that is real-time order:
//! tokens strictly increase per key, and they start at 1. (Keys of one slot share the
//! counter, so a key's tokens skip the values its neighbours took; nothing is promised
//! across keys.)
//!
//! **Not guaranteed when nodes lose data** (a restart without persistence, or with
//! `appendfsync everysec` losing its last second): a node that comes back empty has
//! forgotten both the lock keys and its counters. Mutual exclusion needs the
//! *delayed-restart rule*: a crashed node must stay down longer than the longest ttl in
//! use (including `extend`), so every lock it knew has expired or been renewed on the
//! others before it answers again. Tokens stay increasing as long as every quorum still
//! meets a node that vouched for the previous token and kept its counter: with V vouching
//! nodes and f of them restarted empty, that holds when V − f > N − quorum. An
//! acquisition that won all N nodes tolerates ⌊N/2⌋ lost counters; one that won just a
//! quorum tolerates none. Restarted nodes catch up with the next acquisition that wins
//! them (their low counter is raised to the token). Persistence with
//! `appendfsync always` on every node removes the caveat for both.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::glob::glob_match;
use super::server::{release_call, scan_glob, INSPECT_BATCH};
use super::single::SingleBackend;
use super::{jitter, Attempt, Claim, Policies, Renewed, Seen, Store, Timeouts, Together};
use crate::error::chain;
use crate::info::{soonest_to_expire_first, LockInfo, SharedHolder};
use crate::key::{LockKey, PLACE_INFIX};
use crate::kind::{LockKind, Mode};
use crate::lease::drift;
use crate::notify::Hearing;
use crate::scripts::FENCE_FLOOR;
use crate::token::Token;
use crate::waiters::Wake;
use crate::wire::{LeaseRef, Publish, Renewal};
use crate::LockError;

/// The default bound on each node's reply.
pub(crate) const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(200);
/// The shortest ttl a Redlock lock can have: the shortest whole number of milliseconds
/// whose validity (ttl − drift, drift = 1 % of the ttl + 2 ms) outlasts an attempt's
/// two rounds (acquire and fencing, each within the per-node timeout, at least 1 ms),
/// so that a grant answered in time is still valid. At or below the drift no grant
/// ever is: a free key would read as held (see [`Store::min_ttl`]).
const MIN_REDLOCK_TTL: Duration = Duration::from_millis(5);
/// Pauses before each request of a background undo: the first at once, then retries
/// while the node does not confirm (a release retries from the second). About 6 s in
/// all, as long as the manager's background release of a failed attempt used to try.
const UNDO_PAUSES: [Duration; 5] = [
    Duration::ZERO,
    Duration::from_millis(200),
    Duration::from_millis(800),
    Duration::from_secs(2),
    Duration::from_secs(3),
];
/// Pauses before asking a node again for a channel whose `SUBSCRIBE` failed there (a
/// request to a connection that gave up reconnecting fails, and starts a reconnection:
/// the next one may get through).
const RESUBSCRIBE_PAUSES: [Duration; 4] = [
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
];
/// The time a renewal request may take per lock, on top of the per-node timeout.
const RENEW_PER_LOCK: Duration = Duration::from_micros(10);
/// The longest random delay added to a retry after a failed attempt.
const MAX_JITTER: Duration = Duration::from_millis(50);

/// N independent masters.
pub(crate) struct RedlockBackend {
    /// Shared with the requests still in flight after a call returned.
    nodes: Arc<[SingleBackend]>,
    quorum: usize,
    node_timeout: Duration,
    /// Won attempts whose requests to some nodes are still in flight, by token: `true`
    /// once the lock was released meanwhile (see [`RedlockBackend::keep_late_grants`]).
    landing: Arc<Mutex<HashMap<Token, Landing>>>,
    /// Requests that set a lock's expiry (a won acquisition's late grants, an extend's
    /// stragglers) and may still be written, by token and full key: see
    /// [`RedlockBackend::settle`].
    settling: Arc<Mutex<HashMap<(Token, String), Settling>>>,
    /// Tells the entries of `settling` apart.
    settle_ids: AtomicU64,
    /// What each node answered to the release of a lock, by token and full key, while
    /// its acquisition (of that key alone) still has requests in flight: a late grant
    /// that the release found needs no undo (see
    /// [`keep_late_grants`](RedlockBackend::keep_late_grants)).
    released_on: Arc<Mutex<HashMap<(Token, String), ReleaseAnswers>>>,
    /// The place of each permit held or being acquired, by token (see
    /// [`LockKey::place`]).
    places: Mutex<HashMap<Token, Arc<LockKey>>>,
}

/// The late grants of the won acquisitions of one token (a permit's place and its hold
/// on the key share it).
#[derive(Debug, Default)]
struct Landing {
    /// The acquisitions whose requests are still in flight.
    pending: usize,
    /// Whether the lock was released meanwhile (its late grants are undone).
    released: bool,
}

/// Each node's answer to a release, once it came: whether it found the token there
/// (deleted it, or kept it for `hold_at_least`).
type ReleaseAnswers = Arc<watch::Sender<Vec<Option<bool>>>>;

/// The expiry-setting requests of one lock still in flight after their call returned.
struct Settling {
    id: u64,
    /// Cuts the unanswered ones (see [`RedlockBackend::send_to`]) when the next extend
    /// may (extend stragglers); `None` for the late grants of an acquisition.
    cut: Option<CancellationToken>,
    /// Cancelled once every one of them was answered or cut (never written after that).
    done: CancellationToken,
}

/// What a release or undo on a node names: the token, its kind of place, and how long
/// to keep the key (`hold_at_least`; zero for an undo).
#[derive(Debug, Clone, Copy)]
struct Stake {
    token: Token,
    mode: Mode,
    keep: Duration,
}

/// What becomes of the requests of a quorum vote still in flight when it is decided.
enum Stragglers {
    /// A release: each is retried in the background until confirmed, as is every node
    /// whose request failed before the vote was decided.
    Retry(Stake),
    /// An extend of this lock: driven until the per-node deadline, then cut, so that the
    /// next extend of the lock can wait for them (see [`RedlockBackend::settle`]).
    Settle(Token),
}

/// One node's answer to an acquisition, one lock or several at once.
trait Grant: Send + 'static {
    /// The fencing counters of a grant, one per key in key order; `Err` with the
    /// remaining ttl and holder when someone else holds a key.
    fn fences(&self) -> Result<&[u64], (Option<Duration>, Option<u64>)>;
}

impl Grant for Attempt {
    fn fences(&self) -> Result<&[u64], (Option<Duration>, Option<u64>)> {
        match self {
            Attempt::Acquired { fence, .. } => Ok(std::slice::from_ref(fence)),
            Attempt::Held { remaining, holder } => Err((*remaining, *holder)),
        }
    }
}

/// `acquire_all.lua` does not say who holds the key it found.
impl Grant for Together {
    fn fences(&self) -> Result<&[u64], (Option<Duration>, Option<u64>)> {
        match self {
            Together::Acquired(fences) => Ok(fences),
            Together::Held(remaining) => Err((*remaining, None)),
        }
    }
}

/// Whether a node answered that someone else holds a key (it took nothing then).
fn refused<T: Grant>(answer: &Result<T, LockError>) -> bool {
    matches!(answer, Ok(a) if a.fences().is_err())
}

/// How a contended acquisition of one or more keys came out (see
/// [`RedlockBackend::contend`]).
enum Contest {
    /// Ours, with the fencing token of each key.
    Won(Vec<u64>),
    /// Lost; retry after this long.
    Lost(Duration),
}

/// One node's answer: its index and its outcome.
type Answer<T> = (usize, Result<T, LockError>);

/// One request per node, each owning what it needs. A call returns as soon as its outcome
/// is decided; the requests still unanswered then are driven to completion by a task of
/// their own ([`finish`]), never dropped: a dropped request may never be written (an undo
/// lost that way leaves its key behind for the whole ttl), or be written with nobody left
/// to undo what it did.
type InFlight<T> = FuturesUnordered<Pin<Box<dyn Future<Output = Answer<T>> + Send>>>;

/// How a quorum vote came out.
enum Vote {
    /// A quorum confirmed.
    Yes,
    /// So many nodes denied that no quorum can confirm.
    No,
    /// Too few answered to tell (yet).
    Unknown,
}

/// The answers to an acquisition so far.
#[derive(Default)]
struct Tally {
    /// Node and fencing counters (one per key) of every grant.
    granted: Vec<(usize, Vec<u64>)>,
    /// Remaining ttl and holder of every node held by someone else.
    held: Vec<(Option<Duration>, Option<u64>)>,
    /// Every node that answered "held".
    held_by: Vec<usize>,
    /// Every node whose request failed (it may have been applied, its reply lost).
    failed: Vec<usize>,
    last_error: Option<LockError>,
}

impl Tally {
    fn add<T: Grant>(&mut self, (i, answer): Answer<T>) {
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                self.failed.push(i);
                self.last_error = Some(e);
                return;
            }
        };
        match answer.fences() {
            Ok(fences) => self.granted.push((i, fences.to_vec())),
            Err(held) => {
                self.held.push(held);
                self.held_by.push(i);
            }
        }
    }

    /// Whether node `i` answered, or its request failed.
    fn answered_by(&self, i: usize) -> bool {
        self.granted.iter().any(|(g, _)| *g == i)
            || self.held_by.contains(&i)
            || self.failed.contains(&i)
    }

    fn answered(&self) -> usize {
        self.granted.len() + self.held.len()
    }

    /// Whether the answers so far decide the attempt: a quorum granted, or it cannot
    /// and enough answered to tell "held" from "quorum unavailable" — and, for a lost
    /// attempt, from a split vote: while some holder seen so far could still turn out
    /// to hold a quorum with the nodes yet to answer, and none is known to, the answers
    /// so far cannot say when to retry (at once after a split vote, or when the holder
    /// of a quorum lets go), so the attempt waits for the other nodes (still bounded by
    /// the per-node timeout): otherwise a waiter behind a majority holder whose keys are
    /// on the slower nodes would re-poll every few milliseconds for as long as it holds.
    fn decided(&self, nodes: usize, quorum: usize) -> bool {
        let failed = self.failed.len();
        let pending = nodes - self.answered() - failed;
        self.granted.len() >= quorum
            || (self.granted.len() + pending < quorum
                && (self.answered() >= quorum || failed > nodes - quorum)
                && !self.holder_unclear(pending, quorum))
    }

    /// Whether no holder is known to hold `quorum` nodes, yet one could with the
    /// `pending` nodes that have not answered.
    fn holder_unclear(&self, pending: usize, quorum: usize) -> bool {
        if pending == 0 {
            return false;
        }
        let count = |h: u64| self.held.iter().filter(|(_, o)| *o == Some(h)).count();
        let holders = || self.held.iter().filter_map(|&(_, h)| h);
        !holders().any(|h| count(h) >= quorum) && holders().any(|h| count(h) + pending >= quorum)
    }
}

impl RedlockBackend {
    /// Connects to and PINGs every node concurrently, within the connect timeout.
    pub(crate) async fn connect(
        nodes: Vec<redis::ConnectionInfo>,
        timeouts: Timeouts,
        node_timeout: Duration,
        wake: Wake,
    ) -> Result<Self, LockError> {
        if nodes.is_empty() {
            return Err(LockError::invalid_option(
                "redlock() needs at least one node URL",
            ));
        }
        if node_timeout.is_zero() {
            return Err(LockError::invalid_option(
                "redlock_node_timeout must be positive",
            ));
        }
        let connected = join_all(
            nodes
                .into_iter()
                .map(|node| SingleBackend::connect(node, timeouts, wake.clone(), "redlock")),
        )
        .await;
        let nodes = connected
            .into_iter()
            .map(|node| node.map(SingleBackend::alone))
            .collect::<Result<Vec<_>, _>>()?;
        let quorum = nodes.len() / 2 + 1;
        Hearing::join(
            nodes.iter().map(SingleBackend::subscriber),
            hearing(nodes.len(), quorum),
        );
        Ok(Self {
            quorum,
            nodes: nodes.into(),
            node_timeout,
            landing: Arc::default(),
            places: Mutex::default(),
            settling: Arc::default(),
            settle_ids: AtomicU64::new(0),
            released_on: Arc::default(),
        })
    }

    /// The per-node bound for a lock of `ttl`: the configured timeout, at most ttl/10.
    fn node_timeout(&self, ttl: Duration) -> Duration {
        self.node_timeout
            .min(ttl / 10)
            .max(Duration::from_millis(1))
    }

    /// Runs `f` on every node at once, each bounded by `timeout`, and waits for them all
    /// (for requests whose loss is harmless: reads, renewals, unsubscriptions).
    async fn on_all<'a, T, F, Fut>(
        &'a self,
        operation: &'static str,
        timeout: Duration,
        f: F,
    ) -> Vec<Result<T, LockError>>
    where
        F: Fn(&'a SingleBackend) -> Fut,
        Fut: Future<Output = Result<T, LockError>> + 'a,
    {
        join_all(self.nodes.iter().map(|node| {
            let request = f(node);
            async move {
                tokio::time::timeout(timeout, request)
                    .await
                    .unwrap_or_else(|_| Err(LockError::timed_out(operation, timeout)))
            }
        }))
        .await
    }

    /// Sends `request(nodes, i)` to every node `i`.
    fn send_all<T, F, Fut>(&self, request: F) -> InFlight<T>
    where
        F: Fn(Arc<[SingleBackend]>, usize) -> Fut,
        Fut: Future<Output = Result<T, LockError>> + Send + 'static,
        T: 'static,
    {
        self.send_to(0..self.nodes.len(), None, request)
    }

    /// Sends `request(nodes, i)` to each node `i` of `to`. Once `cut` is cancelled, the
    /// requests still unanswered answer a timeout error at once, their futures dropped:
    /// whatever they had not written yet (a send after a reconnect, an `EVAL` after
    /// `NOSCRIPT`) is never written.
    fn send_to<T, F, Fut>(
        &self,
        to: impl IntoIterator<Item = usize>,
        cut: Option<(&CancellationToken, &'static str, Duration)>,
        request: F,
    ) -> InFlight<T>
    where
        F: Fn(Arc<[SingleBackend]>, usize) -> Fut,
        Fut: Future<Output = Result<T, LockError>> + Send + 'static,
        T: 'static,
    {
        to.into_iter()
            .map(|i| {
                let request = request(self.nodes.clone(), i);
                let cut = cut.map(|(c, operation, timeout)| (c.clone(), operation, timeout));
                Box::pin(async move {
                    let Some((cut, operation, timeout)) = cut else {
                        return (i, request.await);
                    };
                    tokio::select! {
                        biased;
                        answer = request => (i, answer),
                        () = cut.cancelled() => (i, Err(LockError::timed_out(operation, timeout))),
                    }
                }) as Pin<Box<dyn Future<Output = Answer<T>> + Send>>
            })
            .collect()
    }

    /// Waits until the requests that may still set the expiry of `key` held with `token`
    /// on some node (the late grants of its acquisition, the stragglers of its last
    /// extend) were answered or cut, so that none of them can be written after a request
    /// sent from now on. By key: the keys of a `lock_all` share a token, and are
    /// extended at once (`MultiGuard::extend`), each waiting for its own stragglers only.
    ///
    /// An extend's stragglers are cut at once: one already written was written before
    /// anything sent from now on over the same connection, so the node applies it
    /// first; one not written yet never will be, and the new extend sets that node's
    /// expiry anyway. So back-to-back extends do not wait for a frozen node. The late
    /// grants of an acquisition are waited for (bounded by its per-node timeout): cut
    /// unwritten (an `EVAL` after `NOSCRIPT`), a grant would leave its node without the
    /// key for good, and the lock on a bare quorum.
    async fn settled(&self, token: Token, key: &LockKey) {
        let pending = lock(&self.settling)
            .get(&(token, key.full().to_owned()))
            .map(|s| (s.cut.clone(), s.done.clone()));
        if let Some((cut, done)) = pending {
            if let Some(cut) = cut {
                cut.cancel();
            }
            done.cancelled().await;
        }
    }

    /// Drives the expiry-setting requests of `keys` held with `token` still in flight
    /// after their call returned, in a task of its own, handing each answer to `then`;
    /// at `deadline` the unanswered ones are cut (`cut`: see [`send_to`](Self::send_to))
    /// and answer a timeout. The next extend of each key waits for that, cutting them at
    /// once when `cut_early` (an extend's stragglers: see [`settled`](Self::settled)).
    ///
    /// Why: a request may be written long after its call returned — `reconnecting`
    /// sends it again after a dropped connection, `LuaScript::invoke` sends `EVAL` after
    /// `NOSCRIPT`, and a send waits for a reconnect in progress. If that happened after a
    /// later extend of the same lock had been applied on that node, the node would end up
    /// with the older (possibly shorter) ttl while the lease books the newer one: the
    /// lease could outlive a quorum of its keys. The lease's operation lock cannot cover
    /// them (the call returned and released it), so the next extend of the lock settles
    /// them before sending: the lock's expiry-setting requests stay one at a time, as
    /// the `lease` module requires. Renewals need not wait: they carry the lease's
    /// current ttl, the one of its last extend (or of the acquisition when none), so one
    /// of these requests landing after a renewal sets an expiry at least as late as the
    /// one the renewal booked; and a renewal's own requests are dropped, never re-sent,
    /// when its call returns (under the operation lock).
    #[allow(clippy::too_many_arguments)] // Each one says what to settle, or how.
    fn settle<T, G>(
        &self,
        token: Token,
        keys: impl IntoIterator<Item = String>,
        deadline: tokio::time::Instant,
        cut: CancellationToken,
        cut_early: bool,
        in_flight: InFlight<T>,
        mut then: G,
    ) where
        T: Send + 'static,
        G: FnMut(Answer<T>) + Send + 'static,
    {
        if in_flight.is_empty() {
            return;
        }
        let done = CancellationToken::new();
        let id = self.settle_ids.fetch_add(1, Ordering::Relaxed);
        let keys: Vec<(Token, String)> = keys.into_iter().map(|k| (token, k)).collect();
        let mut settling = lock(&self.settling);
        for key in &keys {
            let entry = Settling {
                id,
                cut: cut_early.then(|| cut.clone()),
                done: done.clone(),
            };
            settling.insert(key.clone(), entry);
        }
        drop(settling);
        let settling = self.settling.clone();
        tokio::spawn(async move {
            let answers = in_flight.for_each(move |answer| {
                then(answer);
                std::future::ready(())
            });
            tokio::pin!(answers);
            tokio::select! {
                biased;
                () = &mut answers => {}
                () = tokio::time::sleep_until(deadline) => {
                    cut.cancel();
                    answers.await;
                }
            }
            let mut settling = lock(&settling);
            for key in keys {
                if settling.get(&key).is_some_and(|s| s.id == id) {
                    settling.remove(&key);
                }
            }
            done.cancel();
        });
    }

    /// Counts confirmations and denials.
    fn vote(&self, answers: impl IntoIterator<Item = Option<bool>>) -> Vote {
        let (mut yes, mut no) = (0, 0);
        for answer in answers {
            match answer {
                Some(true) => yes += 1,
                Some(false) => no += 1,
                None => {}
            }
        }
        if yes >= self.quorum {
            Vote::Yes
        } else if no > self.nodes.len() - self.quorum {
            Vote::No
        } else {
            Vote::Unknown
        }
    }

    /// The vote of the answers to a compare-token request so far.
    fn vote_of(&self, answers: &[Answer<bool>]) -> Vote {
        self.vote(answers.iter().map(|(_, a)| a.as_ref().ok().copied()))
    }

    /// `QuorumUnavailable` for a call that got `reached` answers.
    fn unavailable(&self, key: &LockKey, reached: usize, error: Option<&LockError>) -> LockError {
        if let Some(e) = error {
            tracing::debug!(
                target: "redlock",
                key = key.full(),
                backend = "redlock",
                error = %chain(e),
                "redlock: too few nodes answered"
            );
        }
        LockError::QuorumUnavailable {
            key: key.full().to_owned(),
            reached,
            needed: self.quorum,
        }
    }

    /// [`unavailable`](Self::unavailable) unless a quorum of the `answers` succeeded.
    fn require_quorum<T>(
        &self,
        key: &LockKey,
        answers: &[Result<T, LockError>],
    ) -> Result<(), LockError> {
        let reached = answers.iter().filter(|a| a.is_ok()).count();
        if reached < self.quorum {
            let error = answers.iter().find_map(|a| a.as_ref().err());
            return Err(self.unavailable(key, reached, error));
        }
        Ok(())
    }

    /// A compare-token request to every node, decided by a quorum vote: returns as soon
    /// as a quorum confirmed or denied (or the per-node timeout passed); the requests
    /// still in flight finish in the background, as `stragglers` says.
    async fn decide<F, Fut>(
        &self,
        key: &LockKey,
        timeout: Duration,
        stragglers: Stragglers,
        request: F,
    ) -> Result<bool, LockError>
    where
        F: Fn(Arc<[SingleBackend]>, usize) -> Fut,
        Fut: Future<Output = Result<bool, LockError>> + Send + 'static,
    {
        let operation = match stragglers {
            Stragglers::Retry(_) => "release",
            Stragglers::Settle(_) => "extend",
        };
        let deadline = tokio::time::Instant::now() + timeout;
        let cut = CancellationToken::new();
        let mut in_flight = match stragglers {
            Stragglers::Retry(_) => self.send_all(request),
            Stragglers::Settle(_) => self.send_to(
                0..self.nodes.len(),
                Some((&cut, operation, timeout)),
                request,
            ),
        };
        let mut answers = Vec::with_capacity(self.nodes.len());
        gather(&mut in_flight, timeout, |answer| {
            answers.push(answer);
            !matches!(self.vote_of(&answers), Vote::Unknown)
        })
        .await;
        let vote = self.vote_of(&answers);
        match stragglers {
            Stragglers::Retry(stake) => {
                let shared_key = Arc::new(key.clone());
                let nodes = self.nodes.clone();
                // A node whose release failed before the vote was decided (a dropped
                // connection fails at once) is retried like one that answered late.
                let failed: Vec<usize> = answers
                    .iter()
                    .filter(|(_, a)| a.is_err())
                    .map(|&(i, _)| i)
                    .collect();
                if !failed.is_empty() {
                    let (nodes, key) = (nodes.clone(), shared_key.clone());
                    tokio::spawn(async move {
                        join_all(
                            failed
                                .into_iter()
                                .filter_map(|i| nodes.get(i))
                                .map(|node| release_again(node, &key, stake)),
                        )
                        .await;
                    });
                }
                finish(in_flight, move |(i, answer)| {
                    let (nodes, key) = (nodes.clone(), shared_key.clone());
                    async move {
                        if let (Err(_), Some(node)) = (answer, nodes.get(i)) {
                            release_again(node, &key, stake).await;
                        }
                    }
                });
            }
            Stragglers::Settle(token) => {
                let key = std::iter::once_with(|| key.full().to_owned());
                self.settle(token, key, deadline, cut, true, in_flight, |_| {});
            }
        }
        match vote {
            Vote::Yes => Ok(true),
            Vote::No => Ok(false),
            Vote::Unknown => {
                let reached = answers.iter().filter(|(_, a)| a.is_ok()).count();
                let error = answers.iter().find_map(|(_, a)| a.as_ref().err());
                Err(self.unavailable(key, reached, error))
            }
        }
    }

    /// The rest of a won attempt, in a task of its own: a grant landing late is kept as
    /// part of the lock (the lease's renewals and release go to every node, so they
    /// cover it, and a lock on more than a bare quorum survives more node failures),
    /// unless the lock was released before it landed. A request sent before the release
    /// is applied before it on that node's connection, but not every request is sent at
    /// once (an `EVAL` after a restarted node's `NOSCRIPT`, a send after a reconnect):
    /// the release marks the token (under the lock of `landing`, before sending), and a
    /// grant or unanswered request seen after that is undone. A kept grant whose counter
    /// is behind the token is raised to it, so that it vouches for the token too (see
    /// "Fencing tokens").
    ///
    /// The late grants are expiry-setting requests: they are cut at the acquisition's
    /// per-node deadline (`cut`), and the next extend of the lock waits for them first (see
    /// [`settle`](Self::settle)), so that a grant re-sent late (its `PEXPIRE ttl` branch)
    /// cannot land after an extend the node already applied. A request cut unanswered is
    /// undone if the lock was released meanwhile, like one that failed.
    ///
    /// The keys of a `lock_all` share the token and one request per node, and are
    /// released together (`MultiGuard`): the release of any of them undoes a late grant
    /// of all of them.
    ///
    /// A late grant of one key that the release on its node found is not undone (an
    /// undo would find nothing left of it: one more script call per late node on every
    /// quick lock + release): that release found the token, so the grant was applied
    /// before it, and a grant whose node sent no acquire request again meanwhile
    /// (`resends`, counted before the acquisition's requests were sent) was applied only
    /// once. Any other late grant — the release there not answered within twice the
    /// node timeout, not finding the token, or a request sent again — is undone as
    /// before. (A release with `hold_at_least` that found the token keeps the key on that
    /// node too, as it does on the nodes that answered in time.)
    fn keep_late_grants<T: Grant>(
        &self,
        keys: &[Arc<LockKey>],
        stake: Stake,
        fences: Vec<u64>,
        (deadline, cut): (tokio::time::Instant, CancellationToken),
        (in_flight, resends): (InFlight<T>, Vec<u64>),
    ) {
        if in_flight.is_empty() {
            return;
        }
        let token = stake.token;
        lock(&self.landing).entry(token).or_default().pending += 1;
        let (nodes, landing) = (self.nodes.clone(), self.landing.clone());
        let keys = keys.to_vec();
        let names = keys.iter().map(|k| k.full().to_owned()).collect::<Vec<_>>();
        let told: Option<(String, ReleaseAnswers)> = match names.as_slice() {
            [name] => {
                let told = Arc::new(watch::Sender::new(vec![None; nodes.len()]));
                let entry = (token, name.clone());
                lock(&self.released_on).insert(entry, told.clone());
                Some((name.clone(), told))
            }
            _ => None,
        };
        let released_on = self.released_on.clone();
        let wait = self.node_timeout.saturating_mul(2);
        let mut unanswered = in_flight.len();
        self.settle(
            token,
            names,
            deadline,
            cut,
            false,
            in_flight,
            move |(i, answer)| {
                let landed = answer.as_ref().ok().and_then(|a| a.fences().ok());
                let released =
                    !refused(&answer) && lock(&landing).get(&token).is_none_or(|l| l.released);
                unanswered -= 1;
                if unanswered == 0 {
                    landed_all(&landing, token);
                    if let Some((name, told)) = &told {
                        forget_release_answers(&released_on, (token, name.clone()), told);
                    }
                }
                let sent_once = landed.is_some()
                    && nodes.get(i).map(SingleBackend::resends) == resends.get(i).copied();
                for (k, (key, &fence)) in keys.iter().zip(&fences).enumerate() {
                    let behind = landed.and_then(|f| f.get(k)).is_some_and(|&f| f < fence);
                    let (nodes, key) = (nodes.clone(), key.clone());
                    // Its own task: the next answers (and the end of `settle`) do not wait for it.
                    if released {
                        match told.as_ref().filter(|_| sent_once) {
                            Some((_, told)) => {
                                let told = told.clone();
                                tokio::spawn(async move {
                                    if !released_there(&told, i, wait).await {
                                        undo(nodes, key, stake, i).await;
                                    }
                                });
                            }
                            None => {
                                tokio::spawn(undo(nodes, key, stake, i));
                            }
                        }
                    } else if behind {
                        tokio::spawn(async move {
                            if let Some(node) = nodes.get(i) {
                                // Compare-token: a no-op if the lock is gone meanwhile.
                                let _ = raise_fence(node, &key, stake, fence).await;
                            }
                        });
                    }
                }
            },
        );
    }

    /// Removes a writer's intent from every node once it won, in the background: the
    /// nodes that refused this attempt registered it, and would keep new readers out
    /// (a majority of such nodes, left by successive writers, would keep them out for
    /// good) until it ran out by itself.
    fn withdraw_intent(&self, key: &LockKey, waiter: u64) {
        let (nodes, intents, full) = (self.nodes.clone(), key.intents(), key.full().to_owned());
        tokio::spawn(async move {
            join_all(nodes.iter().map(|node| {
                let mut zrem = redis::cmd("ZREM");
                zrem.arg(&intents).arg(waiter.to_string());
                let mut con = node.connection();
                let key = &full;
                async move {
                    if let Err(e) = zrem.query_async::<i64>(&mut con).await {
                        tracing::debug!(
                            target: "redlock",
                            key,
                            backend = "redlock",
                            node = node.addr(),
                            error = %chain(&e),
                            "redlock: withdrawing a writer's intent failed; it runs out by itself"
                        );
                    }
                }
            }))
            .await;
        });
    }

    /// Undoes a lost attempt in a task of its own: at once on the nodes in `won` (those
    /// that granted, and those whose request failed), and on
    /// every node still in flight once it answers, unless it answered "held" (a grant
    /// landing late, or a request whose reply never came and that may have been applied:
    /// the undo follows it on the same connection, so it is applied after it).
    ///
    /// A node still in flight also gets one undo at once (`pending`), queued behind the
    /// attempt's request on the node's connection: the next attempts of this manager
    /// are queued behind it, so they do not find this attempt's late grants (a quorum of
    /// them, when a majority was frozen or slow, would look like a holder of the whole
    /// ttl, and the undo wakes nobody). The undo after the answer still covers a request
    /// written later than that (re-sent after a reconnect, or `EVAL` after `NOSCRIPT`).
    fn undo_in_background<T: Grant>(
        &self,
        keys: &[Arc<LockKey>],
        stake: Stake,
        won: Vec<usize>,
        pending: Vec<usize>,
        in_flight: InFlight<T>,
    ) {
        if won.is_empty() && in_flight.is_empty() {
            return;
        }
        let (nodes, keys) = (self.nodes.clone(), keys.to_vec());
        let every_key = {
            let (nodes, keys) = (nodes.clone(), keys.clone());
            move |i: usize| {
                let nodes = nodes.clone();
                join_all(
                    keys.clone()
                        .into_iter()
                        .map(move |key| undo(nodes.clone(), key, stake, i)),
                )
            }
        };
        let ahead = join_all(pending.into_iter().flat_map(|i| {
            let nodes = nodes.clone();
            keys.clone().into_iter().map(move |key| {
                let nodes = nodes.clone();
                async move {
                    if let Some(node) = nodes.get(i) {
                        release_until_confirmed(
                            node,
                            &key,
                            stake,
                            Publish::Nobody,
                            &[Duration::ZERO],
                        )
                        .await;
                    }
                }
            })
        }));
        let at_once = join_all(won.into_iter().map(every_key.clone()));
        let at_once = futures_util::future::join(ahead, at_once);
        let stragglers = in_flight.for_each_concurrent(None, move |(i, answer)| {
            let undo = (!refused(&answer)).then(|| every_key(i));
            async move {
                if let Some(undo) = undo {
                    undo.await;
                }
            }
        });
        tokio::spawn(futures_util::future::join(at_once, stragglers));
    }

    /// The fencing token of a won quorum (the highest counter among `granted`), once a
    /// quorum vouches for it; `None` when it cannot (the attempt must be undone). Only
    /// nodes that granted are asked, and only until a quorum vouches.
    async fn settle_fence(
        &self,
        key: &LockKey,
        stake: Stake,
        granted: &[(usize, u64)],
        timeout: Duration,
    ) -> Option<u64> {
        let fence = granted.iter().map(|&(_, f)| f).max()?;
        let behind: Vec<usize> = granted
            .iter()
            .filter(|&&(_, f)| f < fence)
            .map(|&(i, _)| i)
            .collect();
        if behind.is_empty() {
            return Some(fence);
        }
        let needed = self.quorum.saturating_sub(granted.len() - behind.len());
        let shared_key = Arc::new(key.clone());
        let mut raises = self.send_to(behind, None, |nodes, i| {
            let key = shared_key.clone();
            async move {
                match nodes.get(i) {
                    Some(node) => raise_fence(node, &key, stake, fence).await,
                    None => Err(LockError::invalid_option("no such redlock node")),
                }
            }
        });
        // Already safe once a quorum vouches: the other laggards are raised in the
        // background.
        let mut raised = 0;
        if needed > 0 {
            gather(&mut raises, timeout, |(_, answer)| {
                raised += usize::from(matches!(answer, Ok(true)));
                raised >= needed
            })
            .await;
        }
        finish(raises, |_| async {});
        if raised >= needed {
            Some(fence)
        } else {
            tracing::debug!(
                target: "redlock",
                key = key.full(),
                backend = "redlock",
                "redlock: too few nodes vouch for the fencing token"
            );
            None
        }
    }

    /// When to try again after losing. When one holder has a quorum of the nodes: once
    /// enough of its keys expire that a quorum becomes possible (a release notification
    /// comes first). Otherwise (a split vote, or stale grants of other failed attempts
    /// that their undos are removing): at once. Plus a random jitter, so competing
    /// clients do not collide again.
    fn retry_after(&self, held: &[(Option<Duration>, Option<u64>)], ttl: Duration) -> Duration {
        let majority_holder = held.iter().any(|(_, holder)| {
            holder
                .is_some_and(|h| held.iter().filter(|(_, o)| *o == Some(h)).count() >= self.quorum)
        });
        // Holding nodes that must free up before the others can form a quorum.
        let must_free = (self.quorum + held.len()).saturating_sub(self.nodes.len());
        let base = if !majority_holder || must_free == 0 {
            Duration::ZERO
        } else {
            let mut remaining: Vec<Duration> = held
                .iter()
                .map(|(r, _)| r.unwrap_or(Duration::from_secs(1)))
                .collect();
            remaining.sort_unstable();
            remaining.get(must_free - 1).copied().unwrap_or_default()
        };
        base + jitter((ttl / 10).clamp(Duration::from_millis(2), MAX_JITTER))
    }

    /// The bound on one node's answer to a renewal request for `locks` locks, the
    /// shortest with `ttl`: the per-node timeout for that ttl plus [`RENEW_PER_LOCK`] per
    /// lock (a node renews a few hundred thousand locks a second), but never more than
    /// ttl/4, which leaves a failed renewal time for a retry before the lock's deadline.
    fn renew_timeout(&self, ttl: Duration, locks: usize) -> Duration {
        let base = self.node_timeout(ttl);
        let allowance = RENEW_PER_LOCK.saturating_mul(u32::try_from(locks).unwrap_or(u32::MAX));
        (base + allowance).min((ttl / 4).max(base))
    }
}

/// Permits on Redlock: the places of a key (see [`LockKey::place`]).
impl RedlockBackend {
    /// A permit of `n`: a free place of the key, each an exclusive lock on a quorum.
    ///
    /// The places are probed first, [`PROBE_BATCH`] at a time from a random one, on a
    /// quorum of nodes at once ([`probe_places`](Self::probe_places)); only those a
    /// quorum may grant are tried, the freest first. So a full set of places is told in
    /// one round trip whatever `n` (tried one by one, `n` round trips outlasted the
    /// attempt's bound: an error instead of "held"). A probe only reads: each place is
    /// still won by its own quorum vote, as any exclusive lock.
    ///
    /// Bounded in time by [`PERMIT_ROUNDS`] per-node timeouts (a probe or a try starts
    /// only while the rounds it may take are left) and in count by the places.
    async fn acquire_place(&self, claim: &Claim<'_>, n: u32) -> Result<Attempt, LockError> {
        let started = Instant::now();
        let round = self.node_timeout(claim.ttl);
        let fits = |rounds: u32| started.elapsed() + round * rounds <= round * PERMIT_ROUNDS;
        let start = getrandom::u32().unwrap_or(0) % n;
        let mut search = Search::default();
        for first in (0..n).step_by(PROBE_BATCH as usize) {
            if !fits(1 + TRY_ROUNDS) {
                break;
            }
            let last = n.min(first.saturating_add(PROBE_BATCH));
            let indices: Vec<u32> = (first..last).map(|k| nth_place(start, k, n)).collect();
            let probe = self.probe_places(claim.key, &indices, round).await?;
            search.wait(probe.remaining);
            for i in probe.free {
                if !fits(TRY_ROUNDS) {
                    break;
                }
                match self.try_place(claim, i).await {
                    Ok(Attempt::Held { remaining, .. }) => search.wait(remaining),
                    Ok(Attempt::Acquired { .. }) => return self.hold_key(claim).await,
                    Err(e) => search.last_error = Some(e),
                }
            }
        }
        lock(&self.places).remove(&claim.token);
        search.outcome(claim.ttl)
    }

    /// The permit's hold on the key itself, once it won a place: a shared holder with
    /// the permit marker and no limit (`acquire_shared.lua`, the place bounds the count),
    /// voted on like a reader. So each node's own script keeps the kinds apart, as on
    /// one server: an exclusive holder (or a reader) of the key refuses it, and it
    /// refuses them. Its fencing token is the permit's: it orders the permit among the
    /// key's writers as a reader's does (see "Fencing tokens"). When the key cannot be
    /// had, the place is given back ([`give_back_place`](Self::give_back_place)).
    ///
    /// The key is taken after the place, never before: a caller that finds every place
    /// taken then leaves nothing on the key, whose undo (silent, or it would wake the
    /// caller itself) writers waiting on it would not hear.
    async fn hold_key(&self, claim: &Claim<'_>) -> Result<Attempt, LockError> {
        let unlimited = Claim {
            mode: Mode::Permit(0),
            intent: None,
            ..*claim
        };
        let held = self.acquire_quorum(&unlimited).await;
        if !matches!(held, Ok(Attempt::Acquired { .. })) {
            self.give_back_place(claim.token);
        }
        held
    }

    /// Undoes the place of an attempt that could not hold the key, in the background,
    /// without a wake-up (the permit waiters listen on the key, whose holder they wait
    /// for), and its late grants as they land.
    fn give_back_place(&self, token: Token) {
        let Some(place) = lock(&self.places).remove(&token) else {
            return;
        };
        // Undone everywhere below: a late grant there waits for no release's answer.
        let told = lock(&self.released_on)
            .get(&(token, place.full().to_owned()))
            .cloned();
        if let Some(told) = told {
            told.send_modify(|answers| answers.fill(Some(false)));
        }
        if let Some(landing) = lock(&self.landing).get_mut(&token) {
            landing.released = true;
        }
        let stake = Stake {
            token,
            mode: Mode::Exclusive,
            keep: Duration::ZERO,
        };
        for i in 0..self.nodes.len() {
            tokio::spawn(undo(self.nodes.clone(), place.clone(), stake, i));
        }
    }

    /// One try at place `i`, recorded under the attempt's token first, so that an
    /// attempt cut short is undone where it was.
    async fn try_place(&self, claim: &Claim<'_>, i: u32) -> Result<Attempt, LockError> {
        let place = Arc::new(claim.key.place(i));
        lock(&self.places).insert(claim.token, place.clone());
        let attempt = Claim {
            key: &place,
            mode: Mode::Exclusive,
            intent: None,
            ..*claim
        };
        self.acquire_quorum(&attempt).await
    }

    /// Reads the remaining ttl of places `indices` of `key` on every node (one pipeline
    /// of `PTTL`s each), until a quorum answered or `timeout` passed: a place held on
    /// more than N − quorum of them cannot be granted now. The reads still running are
    /// dropped: they leave nothing behind.
    async fn probe_places(
        &self,
        key: &LockKey,
        indices: &[u32],
        timeout: Duration,
    ) -> Result<Probe, LockError> {
        let names: Vec<String> = indices
            .iter()
            .map(|&i| key.place(i).full().to_owned())
            .collect();
        let mut reads: FuturesUnordered<_> = self
            .nodes
            .iter()
            .map(|node| place_ttls(node, &names))
            .collect();
        let (mut answered, mut error) = (Vec::new(), None);
        let gathered = async {
            // Bounded: one item per node.
            while answered.len() < self.quorum {
                match reads.next().await {
                    Some(Ok(ttls)) => answered.push(ttls),
                    Some(Err(e)) => error = Some(e),
                    None => break,
                }
            }
        };
        let _ = tokio::time::timeout(timeout, gathered).await;
        if answered.len() < self.quorum {
            return Err(self.unavailable(key, answered.len(), error.as_ref()));
        }
        Ok(Probe::of(
            indices,
            &answered,
            self.nodes.len() - self.quorum,
        ))
    }
    /// The place a permit's token holds (or is being tried), if any.
    fn place_of(&self, token: Token) -> Option<Arc<LockKey>> {
        lock(&self.places).get(&token).cloned()
    }

    /// Wakes the permit waiters of `key` (they listen on the key's channel, not their
    /// places'), on every node, in the background: a place was freed, or is kept only
    /// until its `hold_at_least` ends (sooner than the waiters were told).
    fn announce_place_freed(&self, key: &LockKey) {
        let (nodes, channel) = (self.nodes.clone(), key.full().to_owned());
        tokio::spawn(async move {
            join_all(nodes.iter().map(|node| {
                let mut publish = redis::cmd(Publish::Channel.command());
                publish.arg(&channel).arg("1");
                let mut con = node.connection();
                async move {
                    let _ = publish.query_async::<i64>(&mut con).await;
                }
            }))
            .await;
        });
    }
}

/// The most places one probe reads (see [`RedlockBackend::acquire_place`]).
const PROBE_BATCH: u32 = 256;
/// The rounds of one try at a place: the acquire and fencing rounds of the place, then
/// of the key (see [`RedlockBackend::hold_key`]).
const TRY_ROUNDS: u32 = 4;
/// The per-node timeouts one permit attempt may take: a probe and a try, and room for
/// more when they are quick ([`RedlockBackend::request_timeout`] adds one spare).
const PERMIT_ROUNDS: u32 = 1 + TRY_ROUNDS + 1;

/// Place `k` of a search of `n` places from `start`: `(start + k) mod n`.
fn nth_place(start: u32, k: u32, n: u32) -> u32 {
    let i = (u64::from(start) + u64::from(k)) % u64::from(n.max(1));
    u32::try_from(i).unwrap_or(0)
}

/// `PTTL` of each of `names` on one node: -2 for a free place.
async fn place_ttls(node: &SingleBackend, names: &[String]) -> Result<Vec<i64>, LockError> {
    let mut pipe = redis::pipe();
    for name in names {
        pipe.cmd("PTTL").arg(name);
    }
    pipe.query_async(&mut node.connection())
        .await
        .map_err(LockError::backend("probe"))
}

/// What a probe of some places found on a quorum of nodes.
#[derive(Debug, Default, PartialEq)]
struct Probe {
    /// The places a quorum may grant, the freest first.
    free: Vec<u32>,
    /// How long until one of the others may be granted, if any is held.
    remaining: Option<Duration>,
}

impl Probe {
    /// From each answering node's `PTTL`s of `indices` (a missing one counts as held):
    /// a place held on more than `spare` (N − quorum) nodes cannot be granted until
    /// enough of them expire (or are released: a wake-up comes first).
    fn of(indices: &[u32], answered: &[Vec<i64>], spare: usize) -> Self {
        let mut free: Vec<(usize, u32)> = Vec::new();
        let mut remaining: Option<Duration> = None;
        for (k, &i) in indices.iter().enumerate() {
            let mut held: Vec<Duration> = answered
                .iter()
                .filter_map(|ttls| match ttls.get(k).copied() {
                    Some(-2) => None,
                    Some(ms) => Some(
                        u64::try_from(ms).map_or(Duration::from_secs(1), Duration::from_millis),
                    ),
                    None => Some(Duration::from_secs(1)),
                })
                .collect();
            if held.len() <= spare {
                free.push((held.len(), i));
                continue;
            }
            held.sort_unstable();
            let frees_at = held
                .get(held.len() - spare - 1)
                .copied()
                .unwrap_or_default();
            remaining = Some(remaining.map_or(frees_at, |r| r.min(frees_at)));
        }
        free.sort_by_key(|&(held, _)| held);
        Self {
            free: free.into_iter().map(|(_, i)| i).collect(),
            remaining,
        }
    }
}

/// What a search of places found when it won none.
#[derive(Default)]
struct Search {
    /// The soonest a held place may be granted.
    remaining: Option<Duration>,
    last_error: Option<LockError>,
}

impl Search {
    fn wait(&mut self, remaining: Option<Duration>) {
        self.remaining = match (self.remaining, remaining) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// Held (retry after the soonest place frees, or shortly when none was seen
    /// held: places lost to other callers, or the time ran out), or the last error
    /// when every try failed.
    fn outcome(self, ttl: Duration) -> Result<Attempt, LockError> {
        match (self.remaining, self.last_error) {
            (None, Some(e)) => Err(e),
            (remaining, _) => Ok(Attempt::Held {
                remaining: Some(remaining.unwrap_or_else(|| {
                    jitter((ttl / 10).clamp(Duration::from_millis(2), MAX_JITTER))
                })),
                holder: None,
            }),
        }
    }
}

/// An exclusive lease on `key` with `token`: a permit's place.
fn exclusive(key: &LockKey, token: Token) -> LeaseRef<'_> {
    LeaseRef::new(key, token, Mode::Exclusive)
}

/// The nodes whose `SCAN` a search for permit places waits for.
#[derive(Debug, Clone, Copy)]
enum Reach {
    /// The first quorum to finish: enough to find every place held on a quorum.
    Quorum,
    /// Every node that answers (`list`, as for its lock keys; `force_unlock`, which also
    /// deletes the places a minority still has).
    Every,
}

/// What `inspect`, `list` and `force_unlock` find on the nodes.
impl RedlockBackend {
    /// The holder that holds the key on a quorum of nodes (by its digest), if any, as
    /// the node with its latest grant (the highest fence, at least the token issued:
    /// that is the highest of a quorum) describes it; each node records its own
    /// acquire time. The ttl is the one a quorum still has (the quorum-th longest);
    /// readers are those a quorum of nodes lists (a reader holds a quorum of the
    /// nodes, not necessarily the same as another's), and none is not held.
    async fn inspect_key(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let answers = self
            .on_all("inspect", self.node_timeout, |n| n.inspect(key))
            .await;
        self.require_quorum(key, &answers)?;
        let found: Vec<LockInfo> = answers
            .into_iter()
            .filter_map(|a| a.ok().flatten())
            .collect();
        let of = |holder: &str| -> Vec<&LockInfo> {
            found.iter().filter(|i| i.holder == holder).collect()
        };
        let Some(group) = found
            .iter()
            .map(|i| of(&i.holder))
            .find(|group| group.len() >= self.quorum)
        else {
            return Ok(None);
        };
        let Some(latest) = group.iter().max_by_key(|i| i.fencing_token) else {
            return Ok(None);
        };
        let mut ttls: Vec<Duration> = group
            .iter()
            .map(|i| i.ttl.unwrap_or(Duration::MAX))
            .collect();
        ttls.sort_unstable_by(|a, b| b.cmp(a));
        let mut info = (*latest).clone();
        info.ttl = ttls
            .get(self.quorum - 1)
            .copied()
            .filter(|&t| t != Duration::MAX);
        info.shared = self.shared_on_quorum(&group);
        if info.kind == LockKind::Read {
            // A node a release has not reached yet still lists the reader that left.
            if info.shared.is_empty() {
                return Ok(None);
            }
            info.holders = u32::try_from(info.shared.len()).unwrap_or(u32::MAX);
            let kept = info.shared.iter().filter(|h| h.kept).count();
            info.kept = u32::try_from(kept).unwrap_or(u32::MAX);
        } else {
            info.kept = group.iter().map(|i| i.kept).max().unwrap_or(0);
        }
        Ok(Some(info))
    }

    /// The readers that hold a quorum of `group`'s nodes (each node lists its own), with
    /// the ttl a quorum still has, the soonest to expire first.
    fn shared_on_quorum(&self, group: &[&LockInfo]) -> Vec<SharedHolder> {
        let mut seen: BTreeMap<&str, Vec<&SharedHolder>> = BTreeMap::new();
        for holder in group.iter().flat_map(|i| &i.shared) {
            seen.entry(holder.name.as_str()).or_default().push(holder);
        }
        let mut shared: Vec<SharedHolder> = seen
            .into_values()
            .filter(|on| on.len() >= self.quorum)
            .map(|mut on| {
                on.sort_by(|a, b| {
                    b.ttl
                        .unwrap_or(Duration::MAX)
                        .cmp(&a.ttl.unwrap_or(Duration::MAX))
                });
                let at_quorum = on[self.quorum - 1];
                SharedHolder {
                    kept: on.iter().filter(|h| h.kept).count() >= self.quorum,
                    ..at_quorum.clone()
                }
            })
            .collect();
        soonest_to_expire_first(&mut shared);
        shared
    }

    /// The permit places whose name matches `glob` on the nodes `reach` says (a node
    /// that fails is left out while a quorum answered), by the key they belong to, for
    /// the keys `wanted` (under `prefix`).
    async fn permits(
        &self,
        prefix: &str,
        glob: &str,
        wanted: impl Fn(&LockKey) -> bool,
        reach: Reach,
    ) -> Result<BTreeMap<String, (LockKey, Vec<LockKey>)>, LockError> {
        let enough = match reach {
            Reach::Quorum => self.quorum,
            Reach::Every => self.nodes.len(),
        };
        let mut scans: FuturesUnordered<_> = self
            .nodes
            .iter()
            .map(|n| n.scan_places(prefix, glob))
            .collect();
        let (mut answered, mut error) = (Vec::new(), None);
        while answered.len() < enough {
            match scans.next().await {
                Some(Ok(places)) => answered.push(places),
                Some(Err(e)) => error = error.or(Some(e)),
                None => break,
            }
        }
        // The scans still running are read-only: dropping them leaves nothing behind.
        drop(scans);
        if answered.len() < self.quorum {
            let any = LockKey::prefixed(prefix, "*")?;
            return Err(self.unavailable(&any, answered.len(), error.as_ref()));
        }
        let mut found: BTreeMap<String, (LockKey, BTreeMap<String, LockKey>)> = BTreeMap::new();
        for (owner, place) in answered.into_iter().flatten() {
            if wanted(&owner) {
                found
                    .entry(owner.full().to_owned())
                    .or_insert_with(|| (owner, BTreeMap::new()))
                    .1
                    .insert(place.full().to_owned(), place);
            }
        }
        Ok(found
            .into_iter()
            .map(|(k, (owner, places))| (k, (owner, places.into_values().collect())))
            .collect())
    }

    /// The permit of `key`, found by its places, as [`permit_info`](Self::permit_info)
    /// describes it; `None` when no place is held. The places are scanned for on the
    /// first quorum of nodes to finish (a place held on a quorum is on one of them: two
    /// quorums share a node), so a slow or frozen minority costs nothing.
    async fn permit_of(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let glob = scan_glob(&key.places_prefix(), "*");
        let permits = self
            .permits(key.prefix(), &glob, |owner| owner == key, Reach::Quorum)
            .await?;
        match permits.into_values().next() {
            Some((owner, places)) => self.permit_info(&owner, &places).await,
            None => Ok(None),
        }
    }

    /// A permit of `key` as its `places` show it: a holder per place held on a quorum
    /// (kept ones counted), the latest grant's fencing token and owner, the longest ttl;
    /// `None` when no place is held.
    async fn permit_info(
        &self,
        key: &LockKey,
        places: &[LockKey],
    ) -> Result<Option<LockInfo>, LockError> {
        let mut held = Vec::new();
        let mut shared = Vec::new();
        for batch in places.chunks(INSPECT_BATCH) {
            let infos =
                futures_util::future::try_join_all(batch.iter().map(|p| self.inspect_key(p)))
                    .await?;
            for (place, info) in batch.iter().zip(infos) {
                if let Some(info) = info {
                    shared.push(SharedHolder {
                        name: place_name(key, place),
                        ttl: info.ttl,
                        kept: info.kept > 0,
                        fencing_token: info.fencing_token,
                    });
                    held.push(info);
                }
            }
        }
        soonest_to_expire_first(&mut shared);
        let Some(latest) = held.iter().max_by_key(|i| i.fencing_token) else {
            return Ok(None);
        };
        let ttl = if held.iter().any(|i| i.ttl.is_none()) {
            None
        } else {
            held.iter().filter_map(|i| i.ttl).max()
        };
        Ok(Some(LockInfo {
            key: key.full().to_owned(),
            kind: LockKind::Permit,
            holders: u32::try_from(held.len()).unwrap_or(u32::MAX),
            kept: held.iter().map(|i| i.kept).sum(),
            ttl,
            shared,
            ..latest.clone()
        }))
    }
}

/// How a permit holder on Redlock is named: by its place of `key` (`place 3`).
fn place_name(key: &LockKey, place: &LockKey) -> String {
    let index = place
        .full()
        .strip_prefix(key.places_prefix().as_str())
        .unwrap_or(place.full());
    format!("place {index}")
}

/// Quorum operations on one key.
impl RedlockBackend {
    async fn acquire_quorum(&self, claim: &Claim<'_>) -> Result<Attempt, LockError> {
        let Claim {
            key,
            token,
            ttl,
            replicas,
            mode,
            intent,
        } = *claim;
        // An attempt's undo deletes its place at once, whatever `hold_at_least` says.
        let stake = Stake {
            token,
            mode,
            keep: Duration::ZERO,
        };
        if replicas.is_some() {
            return Err(LockError::invalid_option(
                "min_replicas is not available with the redlock backend (its quorum of masters replaces it)",
            ));
        }
        let shared_key = Arc::new(key.clone());
        let request = |nodes: Arc<[SingleBackend]>, i: usize| {
            let key = shared_key.clone();
            async move {
                match nodes.get(i) {
                    Some(node) => {
                        let claim = Claim {
                            key: &key,
                            token,
                            ttl,
                            replicas: None,
                            mode,
                            intent,
                        };
                        node.acquire(&claim).await
                    }
                    None => Err(LockError::invalid_option("no such redlock node")),
                }
            }
        };
        let keys = [shared_key.clone()];
        match self.contend(&keys, stake, ttl, request).await? {
            Contest::Won(fences) => {
                if let Some(intent) = intent {
                    self.withdraw_intent(key, intent.waiter);
                }
                // One fence per key: never missing.
                let fence = fences.first().copied().ok_or_else(|| {
                    LockError::invalid_option("redlock: a grant without its fencing token")
                })?;
                Ok(Attempt::Acquired {
                    fence,
                    replicas: None,
                })
            }
            Contest::Lost(retry) => Ok(Attempt::Held {
                remaining: Some(retry),
                holder: None,
            }),
        }
    }

    /// Every key of `keys` (distinct, exclusive) with one `token`, by one
    /// `acquire_all.lua` call per node: all keys or none on each node. Won on a quorum
    /// as [`contend`](Self::contend) says, with a fencing token per key.
    async fn acquire_all_quorum(
        &self,
        keys: &[&LockKey],
        token: Token,
        ttl: Duration,
    ) -> Result<Together, LockError> {
        let stake = Stake {
            token,
            mode: Mode::Exclusive,
            keep: Duration::ZERO,
        };
        let keys: Vec<Arc<LockKey>> = keys.iter().map(|&k| Arc::new(k.clone())).collect();
        let shared: Arc<[Arc<LockKey>]> = keys.clone().into();
        let request = |nodes: Arc<[SingleBackend]>, i: usize| {
            let keys = shared.clone();
            async move {
                let Some(node) = nodes.get(i) else {
                    return Err(LockError::invalid_option("no such redlock node"));
                };
                let refs: Vec<&LockKey> = keys.iter().map(|k| &**k).collect();
                match node.acquire_together(&refs, token, ttl).await? {
                    Some(together) => Ok(together),
                    None => Err(LockError::invalid_option(
                        "a redlock node cannot take several keys at once",
                    )),
                }
            }
        };
        Ok(match self.contend(&keys, stake, ttl, request).await? {
            Contest::Won(fences) => Together::Acquired(fences),
            Contest::Lost(retry) => Together::Held(Some(retry)),
        })
    }

    /// One acquisition of `keys` (one key, or the keys of a `lock_all`, all with the
    /// stake's token) on every node, `request(nodes, i)` asking node `i` for all of them
    /// at once. Won iff a quorum granted within the validity and, for each key, a quorum
    /// vouches for its fencing token (the highest counter among the deciding grants: see
    /// "Fencing tokens"); late grants are kept ([`keep_late_grants`](Self::keep_late_grants)).
    /// Lost: everything the attempt may have taken on any node is undone in the
    /// background ([`undo_in_background`](Self::undo_in_background)), and the answer is
    /// when to retry, or `QuorumUnavailable` when fewer than a quorum answered.
    async fn contend<T, F, Fut>(
        &self,
        keys: &[Arc<LockKey>],
        stake: Stake,
        ttl: Duration,
        request: F,
    ) -> Result<Contest, LockError>
    where
        T: Grant,
        F: Fn(Arc<[SingleBackend]>, usize) -> Fut,
        Fut: Future<Output = Result<T, LockError>> + Send + 'static,
    {
        let first = keys
            .first()
            .ok_or_else(|| LockError::invalid_option("an acquisition of no key"))?;
        let started = Instant::now();
        let timeout = self.node_timeout(ttl);
        let deadline = tokio::time::Instant::now() + timeout;
        // Cut at `deadline` only when the attempt is won (its late grants must not be
        // written after a later extend: see `settle`); a lost attempt's stragglers are
        // followed by their undo.
        let cut = CancellationToken::new();
        let resends: Vec<u64> = self.nodes.iter().map(SingleBackend::resends).collect();
        let mut in_flight = self.send_to(
            0..self.nodes.len(),
            Some((&cut, "acquire", timeout)),
            request,
        );
        let (nodes, quorum) = (self.nodes.len(), self.quorum);
        let mut tally = Tally::default();
        gather(&mut in_flight, timeout, |answer| {
            tally.add(answer);
            tally.decided(nodes, quorum)
        })
        .await;
        let mut too_late = None;
        if tally.granted.len() >= quorum {
            // Each key's token vouched for by a quorum, the keys at once.
            let vouched = join_all(keys.iter().enumerate().map(|(k, key)| {
                let granted: Vec<(usize, u64)> = tally
                    .granted
                    .iter()
                    .filter_map(|(i, fences)| fences.get(k).map(|&f| (*i, f)))
                    .collect();
                async move { self.settle_fence(key, stake, &granted, timeout).await }
            }))
            .await;
            if let Some(fences) = vouched.into_iter().collect::<Option<Vec<u64>>>() {
                // Measured from before the requests were sent, after the last grant counted.
                let validity = ttl
                    .saturating_sub(started.elapsed())
                    .saturating_sub(drift(ttl));
                if !validity.is_zero() {
                    let late = (in_flight, resends);
                    self.keep_late_grants(keys, stake, fences.clone(), (deadline, cut), late);
                    return Ok(Contest::Won(fences));
                }
                tracing::debug!(
                    target: "redlock",
                    key = first.full(),
                    backend = "redlock",
                    elapsed = ?started.elapsed(),
                    "redlock: quorum won too late; undoing"
                );
                too_late = Some(started.elapsed());
            }
        }
        // Lost: undo what was won, in the background, and retry (the manager) without
        // waiting for it: the error or the retry is not delayed by another round trip.
        // A node whose request failed is undone too (its reply may have been lost after
        // it was applied): the manager leaves a failed attempt to this undo, silent
        // (see `Backend::undoes_failed_attempts`).
        let undone = tally.granted.iter().map(|(i, _)| *i);
        let undone = undone.chain(tally.failed.iter().copied()).collect();
        let pending = (0..nodes).filter(|i| !tally.answered_by(*i)).collect();
        self.undo_in_background(keys, stake, undone, pending, in_flight);
        // A quorum granted: the key is free, not held (an error, retried while waiting).
        if let Some(elapsed) = too_late {
            return Err(won_too_late(ttl, elapsed));
        }
        if tally.answered() < quorum {
            return Err(self.unavailable(first, tally.answered(), tally.last_error.as_ref()));
        }
        Ok(Contest::Lost(self.retry_after(&tally.held, ttl)))
    }

    /// Releases on every node; true when a quorum deleted our token. Returns once a
    /// quorum decided; the other nodes' requests finish in the background (and are
    /// retried there if they fail).
    async fn release_quorum(&self, lease: LeaseRef<'_>, keep: Duration) -> Result<bool, LockError> {
        let LeaseRef {
            key, token, mode, ..
        } = lease;
        let stake = Stake { token, mode, keep };
        // Before the mark: a late grant that sees the mark finds these answers told.
        let told = lock(&self.released_on)
            .get(&(token, key.full().to_owned()))
            .cloned();
        if let Some(landing) = lock(&self.landing).get_mut(&token) {
            landing.released = true;
        }
        let shared_key = Arc::new(key.clone());
        self.decide(
            key,
            self.node_timeout,
            Stragglers::Retry(stake),
            |nodes, i| {
                let (key, told) = (shared_key.clone(), told.clone());
                async move {
                    let answer = match nodes.get(i) {
                        Some(node) => release_on(node, &key, stake, Publish::Channel).await,
                        None => Err(LockError::invalid_option("no such redlock node")),
                    };
                    if let Some(told) = told {
                        let found = matches!(answer, Ok(true));
                        told.send_modify(|answers| {
                            if let Some(slot) = answers.get_mut(i) {
                                *slot = Some(found);
                            }
                        });
                    }
                    answer
                }
            },
        )
        .await
    }

    /// Extends on every node; true when a quorum still had our token. Returns once a
    /// quorum decided; the other nodes' requests finish in the background until the
    /// per-node timeout, and the next extend of the lock cuts them (and waits for the
    /// late grants of its acquisition) before sending: see [`settled`](Self::settled).
    async fn extend_quorum(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<bool, LockError> {
        let LeaseRef {
            key, token, mode, ..
        } = lease;
        self.settled(token, key).await;
        let shared_key = Arc::new(key.clone());
        self.decide(
            key,
            self.node_timeout(ttl),
            Stragglers::Settle(token),
            |nodes, i| {
                let key = shared_key.clone();
                async move {
                    match nodes.get(i) {
                        Some(node) => node.extend(LeaseRef::new(&key, token, mode), ttl).await,
                        None => Err(LockError::invalid_option("no such redlock node")),
                    }
                }
            },
        )
        .await
    }

    /// Renews a batch on every node; each lock is decided by its own vote.
    ///
    /// The batch is split into ttl groups ([`ttl_groups`]), each sent to every node as one
    /// pipelined request (chunks of scripts, one round trip per node and group), the
    /// shortest ttls first, all at once. Each request has its own bound
    /// ([`renew_timeout`](Self::renew_timeout)): the per-node timeout of its shortest ttl
    /// plus an allowance per lock, so a large group is not cut short by its size, nor
    /// a group of long-lived locks by a short-lived lock of another group. The call
    /// returns as soon as a quorum has decided every lock: a frozen node costs nothing
    /// then (its requests were sent and are applied in order if it wakes).
    async fn renew_quorum(&self, batch: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        let groups: Vec<(Vec<usize>, Vec<Renewal<'_>>)> = ttl_groups(batch, self.node_timeout)
            .into_iter()
            .map(|indices| {
                let renewals = indices
                    .iter()
                    .filter_map(|&i| batch.get(i).copied())
                    .collect();
                (indices, renewals)
            })
            .collect();
        let mut calls = FuturesUnordered::new();
        for (g, (_, renewals)) in groups.iter().enumerate() {
            let shortest = renewals.iter().map(|r| r.ttl).min().unwrap_or_default();
            let timeout = self.renew_timeout(shortest, renewals.len());
            for node in self.nodes.iter() {
                calls.push(async move {
                    let answer = tokio::time::timeout(timeout, node.renew(renewals))
                        .await
                        .unwrap_or_else(|_| Err(LockError::timed_out("renew", timeout)));
                    (g, answer)
                });
            }
        }
        let (mut yes, mut no) = (vec![0usize; batch.len()], vec![0usize; batch.len()]);
        let decided =
            |yes: usize, no: usize| yes >= self.quorum || no > self.nodes.len() - self.quorum;
        let mut undecided = batch.len();
        let mut first_error = None;
        let mut answered = false;
        // Bounded: one item per group and node, each bounded by its timeout.
        while let Some((g, answer)) = calls.next().await {
            let outcomes = match answer {
                Ok(outcomes) => outcomes,
                Err(e) => {
                    first_error.get_or_insert(e);
                    continue;
                }
            };
            let Some((indices, _)) = groups.get(g) else {
                continue;
            };
            answered = true;
            for (&i, outcome) in indices.iter().zip(outcomes) {
                let (Some(y), Some(n)) = (yes.get(i).copied(), no.get(i).copied()) else {
                    continue;
                };
                if decided(y, n) {
                    continue;
                }
                match outcome {
                    Renewed::Yes => yes[i] += 1,
                    Renewed::Lost => no[i] += 1,
                    Renewed::Unknown => continue,
                }
                if decided(yes[i], no[i]) {
                    undecided -= 1;
                }
            }
            if undecided == 0 {
                break;
            }
        }
        if !answered {
            if let Some(e) = first_error {
                return Err(e);
            }
        }
        Ok(yes
            .iter()
            .zip(&no)
            .map(|(&y, &n)| {
                if y >= self.quorum {
                    Renewed::Yes
                } else if n > self.nodes.len() - self.quorum {
                    Renewed::Lost
                } else {
                    Renewed::Unknown
                }
            })
            .collect())
    }
}

impl Store for RedlockBackend {
    fn name(&self) -> &'static str {
        "redlock"
    }

    fn min_ttl(&self) -> Duration {
        MIN_REDLOCK_TTL
    }

    /// One attempt's bound: its acquire round, the fencing round and a spare round; for
    /// a permit, its [`PERMIT_ROUNDS`] and a spare round.
    fn request_timeout(&self, ttl: Duration, mode: Mode) -> Duration {
        let rounds = match mode {
            Mode::Permit(_) => PERMIT_ROUNDS + 1,
            Mode::Exclusive | Mode::Read => 3,
        };
        self.node_timeout(ttl) * rounds
    }

    async fn acquire(&self, claim: &Claim<'_>) -> Result<Attempt, LockError> {
        match claim.mode {
            Mode::Permit(n) => self.acquire_place(claim, n).await,
            Mode::Exclusive | Mode::Read => self.acquire_quorum(claim).await,
        }
    }

    /// One `acquire_all.lua` call per node (see [`acquire_all_quorum`](Self::acquire_all_quorum)).
    async fn acquire_together(
        &self,
        keys: &[&LockKey],
        token: Token,
        ttl: Duration,
    ) -> Result<Option<Together>, LockError> {
        self.acquire_all_quorum(keys, token, ttl).await.map(Some)
    }

    /// A permit releases its place and its hold on the key, at once; the key's release
    /// wakes the waiters (permit waiters listen on the key too).
    async fn release(&self, lease: LeaseRef<'_>, keep: Duration) -> Result<bool, LockError> {
        if !matches!(lease.mode, Mode::Permit(_)) {
            return self.release_quorum(lease, keep).await;
        }
        let place = self.place_of(lease.token);
        let place_released = async {
            match &place {
                Some(place) => {
                    let released = self.release_quorum(exclusive(place, lease.token), keep);
                    released.await
                }
                None => Ok(false),
            }
        };
        let (key_released, place_released) =
            futures_util::future::join(self.release_quorum(lease, keep), place_released).await;
        if place_released.is_ok() {
            lock(&self.places).remove(&lease.token);
        }
        if matches!(place_released, Ok(true)) && !matches!(key_released, Ok(true)) {
            self.announce_place_freed(lease.key);
        }
        both(key_released, place_released)
    }

    /// A permit extends its place and its hold on the key, at once.
    async fn extend(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<bool, LockError> {
        if !matches!(lease.mode, Mode::Permit(_)) {
            return self.extend_quorum(lease, ttl).await;
        }
        let Some(place) = self.place_of(lease.token) else {
            return Ok(false);
        };
        let (key, place) = futures_util::future::join(
            self.extend_quorum(lease, ttl),
            self.extend_quorum(exclusive(&place, lease.token), ttl),
        )
        .await;
        both(key, place)
    }

    /// A permit is renewed as its place's exclusive lock and its hold on the key, in
    /// the same batch; it is renewed when both are.
    async fn renew(&self, batch: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        if !batch.iter().any(|r| matches!(r.mode, Mode::Permit(_))) {
            return self.renew_quorum(batch).await;
        }
        let places: Vec<Option<Arc<LockKey>>> = batch
            .iter()
            .map(|r| match r.mode {
                Mode::Permit(_) => self.place_of(r.token),
                Mode::Exclusive | Mode::Read => None,
            })
            .collect();
        let mut asked = Vec::with_capacity(batch.len() * 2);
        let mut renewals = Vec::with_capacity(batch.len() * 2);
        for (i, (r, place)) in batch.iter().zip(&places).enumerate() {
            match (r.mode, place) {
                (Mode::Permit(_), Some(place)) => {
                    asked.push(i);
                    renewals.push(Renewal {
                        key: place,
                        mode: Mode::Exclusive,
                        ..*r
                    });
                }
                // A permit without a place is no longer held.
                (Mode::Permit(_), None) => continue,
                _ => {}
            }
            asked.push(i);
            renewals.push(*r);
        }
        let outcomes = self.renew_quorum(&renewals).await?;
        let mut out: Vec<Option<Renewed>> = vec![None; batch.len()];
        for (i, outcome) in asked.into_iter().zip(outcomes) {
            if let Some(slot) = out.get_mut(i) {
                *slot = Some(slot.map_or(outcome, |o| renewed_both(o, outcome)));
            }
        }
        Ok(out
            .into_iter()
            .map(|o| o.unwrap_or(Renewed::Lost))
            .collect())
    }

    /// Every node's `maxmemory-policy`, by node address.
    async fn eviction_policies(&self) -> Result<Policies, LockError> {
        let policies = self
            .on_all("info", self.node_timeout, |n| n.eviction_policy())
            .await;
        Ok(self
            .nodes
            .iter()
            .map(SingleBackend::addr)
            .zip(policies)
            .collect())
    }

    /// Held when a quorum of nodes has the key, or else when a permit of it holds a
    /// place on a quorum (found as [`inspect`](Store::inspect) finds it: a `SCAN` of
    /// every node for the key's places).
    async fn is_locked(&self, key: &LockKey) -> Result<bool, LockError> {
        let answers = self
            .on_all("exists", self.node_timeout, |n| n.is_locked(key))
            .await;
        match self.vote(answers.iter().map(|a| a.as_ref().ok().copied())) {
            Vote::Yes => Ok(true),
            Vote::No => Ok(self.permit_of(key).await?.is_some()),
            Vote::Unknown => {
                let reached = answers.iter().filter(|a| a.is_ok()).count();
                let error = answers.iter().find_map(|a| a.as_ref().err());
                Err(self.unavailable(key, reached, error))
            }
        }
    }

    /// The lock on the key as [`inspect_key`](RedlockBackend::inspect_key) finds it, or
    /// else its permit places' holders: a `SCAN` of every node for the key's places
    /// (about 1 000 names a round trip), each place inspected the same way.
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        match self.inspect_key(key).await? {
            Some(info) => Ok(Some(info)),
            None => self.permit_of(key).await,
        }
    }

    /// The union of every node's lock keys (`SCAN`; a node that fails is left out while
    /// a quorum answered), each inspected as [`inspect_key`](RedlockBackend::inspect_key)
    /// does, and the permits whose key matches, found by their places (a second `SCAN`).
    async fn list(&self, prefix: &str, pattern: &str) -> Result<Vec<LockInfo>, LockError> {
        let scans = join_all(self.nodes.iter().map(|n| n.scan_keys(prefix, pattern))).await;
        self.require_quorum(&LockKey::prefixed(prefix, "*")?, &scans)?;
        let keys: BTreeMap<String, LockKey> = scans
            .into_iter()
            .flatten()
            .flatten()
            .map(|k| (k.full().to_owned(), k))
            .collect();
        let mut out = Vec::new();
        let keys: Vec<&LockKey> = keys.values().collect();
        for batch in keys.chunks(INSPECT_BATCH) {
            let infos =
                futures_util::future::try_join_all(batch.iter().map(|k| self.inspect_key(k)))
                    .await?;
            out.extend(infos.into_iter().flatten());
        }
        let wanted = scan_glob(prefix, pattern);
        let all_places = scan_glob(prefix, &format!("*{}*", PLACE_INFIX));
        let permits = self
            .permits(
                prefix,
                &all_places,
                |owner| glob_match(wanted.as_bytes(), owner.full().as_bytes()),
                Reach::Every,
            )
            .await?;
        for (owner, places) in permits.values() {
            out.extend(self.permit_info(owner, places).await?);
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Deletes the key on every node and wakes the waiters, and so every permit place of
    /// the key (found by a `SCAN` of every node) and wakes the permit waiters; true when
    /// any node had any of them. With `seen`: nothing when the lock as
    /// [`inspect`](Store::inspect) finds it now is another grant; else each node deletes
    /// the key only while that grant holds it there, and each place only while no
    /// later grant holds it (by fencing token: a node's is at most the one shown, the
    /// highest of the quorum).
    async fn force_unlock(&self, key: &LockKey, seen: Option<Seen<'_>>) -> Result<bool, LockError> {
        if let Some(seen) = seen {
            match self.inspect(key).await? {
                Some(now) if seen.admits(&now.holder, now.fencing_token) => {}
                _ => return Ok(false),
            }
        }
        let glob = scan_glob(&key.places_prefix(), "*");
        let permits = self
            .permits(key.prefix(), &glob, |owner| owner == key, Reach::Every)
            .await?;
        let places: Vec<LockKey> = permits
            .into_values()
            .flat_map(|(_, places)| places)
            .collect();
        let keys: Vec<&LockKey> = std::iter::once(key).chain(&places).collect();
        let mut held = false;
        for batch in keys.chunks(INSPECT_BATCH) {
            let deleted = batch.iter().map(|&k| async move {
                // A place is held by a token of its own: only its grant is compared.
                let seen = seen.map(|s| Seen {
                    holder: s.holder.filter(|_| k == key),
                    ..s
                });
                let answers = self
                    .on_all("force_unlock", self.node_timeout, |n| {
                        n.force_unlock(k, seen)
                    })
                    .await;
                self.require_quorum(k, &answers)?;
                Ok(answers.iter().any(|a| matches!(a, Ok(true))))
            });
            let found = futures_util::future::try_join_all(deleted).await?;
            held |= found.into_iter().any(|h| h);
        }
        if !places.is_empty() {
            self.announce_place_freed(key);
        }
        Ok(held)
    }

    /// Withdraws the intent on every node (those that refused the writer registered
    /// it), waking the key's waiters there; `Err` when no node could be reached.
    async fn withdraw(&self, key: &LockKey, waiter: u64) -> Result<(), LockError> {
        let answers = self
            .on_all("withdraw", self.node_timeout, |n| n.withdraw(key, waiter))
            .await;
        if answers.iter().any(Result::is_ok) {
            return Ok(());
        }
        let error = answers.iter().find_map(|a| a.as_ref().err());
        Err(self.unavailable(key, 0, error))
    }

    /// Subscribes on every node whose server has not confirmed the channel; succeeds
    /// once it is [`listening`](Self::listening) (enough nodes confirmed it to hear every
    /// successful release), at once if it was already. The interest is counted on every
    /// node before anything is awaited, so the matching
    /// [`unsubscribe`](Self::unsubscribe) drops it wherever it was counted.
    ///
    /// The other nodes' subscriptions finish in the background. When the call succeeds,
    /// a node whose `SUBSCRIBE` failed is asked again a few times in the background
    /// ([`resubscribe`]): the channel is heard without it, but only just (one more node
    /// lost and a release could go unheard). When the call fails, the waiter polls and
    /// calls again after a while (the manager's wait loop), which asks every node that
    /// is still missing.
    async fn subscribe(&self, key: &str, register: bool) -> Result<(), LockError> {
        let needed: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].subscriber().register(key, register))
            .collect();
        let channel: Arc<str> = Arc::from(key);
        let mut in_flight = self.send_to(needed, None, |nodes, i| {
            let channel = channel.clone();
            async move {
                match nodes.get(i) {
                    Some(node) => node.subscriber().send_subscribe(&channel).await,
                    None => Err(LockError::invalid_option("no such redlock node")),
                }
            }
        });
        let mut failed = Vec::new();
        let mut last_error = None;
        if !self.listening(key) {
            gather(&mut in_flight, self.node_timeout, |(i, answer)| {
                if let Err(e) = answer {
                    failed.push(i);
                    last_error = Some(e);
                }
                self.listening(key)
            })
            .await;
        }
        if !self.listening(key) {
            finish(in_flight, |_| async {});
            return Err(
                last_error.unwrap_or_else(|| LockError::timed_out("subscribe", self.node_timeout))
            );
        }
        if !failed.is_empty() || !in_flight.is_empty() {
            let nodes = self.nodes.clone();
            let again = failed
                .into_iter()
                .map(|i| resubscribe(nodes.clone(), i, channel.clone()))
                .collect::<Vec<_>>();
            let stragglers = in_flight.for_each_concurrent(None, move |(i, answer)| {
                let again = answer
                    .is_err()
                    .then(|| resubscribe(nodes.clone(), i, channel.clone()));
                async move {
                    if let Some(again) = again {
                        again.await;
                    }
                }
            });
            // Bounded: each request by the connection's response timeout, each
            // `resubscribe` by its pauses.
            tokio::spawn(futures_util::future::join(join_all(again), stragglers));
        }
        Ok(())
    }

    /// Whether a release of `key` would be heard now: at least N − quorum + 1 nodes
    /// confirmed its channel (and kept their connection since). A release publishes on
    /// every node it reaches, and a successful one reaches a quorum, which meets every
    /// such set of nodes; with fewer, a release can reach a quorum made only of the
    /// nodes that do not listen (the waiter polls then).
    fn listening(&self, key: &str) -> bool {
        let listeners = self
            .nodes
            .iter()
            .filter(|n| n.subscriber().listening(key))
            .count();
        listeners >= hearing(self.nodes.len(), self.quorum)
    }

    /// Drops one interest in `key` on every node, at once; the `UNSUBSCRIBE`s go out in
    /// the background, each when its node's earlier (un)subscriptions are done.
    async fn unsubscribe(&self, key: &str) -> Result<(), LockError> {
        for node in self.nodes.iter() {
            node.subscriber().unsubscribe(key);
        }
        Ok(())
    }

    /// The number of channels with an interest, summed over the nodes.
    fn interests(&self) -> usize {
        self.nodes.iter().map(|n| n.subscriber().interests()).sum()
    }

    fn undoes_failed_attempts(&self) -> bool {
        true
    }
}

/// Feeds the answers of `in_flight` to `take` as they arrive, until it says the outcome
/// is decided or `timeout` passes (nodes that did not answer by then count as failed;
/// their requests stay in `in_flight`).
async fn gather<T>(
    in_flight: &mut InFlight<T>,
    timeout: Duration,
    mut take: impl FnMut(Answer<T>) -> bool,
) {
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            biased;
            answer = in_flight.next() => match answer {
                Some(answer) => {
                    if take(answer) {
                        return;
                    }
                }
                None => return,
            },
            () = &mut deadline => return,
        }
    }
}

/// Drives the requests still in flight to completion in a task of their own, handing
/// each answer to `then`. The task owns the nodes it talks to, so it finishes even when
/// the manager is dropped meanwhile.
fn finish<T, G, Fut>(in_flight: InFlight<T>, then: G)
where
    T: Send + 'static,
    G: FnMut(Answer<T>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    if !in_flight.is_empty() {
        tokio::spawn(in_flight.for_each_concurrent(None, then));
    }
}

/// The number of nodes that must listen on a channel for every successful release to be
/// heard: N − quorum + 1 (2 of 3, 3 of 5), since a successful release publishes on at
/// least a quorum of nodes.
fn hearing(nodes: usize, quorum: usize) -> usize {
    (nodes + 1).saturating_sub(quorum).max(1)
}

/// Asks node `i` again for `channel`, whose `SUBSCRIBE` failed there, after each pause
/// of [`RESUBSCRIBE_PAUSES`], until its server confirms it or nobody wants it any more
/// (`send_subscribe` sends nothing then).
async fn resubscribe(nodes: Arc<[SingleBackend]>, i: usize, channel: Arc<str>) {
    let Some(node) = nodes.get(i) else {
        return;
    };
    for pause in RESUBSCRIBE_PAUSES {
        tokio::time::sleep(pause).await;
        if node.subscriber().listening(&channel) {
            return;
        }
        if node.subscriber().send_subscribe(&channel).await.is_ok() {
            return;
        }
    }
    tracing::debug!(
        target: "redlock",
        key = &*channel,
        backend = "redlock",
        node = node.addr(),
        "redlock: a node does not confirm a subscription; heard without it"
    );
}

/// Compare-token delete on one node, waking by `publish`, as
/// one self-contained `EVAL`: never answered `NOSCRIPT` by a restarted node, so the
/// request is applied whenever it is delivered. True when our token was deleted.
async fn release_on(
    node: &SingleBackend,
    key: &LockKey,
    stake: Stake,
    publish: Publish,
) -> Result<bool, LockError> {
    let lease = LeaseRef::new(key, stake.token, stake.mode);
    let released: i64 = release_call(lease, stake.keep, publish)
        .eval()
        .query_async(&mut node.connection())
        .await
        .map_err(LockError::backend("release"))?;
    Ok(released == 1)
}

/// `fence_floor.lua` on one node: true when its counter is now at least `fence` (and the
/// lock still ours there).
async fn raise_fence(
    node: &SingleBackend,
    key: &LockKey,
    stake: Stake,
    fence: u64,
) -> Result<bool, LockError> {
    let con = node.connection();
    let token = stake.token.as_bytes();
    let raised = if stake.mode.is_shared() {
        let keys = [key.full().to_owned(), key.fence().to_owned(), key.holders()];
        let args = (token, fence, stake.mode.marker());
        FENCE_FLOOR.invoke(&con, &keys, args).await
    } else {
        FENCE_FLOOR
            .invoke(&con, &[key.full(), key.fence()], (token, fence))
            .await
    };
    raised.map_err(LockError::backend("fence_floor"))
}

/// Undoes an attempt on node `i`: compare-token delete, without waking anyone (the
/// waiters there would include this attempt's own caller, which retries by its own
/// timer), retried for a few seconds while unconfirmed; after that the ttl frees it.
async fn undo(nodes: Arc<[SingleBackend]>, key: Arc<LockKey>, stake: Stake, i: usize) {
    if let Some(node) = nodes.get(i) {
        release_until_confirmed(node, &key, stake, Publish::Nobody, &UNDO_PAUSES).await;
    }
}

/// Whether the release of a lock found its token on node `i`, as `told` says once the
/// release's request there was answered; false when it was not answered within `wait`.
async fn released_there(told: &ReleaseAnswers, i: usize, wait: Duration) -> bool {
    let mut answers = told.subscribe();
    let answered = async {
        answers
            .wait_for(|a| a.get(i).is_some_and(Option::is_some))
            .await
            .is_ok_and(|a| a.get(i) == Some(&Some(true)))
    };
    tokio::time::timeout(wait, answered).await.unwrap_or(false)
}

/// Drops the release answers of `entry` once its acquisition has no request in flight,
/// unless a later acquisition of the same token and key put its own there.
fn forget_release_answers(
    released_on: &Mutex<HashMap<(Token, String), ReleaseAnswers>>,
    entry: (Token, String),
    told: &ReleaseAnswers,
) {
    let mut released_on = lock(released_on);
    if released_on
        .get(&entry)
        .is_some_and(|t| Arc::ptr_eq(t, told))
    {
        released_on.remove(&entry);
    }
}

/// A quorum granted, but after so long that no validity was left of the ttl.
fn won_too_late(ttl: Duration, elapsed: Duration) -> LockError {
    let source = std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("a quorum granted after {elapsed:?}, too late for a ttl of {ttl:?}"),
    );
    LockError::Backend {
        operation: "acquire",
        node: None,
        source: source.into(),
    }
}

/// One acquisition of `token` has no request in flight any more: its entry goes with
/// the last one.
fn landed_all(landing: &Mutex<HashMap<Token, Landing>>, token: Token) {
    let mut landing = lock(landing);
    if let Some(l) = landing.get_mut(&token) {
        l.pending = l.pending.saturating_sub(1);
        if l.pending == 0 {
            landing.remove(&token);
        }
    }
}

/// Ours on both halves of a permit (its place and its hold on the key): false when
/// either is denied, else an error when either failed.
fn both(a: Result<bool, LockError>, b: Result<bool, LockError>) -> Result<bool, LockError> {
    match (a, b) {
        (Ok(false), _) | (_, Ok(false)) => Ok(false),
        (Err(e), _) | (_, Err(e)) => Err(e),
        (Ok(true), Ok(true)) => Ok(true),
    }
}

/// A permit's renewal from those of its two halves: lost when either is, unknown when
/// either is.
fn renewed_both(a: Renewed, b: Renewed) -> Renewed {
    match (a, b) {
        (Renewed::Lost, _) | (_, Renewed::Lost) => Renewed::Lost,
        (Renewed::Unknown, _) | (_, Renewed::Unknown) => Renewed::Unknown,
        (Renewed::Yes, Renewed::Yes) => Renewed::Yes,
    }
}

/// The map of won attempts still landing, whatever a panic elsewhere left in it.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A release whose first request to `node` failed, sent again in the background from the
/// retries' second pause on, until the node answers.
async fn release_again(node: &SingleBackend, key: &LockKey, stake: Stake) {
    release_until_confirmed(node, key, stake, Publish::Channel, &UNDO_PAUSES[1..]).await;
}

/// Releases on one node until a request is answered: one request after each pause of
/// `pauses` (zero: at once). Each request is bounded by the connection's response
/// timeout, never cut short by ours, so it is written whatever happens.
async fn release_until_confirmed(
    node: &SingleBackend,
    key: &LockKey,
    stake: Stake,
    publish: Publish,
    pauses: &[Duration],
) {
    for &pause in pauses {
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        if release_on(node, key, stake, publish).await.is_ok() {
            return;
        }
    }
    tracing::debug!(
        target: "redlock",
        key = key.full(),
        backend = "redlock",
        node = node.addr(),
        "redlock: release not confirmed by a node; its ttl frees it"
    );
}

/// The batch indices of a renewal batch in groups of similar ttl, shortest first: ttls
/// with the same power-of-two number of milliseconds form a group, and all ttls of at
/// least 10 × `node_timeout` (whose per-node timeout is `node_timeout` itself) form one.
/// Within a group the shortest ttl is more than half the longest, so the group's
/// timeout, set by its shortest ttl, suits all its locks.
fn ttl_groups(batch: &[Renewal<'_>], node_timeout: Duration) -> Vec<Vec<usize>> {
    let mut groups: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, r) in batch.iter().enumerate() {
        let class = if r.ttl >= node_timeout.saturating_mul(10) {
            u32::MAX
        } else {
            u128::BITS - r.ttl.as_millis().leading_zeros()
        };
        groups.entry(class).or_default().push(i);
    }
    groups.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(holder: u64) -> Answer<Attempt> {
        (
            0,
            Ok(Attempt::Held {
                remaining: Some(Duration::from_secs(30)),
                holder: Some(holder),
            }),
        )
    }

    /// Review finding 6: a lost attempt is decided early only when its answers tell a
    /// holder of a quorum from a split vote.
    #[test]
    fn a_lost_attempt_waits_until_a_majority_holder_can_be_told_from_a_split_vote() {
        // N = 3: H on one node, a stale key Z on another, the third (maybe H) pending.
        let mut t = Tally::default();
        t.add(held(1));
        t.add(held(2));
        assert!(!t.decided(3, 2), "H may hold the pending node too");
        t.add(held(1));
        assert!(t.decided(3, 2), "H holds a quorum");
        // N = 5, three holders seen, two pending: any of them may hold those two.
        let mut t = Tally::default();
        t.add(held(1));
        t.add(held(2));
        t.add(held(3));
        assert!(!t.decided(5, 3));
        t.add(held(2));
        assert!(!t.decided(5, 3), "holder 2 may hold the last node");
        t.add(held(3));
        assert!(t.decided(5, 3), "a split vote, every node answered");
        let mut t = Tally::default();
        t.add(held(1));
        t.add(held(1));
        t.add(held(1));
        assert!(t.decided(5, 3), "H holds a quorum of 5");
        let mut t = Tally::default();
        t.add(held(1));
        t.add(held(2));
        t.add(held(3));
        t.add(held(4));
        assert!(t.decided(5, 3), "nobody can reach 3 with one pending node");
    }

    /// Review 2, finding 1: a waiter hears every successful release only when it
    /// listens on N − quorum + 1 nodes (a quorum meets every such set).
    #[test]
    fn a_release_is_heard_on_n_minus_quorum_plus_one_nodes() {
        for (nodes, needed) in [(1, 1), (2, 1), (3, 2), (4, 2), (5, 3), (7, 4)] {
            let quorum = nodes / 2 + 1;
            assert_eq!(hearing(nodes, quorum), needed, "{nodes} nodes");
            // Any `needed` listeners and any quorum share a node; one fewer may not.
            assert!(needed + quorum > nodes);
            assert!(needed - 1 + quorum <= nodes);
        }
    }

    /// Review finding 8: from the minimum up a grant answered within an attempt's two
    /// rounds (each within the per-node timeout) is valid; just below it, it may not be.
    #[test]
    fn the_minimum_ttl_outlasts_drift_and_two_rounds() {
        let valid_after_timeout = |ttl: Duration| {
            let timeout = DEFAULT_NODE_TIMEOUT
                .min(ttl / 10)
                .max(Duration::from_millis(1));
            ttl.saturating_sub(drift(ttl)) > timeout * 2
        };
        let below = MIN_REDLOCK_TTL - Duration::from_millis(1);
        assert!(!valid_after_timeout(below));
        let min = u64::try_from(MIN_REDLOCK_TTL.as_millis()).unwrap();
        for ms in min..100_000 {
            assert!(valid_after_timeout(Duration::from_millis(ms)), "{ms} ms");
        }
    }

    /// Review finding 6: a probe tells the places a quorum may grant (the freest
    /// first) from those held on more than N − quorum of the answering nodes, and when
    /// the first of those may be granted.
    #[test]
    fn a_probe_tells_grantable_places_from_held_ones() {
        // N = 5 (spare 2), three nodes answered, places 7, 8, 9, 3.
        let answered = vec![
            vec![-2, 500, 900, -2],
            vec![-2, 400, 800, 100],
            vec![-2, 300, -1],
        ];
        let probe = Probe::of(&[7, 8, 9, 3], &answered, 2);
        // 7: free; 3: held on one (its third reply missing: counts as held), 8 and 9: on
        // three, the first of them frees in 300 ms (one more node free makes a quorum).
        assert_eq!(probe.free, [7, 3]);
        assert_eq!(probe.remaining, Some(Duration::from_millis(300)));
        let full = Probe::of(&[0, 1], &[vec![1000, 2000], vec![1500, -1]], 0);
        assert!(full.free.is_empty());
        // Both nodes must free (N = 2): place 0 at 1.5 s, place 1 at 2 s.
        assert_eq!(full.remaining, Some(Duration::from_millis(1500)));
        assert_eq!(
            nth_place(u32::MAX - 1, u32::MAX - 1, u32::MAX),
            u32::MAX - 2
        );
    }

    #[test]
    fn jitter_stays_in_range() {
        for _ in 0..100 {
            assert!(jitter(Duration::from_millis(5)) <= Duration::from_millis(5));
        }
    }
}
