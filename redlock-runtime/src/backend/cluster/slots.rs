//! Which master serves each slot: the slot map, fetched with `CLUSTER SLOTS`, that groups
//! the watchdog's renewals and the subscriber's audits by master.

use std::time::{Duration, Instant};

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::Value;

use crate::error::chain;
use crate::key::SLOTS;

/// How long a fetched slot map groups renewals before it is fetched again.
pub(super) const SLOT_MAP_AGE: Duration = Duration::from_secs(10);

/// Which master serves each slot, as `CLUSTER SLOTS` said when it was fetched. Used
/// only to group renewals by master: a stale map costs a retry, never a wrong outcome.
pub(super) struct SlotMap {
    /// When `CLUSTER SLOTS` answered.
    pub(super) fetched: Instant,
    /// The index of each slot's master (in order of first appearance), or `u16::MAX`.
    masters: Vec<u16>,
}

impl SlotMap {
    /// From a `CLUSTER SLOTS` reply: `[[start, end, [host, port, ..], replicas..], ..]`.
    /// `None` when it has another shape.
    fn parse(reply: Value) -> Option<Self> {
        let Value::Array(ranges) = reply else {
            return None;
        };
        let mut masters = vec![u16::MAX; SLOTS];
        let mut known: Vec<(String, i64)> = Vec::new();
        for range in ranges {
            let Value::Array(fields) = range else {
                return None;
            };
            let mut fields = fields.into_iter();
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(node))) =
                (fields.next(), fields.next(), fields.next())
            else {
                return None;
            };
            let mut node = node.into_iter();
            let host: String = redis::from_redis_value(node.next()?).ok()?;
            let port: i64 = redis::from_redis_value(node.next()?).ok()?;
            let address = (host, port);
            let index = match known.iter().position(|a| *a == address) {
                Some(i) => i,
                None => {
                    known.push(address);
                    known.len() - 1
                }
            };
            let index = u16::try_from(index).ok().filter(|&i| i != u16::MAX)?;
            let start = usize::try_from(start).ok()?;
            let end = usize::try_from(end).ok()?;
            for master in masters.get_mut(start..=end)? {
                *master = index;
            }
        }
        Some(Self {
            fetched: Instant::now(),
            masters,
        })
    }

    /// The master serving `slot`, if known.
    pub(super) fn master(&self, slot: u16) -> Option<u16> {
        self.masters
            .get(usize::from(slot))
            .copied()
            .filter(|&m| m != u16::MAX)
    }
}

/// The slot map, from `CLUSTER SLOTS` on a random primary; `None` (logged, with what
/// the caller does `instead`) when it cannot be had.
pub(super) async fn fetch_slot_map(con: &ClusterConnection, instead: &str) -> Option<SlotMap> {
    let reply = con
        .clone()
        .route_command(
            redis::cmd("CLUSTER").arg("SLOTS").to_owned(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary),
        )
        .await;
    match reply.map(SlotMap::parse) {
        Ok(Some(map)) => Some(map),
        Ok(None) => {
            tracing::debug!(
                target: "redlock",
                backend = "cluster",
                "unexpected CLUSTER SLOTS reply; {instead}"
            );
            None
        }
        Err(e) => {
            tracing::debug!(
                target: "redlock",
                backend = "cluster",
                error = %chain(&e),
                "CLUSTER SLOTS failed; {instead}"
            );
            None
        }
    }
}
