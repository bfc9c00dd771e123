//! Redis Cluster: every key a lock touches lives in the lock's hash slot.
//!
//! The lock key, its slot's fencing counter ([`LockKey::fence`], named with a hash tag
//! of that slot) and its wake-up channel live in one hash slot, so every script is
//! single-slot (no `CROSSSLOT`) and is routed by its first key; redis-rs's async cluster client follows `MOVED`/`ASK` and refreshes the
//! slot map after a failover. Wake-ups use sharded pub/sub: `release.lua` runs
//! `SPUBLISH` on the slot's owner and a [`ShardSubscriber`] `SSUBSCRIBE`s there.
//!
//! # redis-rs 1.8 workarounds
//! - **Stray `sunsubscribe`** (a slot moved away from the node serving a channel): the
//!   client takes the push for a reply and drops the channel from its own
//!   resubscription tracker. Lock commands therefore never share the subscriber's
//!   connection, and the subscriber treats any `SUnsubscribe` for a channel it still
//!   wants as "wake its waiters and subscribe again" (the new `SSUBSCRIBE` follows
//!   `MOVED` to the slot's new owner).
//! - **Cross-slot resubscription**: after a reconnect redis-rs re-sends all of a node's
//!   shard channels in one `SSUBSCRIBE`, which fails with `CROSSSLOT` as soon as they
//!   span two slots. On every `Disconnection` push the subscriber marks every channel
//!   lost (their heads poll until it is back), wakes all waiters and re-subscribes each
//!   wanted channel on its own, retrying with backoff while the cluster is failing over.
//! - **Script loading on every node**: `Script::invoke_async` answers `NOSCRIPT` with a
//!   `SCRIPT LOAD` sent to all nodes, so one unhealthy unrelated node fails an acquire.
//!   [`LuaScript::invoke`](crate::scripts) falls back to `EVAL` instead, routed by the
//!   same key as the `EVALSHA`; pipelines load the script inside the pipeline, which is
//!   routed explicitly to the key's master.
//! - **Timeouts and retries**: the cluster client has no response timeout by default,
//!   and a timed-out request can be parked and re-sent much later. Both a per-node
//!   response timeout and a finite overall timeout are set, and retries are few and
//!   short, so during a failover an acquire attempt fails within about twice the
//!   response timeout and the manager's wait loop tries again. Every script is
//!   idempotent per owner token, so a re-sent request cannot corrupt a lock.
//! - `WAIT` (for `min_replicas`) is never sent bare, which would go to every primary: it
//!   is pipelined after the acquire script and the pipeline is routed to the key's
//!   master, on a connection of its own from a small pool ([`WaitPool`]) because `WAIT`
//!   blocks the connection it runs on.
//!
//! The watchdog's renewals are grouped by hash slot: one `renew.lua` call per slot
//! (scripts cannot span slots), all sent concurrently, so a batch costs about one round
//! trip per node however many locks it holds.
//!
//! The backend and its `Store` impl are here; `nodes` opens the connections, `slots`
//! maps slots to masters, `renew` groups the watchdog's renewals, `subscriber` is the
//! sharded pub/sub subscriber and `recovery` its tasks that get lost channels back.

mod nodes;
mod recovery;
mod renew;
mod slots;
mod subscriber;

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::Value;
use tokio::sync::mpsc;

pub(crate) use self::nodes::ClusterNodes;
use self::slots::SlotMap;
use self::subscriber::ShardSubscriber;
use super::server::{
    acquire_all_call, acquire_args, acquire_by_call, acquire_call, by_script_call, decode,
    decode_acquire, decode_acquire_all, decode_scan, exists_on, extend_lease, force_unlock_on,
    inspect_all, inspect_on, parse_eviction_policy, release_lease, renew_in_parts, scan_cmd,
    scan_glob, scan_unfinished, script_loads, ttl_ms, unexpected, withdraw_call, LeaseSender,
    Resend, ScriptCall, Timeouts, WaitAttempt, WaitPool, MAX_REPLICA_WAIT, MAX_SCAN_STEPS,
};
use super::{Policies, Store};
use crate::info::LockInfo;
use crate::key::{key_slot, LockKey};
use crate::kind::Mode;
use crate::notify::Register;
use crate::scripts::ACQUIRE;
use crate::token::Token;
use crate::waiters::Wake;
use crate::wire::{Attempt, Claim, Renewed, Seen, Together};
use crate::wire::{LeaseRef, Publish, Renewal, ReplicaWait};
use crate::LockError;

/// The pattern `cluster_client`'s RESP3 check unsubscribes from.
const RESP3_PROBE: &str = "redlock:resp3-probe";

/// A Redis Cluster.
pub(crate) struct ClusterBackend {
    nodes: ClusterNodes,
    con: ClusterConnection,
    subscriber: ShardSubscriber,
    wait_pool: WaitPool<ClusterConnection>,
    timeouts: Timeouts,
    slot_map: StdMutex<Option<Arc<SlotMap>>>,
}

impl ClusterBackend {
    /// Opens the command and subscriber connections (each sees the whole cluster) and
    /// PINGs every node, within the connect timeout.
    pub(crate) async fn connect(
        nodes: ClusterNodes,
        timeouts: Timeouts,
        wake: Wake,
    ) -> Result<Self, LockError> {
        if matches!(&nodes, ClusterNodes::Infos(infos) if infos.is_empty()) {
            return Err(LockError::invalid_option(
                "cluster() needs at least one node URL",
            ));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let connect = async {
            let mut con = nodes.connection(timeouts, timeouts.response, None).await?;
            let sub_con = nodes
                .connection(timeouts, timeouts.response, Some(tx))
                .await?;
            con.route_command(
                redis::cmd("PING"),
                RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllNodes,
                    Some(ResponsePolicy::AllSucceeded),
                )),
            )
            .await?;
            Ok::<_, redis::RedisError>((con, sub_con))
        };
        // redis-rs #1953: the cluster connect can hang; the timeout bounds it.
        let (con, mut sub_con) = timeouts.connecting(nodes.seeds(), connect).await?;
        if let ClusterNodes::Client(_) = nodes {
            // Refused locally (no request) unless the client speaks RESP3; harmless
            // otherwise (a pattern never subscribed).
            sub_con.punsubscribe(RESP3_PROBE).await.map_err(|e| {
                LockError::invalid_option(format!(
                    "cluster_client: wake-ups need sharded pub/sub, so the client must \
                     speak RESP3 (ClusterClientBuilder::use_protocol(ProtocolVersion::RESP3)): {e}"
                ))
            })?;
        }
        Ok(Self {
            nodes,
            con,
            subscriber: ShardSubscriber::new(sub_con, rx, wake, timeouts.response * 2),
            wait_pool: WaitPool::new(),
            timeouts,
            slot_map: StdMutex::new(None),
        })
    }

    /// `calls` as one pipeline (led by their `SCRIPT LOAD`s, so a flushed script cache
    /// cannot fail it) routed by `route`: each call's reply. With `rw`, the pipeline ends
    /// in a `WAIT` for it and runs on a connection of its own (`WAIT` blocks the
    /// connection; never a bare `WAIT`, which would go to every primary): the replies,
    /// and how many replicas acknowledged them all. A pipeline cut short takes its
    /// connection with it (never pooled with a `WAIT` in flight).
    async fn pipeline(
        &self,
        calls: &[ScriptCall],
        rw: Option<ReplicaWait>,
        route: SingleNodeRoutingInfo,
        operation: &'static str,
    ) -> Result<(Vec<Value>, Option<u32>), LockError> {
        let loads = script_loads(calls);
        let mut pipe = redis::pipe();
        for load in &loads {
            pipe.add_command(load.clone());
        }
        for call in calls {
            pipe.add_command(call.evalsha());
        }
        let Some(rw) = rw else {
            let replies = self
                .con
                .clone()
                .route_pipeline(pipe, loads.len(), calls.len(), route)
                .await
                .map_err(LockError::backend(operation))?;
            if replies.len() != calls.len() {
                return Err(unexpected(operation, replies.len()));
            }
            return Ok((replies, None));
        };
        pipe.cmd("WAIT").arg(rw.replicas).arg(ttl_ms(rw.timeout));
        let mut con = self.wait_connection().await?;
        let mut replies = con
            .route_pipeline(pipe, loads.len(), calls.len() + 1, route)
            .await
            .map_err(LockError::backend(operation))?;
        self.wait_pool.put(con);
        let acked = replies.pop().ok_or_else(|| unexpected(operation, 0))?;
        if replies.len() != calls.len() {
            return Err(unexpected(operation, replies.len()));
        }
        Ok((replies, Some(decode(acked, operation)?)))
    }

    /// A cluster connection of its own for a pipeline ending in `WAIT`: an idle one
    /// from the pool, or a new one whose response timeout leaves room for the longest.
    async fn wait_connection(&self) -> Result<ClusterConnection, LockError> {
        if let Some(con) = self.wait_pool.take() {
            return Ok(con);
        }
        let response = self.timeouts.response + MAX_REPLICA_WAIT;
        self.timeouts
            .connecting(
                self.nodes.seeds(),
                self.nodes.connection(self.timeouts, response, None),
            )
            .await
    }

    #[cfg(test)]
    fn subscriber(&self) -> &ShardSubscriber {
        &self.subscriber
    }
}

/// Cluster's extends and releases: on the cluster connection (which re-sends a request
/// by itself: [`CLIENT_RETRIES`](nodes::CLIENT_RETRIES)); with replicas to wait for, a pipeline ending in a
/// `WAIT` routed to the key's master ([`pipeline`](ClusterBackend::pipeline)).
impl LeaseSender for ClusterBackend {
    type Con = ClusterConnection;

    const RESEND: Resend = Resend::ByClient;

    fn command_con(&self) -> &ClusterConnection {
        &self.con
    }

    async fn send_waiting(
        &self,
        call: &ScriptCall,
        key: &LockKey,
        rw: ReplicaWait,
        operation: &'static str,
    ) -> Result<(Value, u32), LockError> {
        let route = master_of(key.full());
        let (replies, acked) = self
            .pipeline(std::slice::from_ref(call), Some(rw), route, operation)
            .await?;
        let reply = replies
            .into_iter()
            .next()
            .ok_or_else(|| unexpected(operation, 0))?;
        Ok((reply, acked.unwrap_or(0)))
    }
}

impl Store for ClusterBackend {
    fn name(&self) -> &'static str {
        "cluster"
    }

    /// One request's bound: the overall response timeout, retries included.
    fn request_timeout(&self, _ttl: Duration, _mode: Mode) -> Duration {
        self.timeouts.response * 2
    }

    async fn acquire(&self, claim: &Claim<'_>) -> Result<Attempt, LockError> {
        let Claim {
            key,
            token,
            ttl,
            replicas,
            ..
        } = *claim;
        let Some(rw) = replicas else {
            if by_script_call(claim) {
                return acquire_by_call(&self.con, claim, Publish::Shard).await;
            }
            let keys = [key.full(), key.fence()];
            let args = acquire_args(&token, ttl);
            let reply: Value = ACQUIRE
                .invoke(&self.con, &keys, args)
                .await
                .map_err(LockError::backend("acquire"))?;
            return decode_acquire(reply, None);
        };
        // Every kind `WAIT`s for its replicas.
        let call = acquire_call(claim, Publish::Shard);
        // WAIT blocks the node connection it runs on: a cluster connection of its own
        // (it reconnects by itself), and the pipeline explicitly routed to the key's
        // master (never a bare WAIT).
        let con = self.wait_connection().await?;
        let mut pipe = redis::pipe();
        pipe.add_command(call.load())
            .add_command(call.evalsha())
            .cmd("WAIT")
            .arg(rw.replicas)
            .arg(ttl_ms(rw.timeout));
        // Until its reply is read, the attempt is undone on this same connection (the
        // same node connection: routed by the key) if it ends: see [`WaitAttempt`].
        let mut attempt =
            WaitAttempt::new(con, self.con.clone(), claim, (Publish::Shard, "cluster"));
        let replies = attempt
            .con()
            .route_pipeline(pipe, 0, 3, master_of(key.full()))
            .await
            .map_err(LockError::backend("acquire"))?;
        self.wait_pool.put(attempt.finish());
        let (reply, acked): (Value, u32) = match <[Value; 3]>::try_from(replies) {
            Ok([_, reply, acked]) => (decode(reply, "acquire")?, decode(acked, "acquire")?),
            Err(other) => return Err(unexpected("acquire", other.len())),
        };
        decode_acquire(reply, Some(acked))
    }

    /// Only when every key is in one slot (a script cannot span slots).
    async fn acquire_together(
        &self,
        keys: &[&LockKey],
        token: Token,
        ttl: Duration,
    ) -> Result<Option<Together>, LockError> {
        let slot = keys.first().map(|k| key_slot(k.full()));
        if keys.iter().any(|k| Some(key_slot(k.full())) != slot) {
            return Ok(None);
        }
        let reply: Value = acquire_all_call(keys, token, ttl)
            .invoke(&self.con)
            .await
            .map_err(LockError::backend("acquire"))?;
        decode_acquire_all(reply, keys.len()).map(Some)
    }

    /// See [`release_lease`]: the cluster client sends a request again by itself, so a
    /// 0 reply is never taken for released (see [`Resend::ByClient`]).
    async fn release(&self, lease: LeaseRef<'_>, keep: Duration) -> Result<bool, LockError> {
        release_lease(self, lease, keep, Publish::Shard).await
    }

    /// See [`extend_lease`]: with the lease's replicas to wait for, the extend and a
    /// `WAIT` go as one pipeline routed to the key's master.
    async fn extend(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<bool, LockError> {
        extend_lease(self, lease, ttl, Publish::Shard).await
    }

    /// Renews a batch with one pipeline per master ([`renew_part`](Self::renew_part));
    /// the renewals of leases waiting for replicas go at the same time, in pipelines of
    /// their own that end in one `WAIT` each.
    async fn renew(&self, batch: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        renew_in_parts(
            batch,
            |part, rw| async move { self.renew_part(&part, rw).await },
        )
        .await
    }

    /// Every master's `maxmemory-policy` (from `INFO memory`), by node address.
    async fn eviction_policies(&self) -> Result<Policies, LockError> {
        let mut info = redis::cmd("INFO");
        info.arg("memory");
        let replies = self
            .con
            .clone()
            .route_command(
                info,
                RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
            )
            .await
            .map_err(LockError::backend("info"))?;
        let Value::Map(replies) = replies else {
            return Err(unexpected("info", 1));
        };
        Ok(replies
            .into_iter()
            .map(|(node, reply)| {
                let node = decode::<String>(node, "info").unwrap_or_else(|_| "?".to_owned());
                let policy =
                    decode::<String>(reply, "info").and_then(|info| parse_eviction_policy(&info));
                (node, policy)
            })
            .collect())
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        inspect_on(&self.con, key).await
    }

    /// Every master, `SCAN` by `SCAN`: the first step sent to all masters at once, the
    /// next ones to each master by its address; each step's locks inspected before the
    /// next step.
    async fn list(&self, prefix: &str, pattern: &str) -> Result<Vec<LockInfo>, LockError> {
        let glob = scan_glob(prefix, pattern);
        let first = self
            .con
            .clone()
            .route_command(
                scan_cmd(0, &glob),
                RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
            )
            .await
            .map_err(LockError::backend("scan"))?;
        let Value::Map(firsts) = first else {
            return Err(unexpected("scan", 1));
        };
        let mut out = Vec::new();
        for (node, reply) in firsts {
            let node: String = decode(node, "scan")?;
            let Some((host, port)) = node
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
            else {
                return Err(unexpected("scan", 1));
            };
            let (mut cursor, keys) = decode_scan(prefix, reply)?;
            out.extend(inspect_all(&self.con, &keys).await?);
            for _ in 0..MAX_SCAN_STEPS {
                if cursor == 0 {
                    break;
                }
                let at = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port,
                };
                let reply = self
                    .con
                    .clone()
                    .route_command(scan_cmd(cursor, &glob), RoutingInfo::SingleNode(at))
                    .await
                    .map_err(LockError::backend("scan"))?;
                let (next, keys) = decode_scan(prefix, reply)?;
                out.extend(inspect_all(&self.con, &keys).await?);
                cursor = next;
            }
            if cursor != 0 {
                return Err(scan_unfinished());
            }
        }
        Ok(out)
    }

    async fn is_locked(&self, key: &LockKey) -> Result<bool, LockError> {
        exists_on(&self.con, key).await
    }

    async fn force_unlock(&self, key: &LockKey, seen: Option<Seen<'_>>) -> Result<bool, LockError> {
        force_unlock_on(&self.con, key, Publish::Shard, seen).await
    }

    async fn withdraw(&self, key: &LockKey, waiter: u64) -> Result<(), LockError> {
        withdraw_call(key, waiter, Publish::Shard)
            .invoke::<i64, _>(&self.con)
            .await
            .map(drop)
            .map_err(LockError::backend("withdraw"))
    }

    async fn subscribe(&self, key: &str, register: Register) -> Result<(), LockError> {
        self.subscriber.subscribe(key, register).await
    }

    async fn unsubscribe(&self, key: &str) -> Result<(), LockError> {
        self.subscriber.unsubscribe(key).await
    }

    fn listening(&self, key: &str) -> bool {
        self.subscriber.listening(key)
    }

    fn interests(&self) -> usize {
        self.subscriber.interests()
    }
}

/// The route to the master of `key`'s slot.
fn master_of(key: &str) -> SingleNodeRoutingInfo {
    SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master))
}

/// The route to the master of `slot`.
fn slot_master(slot: u16) -> SingleNodeRoutingInfo {
    SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master))
}
