//! Permits on Redlock: a permit of `n` is one of the key's `n` places, each an exclusive
//! lock won by its own quorum vote and found by a probe of the places, plus a shared hold
//! on the key itself, won as a reader is.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};

use super::stragglers::undo;
use super::{lock, RedlockBackend, Stake, MAX_JITTER};
use crate::backend::jitter;
use crate::backend::single::SingleBackend;
use crate::key::LockKey;
use crate::kind::Mode;
use crate::token::Token;
use crate::wire::{Attempt, Claim, Renewed};
use crate::wire::{LeaseRef, Publish};
use crate::LockError;

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
    pub(super) async fn acquire_place(
        &self,
        claim: &Claim<'_>,
        n: u32,
    ) -> Result<Attempt, LockError> {
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
                    Ok(Attempt::Held { remaining, .. } | Attempt::Queued { remaining, .. }) => {
                        search.wait(remaining)
                    }
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
    /// key's writers as a reader's does (see [`fences`](super::fences)). When the key
    /// cannot be had, the place is given back
    /// ([`give_back_place`](Self::give_back_place)).
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
        let held = self.acquire_quorum(&unlimited, None).await;
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
        self.acquire_quorum(&attempt, None).await
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
    pub(super) fn place_of(&self, token: Token) -> Option<Arc<LockKey>> {
        lock(&self.places).get(&token).cloned()
    }

    /// Wakes the permit waiters of `key` (they listen on the key's channel, not their
    /// places'), on every node, in the background: a place was freed, or is kept only
    /// until its `hold_at_least` ends (sooner than the waiters were told).
    pub(super) fn announce_place_freed(&self, key: &LockKey) {
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
/// more when they are quick (the store's
/// [`request_timeout`](crate::backend::Store::request_timeout) adds one spare).
pub(super) const PERMIT_ROUNDS: u32 = 1 + TRY_ROUNDS + 1;

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
pub(super) fn exclusive(key: &LockKey, token: Token) -> LeaseRef<'_> {
    LeaseRef::new(key, token, Mode::Exclusive)
}

/// Ours on both halves of a permit (its place and its hold on the key): false when
/// either is denied, else an error when either failed.
pub(super) fn both(
    a: Result<bool, LockError>,
    b: Result<bool, LockError>,
) -> Result<bool, LockError> {
    match (a, b) {
        (Ok(false), _) | (_, Ok(false)) => Ok(false),
        (Err(e), _) | (_, Err(e)) => Err(e),
        (Ok(true), Ok(true)) => Ok(true),
    }
}

/// A permit's renewal from those of its two halves: lost when either is, unknown when
/// either is.
pub(super) fn renewed_both(a: Renewed, b: Renewed) -> Renewed {
    match (a, b) {
        (Renewed::Lost, _) | (_, Renewed::Lost) => Renewed::Lost,
        (Renewed::Unknown, _) | (_, Renewed::Unknown) => Renewed::Unknown,
        (Renewed::Yes, Renewed::Yes) => Renewed::Yes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
