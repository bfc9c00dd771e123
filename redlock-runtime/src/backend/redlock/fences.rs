//! Fencing tokens on Redlock: the token of an acquisition is the highest counter among
//! the grants that decided it, vouched for by a quorum of nodes, raising the lagging ones
//! when they disagree.
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

use std::sync::Arc;
use std::time::Duration;

use super::{finish, gather, RedlockBackend, Stake};
use crate::backend::single::SingleBackend;
use crate::key::LockKey;
use crate::scripts::FENCE_FLOOR;
use crate::LockError;

/// Fencing tokens vouched for by a quorum.
impl RedlockBackend {
    /// The fencing token of a won quorum (the highest counter among `granted`), once a
    /// quorum vouches for it; `None` when it cannot (the attempt must be undone). Only
    /// nodes that granted are asked, and only until a quorum vouches.
    pub(super) async fn settle_fence(
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
}

/// `fence_floor.lua` on one node: true when its counter is now at least `fence` (and the
/// lock still ours there).
pub(super) async fn raise_fence(
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
