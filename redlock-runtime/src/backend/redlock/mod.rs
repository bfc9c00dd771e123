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
//!   deciding grants vouched for by a quorum (see [`fences`]); a late grant is
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
//!   [`RedlockBackend::renew_quorum`]); a lock is lost once a majority no longer confirms it.
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
//! How fencing tokens are chosen, and what they guarantee, is told in [`fences`].
//!
//! # Where each part lives
//! - this module: the backend, its nodes and how a request is sent to each of them;
//! - [`voting`]: how the nodes' answers decide a call (`decide`, `contend`);
//! - [`stragglers`]: the requests still in flight when a call returns (late grants kept
//!   or undone, an extend's stragglers settled, releases sent again);
//! - [`fences`]: fencing tokens vouched for by a quorum;
//! - [`permits`]: a permit as a place of its key plus a hold on the key;
//! - [`inspect`]: what `inspect`, `list` and `force_unlock` find on the nodes;
//! - [`quorum`]: acquire, release, extend and renew of locks on every node;
//! - [`store`]: the [`Store`](super::Store) impl.

mod fair;
mod fences;
mod inspect;
mod permits;
mod quorum;
mod store;
mod stragglers;
mod voting;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio_util::sync::CancellationToken;

use self::stragglers::{Landing, ReleaseAnswers, Settling};
use super::single::SingleBackend;
use super::Timeouts;
use crate::key::LockKey;
use crate::kind::Mode;
use crate::notify::Hearing;
use crate::token::Token;
use crate::waiters::Wake;
use crate::wire::{Attempt, Together};
use crate::LockError;

/// The default bound on each node's reply.
pub(crate) const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(200);

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

/// What a release or undo on a node names: the token, its kind of place, and how long
/// to keep the key (`hold_at_least`; zero for an undo).
#[derive(Debug, Clone, Copy)]
struct Stake {
    token: Token,
    mode: Mode,
    keep: Duration,
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
            Attempt::Held { remaining, holder }
            | Attempt::Queued {
                remaining, holder, ..
            } => Err((*remaining, *holder)),
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

/// One node's answer: its index and its outcome.
type Answer<T> = (usize, Result<T, LockError>);

/// One request per node, each owning what it needs. A call returns as soon as its outcome
/// is decided; the requests still unanswered then are driven to completion by a task of
/// their own ([`finish`]), never dropped: a dropped request may never be written (an undo
/// lost that way leaves its key behind for the whole ttl), or be written with nobody left
/// to undo what it did.
type InFlight<T> = FuturesUnordered<Pin<Box<dyn Future<Output = Answer<T>> + Send>>>;

/// Connecting, and sending to the nodes.
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

/// The map of won attempts still landing, whatever a panic elsewhere left in it.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::jitter;

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

    #[test]
    fn jitter_stays_in_range() {
        for _ in 0..100 {
            assert!(jitter(Duration::from_millis(5)) <= Duration::from_millis(5));
        }
    }
}
