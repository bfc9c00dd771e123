//! The requests still in flight when a call returns, never dropped: each is driven to
//! completion in a task of its own that finishes what it did. A won acquisition's late
//! grants are kept (or undone when the lock was released before they landed), a lost
//! one's are undone; an extend's stragglers are settled before the lock's next extend;
//! a release a node did not confirm is sent again.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::stream::StreamExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::fences::raise_fence;
use super::{lock, Answer, Grant, InFlight, RedlockBackend, Stake};
use crate::backend::server::release_call;
use crate::backend::single::SingleBackend;
use crate::error::chain;
use crate::key::LockKey;
use crate::token::Token;
use crate::wire::{LeaseRef, Publish};
use crate::LockError;

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

/// The late grants of the won acquisitions of one token (a permit's place and its hold
/// on the key share it).
#[derive(Debug, Default)]
pub(super) struct Landing {
    /// The acquisitions whose requests are still in flight.
    pending: usize,
    /// Whether the lock was released meanwhile (its late grants are undone).
    pub(super) released: bool,
}

/// Each node's answer to a release, once it came: whether it found the token there
/// (deleted it, or kept it for `hold_at_least`).
pub(super) type ReleaseAnswers = Arc<watch::Sender<Vec<Option<bool>>>>;

/// The expiry-setting requests of one lock still in flight after their call returned.
pub(super) struct Settling {
    id: u64,
    /// Cuts the unanswered ones (see [`RedlockBackend::send_to`]) when the next extend
    /// may (extend stragglers); `None` for the late grants of an acquisition.
    cut: Option<CancellationToken>,
    /// Cancelled once every one of them was answered or cut (never written after that).
    done: CancellationToken,
}

/// What becomes of the requests of a quorum vote still in flight when it is decided.
pub(super) enum Stragglers {
    /// A release: each is retried in the background until confirmed, as is every node
    /// whose request failed before the vote was decided.
    Retry(Stake),
    /// An extend of this lock: driven until the per-node deadline, then cut, so that the
    /// next extend of the lock can wait for them (see [`RedlockBackend::settle`]).
    Settle(Token),
}

/// What the next extend of a lock does with its expiry-setting requests still in flight
/// (see [`RedlockBackend::settled`]).
#[derive(Debug, Clone, Copy)]
pub(super) enum NextExtend {
    /// Cuts them at once: an extend's stragglers (one already written is applied before
    /// the next extend, one not written yet never will be).
    Cuts,
    /// Waits for them, until their deadline: the late grants of an acquisition (cut
    /// unwritten, a grant would leave its node without the key for good).
    Waits,
}

/// Whether a node answered that someone else holds a key (it took nothing then).
fn refused<T: Grant>(answer: &Result<T, LockError>) -> bool {
    matches!(answer, Ok(a) if a.fences().is_err())
}

/// What happens to the requests still in flight when a call returns.
impl RedlockBackend {
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
    pub(super) async fn settled(&self, token: Token, key: &LockKey) {
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
    /// and answer a timeout. The next extend of each key waits for that, or cuts them at
    /// once, as `next_extend` says (see [`settled`](Self::settled)).
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
    pub(super) fn settle<T, G>(
        &self,
        token: Token,
        keys: impl IntoIterator<Item = String>,
        (deadline, cut): (tokio::time::Instant, CancellationToken),
        next_extend: NextExtend,
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
                cut: matches!(next_extend, NextExtend::Cuts).then(|| cut.clone()),
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

    /// The rest of a won attempt, in a task of its own: a grant landing late is kept as
    /// part of the lock (the lease's renewals and release go to every node, so they
    /// cover it, and a lock on more than a bare quorum survives more node failures),
    /// unless the lock was released before it landed. A request sent before the release
    /// is applied before it on that node's connection, but not every request is sent at
    /// once (an `EVAL` after a restarted node's `NOSCRIPT`, a send after a reconnect):
    /// the release marks the token (under the lock of `landing`, before sending), and a
    /// grant or unanswered request seen after that is undone. A kept grant whose counter
    /// is behind the token is raised to it, so that it vouches for the token too (see
    /// [`fences`](super::fences)).
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
    pub(super) fn keep_late_grants<T: Grant>(
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
            (deadline, cut),
            NextExtend::Waits,
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
    pub(super) fn undo_in_background<T: Grant>(
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

    /// Removes a writer's intent, or a fair waiter's place, from every node once it
    /// won, in the background: the nodes that refused this attempt registered it, and
    /// would keep new readers out (a majority of such nodes, left by successive writers,
    /// would keep them out for good), or keep the fair waiters behind it waiting, until
    /// it ran out by itself.
    pub(super) fn withdraw_intent(&self, key: &LockKey, waiter: u64) {
        let mut zrem = redis::pipe();
        for set in [key.intents(), key.queue(), key.heartbeats()] {
            zrem.cmd("ZREM").arg(set).arg(waiter).ignore();
        }
        let (nodes, full) = (self.nodes.clone(), key.full().to_owned());
        tokio::spawn(async move {
            join_all(nodes.iter().map(|node| {
                let zrem = &zrem;
                let mut con = node.connection();
                let key = &full;
                async move {
                    if let Err(e) = zrem.query_async::<()>(&mut con).await {
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
}

/// Compare-token delete on one node, waking by `publish`, as
/// one self-contained `EVAL`: never answered `NOSCRIPT` by a restarted node, so the
/// request is applied whenever it is delivered. True when our token was deleted.
pub(super) async fn release_on(
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

/// Undoes an attempt on node `i`: compare-token delete, without waking anyone (the
/// waiters there would include this attempt's own caller, which retries by its own
/// timer), retried for a few seconds while unconfirmed; after that the ttl frees it.
pub(super) async fn undo(nodes: Arc<[SingleBackend]>, key: Arc<LockKey>, stake: Stake, i: usize) {
    if let Some(node) = nodes.get(i) {
        release_until_confirmed(node, &key, stake, Publish::Nobody, &UNDO_PAUSES).await;
    }
}

/// A release whose first request to `node` failed, sent again in the background from the
/// retries' second pause on, until the node answers.
pub(super) async fn release_again(node: &SingleBackend, key: &LockKey, stake: Stake) {
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
