//! Batched renewals (the watchdog's): the `renew.lua` and `renew_shared.lua` calls of a
//! batch, the part of a batch that waits for replicas, and the outcomes read back in
//! batch order.

use std::future::Future;

use super::{ttl_ms, ScriptCall};
use crate::scripts::{RENEW, RENEW_SHARED};
use crate::wire::Renewed;
use crate::wire::{Renewal, ReplicaWait};
use crate::LockError;

/// The one `WAIT` that covers every renewal of `batch` waiting for replicas (the most
/// replicas and the longest timeout any asks for), `None` when none does.
pub(crate) fn batch_wait(batch: &[Renewal<'_>]) -> Option<ReplicaWait> {
    batch
        .iter()
        .filter_map(|r| r.replicas)
        .reduce(|a, b| ReplicaWait {
            replicas: a.replicas.max(b.replicas),
            timeout: a.timeout.max(b.timeout),
        })
}

/// Renews a batch in two parts at once, each with `renew_part`: the renewals that wait
/// for no replicas (`None`), and those that do, with the one `WAIT` that covers them
/// ([`batch_wait`]). Outcomes in batch order; `Err` only when both parts failed (a part
/// that failed leaves its renewals unknown).
pub(crate) async fn renew_in_parts<'a, F, Fut>(
    batch: &[Renewal<'a>],
    renew_part: F,
) -> Result<Vec<Renewed>, LockError>
where
    F: Fn(Vec<Renewal<'a>>, Option<ReplicaWait>) -> Fut,
    Fut: Future<Output = Result<Vec<Renewed>, LockError>>,
{
    let Some(rw) = batch_wait(batch) else {
        return renew_part(batch.to_vec(), None).await;
    };
    let (waiting, plain): (Vec<usize>, Vec<usize>) =
        (0..batch.len()).partition(|&i| batch[i].replicas.is_some());
    let part = |indices: &[usize]| indices.iter().map(|&i| batch[i]).collect::<Vec<_>>();
    let (plain_outcomes, waiting_outcomes) = futures_util::future::join(
        renew_part(part(&plain), None),
        renew_part(part(&waiting), Some(rw)),
    )
    .await;
    let (plain_outcomes, waiting_outcomes) = match (plain_outcomes, waiting_outcomes) {
        (Err(e), Err(_)) => return Err(e),
        parts => parts,
    };
    let mut outcomes = vec![Renewed::Unknown; batch.len()];
    for (indices, part) in [(plain, plain_outcomes), (waiting, waiting_outcomes)] {
        for (i, outcome) in indices.into_iter().zip(part.unwrap_or_default()) {
            outcomes[i] = outcome;
        }
    }
    Ok(outcomes)
}

/// A renewal confirmed by the server counts only once its lease's replicas
/// acknowledged it (`acked`, from the `WAIT` after it): otherwise it is unknown (retried
/// soon; the lease's deadline stays where a replicated expiry backs it).
/// `acked` is `None` when no `WAIT` was sent (then nothing is waited for).
pub(crate) fn replicated_outcome(r: &Renewal<'_>, outcome: Renewed, acked: Option<u32>) -> Renewed {
    match (outcome, r.replicas, acked) {
        (Renewed::Yes, Some(rw), Some(acked)) if acked < rw.replicas => Renewed::Unknown,
        (Renewed::Yes, Some(_), None) => Renewed::Unknown,
        (outcome, _, _) => outcome,
    }
}

/// One renewal call over `renewals`, all of one kind (exclusive, or shared): see
/// [`renew_groups`].
pub(crate) fn renew_call(renewals: &[Renewal<'_>]) -> ScriptCall {
    let shared = renewals.first().is_some_and(|r| r.mode.is_shared());
    if !shared {
        return ScriptCall {
            script: &RENEW,
            keys: renewals.iter().map(|r| r.key.full().to_owned()).collect(),
            args: renew_args(renewals),
        };
    }
    let mut keys = Vec::with_capacity(renewals.len() * 2);
    let mut args = Vec::with_capacity(renewals.len() * 3);
    for r in renewals {
        keys.push(r.key.full().to_owned());
        keys.push(r.key.holders());
        args.push(r.token.as_bytes().to_vec());
        args.push(ttl_ms(r.ttl).to_string().into_bytes());
        args.push(r.mode.marker().as_bytes().to_vec());
    }
    ScriptCall {
        script: &RENEW_SHARED,
        keys,
        args,
    }
}

/// The batch indices of a renewal batch split by kind, exclusive first, then shared,
/// each in chunks of at most `chunk` locks: one renewal call per group.
pub(crate) fn renew_groups(batch: &[Renewal<'_>], chunk: usize) -> Vec<Vec<usize>> {
    let (shared, exclusive): (Vec<usize>, Vec<usize>) =
        (0..batch.len()).partition(|&i| batch[i].mode.is_shared());
    let chunk = chunk.max(1);
    exclusive
        .chunks(chunk)
        .chain(shared.chunks(chunk))
        .map(<[usize]>::to_vec)
        .collect()
}

/// One renewal call per group of [`renew_groups`].
pub(crate) fn renew_calls(batch: &[Renewal<'_>], groups: &[Vec<usize>]) -> Vec<ScriptCall> {
    groups
        .iter()
        .map(|group| {
            let renewals: Vec<Renewal<'_>> = group
                .iter()
                .filter_map(|&i| batch.get(i).copied())
                .collect();
            renew_call(&renewals)
        })
        .collect()
}

/// Outcomes listed group after group (see [`renew_groups`]) put back in batch order; a
/// lock without an outcome is unknown.
pub(crate) fn in_batch_order(
    len: usize,
    groups: &[Vec<usize>],
    outcomes: Vec<Renewed>,
) -> Vec<Renewed> {
    let mut ordered = vec![Renewed::Unknown; len];
    for (&i, outcome) in groups.iter().flatten().zip(outcomes) {
        if let Some(slot) = ordered.get_mut(i) {
            *slot = outcome;
        }
    }
    ordered
}

/// The arguments of a `renew.lua` call: token and ttl of each lock.
pub(crate) fn renew_args<'r, 'k: 'r>(
    renewals: impl IntoIterator<Item = &'r Renewal<'k>>,
) -> Vec<Vec<u8>> {
    let renewals = renewals.into_iter();
    let mut args = Vec::with_capacity(renewals.size_hint().1.unwrap_or(0) * 2);
    for r in renewals {
        args.push(r.token.as_bytes().to_vec());
        args.push(ttl_ms(r.ttl).to_string().into_bytes());
    }
    args
}

/// The outcomes of one `renew.lua` call over `len` locks, from its reply (`None`: the
/// call failed). A reply without exactly one integer per lock cannot be matched to the
/// locks, so all of them are unknown (retried soon), never credited to a neighbour.
pub(crate) fn chunk_outcomes(
    len: usize,
    reply: Option<Vec<i64>>,
    backend: &'static str,
) -> Vec<Renewed> {
    match reply {
        Some(flags) if flags.len() == len => flags
            .into_iter()
            .map(|flag| Renewed::from(flag == 1))
            .collect(),
        Some(flags) => {
            tracing::warn!(
                target: "redlock",
                backend,
                locks = len,
                answers = flags.len(),
                "renewal reply does not match its locks; retrying them"
            );
            vec![Renewed::Unknown; len]
        }
        None => vec![Renewed::Unknown; len],
    }
}
