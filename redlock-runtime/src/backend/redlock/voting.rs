//! How the nodes' answers decide a call: a compare-token request (release, extend) by a
//! quorum vote ([`decide`](RedlockBackend::decide)), an acquisition by a quorum of grants
//! within the validity ([`contend`](RedlockBackend::contend)), and, when it is lost,
//! when to retry.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio_util::sync::CancellationToken;

use super::stragglers::{release_again, NextExtend, Stragglers};
use super::{finish, gather, Answer, Grant, RedlockBackend, Stake, MAX_JITTER};
use crate::backend::jitter;
use crate::backend::single::SingleBackend;
use crate::error::chain;
use crate::key::LockKey;
use crate::lease::drift;
use crate::LockError;

/// How a contended acquisition of one or more keys came out (see
/// [`RedlockBackend::contend`]).
pub(super) enum Contest {
    /// Ours, with the fencing token of each key.
    Won(Vec<u64>),
    /// Lost; retry after this long.
    Lost(Duration),
}

/// How a quorum vote came out.
pub(super) enum Vote {
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

/// Deciding a call by the nodes' answers.
impl RedlockBackend {
    /// Counts confirmations and denials.
    pub(super) fn vote(&self, answers: impl IntoIterator<Item = Option<bool>>) -> Vote {
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
    pub(super) fn unavailable(
        &self,
        key: &LockKey,
        reached: usize,
        error: Option<&LockError>,
    ) -> LockError {
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
    pub(super) fn require_quorum<T>(
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
    pub(super) async fn decide<F, Fut>(
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
                self.settle(
                    token,
                    key,
                    (deadline, cut),
                    NextExtend::Cuts,
                    in_flight,
                    |_| {},
                );
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

    /// One acquisition of `keys` (one key, or the keys of a `lock_all`, all with the
    /// stake's token) on every node, `request(nodes, i)` asking node `i` for all of them
    /// at once. Won iff a quorum granted within the validity and, for each key, a quorum
    /// vouches for its fencing token (the highest counter among the deciding grants: see
    /// [`fences`](super::fences)); late grants are kept
    /// ([`keep_late_grants`](Self::keep_late_grants)).
    /// Lost: everything the attempt may have taken on any node is undone in the
    /// background ([`undo_in_background`](Self::undo_in_background)), and the answer is
    /// when to retry, or `QuorumUnavailable` when fewer than a quorum answered.
    pub(super) async fn contend<T, F, Fut>(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Attempt;

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
}
