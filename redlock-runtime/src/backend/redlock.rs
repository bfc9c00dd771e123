//! Redlock: the same lock on N independent Redis masters, held by a majority.
//!
//! Every operation goes to all N nodes at once, each request bounded by the per-node
//! timeout (default 200 ms, at most ttl/10), so a frozen or partitioned node costs at
//! most that long and never hangs a call. Each node is a [`SingleBackend`] (its own
//! command and subscriber connections, reconnecting by themselves).
//!
//! - **Acquire** runs `acquire.lua` (`SET NX PX` plus the node's fencing `INCR`) on every
//!   node. The lock is ours iff a quorum (N/2+1) said yes *and* the validity
//!   ttl − elapsed − drift (drift = 1 % of the ttl + 2 ms) is still positive. Otherwise
//!   the attempt is undone on every node at once (a node whose reply was lost may have
//!   applied it) and reported as [`Attempt::Held`] (retried by the manager after the
//!   holders' remaining ttl plus a random jitter, or at once on a release notification),
//!   or as [`LockError::QuorumUnavailable`] when fewer than a quorum of nodes answered.
//! - **Release and extend** go to every node; they succeed when a quorum confirms, report
//!   the lock lost when so many nodes deny it that no quorum can, and fail with
//!   `QuorumUnavailable` when too few answered to tell.
//! - **Renewal** (the watchdog) extends each lock on every node, one pipelined request
//!   per node and ttl group, each bounded by its group's shortest ttl and its size (see
//!   [`RedlockBackend::renew`]); a lock is lost once a majority no longer confirms it.
//! - **Wake-ups**: waiters subscribe on every node, and any node's message wakes them
//!   (a release publishes on every node it reaches).
//!
//! # Fencing tokens
//! Each node keeps its own fencing counters, one per hash slot, shared by every key of
//! the slot (see `key.rs`). A counter changes in two ways only, both upwards: `INCR` by
//! one in the script of every `SET NX` the node grants for a key of the slot, and
//! `fence_floor.lua` (a compare-token `counter = max(counter, token)`, run only while the
//! node still holds our lock key). So, as long as the node keeps its data, **a counter
//! never decreases**. Counters and the floor are exact decimal strings on the server
//! and `u64` here, never Lua doubles.
//!
//! The token of an acquisition is the **maximum** counter among the nodes that granted
//! it. That maximum must be *vouched for* by a quorum: nodes whose acquire script
//! reported it, plus nodes raised to it by `fence_floor.lua`. When all granting
//! nodes agree (the normal case) this costs nothing; when they disagree (a node was down
//! or restarted, or other keys of the slot were granted by some nodes only) a second
//! round trip raises the lagging ones before the guard is handed out, and an attempt
//! that cannot get a quorum to vouch is undone like any failed attempt. Granting nodes
//! that lag behind while a quorum already vouches are raised in the background.
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

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Weak;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::aio::ConnectionManager;

use super::single::SingleBackend;
use super::{Attempt, Renewal, Renewed, ReplicaWait, Timeouts};
use crate::key::LockKey;
use crate::lease::drift;
use crate::scripts::{FENCE_FLOOR, RELEASE};
use crate::token::Token;
use crate::waiters::Waiters;
use crate::LockError;

/// The default bound on each node's reply.
pub(crate) const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(200);
/// Pauses before the background retries of an undo some node did not confirm.
const UNDO_RETRIES: [Duration; 3] = [
    Duration::from_millis(200),
    Duration::from_millis(800),
    Duration::from_secs(2),
];
/// The time a renewal request may take per lock, on top of the per-node timeout.
const RENEW_PER_LOCK: Duration = Duration::from_micros(10);
/// The longest random delay added to a retry after a failed attempt.
const MAX_JITTER: Duration = Duration::from_millis(50);

/// N independent masters.
pub(crate) struct RedlockBackend {
    nodes: Vec<SingleBackend>,
    quorum: usize,
    node_timeout: Duration,
}

/// How a quorum vote came out.
enum Vote {
    /// A quorum confirmed.
    Yes,
    /// So many nodes denied that no quorum can confirm.
    No,
    /// Too few answered to tell.
    Unknown,
}

impl RedlockBackend {
    /// Connects to and PINGs every node concurrently, within the connect timeout.
    pub(crate) async fn connect(
        urls: &[String],
        timeouts: Timeouts,
        node_timeout: Duration,
        waiters: Weak<Waiters>,
    ) -> Result<Self, LockError> {
        if urls.is_empty() {
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
            urls.iter()
                .map(|url| SingleBackend::connect(url, timeouts, waiters.clone())),
        )
        .await;
        let nodes = connected.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            quorum: nodes.len() / 2 + 1,
            nodes,
            node_timeout,
        })
    }

    /// The per-node bound for a lock of `ttl`: the configured timeout, at most ttl/10.
    fn node_timeout(&self, ttl: Duration) -> Duration {
        self.node_timeout
            .min(ttl / 10)
            .max(Duration::from_millis(1))
    }

    /// Runs `f` on every node at once, each bounded by `timeout`.
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

    fn unavailable(&self, key: &LockKey, answers: &[Result<bool, LockError>]) -> LockError {
        if let Some(Err(e)) = answers.iter().find(|a| a.is_err()) {
            tracing::debug!(key = key.full(), error = %e, "redlock: too few nodes answered");
        }
        LockError::QuorumUnavailable {
            key: key.full().to_owned(),
            reached: answers.iter().filter(|a| a.is_ok()).count(),
            needed: self.quorum,
        }
    }

    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        token: Token,
        ttl: Duration,
        replicas: Option<ReplicaWait>,
    ) -> Result<Attempt, LockError> {
        if replicas.is_some() {
            return Err(LockError::invalid_option(
                "min_replicas is not available with the redlock backend (its quorum of masters replaces it)",
            ));
        }
        let started = Instant::now();
        let timeout = self.node_timeout(ttl);
        let answers = self
            .on_all("acquire", timeout, |n| n.acquire(key, token, ttl, None))
            .await;
        let mut granted: Vec<(usize, u64)> = Vec::new();
        let mut held: Vec<Option<Duration>> = Vec::new();
        let mut last_error = None;
        for (i, answer) in answers.into_iter().enumerate() {
            match answer {
                Ok(Attempt::Acquired { fence, .. }) => granted.push((i, fence)),
                Ok(Attempt::Held { remaining }) => held.push(remaining),
                Err(e) => last_error = Some(e),
            }
        }
        if granted.len() >= self.quorum {
            if let Some(fence) = self.settle_fence(key, token, &granted, timeout).await {
                let validity = ttl
                    .saturating_sub(started.elapsed())
                    .saturating_sub(drift(ttl));
                if !validity.is_zero() {
                    return Ok(Attempt::Acquired {
                        fence,
                        replicas: None,
                    });
                }
                tracing::debug!(key = key.full(), elapsed = ?started.elapsed(), "redlock: quorum won too late; undoing");
            }
        }
        let answered = granted.len() + held.len();
        if answered < self.quorum {
            if let Some(e) = last_error {
                tracing::debug!(key = key.full(), error = %e, "redlock: too few nodes answered");
            }
            // The manager releases what a failed attempt may have taken, on every node,
            // in the background: the error is not delayed by another round of timeouts.
            return Err(LockError::QuorumUnavailable {
                key: key.full().to_owned(),
                reached: answered,
                needed: self.quorum,
            });
        }
        // Undo everywhere at once (a node whose reply was lost may have granted it),
        // before retrying, so that competing clients find the nodes free.
        self.undo_everywhere(key, token, timeout).await;
        Ok(Attempt::Held {
            remaining: Some(self.retry_after(&held, ttl)),
        })
    }

    /// Undoes a failed attempt on every node. Nodes that did not confirm are retried in
    /// the background for a few seconds, so a lost undo does not leave a stale grant
    /// standing in the way of everyone for its whole ttl. (It can never be counted as a
    /// grant again: every attempt has a token of its own.)
    async fn undo_everywhere(&self, key: &LockKey, token: Token, timeout: Duration) {
        let answers = self
            .on_all("release", timeout, |n| undo(n, key, token))
            .await;
        let unconfirmed: Vec<ConnectionManager> = self
            .nodes
            .iter()
            .zip(&answers)
            .filter(|(_, answer)| answer.is_err())
            .map(|(node, _)| node.connection())
            .collect();
        if unconfirmed.is_empty() {
            return;
        }
        let key = key.clone();
        let node_timeout = self.node_timeout;
        tokio::spawn(async move {
            for pause in UNDO_RETRIES {
                tokio::time::sleep(pause).await;
                let retries = unconfirmed.iter().map(|con| {
                    let (mut con, key) = (con.clone(), &key);
                    async move {
                        let cmd = RELEASE.eval(&[key.full()], (token.as_bytes(), "PUBLISH"));
                        tokio::time::timeout(node_timeout, cmd.query_async::<i64>(&mut con)).await
                    }
                });
                if join_all(retries)
                    .await
                    .iter()
                    .all(|r| matches!(r, Ok(Ok(_))))
                {
                    return;
                }
            }
            tracing::debug!(
                key = key.full(),
                "redlock: undo not confirmed by every node; the ttl frees the rest"
            );
        });
    }

    /// The fencing token of a won quorum (the highest counter among `granted`), once a
    /// quorum vouches for it; `None` when it cannot (the attempt must be undone).
    async fn settle_fence(
        &self,
        key: &LockKey,
        token: Token,
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
        let vouching = granted.len() - behind.len();
        let raise = |i: usize| {
            let con = self.nodes.get(i).map(SingleBackend::connection);
            let keys = [key.full().to_owned(), key.fence().to_owned()];
            async move {
                let con = con.as_ref()?;
                let raised =
                    FENCE_FLOOR.invoke::<bool, _, _, _>(con, &keys, (token.as_bytes(), fence));
                tokio::time::timeout(timeout, raised).await.ok()?.ok()
            }
        };
        if vouching >= self.quorum {
            // Already safe; bring the laggards up in the background.
            let catch_up = join_all(behind.into_iter().map(raise));
            tokio::spawn(async move {
                catch_up.await;
            });
            return Some(fence);
        }
        let raised = join_all(behind.into_iter().map(raise))
            .await
            .into_iter()
            .filter(|r| *r == Some(true))
            .count();
        if vouching + raised >= self.quorum {
            Some(fence)
        } else {
            tracing::debug!(
                key = key.full(),
                "redlock: too few nodes vouch for the fencing token"
            );
            None
        }
    }

    /// When to try again after losing: once enough holders' keys expire that a quorum
    /// becomes possible (at once after a split vote), plus a random jitter so competing
    /// clients do not collide again.
    fn retry_after(&self, held: &[Option<Duration>], ttl: Duration) -> Duration {
        // Holding nodes that must free up before the others can form a quorum.
        let must_free = (self.quorum + held.len()).saturating_sub(self.nodes.len());
        let base = if must_free == 0 {
            Duration::ZERO
        } else {
            let mut remaining: Vec<Duration> = held
                .iter()
                .map(|r| r.unwrap_or(Duration::from_secs(1)))
                .collect();
            remaining.sort_unstable();
            remaining.get(must_free - 1).copied().unwrap_or_default()
        };
        base + jitter((ttl / 10).clamp(Duration::from_millis(2), MAX_JITTER))
    }

    /// Releases on every node; true when a quorum deleted our token.
    pub(crate) async fn release(&self, key: &LockKey, token: Token) -> Result<bool, LockError> {
        let answers = self
            .on_all("release", self.node_timeout, |n| undo(n, key, token))
            .await;
        match self.vote(answers.iter().map(|a| a.as_ref().ok().copied())) {
            Vote::Yes => Ok(true),
            Vote::No => Ok(false),
            Vote::Unknown => Err(self.unavailable(key, &answers)),
        }
    }

    /// Extends on every node; true when a quorum still had our token.
    pub(crate) async fn extend(
        &self,
        key: &LockKey,
        token: Token,
        ttl: Duration,
    ) -> Result<bool, LockError> {
        let answers = self
            .on_all("extend", self.node_timeout(ttl), |n| {
                n.extend(key, token, ttl)
            })
            .await;
        match self.vote(answers.iter().map(|a| a.as_ref().ok().copied())) {
            Vote::Yes => Ok(true),
            Vote::No => Ok(false),
            Vote::Unknown => Err(self.unavailable(key, &answers)),
        }
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
    pub(crate) async fn renew(&self, batch: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
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
            for node in &self.nodes {
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

    /// The bound on one node's answer to a renewal request for `locks` locks, the
    /// shortest with `ttl`: the per-node timeout for that ttl plus [`RENEW_PER_LOCK`] per
    /// lock (a node renews a few hundred thousand locks a second), but never more than
    /// ttl/4, which leaves a failed renewal time for a retry before the lock's deadline.
    fn renew_timeout(&self, ttl: Duration, locks: usize) -> Duration {
        let base = self.node_timeout(ttl);
        let allowance = RENEW_PER_LOCK.saturating_mul(u32::try_from(locks).unwrap_or(u32::MAX));
        (base + allowance).min((ttl / 4).max(base))
    }

    /// Every node's `maxmemory-policy`, by node address.
    pub(crate) async fn eviction_policies(&self) -> Vec<(String, Result<String, LockError>)> {
        let policies = self
            .on_all("info", self.node_timeout, |n| n.eviction_policy())
            .await;
        self.nodes
            .iter()
            .map(SingleBackend::addr)
            .zip(policies)
            .collect()
    }

    /// Held when a quorum of nodes has the key.
    pub(crate) async fn is_locked(&self, key: &LockKey) -> Result<bool, LockError> {
        let answers = self
            .on_all("exists", self.node_timeout, |n| n.is_locked(key))
            .await;
        match self.vote(answers.iter().map(|a| a.as_ref().ok().copied())) {
            Vote::Yes => Ok(true),
            Vote::No => Ok(false),
            Vote::Unknown => Err(self.unavailable(key, &answers)),
        }
    }

    /// Deletes the key on every node and wakes the waiters; true when any node had it.
    pub(crate) async fn force_unlock(&self, key: &LockKey) -> Result<bool, LockError> {
        let answers = self
            .on_all("force_unlock", self.node_timeout, |n| n.force_unlock(key))
            .await;
        if answers.iter().filter(|a| a.is_ok()).count() < self.quorum {
            return Err(self.unavailable(key, &answers));
        }
        Ok(answers.iter().any(|a| matches!(a, Ok(true))))
    }

    /// Subscribes on every node; enough when any node confirms (a release publishes on
    /// every node it reaches, and the fallback timer covers the rest).
    pub(crate) async fn subscribe(&self, key: &str, register: bool) -> Result<(), LockError> {
        let answers = self
            .on_all("subscribe", self.node_timeout, |n| {
                n.subscriber().subscribe(key, register)
            })
            .await;
        first_ok(answers)
    }

    /// Drops one interest in `key` on every node.
    pub(crate) async fn unsubscribe(&self, key: &str) -> Result<(), LockError> {
        let answers = self
            .on_all("unsubscribe", self.node_timeout, |n| {
                n.subscriber().unsubscribe(key)
            })
            .await;
        first_ok(answers)
    }
}

/// Compare-token delete and publish on one node, as one self-contained `EVAL`.
///
/// Not `EVALSHA`: when a node answers late, the caller stops waiting but the request is
/// still delivered, in order after the acquire it undoes. An `EVALSHA` answered with
/// `NOSCRIPT` (a restarted node) would then be lost with nobody left to send the
/// fallback, leaving the late acquire in place for its whole ttl.
async fn undo(node: &SingleBackend, key: &LockKey, token: Token) -> Result<bool, LockError> {
    let released: i64 = RELEASE
        .eval(&[key.full()], (token.as_bytes(), "PUBLISH"))
        .query_async(&mut node.connection())
        .await
        .map_err(LockError::backend("release"))?;
    Ok(released == 1)
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

/// `Ok` when any node succeeded, else the first error.
fn first_ok(answers: Vec<Result<(), LockError>>) -> Result<(), LockError> {
    let mut first_error = None;
    for answer in answers {
        match answer {
            Ok(()) => return Ok(()),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// A uniformly random duration in `0..=max`.
fn jitter(max: Duration) -> Duration {
    let span = u64::try_from(max.as_micros()).unwrap_or(u64::MAX).max(1);
    let r = getrandom::u64().unwrap_or(0);
    Duration::from_micros(r % span.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_range() {
        for _ in 0..100 {
            assert!(jitter(Duration::from_millis(5)) <= Duration::from_millis(5));
        }
    }
}
