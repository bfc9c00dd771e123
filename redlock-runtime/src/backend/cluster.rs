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

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use futures_util::stream::{self, StreamExt};
use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::io::tcp::TcpSettings;
use redis::{ConnectionInfo, ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::mpsc;

use super::server::{
    acquire_all_call, acquire_args, acquire_by_call, acquire_call, by_script_call, chunk_outcomes,
    decode, decode_acquire, decode_acquire_all, decode_scan, exists_on, extend_lease,
    force_unlock_on, inspect_all, inspect_on, parse_eviction_policy, release_lease, renew_call,
    renew_in_parts, replicated_outcome, scan_cmd, scan_glob, scan_unfinished, script_loads, ttl_ms,
    unexpected, withdraw_pipe, LeaseSender, Resend, ScriptCall, Timeouts, WaitAttempt, WaitPool,
    MAX_REPLICA_WAIT, MAX_SCAN_STEPS,
};
use super::{Attempt, Claim, Policies, Renewed, Seen, Store, Together};
use crate::error::chain;
use crate::info::LockInfo;
use crate::key::{key_slot, LockKey, SLOTS};
use crate::kind::Mode;
use crate::notify::{channel_of, ChannelLocks, Interest};
use crate::scripts::ACQUIRE;
use crate::token::Token;
use crate::waiters::Wake;
use crate::wire::{LeaseRef, Publish, Renewal, ReplicaWait};
use crate::LockError;

/// Renewals per script call (one slot's locks per call).
const RENEW_CHUNK: usize = 1000;
/// Slot groups renewed concurrently.
const RENEW_CONCURRENCY: usize = 64;
/// Retries of one request inside the cluster client (redirects, `TRYAGAIN`,
/// `CLUSTERDOWN`, reconnects), each after 50-500 ms.
const CLIENT_RETRIES: u32 = 3;
/// First and longest pause between resubscription rounds while the cluster fails over.
const RESUBSCRIBE_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(50), Duration::from_secs(1));

/// How often the subscriber compares the shard channels it believes confirmed on each
/// node with the count the node reports for its connection (see [`ShardSubscriber`]).
/// A channel lost without a word is heard again within about this plus a round trip.
const AUDIT_EVERY: Duration = Duration::from_millis(250);

/// How long a fetched slot map groups renewals before it is fetched again.
const SLOT_MAP_AGE: Duration = Duration::from_secs(10);

/// The locks (batch indices) of one `renew.lua` call, and its reply.
/// With the replicas that acknowledged them, when the call ended in a `WAIT`.
type SlotRenewal = (Vec<usize>, Result<Vec<i64>, LockError>, Option<u32>);
/// One `renew.lua` call to make: its slot and its locks (batch indices).
type SlotCall = (u16, Vec<usize>);

/// Which master serves each slot, as `CLUSTER SLOTS` said when it was fetched. Used
/// only to group renewals by master: a stale map costs a retry, never a wrong outcome.
struct SlotMap {
    fetched: Instant,
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
    fn master(&self, slot: u16) -> Option<u16> {
        self.masters
            .get(usize::from(slot))
            .copied()
            .filter(|&m| m != u16::MAX)
    }
}

/// The arguments of the `renew.lua` call for the locks of `batch` at `indices`.
fn slot_renew_call(batch: &[Renewal<'_>], indices: &[usize]) -> ScriptCall {
    let renewals: Vec<Renewal<'_>> = indices
        .iter()
        .filter_map(|&i| batch.get(i).copied())
        .collect();
    renew_call(&renewals)
}

/// Where a cluster backend's connections come from: seed nodes, with the library's
/// client settings, or a client the application configured.
#[derive(Clone)]
pub(crate) enum ClusterNodes {
    Infos(Vec<ConnectionInfo>),
    Client(Box<ClusterClient>),
}

impl ClusterNodes {
    /// A connection whose requests are bounded by `response` (the library's client
    /// settings, or the application's client with the library's timeouts), delivering
    /// pushes to `pushes` when given (RESP3).
    async fn connection(
        &self,
        timeouts: Timeouts,
        response: Duration,
        pushes: Option<mpsc::UnboundedSender<PushInfo>>,
    ) -> Result<ClusterConnection, redis::RedisError> {
        match self {
            Self::Infos(infos) => {
                let mut builder = builder(infos, timeouts)
                    .response_timeout(response)
                    .overall_response_timeout(Some(response * 2));
                if let Some(tx) = pushes {
                    builder = builder.use_protocol(ProtocolVersion::RESP3).push_sender(tx);
                }
                builder.build()?.get_async_connection().await
            }
            Self::Client(client) => {
                let mut config = ClusterConfig::new()
                    .set_connection_timeout(timeouts.connect)
                    .set_response_timeout(response);
                if let Some(tx) = pushes {
                    config = config.set_push_sender(tx);
                }
                client.get_async_connection_with_config(config).await
            }
        }
    }
}

impl ClusterNodes {
    /// The seed nodes, for errors: `host:port, host:port`, or `the application's
    /// cluster client`.
    fn seeds(&self) -> String {
        match self {
            Self::Infos(infos) => infos
                .iter()
                .map(|i| i.addr().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            Self::Client(_) => "the application's cluster client".to_owned(),
        }
    }
}

#[cfg(test)]
impl ClusterNodes {
    fn urls(urls: &[String]) -> Self {
        use redis::IntoConnectionInfo;
        Self::Infos(
            urls.iter()
                .map(|u| u.as_str().into_connection_info().unwrap())
                .collect(),
        )
    }
}

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
    /// pipeline ending in a `WAIT` for `rw`) with one pipeline per master: the batch's locks grouped by slot
    /// (scripts cannot span slots) into `renew.lua` calls of up to [`RENEW_CHUNK`] locks,
    /// the calls grouped by the master serving their slot (from `CLUSTER SLOTS`, fetched
    /// at most every [`SLOT_MAP_AGE`]) and each master's calls sent as one pipeline,
    /// routed by its first slot, all masters at once: one round trip per master.
    ///
    /// The slot map only groups: a call whose master is unknown, or whose pipeline
    /// failed (a slot moved since the map was fetched: the whole pipeline is redirected
    /// and fails), is sent on its own, routed by its key ([`RENEW_CONCURRENCY`] at a
    /// time), and the map is fetched again next time. Renewals are idempotent per token,
    /// so a call applied twice is harmless. A call that failed leaves its locks
    /// [`Renewed::Unknown`]; the batch fails as a whole only when every call failed.
    async fn renew_part(
        &self,
        batch: &[Renewal<'_>],
        rw: Option<ReplicaWait>,
    ) -> Result<Vec<Renewed>, LockError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        // One script per kind: exclusive and shared locks of a slot go in separate calls.
        let mut groups: HashMap<(u16, bool), Vec<usize>> = HashMap::new();
        for (i, r) in batch.iter().enumerate() {
            let group = (key_slot(r.key.full()), r.mode.is_shared());
            groups.entry(group).or_default().push(i);
        }
        let map = self.slot_map().await;
        let mut by_master: HashMap<u16, Vec<SlotCall>> = HashMap::new();
        let mut alone: Vec<SlotCall> = Vec::new();
        for ((slot, _), indices) in groups {
            let master = map.as_ref().and_then(|m| m.master(slot));
            for chunk in indices.chunks(RENEW_CHUNK) {
                let call = (slot, chunk.to_vec());
                match master {
                    Some(m) => by_master.entry(m).or_default().push(call),
                    None => alone.push(call),
                }
            }
        }
        let total = by_master.values().map(Vec::len).sum::<usize>() + alone.len();
        let pipelines = by_master
            .into_values()
            .map(|calls| self.renew_on_master(batch, calls, rw));
        let mut results: Vec<SlotRenewal> = Vec::with_capacity(total);
        for outcome in join_all(pipelines).await {
            match outcome {
                Ok(done) => results.extend(done),
                Err(calls) => {
                    self.forget_slot_map();
                    alone.extend(calls);
                }
            }
        }
        let renew_slot = |(slot, indices): SlotCall| async move {
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
        };
        results.extend(
            stream::iter(alone)
                .map(renew_slot)
                .buffer_unordered(RENEW_CONCURRENCY)
                .collect::<Vec<SlotRenewal>>()
                .await,
        );
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

/// Cluster's extends and releases: on the cluster connection (which re-sends a request
/// by itself: [`CLIENT_RETRIES`]); with replicas to wait for, a pipeline ending in a
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
                return acquire_by_call(&self.con, claim).await;
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
        let call = acquire_call(claim);
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
        let pipe = withdraw_pipe(key, waiter, Publish::Shard);
        self.con
            .clone()
            .route_pipeline(pipe, 0, 2, master_of(key.full()))
            .await
            .map(drop)
            .map_err(LockError::backend("withdraw"))
    }

    async fn subscribe(&self, key: &str, register: bool) -> Result<(), LockError> {
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

/// The slot map, from `CLUSTER SLOTS` on a random primary; `None` (logged, with what
/// the caller does `instead`) when it cannot be had.
async fn fetch_slot_map(con: &ClusterConnection, instead: &str) -> Option<SlotMap> {
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

/// The route to the master of `key`'s slot.
fn master_of(key: &str) -> SingleNodeRoutingInfo {
    SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master))
}

/// The route to the master of `slot`.
fn slot_master(slot: u16) -> SingleNodeRoutingInfo {
    SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master))
}

/// A cluster client builder with the library's timeouts and bounded retries.
fn builder(infos: &[ConnectionInfo], timeouts: Timeouts) -> ClusterClientBuilder {
    ClusterClientBuilder::new(infos.to_vec())
        .tcp_settings(TcpSettings::default().set_nodelay(true))
        .connection_timeout(timeouts.connect)
        .response_timeout(timeouts.response)
        .overall_response_timeout(Some(timeouts.response * 2))
        .retries(CLIENT_RETRIES)
        .min_retry_wait(50)
        .max_retry_wait(500)
}

/// Sharded pub/sub wake-ups for the whole cluster: one RESP3 [`ClusterConnection`] (one
/// socket per node) that carries nothing but `SSUBSCRIBE`/`SUNSUBSCRIBE`, shared by all
/// keys with a reference count per channel.
///
/// Two tasks serve it: the dispatcher turns `smessage` pushes into wake-ups, and on a
/// `Disconnection` push, or a `sunsubscribe` push for a channel still wanted (redis-rs
/// loses those subscriptions), marks the channels lost (not
/// [`listening`](Self::listening): their heads poll), wakes the waiters at once and hands
/// the channels to the resubscriber, which subscribes each one on its own (never several
/// slots in one command), retrying with backoff while the slot has no reachable owner,
/// and confirms the channel and wakes its waiters again once it is back.
///
/// Not every loss is announced. redis-rs may replace a node's connection without a
/// `Disconnection` push (a failed health check during a slot refresh, a node that left
/// the slot map while frozen), and its own resubscription of that node's channels, one
/// `SSUBSCRIBE` across slots, fails with `CROSSSLOT`; a server's `sunsubscribe` push
/// that arrives while an `SSUBSCRIBE` is in flight is taken for that command's reply
/// (issue 23: Cluster waiters in a calm spell slept 1.3-2.0 s past a release). So a
/// third task, the auditor, asks every [`AUDIT_EVERY`] each master that should serve a
/// confirmed channel how many shard channels the subscriber's connection to it holds
/// (`CLIENT INFO`'s `ssub`, one request per master); fewer than the subscriber believes
/// confirmed there marks that master's channels lost, wakes their heads and hands them to
/// the resubscriber (`SSUBSCRIBE` is idempotent, so one lost channel costs the others of
/// its master nothing but a repeated request). The tasks end with the subscriber.
pub(crate) struct ShardSubscriber {
    inner: Arc<SubInner>,
}

struct SubInner {
    con: ClusterConnection,
    /// Wanted channels and the interests in each.
    interest: StdMutex<HashMap<String, Interest>>,
    /// Serialises each channel's (un)subscribe commands so the server sees them in
    /// decision order; different channels (whatever their shard) do not wait for each
    /// other, so a frozen master holds up only the subscriptions of its own channels.
    ops: Arc<ChannelLocks>,
    resubscribe: mpsc::UnboundedSender<String>,
    timeout: Duration,
}

impl ShardSubscriber {
    fn new(
        con: ClusterConnection,
        pushes: mpsc::UnboundedReceiver<PushInfo>,
        wake: Wake,
        timeout: Duration,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let inner = Arc::new(SubInner {
            con,
            interest: StdMutex::new(HashMap::new()),
            ops: Arc::new(ChannelLocks::default()),
            resubscribe: tx,
            timeout,
        });
        tokio::spawn(dispatch(pushes, Arc::downgrade(&inner), wake.clone()));
        tokio::spawn(auditor(Arc::downgrade(&inner), wake.clone()));
        tokio::spawn(resubscriber(rx, Arc::downgrade(&inner), wake));
        Self { inner }
    }

    /// Adds one interest in `key`'s channel when `register`, and subscribes unless the
    /// server already confirmed it (as [`Subscriber::subscribe`](crate::notify)).
    ///
    /// A channel lost with its connection (or dropped by the server) is left to the
    /// resubscriber, which asks for it again until it is back and then wakes its head:
    /// this returns at once without a request, and the head, not
    /// [`listening`](Self::listening), polls meanwhile. (A burst of `SSUBSCRIBE`s sent
    /// while the connection is being re-established hangs until the timeout, and a head
    /// makes no attempt while its subscription is in flight; the resubscriber sends them
    /// one at a time.)
    ///
    /// The interest is counted at once, before anything is awaited (as for the other
    /// backends): a caller cut short while this waits for the channel's turn or for the
    /// reply still owns an interest, which its queue's [`unsubscribe`](Self::unsubscribe)
    /// drops. The `SSUBSCRIBE` is skipped if the channel was confirmed meanwhile or
    /// nobody wants it any more.
    pub(crate) async fn subscribe(&self, key: &str, register: bool) -> Result<(), LockError> {
        let inner = &self.inner;
        if !inner
            .interest()
            .entry(key.to_owned())
            .or_default()
            .add(register)
        {
            return Ok(());
        }
        if inner.lost(key) {
            return Ok(());
        }
        let _turn = inner.ops.lock(key).await;
        // Confirmed meanwhile, or nobody wants it any more, or lost meanwhile.
        if inner.interest().get(key).is_none_or(Interest::is_confirmed) || inner.lost(key) {
            return Ok(());
        }
        inner.ssubscribe(key).await?;
        if let Some(entry) = inner.interest().get_mut(key) {
            entry.confirm();
        }
        Ok(())
    }

    /// The number of channels with an interest (for tests of what is left behind).
    pub(crate) fn interests(&self) -> usize {
        self.inner.interest().len()
    }

    /// Whether the server confirmed `key`'s channel and it has not been lost since.
    pub(crate) fn listening(&self, key: &str) -> bool {
        self.inner
            .interest()
            .get(key)
            .is_some_and(Interest::is_confirmed)
    }

    /// Drops one interest in `key`'s channel at once (before anything is awaited); the
    /// last one unsubscribes when the channel's earlier (un)subscriptions are done,
    /// unless an interest was registered again meanwhile (whose `SSUBSCRIBE` then owns
    /// the channel).
    pub(crate) async fn unsubscribe(&self, key: &str) -> Result<(), LockError> {
        let inner = &self.inner;
        {
            let mut interest = inner.interest();
            let Some(entry) = interest.get_mut(key) else {
                return Ok(());
            };
            if !entry.drop_one() {
                return Ok(());
            }
            interest.remove(key);
        }
        let _turn = inner.ops.lock(key).await;
        if inner.wants(key) {
            return Ok(());
        }
        let mut con = inner.con.clone();
        tokio::time::timeout(inner.timeout, con.sunsubscribe(key))
            .await
            .map_err(|_| LockError::timed_out("unsubscribe", inner.timeout))?
            .map_err(LockError::backend("unsubscribe"))
    }
}

impl SubInner {
    fn interest(&self) -> MutexGuard<'_, HashMap<String, Interest>> {
        self.interest.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wants(&self, channel: &str) -> bool {
        self.interest().contains_key(channel)
    }

    /// Whether `channel` was confirmed and then lost (the resubscriber owns it).
    fn lost(&self, channel: &str) -> bool {
        self.interest().get(channel).is_some_and(Interest::is_lost)
    }

    /// Marks `channel` unsubscribed on the server if it is wanted; whether it is.
    fn lose(&self, channel: &str) -> bool {
        self.interest()
            .get_mut(channel)
            .map(Interest::lose)
            .is_some()
    }

    /// The channels the server confirmed and that were not lost since.
    fn confirmed(&self) -> Vec<String> {
        self.interest()
            .iter()
            .filter(|(_, i)| i.is_confirmed())
            .map(|(c, _)| c.clone())
            .collect()
    }

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
        let still: Vec<String> = {
            let interest = self.interest();
            channels
                .into_iter()
                .filter(|c| interest.get(c).is_some_and(Interest::is_confirmed))
                .collect()
        };
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
        still.into_iter().filter(|c| self.lose(c)).collect()
    }

    /// Marks every channel unsubscribed on the server (the connection dropped).
    fn lose_all(&self) {
        self.interest().values_mut().for_each(Interest::lose);
    }

    /// One `SSUBSCRIBE` for one channel, bounded by the timeout.
    async fn ssubscribe(&self, channel: &str) -> Result<(), LockError> {
        let mut con = self.con.clone();
        tokio::time::timeout(self.timeout, con.ssubscribe(channel))
            .await
            .map_err(|_| LockError::timed_out("subscribe", self.timeout))?
            .map_err(LockError::backend("subscribe"))
    }

    /// Hands every wanted channel to the resubscriber.
    fn resubscribe_all(&self) {
        let wanted: Vec<String> = self.interest().keys().cloned().collect();
        for channel in wanted {
            let _ = self.resubscribe.send(channel);
        }
    }

    /// Subscribes `channel` again if it is still wanted; `Ok(false)` when it is not.
    async fn resubscribe(&self, channel: &str) -> Result<bool, LockError> {
        let _turn = self.ops.lock(channel).await;
        if !self.wants(channel) {
            return Ok(false);
        }
        self.ssubscribe(channel).await?;
        if let Some(entry) = self.interest().get_mut(channel) {
            entry.confirm();
        }
        Ok(true)
    }
}

async fn dispatch(
    mut pushes: mpsc::UnboundedReceiver<PushInfo>,
    inner: Weak<SubInner>,
    wake: Wake,
) {
    // Ends when the subscriber's connection is dropped (the sender goes with it).
    while let Some(push) = pushes.recv().await {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if wake.is_gone() {
            return;
        }
        match push.kind {
            PushKind::SMessage | PushKind::Message => {
                if let Some(msg) = redis::Msg::from_push_info(push) {
                    wake.wake(msg.get_channel_name());
                }
            }
            PushKind::Disconnection => {
                tracing::debug!(
                    target: "redlock",
                    backend = "cluster",
                    "cluster subscriber reconnecting: waking every waiter and resubscribing"
                );
                inner.lose_all();
                wake.wake_all();
                inner.resubscribe_all();
            }
            PushKind::SUnsubscribe => match channel_of(&push) {
                // Ours (after the last interest left) or the server's, when the slot moved.
                Some(channel) => {
                    if inner.lose(&channel) {
                        tracing::debug!(
                            target: "redlock",
                            key = channel,
                            backend = "cluster",
                            "shard channel unsubscribed by the server; resubscribing"
                        );
                        wake.wake(&channel);
                        let _ = inner.resubscribe.send(channel);
                    }
                }
                // Not the documented shape: assume the worst for every channel.
                None => {
                    inner.lose_all();
                    wake.wake_all();
                    inner.resubscribe_all();
                }
            },
            _ => {}
        }
    }
}

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
async fn auditor(inner: Weak<SubInner>, wake: Wake) {
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
        let confirmed = sub.confirmed();
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

async fn resubscriber(
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

#[cfg(test)]
mod tests {
    use redlock_testkit::RedisCluster;

    use super::*;
    use crate::waiters::Waiters;

    /// A 3-master cluster and a backend on it, with the waiters its wake-ups go to (kept
    /// alive: the subscriber's tasks end with them).
    async fn cluster_backend() -> (RedisCluster, Arc<Waiters>, ClusterBackend) {
        let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0))
            .await
            .unwrap();
        let waiters = Arc::new(Waiters::new(16, Box::new(|_| {})));
        let timeouts = Timeouts {
            connect: Duration::from_secs(3),
            response: Duration::from_secs(1),
        };
        let backend = ClusterBackend::connect(
            ClusterNodes::urls(&cluster.urls()),
            timeouts,
            Wake::new(&waiters),
        )
        .await
        .unwrap();
        (cluster, waiters, backend)
    }

    /// How many connections the master of `channel`'s slot has subscribed to it.
    async fn shard_numsub(cluster: &RedisCluster, channel: &str) -> i64 {
        let node = cluster.node(cluster.master_for_key(channel));
        let mut con = redis::Client::open(node.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let (_, n): (String, i64) = redis::cmd("PUBSUB")
            .arg("SHARDNUMSUB")
            .arg(channel)
            .query_async(&mut con)
            .await
            .unwrap();
        n
    }

    /// review2, smaller defect 6: the shard subscriber counted a head's interest only
    /// once the head held the (un)subscription lock. A head cut at its deadline while
    /// waiting for it left its queue `Asked` with nothing counted, and that queue's
    /// `Unsubscribe`, reaching the subscriber after a newer queue of the same key had
    /// asked (the watchdog task picks the job up after the new head's request), dropped
    /// the newer queue's interest: the channel was unsubscribed under a head that believed
    /// it listened (it polled, and asked again only a second later).
    ///
    /// Deterministic: the test holds the channel's turn itself (as an earlier
    /// (un)subscription of the channel still in flight would) and issues the requests in
    /// the order of that interleaving.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn subscription_cut_while_waiting_for_its_turn_still_counts_its_interest() {
        let (cluster, _waiters, backend) = cluster_backend().await;
        let sub = backend.subscriber();
        let key = "lock:cut_while_waiting_{1}";

        let turn = sub.inner.ops.lock(key).await;
        // The old queue's head gives up (its deadline) while waiting for its turn.
        let cut = tokio::time::timeout(Duration::from_millis(50), sub.subscribe(key, true)).await;
        assert!(cut.is_err(), "the subscription did not wait for its turn");
        assert_eq!(
            sub.inner.interest().len(),
            1,
            "a head cut short while waiting for its turn left its queue asked with no interest counted"
        );
        // A newer queue's head asks, then the old queue's `Unsubscribe` arrives; the
        // earlier (un)subscription finishes.
        let newer = sub.subscribe(key, true);
        let old_unsubscribe = sub.unsubscribe(key);
        let earlier_done = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(turn);
        };
        let (newer, old_unsubscribe, ()) = tokio::join!(newer, old_unsubscribe, earlier_done);
        newer.unwrap();
        old_unsubscribe.unwrap();
        assert!(
            sub.listening(key),
            "the old queue's unsubscribe dropped the newer queue's interest"
        );
        assert_eq!(shard_numsub(&cluster, key).await, 1);
        // The newer queue empties: nothing is left behind.
        sub.unsubscribe(key).await.unwrap();
        assert_eq!(sub.inner.interest().len(), 0);
        assert_eq!(shard_numsub(&cluster, key).await, 0);
        assert_eq!(sub.inner.ops.len(), 0);
    }

    /// Issue 23's missed wake-ups on Cluster (soak seed 16583615571038614529: waiters in
    /// a calm spell slept 1.3-2.0 s past a release): the subscriber believed channels
    /// confirmed that the server no longer served on its connection, lost without a
    /// word (a connection redis-rs replaced with no `Disconnection` push and whose
    /// resubscription failed with `CROSSSLOT`, or a `sunsubscribe` push taken for an
    /// `SSUBSCRIBE`'s reply), and their heads slept until the expiry they were told. The
    /// test leaves that state behind directly, whatever made it, beside a channel that
    /// is really subscribed on the same master: the auditor must find the master's
    /// connection holding fewer channels than believed, and subscribe both again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_channel_lost_without_a_word_is_subscribed_again_by_the_audit() {
        let (cluster, _waiters, backend) = cluster_backend().await;
        let sub = backend.subscriber();
        // Two channels in two slots of one master.
        let master = cluster.master_for_key("lock:audited_{0}");
        let keys: Vec<String> = (0..200)
            .map(|i| format!("lock:audited_{{{i}}}"))
            .filter(|k| cluster.master_for_key(k) == master)
            .take(2)
            .collect();
        let (heard, unheard) = (&keys[0], &keys[1]);
        sub.subscribe(heard, true).await.unwrap();
        assert_eq!(shard_numsub(&cluster, heard).await, 1);
        {
            let mut interest = sub.inner.interest();
            let entry = interest.entry(unheard.clone()).or_default();
            entry.add(true);
            entry.confirm();
        }
        assert!(sub.listening(unheard));
        assert_eq!(shard_numsub(&cluster, unheard).await, 0);

        let since = Instant::now();
        while shard_numsub(&cluster, unheard).await == 0 && since.elapsed() < Duration::from_secs(3)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            shard_numsub(&cluster, unheard).await,
            1,
            "a channel believed confirmed but not subscribed on the server stayed unheard for {:?}",
            since.elapsed()
        );
        let back = Instant::now();
        while !keys.iter().all(|k| sub.listening(k)) && back.elapsed() < Duration::from_secs(3) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(keys.iter().all(|k| sub.listening(k)), "not confirmed again");
        assert_eq!(shard_numsub(&cluster, heard).await, 1);
        // Dropping the interests leaves nothing behind.
        for k in &keys {
            sub.unsubscribe(k).await.unwrap();
            assert_eq!(shard_numsub(&cluster, k).await, 0);
        }
        assert_eq!(sub.interests(), 0);
    }

    /// With (un)subscriptions no longer serialised per connection, every head whose
    /// channel was lost with the subscriber connection asked for it again at once, all
    /// concurrently with the resubscriber: that burst of `SSUBSCRIBE`s, sent while the
    /// connection was being re-established, hung until the 2 s timeout (146 of 150 failed
    /// after 4 s and only 4 channels were back 3 s later), and a head makes no attempt
    /// while its subscription is in flight. A lost channel is the resubscriber's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn heads_asking_again_for_lost_channels_leave_them_to_the_resubscriber() {
        let (cluster, _waiters, backend) = cluster_backend().await;
        let sub = backend.subscriber();
        let keys: Vec<String> = (0..150).map(|i| format!("lock:lost_{{{i}}}")).collect();
        for r in join_all(keys.iter().map(|k| sub.subscribe(k, true))).await {
            r.unwrap();
        }
        assert!(keys.iter().all(|k| sub.listening(k)));
        // The window is a few milliseconds wide: several rounds, at several offsets.
        for round in 0..8u64 {
            for i in 0..cluster.len() {
                let mut con = redis::Client::open(cluster.node(i).url())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                let _: redis::Value = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg("pubsub")
                    .query_async(&mut con)
                    .await
                    .unwrap();
            }
            // The heads hear of it (the `Disconnection` pushes) and ask again, all at
            // once, while the connections are being re-established.
            tokio::time::sleep(Duration::from_millis(round % 4)).await;
            let asked = Instant::now();
            let answers = join_all(keys.iter().map(|k| sub.subscribe(k, false))).await;
            let took = asked.elapsed();
            let failed = answers.iter().filter(|r| r.is_err()).count();
            assert!(
                failed == 0 && took < Duration::from_millis(500),
                "round {round}: {failed} of 150 re-asks failed, after {took:?}"
            );
            let back = Instant::now();
            while !keys.iter().all(|k| sub.listening(k)) && back.elapsed() < Duration::from_secs(3)
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let listening = keys.iter().filter(|k| sub.listening(k)).count();
            assert_eq!(
                listening,
                150,
                "round {round}: channels back {:?} after the re-asks",
                back.elapsed()
            );
        }
    }
}
