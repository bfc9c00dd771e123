//! The watchdog's renewals on a cluster: grouped by slot (scripts cannot span slots)
//! and by the master serving it, one pipeline per master, all at once.

use std::collections::HashMap;
use std::sync::{Arc, MutexGuard, PoisonError};

use futures_util::future::join_all;
use futures_util::stream::{self, StreamExt};

use super::super::server::{
    chunk_outcomes, decode, renew_call, replicated_outcome, unexpected, ScriptCall,
};
use super::slots::{fetch_slot_map, SlotMap, SLOT_MAP_AGE};
use super::{slot_master, ClusterBackend};
use crate::error::chain;
use crate::key::key_slot;
use crate::wire::Renewed;
use crate::wire::{Renewal, ReplicaWait};
use crate::LockError;

/// Renewals per script call (one slot's locks per call).
const RENEW_CHUNK: usize = 1000;
/// Slot groups renewed concurrently.
const RENEW_CONCURRENCY: usize = 64;

/// The locks (batch indices) of one `renew.lua` call, and its reply.
/// With the replicas that acknowledged them, when the call ended in a `WAIT`.
type SlotRenewal = (Vec<usize>, Result<Vec<i64>, LockError>, Option<u32>);
/// One `renew.lua` call to make: its slot and its locks (batch indices).
type SlotCall = (u16, Vec<usize>);

/// The arguments of the `renew.lua` call for the locks of `batch` at `indices`.
fn slot_renew_call(batch: &[Renewal<'_>], indices: &[usize]) -> ScriptCall {
    let renewals: Vec<Renewal<'_>> = indices
        .iter()
        .filter_map(|&i| batch.get(i).copied())
        .collect();
    renew_call(&renewals)
}

impl ClusterBackend {
    /// One master's renewal calls as one pipeline (led by a `SCRIPT LOAD`, so a flushed
    /// script cache cannot fail it), routed by the first call's slot. `Err` gives the
    /// calls back when the pipeline failed as a whole.
    async fn renew_on_master(
        &self,
        batch: &[Renewal<'_>],
        calls: Vec<SlotCall>,
        rw: Option<ReplicaWait>,
    ) -> Result<Vec<SlotRenewal>, Vec<SlotCall>> {
        let Some(route) = calls.first().map(|&(slot, _)| slot_master(slot)) else {
            return Ok(Vec::new());
        };
        let scripts: Vec<ScriptCall> = calls
            .iter()
            .map(|(_, indices)| slot_renew_call(batch, indices))
            .collect();
        match self.pipeline(&scripts, rw, route, "renew").await {
            Ok((replies, acked)) => Ok(calls
                .into_iter()
                .zip(replies)
                .map(|((_, indices), reply)| (indices, decode(reply, "renew"), acked))
                .collect()),
            Err(e) => {
                tracing::debug!(
                    target: "redlock",
                    backend = "cluster",
                    error = %chain(&e),
                    calls = calls.len(),
                    "renewal pipeline failed; renewing slot by slot"
                );
                Err(calls)
            }
        }
    }

    /// Renews a batch (or, with `rw`, a batch of leases waiting for replicas, each
    /// pipeline ending in a `WAIT` for `rw`) with one pipeline per master: the batch's
    /// locks grouped by slot (scripts cannot span slots) into `renew.lua` calls of up to
    /// [`RENEW_CHUNK`] locks, the calls grouped by the master serving their slot (from
    /// `CLUSTER SLOTS`, fetched at most every [`SLOT_MAP_AGE`]; see [`plan_calls`]) and
    /// each master's calls sent as one pipeline, routed by its first slot, all masters
    /// at once: one round trip per master ([`renew_by_master`](Self::renew_by_master)).
    ///
    /// The slot map only groups: a call whose master is unknown, or whose pipeline
    /// failed (a slot moved since the map was fetched: the whole pipeline is redirected
    /// and fails), is sent on its own, routed by its key ([`RENEW_CONCURRENCY`] at a
    /// time: [`renew_alone`](Self::renew_alone)), and the map is fetched again next time. Renewals are idempotent per token,
    /// so a call applied twice is harmless. A call that failed leaves its locks
    /// [`Renewed::Unknown`]; the batch fails as a whole only when every call failed.
    pub(super) async fn renew_part(
        &self,
        batch: &[Renewal<'_>],
        rw: Option<ReplicaWait>,
    ) -> Result<Vec<Renewed>, LockError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let map = self.slot_map().await;
        let Plan {
            by_master,
            mut alone,
            total,
        } = plan_calls(batch, map.as_deref());
        let mut results: Vec<SlotRenewal> = Vec::with_capacity(total);
        let (done, failed) = self.renew_by_master(batch, by_master, rw).await;
        results.extend(done);
        alone.extend(failed);
        results.extend(self.renew_alone(batch, alone, rw).await);
        slot_outcomes(batch, results, total)
    }

    /// Each master's calls as one pipeline ([`renew_on_master`](Self::renew_on_master)),
    /// all masters at once: the replies, and the calls of the pipelines that failed as a
    /// whole (the slot map is forgotten: a slot moved since it was fetched).
    async fn renew_by_master(
        &self,
        batch: &[Renewal<'_>],
        by_master: HashMap<u16, Vec<SlotCall>>,
        rw: Option<ReplicaWait>,
    ) -> (Vec<SlotRenewal>, Vec<SlotCall>) {
        let pipelines = by_master
            .into_values()
            .map(|calls| self.renew_on_master(batch, calls, rw));
        let mut done = Vec::new();
        let mut failed = Vec::new();
        for outcome in join_all(pipelines).await {
            match outcome {
                Ok(replies) => done.extend(replies),
                Err(calls) => {
                    self.forget_slot_map();
                    failed.extend(calls);
                }
            }
        }
        (done, failed)
    }

    /// Each call on its own ([`renew_slot`](Self::renew_slot)), [`RENEW_CONCURRENCY`]
    /// at a time.
    async fn renew_alone(
        &self,
        batch: &[Renewal<'_>],
        alone: Vec<SlotCall>,
        rw: Option<ReplicaWait>,
    ) -> Vec<SlotRenewal> {
        stream::iter(alone)
            .map(|call| self.renew_slot(batch, call, rw))
            .buffer_unordered(RENEW_CONCURRENCY)
            .collect()
            .await
    }

    /// One call on its own, routed by its key; with `rw`, in a pipeline ending in a
    /// `WAIT`, routed to its slot's master.
    async fn renew_slot(
        &self,
        batch: &[Renewal<'_>],
        (slot, indices): SlotCall,
        rw: Option<ReplicaWait>,
    ) -> SlotRenewal {
        let call = slot_renew_call(batch, &indices);
        let (reply, acked) = match rw {
            None => (
                call.invoke(&self.con)
                    .await
                    .map_err(LockError::backend("renew")),
                None,
            ),
            Some(rw) => {
                let route = slot_master(slot);
                match self
                    .pipeline(std::slice::from_ref(&call), Some(rw), route, "renew")
                    .await
                {
                    Ok((replies, acked)) => {
                        let reply = replies
                            .into_iter()
                            .next()
                            .ok_or_else(|| unexpected("renew", 0));
                        (reply.and_then(|r| decode(r, "renew")), acked)
                    }
                    Err(e) => (Err(e), None),
                }
            }
        };
        (indices, reply, acked)
    }

    /// The slot map, fetched again when older than [`SLOT_MAP_AGE`] or forgotten;
    /// `None` when it cannot be had (renewals then go slot by slot).
    async fn slot_map(&self) -> Option<Arc<SlotMap>> {
        let cached = self.cached_slot_map().clone();
        if let Some(map) = cached.filter(|m| m.fetched.elapsed() < SLOT_MAP_AGE) {
            return Some(map);
        }
        let map = Arc::new(fetch_slot_map(&self.con, "renewing slot by slot").await?);
        *self.cached_slot_map() = Some(map.clone());
        Some(map)
    }

    fn cached_slot_map(&self) -> MutexGuard<'_, Option<Arc<SlotMap>>> {
        self.slot_map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn forget_slot_map(&self) {
        *self.cached_slot_map() = None;
    }
}

/// A renewal batch's calls: by the master serving their slot, and on their own (master
/// unknown); `total` calls in all.
struct Plan {
    by_master: HashMap<u16, Vec<SlotCall>>,
    alone: Vec<SlotCall>,
    total: usize,
}

/// The calls of `batch`: one per slot and kind (exclusive and shared locks of a slot go
/// in separate calls, one script per kind) and [`RENEW_CHUNK`] locks, grouped by master
/// as far as `map` knows.
fn plan_calls(batch: &[Renewal<'_>], map: Option<&SlotMap>) -> Plan {
    let mut groups: HashMap<(u16, bool), Vec<usize>> = HashMap::new();
    for (i, r) in batch.iter().enumerate() {
        let group = (key_slot(r.key.full()), r.mode.is_shared());
        groups.entry(group).or_default().push(i);
    }
    let mut by_master: HashMap<u16, Vec<SlotCall>> = HashMap::new();
    let mut alone: Vec<SlotCall> = Vec::new();
    for ((slot, _), indices) in groups {
        let master = map.and_then(|m| m.master(slot));
        for chunk in indices.chunks(RENEW_CHUNK) {
            let call = (slot, chunk.to_vec());
            match master {
                Some(m) => by_master.entry(m).or_default().push(call),
                None => alone.push(call),
            }
        }
    }
    let total = by_master.values().map(Vec::len).sum::<usize>() + alone.len();
    Plan {
        by_master,
        alone,
        total,
    }
}

/// The batch's outcomes, in batch order, from the replies of its `total` calls: a
/// call that failed leaves its locks unknown; `Err` only when every call failed.
fn slot_outcomes(
    batch: &[Renewal<'_>],
    results: Vec<SlotRenewal>,
    total: usize,
) -> Result<Vec<Renewed>, LockError> {
    let mut out = vec![Renewed::Unknown; batch.len()];
    let mut failed = 0;
    let mut last_error = None;
    for (indices, reply, acked) in results {
        match reply {
            Ok(flags) => {
                for (&i, outcome) in
                    indices
                        .iter()
                        .zip(chunk_outcomes(indices.len(), Some(flags), "cluster"))
                {
                    if let (Some(slot), Some(r)) = (out.get_mut(i), batch.get(i)) {
                        *slot = replicated_outcome(r, outcome, acked);
                    }
                }
            }
            Err(e) => {
                failed += 1;
                last_error = Some(e);
            }
        }
    }
    match last_error {
        Some(e) if failed == total => Err(e),
        Some(e) => {
            tracing::warn!(
                target: "redlock",
                backend = "cluster",
                failed,
                of = total,
                error = %chain(&e),
                "some slots' renewals failed; retrying them"
            );
            Ok(out)
        }
        None => Ok(out),
    }
}
