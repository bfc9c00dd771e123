//! Redlock as a [`Store`]: each operation on every node, decided by a quorum, a permit on
//! its place and its hold on the key; subscriptions on every node, a channel heard once
//! enough nodes confirmed it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::stream::StreamExt;

use super::inspect::Reach;
use super::permits::{both, exclusive, renewed_both, PERMIT_ROUNDS};
use super::voting::Vote;
use super::{finish, gather, hearing, lock, RedlockBackend};
use crate::backend::glob::glob_match;
use crate::backend::server::{scan_glob, INSPECT_BATCH};
use crate::backend::single::SingleBackend;
use crate::backend::{Policies, Store};
use crate::info::LockInfo;
use crate::key::{LockKey, PLACE_INFIX};
use crate::kind::Mode;
use crate::notify::Register;
use crate::token::Token;
use crate::wire::{Attempt, Claim, Renewed, Seen, Together};
use crate::wire::{LeaseRef, Renewal};
use crate::LockError;

/// The shortest ttl a Redlock lock can have: the shortest whole number of milliseconds
/// whose validity (ttl − drift, drift = 1 % of the ttl + 2 ms) outlasts an attempt's
/// two rounds (acquire and fencing, each within the per-node timeout, at least 1 ms),
/// so that a grant answered in time is still valid. At or below the drift no grant
/// ever is: a free key would read as held (see [`Store::min_ttl`]).
const MIN_REDLOCK_TTL: Duration = Duration::from_millis(5);

/// Pauses before asking a node again for a channel whose `SUBSCRIBE` failed there (a
/// request to a connection that gave up reconnecting fails, and starts a reconnection:
/// the next one may get through).
const RESUBSCRIBE_PAUSES: [Duration; 4] = [
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
];

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
            // A second round when the nodes gave the waiter different tickets.
            Mode::Fair => 6,
        };
        self.node_timeout(ttl) * rounds
    }

    async fn acquire(&self, claim: &Claim<'_>) -> Result<Attempt, LockError> {
        match claim.mode {
            Mode::Permit(n) => self.acquire_place(claim, n).await,
            Mode::Exclusive | Mode::Read => self.acquire_quorum(claim, None).await,
            Mode::Fair => self.acquire_fair(claim).await,
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
                Mode::Exclusive | Mode::Read | Mode::Fair => None,
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

    /// Withdraws the intent or the fair place on every node (those that refused the
    /// waiter registered it), waking the key's waiters there; `Err` when no node could
    /// be reached.
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
    async fn subscribe(&self, key: &str, register: Register) -> Result<(), LockError> {
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

#[cfg(test)]
mod tests {
    use super::super::DEFAULT_NODE_TIMEOUT;
    use super::*;
    use crate::lease::drift;

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
}
