//! The operations on a lock, each on every node and decided by a quorum: acquire one key
//! or several, release, extend, and renew a batch.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};

use super::fair::Tickets;
use super::stragglers::{release_on, Stragglers};
use super::voting::Contest;
use super::{lock, RedlockBackend, Stake};
use crate::backend::single::SingleBackend;
use crate::backend::Store;
use crate::key::LockKey;
use crate::kind::Mode;
use crate::token::Token;
use crate::wire::{Attempt, Claim, Renewed, Together};
use crate::wire::{LeaseRef, Publish, Renewal};
use crate::LockError;

/// The time a renewal request may take per lock, on top of the per-node timeout.
const RENEW_PER_LOCK: Duration = Duration::from_micros(10);

/// Quorum operations on one key.
impl RedlockBackend {
    /// One key (exclusive, a reader, a fair waiter), voted on by the nodes; what they
    /// said of a fair waiter's place goes to `tickets`.
    pub(super) async fn acquire_quorum(
        &self,
        claim: &Claim<'_>,
        tickets: Option<&Arc<Tickets>>,
    ) -> Result<Attempt, LockError> {
        let Claim {
            key,
            token,
            ttl,
            replicas,
            mode,
            intent,
            arrival,
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
            let tickets = tickets.cloned();
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
                            arrival,
                        };
                        let attempt = node.acquire(&claim).await;
                        if let Some(tickets) = &tickets {
                            tickets.add(&attempt);
                        }
                        attempt
                    }
                    None => Err(LockError::invalid_option("no such redlock node")),
                }
            }
        };
        let keys = [shared_key.clone()];
        match self.contend(&keys, stake, ttl, request).await? {
            Contest::Won(fences) => {
                // Withdrawn on every node: the nodes that refused it registered it.
                if let Some(waiter) = intent.map(|i| i.waiter).or(arrival.map(|a| a.waiter)) {
                    self.withdraw_intent(key, waiter);
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
    pub(super) async fn acquire_all_quorum(
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

    /// Releases on every node; true when a quorum deleted our token. Returns once a
    /// quorum decided; the other nodes' requests finish in the background (and are
    /// retried there if they fail).
    pub(super) async fn release_quorum(
        &self,
        lease: LeaseRef<'_>,
        keep: Duration,
    ) -> Result<bool, LockError> {
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
    pub(super) async fn extend_quorum(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
    ) -> Result<bool, LockError> {
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
    pub(super) async fn renew_quorum(
        &self,
        batch: &[Renewal<'_>],
    ) -> Result<Vec<Renewed>, LockError> {
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
