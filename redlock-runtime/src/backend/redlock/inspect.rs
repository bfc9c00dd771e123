//! What `inspect`, `list` and `force_unlock` find on the nodes: a holder is one that
//! holds the key on a quorum of them, a permit is told by its places.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};

use super::RedlockBackend;
use crate::backend::server::scan_glob;
use crate::backend::server::INSPECT_BATCH;
use crate::backend::Store;
use crate::info::{soonest_to_expire_first, LockInfo, SharedHolder};
use crate::key::LockKey;
use crate::kind::LockKind;
use crate::LockError;

/// The nodes whose `SCAN` a search for permit places waits for.
#[derive(Debug, Clone, Copy)]
pub(super) enum Reach {
    /// The first quorum to finish: enough to find every place held on a quorum.
    Quorum,
    /// Every node that answers (`list`, as for its lock keys; `force_unlock`, which also
    /// deletes the places a minority still has).
    Every,
}

/// What `inspect`, `list` and `force_unlock` find on the nodes.
impl RedlockBackend {
    /// The holder that holds the key on a quorum of nodes (by its digest), if any, as
    /// the node with its latest grant (the highest fence, at least the token issued:
    /// that is the highest of a quorum) describes it; each node records its own
    /// acquire time. The ttl is the one a quorum still has (the quorum-th longest);
    /// readers are those a quorum of nodes lists (a reader holds a quorum of the
    /// nodes, not necessarily the same as another's), and none is not held.
    pub(super) async fn inspect_key(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let answers = self
            .on_all("inspect", self.node_timeout, |n| n.inspect(key))
            .await;
        self.require_quorum(key, &answers)?;
        let found: Vec<LockInfo> = answers
            .into_iter()
            .filter_map(|a| a.ok().flatten())
            .collect();
        let of = |holder: &str| -> Vec<&LockInfo> {
            found.iter().filter(|i| i.holder == holder).collect()
        };
        let Some(group) = found
            .iter()
            .map(|i| of(&i.holder))
            .find(|group| group.len() >= self.quorum)
        else {
            return Ok(None);
        };
        let Some(latest) = group.iter().max_by_key(|i| i.fencing_token) else {
            return Ok(None);
        };
        let mut ttls: Vec<Duration> = group
            .iter()
            .map(|i| i.ttl.unwrap_or(Duration::MAX))
            .collect();
        ttls.sort_unstable_by(|a, b| b.cmp(a));
        let mut info = (*latest).clone();
        info.ttl = ttls
            .get(self.quorum - 1)
            .copied()
            .filter(|&t| t != Duration::MAX);
        info.shared = self.shared_on_quorum(&group);
        if info.kind == LockKind::Read {
            // A node a release has not reached yet still lists the reader that left.
            if info.shared.is_empty() {
                return Ok(None);
            }
            info.holders = u32::try_from(info.shared.len()).unwrap_or(u32::MAX);
            let kept = info.shared.iter().filter(|h| h.kept).count();
            info.kept = u32::try_from(kept).unwrap_or(u32::MAX);
        } else {
            info.kept = group.iter().map(|i| i.kept).max().unwrap_or(0);
        }
        Ok(Some(info))
    }

    /// The readers that hold a quorum of `group`'s nodes (each node lists its own), with
    /// the ttl a quorum still has, the soonest to expire first.
    fn shared_on_quorum(&self, group: &[&LockInfo]) -> Vec<SharedHolder> {
        let mut seen: BTreeMap<&str, Vec<&SharedHolder>> = BTreeMap::new();
        for holder in group.iter().flat_map(|i| &i.shared) {
            seen.entry(holder.name.as_str()).or_default().push(holder);
        }
        let mut shared: Vec<SharedHolder> = seen
            .into_values()
            .filter(|on| on.len() >= self.quorum)
            .map(|mut on| {
                on.sort_by(|a, b| {
                    b.ttl
                        .unwrap_or(Duration::MAX)
                        .cmp(&a.ttl.unwrap_or(Duration::MAX))
                });
                let at_quorum = on[self.quorum - 1];
                SharedHolder {
                    kept: on.iter().filter(|h| h.kept).count() >= self.quorum,
                    ..at_quorum.clone()
                }
            })
            .collect();
        soonest_to_expire_first(&mut shared);
        shared
    }

    /// The permit places whose name matches `glob` on the nodes `reach` says (a node
    /// that fails is left out while a quorum answered), by the key they belong to, for
    /// the keys `wanted` (under `prefix`).
    pub(super) async fn permits(
        &self,
        prefix: &str,
        glob: &str,
        wanted: impl Fn(&LockKey) -> bool,
        reach: Reach,
    ) -> Result<BTreeMap<String, (LockKey, Vec<LockKey>)>, LockError> {
        let enough = match reach {
            Reach::Quorum => self.quorum,
            Reach::Every => self.nodes.len(),
        };
        let mut scans: FuturesUnordered<_> = self
            .nodes
            .iter()
            .map(|n| n.scan_places(prefix, glob))
            .collect();
        let (mut answered, mut error) = (Vec::new(), None);
        while answered.len() < enough {
            match scans.next().await {
                Some(Ok(places)) => answered.push(places),
                Some(Err(e)) => error = error.or(Some(e)),
                None => break,
            }
        }
        // The scans still running are read-only: dropping them leaves nothing behind.
        drop(scans);
        if answered.len() < self.quorum {
            let any = LockKey::prefixed(prefix, "*")?;
            return Err(self.unavailable(&any, answered.len(), error.as_ref()));
        }
        let mut found: BTreeMap<String, (LockKey, BTreeMap<String, LockKey>)> = BTreeMap::new();
        for (owner, place) in answered.into_iter().flatten() {
            if wanted(&owner) {
                found
                    .entry(owner.full().to_owned())
                    .or_insert_with(|| (owner, BTreeMap::new()))
                    .1
                    .insert(place.full().to_owned(), place);
            }
        }
        Ok(found
            .into_iter()
            .map(|(k, (owner, places))| (k, (owner, places.into_values().collect())))
            .collect())
    }

    /// The permit of `key`, found by its places, as [`permit_info`](Self::permit_info)
    /// describes it; `None` when no place is held. The places are scanned for on the
    /// first quorum of nodes to finish (a place held on a quorum is on one of them: two
    /// quorums share a node), so a slow or frozen minority costs nothing.
    pub(super) async fn permit_of(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let glob = scan_glob(&key.places_prefix(), "*");
        let permits = self
            .permits(key.prefix(), &glob, |owner| owner == key, Reach::Quorum)
            .await?;
        match permits.into_values().next() {
            Some((owner, places)) => self.permit_info(&owner, &places).await,
            None => Ok(None),
        }
    }

    /// A permit of `key` as its `places` show it: a holder per place held on a quorum
    /// (kept ones counted), the latest grant's fencing token and owner, the longest ttl;
    /// `None` when no place is held.
    pub(super) async fn permit_info(
        &self,
        key: &LockKey,
        places: &[LockKey],
    ) -> Result<Option<LockInfo>, LockError> {
        let mut held = Vec::new();
        let mut shared = Vec::new();
        for batch in places.chunks(INSPECT_BATCH) {
            let infos =
                futures_util::future::try_join_all(batch.iter().map(|p| self.inspect_key(p)))
                    .await?;
            for (place, info) in batch.iter().zip(infos) {
                if let Some(info) = info {
                    shared.push(SharedHolder {
                        name: place_name(key, place),
                        ttl: info.ttl,
                        kept: info.kept > 0,
                        fencing_token: info.fencing_token,
                    });
                    held.push(info);
                }
            }
        }
        soonest_to_expire_first(&mut shared);
        let Some(latest) = held.iter().max_by_key(|i| i.fencing_token) else {
            return Ok(None);
        };
        let ttl = if held.iter().any(|i| i.ttl.is_none()) {
            None
        } else {
            held.iter().filter_map(|i| i.ttl).max()
        };
        Ok(Some(LockInfo {
            key: key.full().to_owned(),
            kind: LockKind::Permit,
            holders: u32::try_from(held.len()).unwrap_or(u32::MAX),
            kept: held.iter().map(|i| i.kept).sum(),
            ttl,
            shared,
            ..latest.clone()
        }))
    }
}

/// How a permit holder on Redlock is named: by its place of `key` (`place 3`).
fn place_name(key: &LockKey, place: &LockKey) -> String {
    let index = place
        .full()
        .strip_prefix(key.places_prefix().as_str())
        .unwrap_or(place.full());
    format!("place {index}")
}
