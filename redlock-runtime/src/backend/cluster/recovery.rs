//! How the cluster subscriber gets lost channels back: the auditor finds the losses
//! nobody announced, the resubscriber subscribes every lost channel again, one at a
//! time (see [`ShardSubscriber`](super::subscriber::ShardSubscriber)).

use std::collections::{HashMap, HashSet};
use std::sync::Weak;
use std::time::Duration;

use futures_util::future::join_all;
use redis::cluster_routing::RoutingInfo;
use redis::Value;
use tokio::sync::mpsc;

use super::master_of;
use super::slots::{fetch_slot_map, SlotMap, SLOT_MAP_AGE};
use super::subscriber::SubInner;
use crate::error::chain;
use crate::key::key_slot;
use crate::waiters::Wake;
use crate::LockError;

/// First and longest pause between resubscription rounds while the cluster fails over.
const RESUBSCRIBE_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(50), Duration::from_secs(1));

/// How often the subscriber compares the shard channels it believes confirmed on each
/// node with the count the node reports for its connection (see [`ShardSubscriber`](super::subscriber::ShardSubscriber)).
/// A channel lost without a word is heard again within about this plus a round trip.
pub(super) const AUDIT_EVERY: Duration = Duration::from_millis(250);

/// The `ssub` count of a `CLIENT INFO` reply: the shard channels the connection holds.
fn shard_subscriptions(info: &Value) -> Option<usize> {
    let text: String = redis::from_redis_value_ref(info).ok()?;
    text.split_whitespace()
        .find_map(|field| field.strip_prefix("ssub="))
        .and_then(|n| n.parse().ok())
}

/// Every [`AUDIT_EVERY`], while some channel is confirmed: groups the confirmed
/// channels by master (the slot map, fetched again when older than [`SLOT_MAP_AGE`];
/// without one, by slot; again at once after a loss), audits the groups concurrently,
/// and wakes and resubscribes the channels found lost.
pub(super) async fn auditor(inner: Weak<SubInner>, wake: Wake) {
    let mut map: Option<SlotMap> = None;
    // Ends when the subscriber is dropped or its waiters are gone.
    loop {
        tokio::time::sleep(AUDIT_EVERY).await;
        let Some(sub) = inner.upgrade() else {
            return;
        };
        if wake.is_gone() {
            return;
        }
        let confirmed = sub.channels.confirmed();
        if confirmed.is_empty() {
            continue;
        }
        if map
            .as_ref()
            .is_none_or(|m| m.fetched.elapsed() >= SLOT_MAP_AGE)
        {
            map = fetch_slot_map(&sub.con, "auditing by slot").await;
        }
        let mut groups: HashMap<u32, Vec<String>> = HashMap::new();
        for channel in confirmed {
            let slot = key_slot(&channel);
            let group = match map.as_ref().and_then(|m| m.master(slot)) {
                Some(master) => u32::from(master),
                None => u32::from(u16::MAX) + 1 + u32::from(slot),
            };
            groups.entry(group).or_default().push(channel);
        }
        let lost: Vec<String> = join_all(groups.into_values().map(|g| sub.audit(g)))
            .await
            .into_iter()
            .flatten()
            .collect();
        if !lost.is_empty() {
            // A moved slot also looks like a loss (its channels were counted against
            // the old master): the next audit groups by a fresh map.
            map = None;
        }
        for channel in lost {
            wake.wake(&channel);
            let _ = sub.resubscribe.send(channel);
        }
    }
}

/// Subscribes each channel it is handed again, one at a time (never several slots in
/// one command), until it is back: a round ends at its first failure (the cluster is
/// probably failing over) and the next one waits a backoff growing from
/// [`RESUBSCRIBE_BACKOFF`]'s first pause to its longest.
pub(super) async fn resubscriber(
    mut requests: mpsc::UnboundedReceiver<String>,
    inner: Weak<SubInner>,
    wake: Wake,
) {
    let (min, max) = RESUBSCRIBE_BACKOFF;
    let mut pending: HashSet<String> = HashSet::new();
    let mut backoff = min;
    // Ends when the subscriber is dropped (its sender goes with it); each round either
    // empties `pending` or sleeps a growing backoff first.
    loop {
        if pending.is_empty() {
            match requests.recv().await {
                Some(channel) => {
                    pending.insert(channel);
                }
                None => return,
            }
        }
        while let Ok(channel) = requests.try_recv() {
            pending.insert(channel);
        }
        let Some(sub) = inner.upgrade() else {
            return;
        };
        // One failure ends the round (the cluster is probably failing over): a round
        // costs at most one request timeout, and the rest waits for the next one.
        let mut round: Vec<String> = pending.drain().collect();
        while let Some(channel) = round.pop() {
            match sub.resubscribe(&channel).await {
                Ok(true) => {
                    // A release between the loss and now went unheard: retry at once.
                    wake.wake(&channel);
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!(
                        target: "redlock",
                        key = channel,
                        backend = "cluster",
                        error = %chain(&e),
                        "resubscription failed; will retry"
                    );
                    pending.insert(channel);
                    pending.extend(round.drain(..));
                }
            }
        }
        drop(sub);
        if pending.is_empty() {
            backoff = min;
            continue;
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            more = requests.recv() => match more {
                Some(channel) => {
                    pending.insert(channel);
                }
                None => return,
            },
        }
        backoff = (backoff * 2).min(max);
    }
}

impl SubInner {
    /// Compares `channels` (confirmed, all served by one master as far as the slot map
    /// knows) with the shard channels the connection to that master holds; the channels
    /// marked lost when it holds fewer. An unanswered or unreadable `CLIENT INFO` proves
    /// nothing (a failing node's losses are announced by its `Disconnection`).
    async fn audit(&self, channels: Vec<String>) -> Vec<String> {
        let Some(first) = channels.first() else {
            return Vec::new();
        };
        let mut con = self.con.clone();
        let ask = con.route_command(
            redis::cmd("CLIENT").arg("INFO").to_owned(),
            RoutingInfo::SingleNode(master_of(first)),
        );
        let Ok(Ok(info)) = tokio::time::timeout(self.timeout, ask).await else {
            return Vec::new();
        };
        let Some(held) = shard_subscriptions(&info) else {
            return Vec::new();
        };
        // Counted after the reply: a channel dropped meanwhile may already be gone from
        // the server; one confirmed meanwhile only adds to `held`.
        let still = self.channels.still_confirmed(channels);
        if held >= still.len() {
            return Vec::new();
        }
        tracing::debug!(
            target: "redlock",
            backend = "cluster",
            held,
            believed = still.len(),
            "the subscriber's connection holds fewer shard channels than it believes \
             confirmed; resubscribing them"
        );
        still
            .into_iter()
            .filter(|c| self.channels.lose(c))
            .collect()
    }

    /// Subscribes `channel` again if it is still wanted; `Ok(false)` when it is not.
    async fn resubscribe(&self, channel: &str) -> Result<bool, LockError> {
        let _turn = self.ops.lock(channel).await;
        if !self.channels.wants(channel) {
            return Ok(false);
        }
        self.ssubscribe(channel).await?;
        self.channels.confirm(channel);
        Ok(true)
    }
}
