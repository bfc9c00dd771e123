//! One Redis server (a primary, optionally with replicas for `min_replicas`).
//!
//! Commands go over one multiplexed, auto-reconnecting [`ConnectionManager`] with
//! `TCP_NODELAY`; plain exclusive acquires and releases made while another call is in
//! flight share one script call (see `coalesce`); wake-ups arrive on a second RESP3
//! connection (see `notify`). `WAIT` blocks the connection it runs on, so each
//! acquisition with `min_replicas` runs on a connection of its own from a small pool
//! ([`WaitPool`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, ConnectionInfo, ProtocolVersion, Value};

use super::batched::{AcquireRequest, ReleaseRequest};
use super::coalesce::Coalescer;
use super::server::{
    acquire_all_call, acquire_args, acquire_call, by_script_call, chunk_outcomes, decode,
    decode_acquire, decode_acquire_all, exists_on, extend_lease, force_unlock_on, in_batch_order,
    inspect_on, is_dropped, list_on, parse_eviction_policy, reconnecting, release_lease,
    renew_calls, renew_groups, renew_in_parts, replicated_outcome, scan_keys_on, scan_places_on,
    script_loads, ttl_ms, unexpected, withdraw_call, LeaseSender, Resend, ScriptCall, Timeouts,
    WaitAttempt, WaitPool, MAX_REPLICA_WAIT,
};
use super::{Policies, Store};
use crate::info::LockInfo;
use crate::key::LockKey;
use crate::kind::Mode;
use crate::notify::{push_handler, Channels, Register, Subscriber};
use crate::scripts::ACQUIRE;
use crate::token::Token;
use crate::waiters::Wake;
use crate::wire::{Attempt, Claim, Renewed, Seen, Together};
use crate::wire::{LeaseRef, Publish, Renewal, ReplicaWait};
use crate::LockError;

/// Renewals per script call: large batches, yet each call stays well under a millisecond
/// of server time per thousand keys.
const RENEW_CHUNK: usize = 1000;

/// A connection to one Redis server.
pub(crate) struct SingleBackend {
    client: Client,
    con: ConnectionManager,
    subscriber: Subscriber,
    wait_pool: WaitPool<MultiplexedConnection>,
    timeouts: Timeouts,
    /// The backend this server belongs to (`single`, or one of `redlock`'s nodes), for logs.
    backend: &'static str,
    /// Acquire requests sent again after a dropped connection: see [`resends`](Self::resends).
    resends: AtomicU64,
    /// Plain acquires and releases made while others are in flight share one call
    /// (`None` for a Redlock node: see [`alone`](Self::alone)).
    coalescing: Option<Coalescing>,
}

/// The queues of requests that can share a call on [`SingleBackend`]'s connection.
struct Coalescing {
    acquires: Arc<Coalescer<AcquireRequest>>,
    releases: Arc<Coalescer<ReleaseRequest>>,
}

impl SingleBackend {
    /// Opens the command and subscriber connections and PINGs, within the connect timeout;
    /// `backend` names the backend it serves in logs.
    pub(crate) async fn connect(
        info: ConnectionInfo,
        timeouts: Timeouts,
        wake: Wake,
        backend: &'static str,
    ) -> Result<Self, LockError> {
        let channels = Arc::new(Channels::default());
        Self::connect_listening(info, timeouts, wake, backend, (channels, 0)).await
    }

    /// [`connect`](Self::connect), the subscriber connection keeping its interests in
    /// `channels` as connection `generation` (a Sentinel deployment's successive masters
    /// share them).
    pub(crate) async fn connect_listening(
        info: ConnectionInfo,
        timeouts: Timeouts,
        wake: Wake,
        backend: &'static str,
        (channels, generation): (Arc<Channels>, u64),
    ) -> Result<Self, LockError> {
        let nodelay = info.tcp_settings().clone().set_nodelay(true);
        let info = info.set_tcp_settings(nodelay);
        let resp3 = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let node = info.addr().to_string();
        let refused = |e| LockError::backend("connect")(e).on_node(&node);
        let client = Client::open(info.clone()).map_err(refused)?;
        let sub_client = Client::open(info.set_redis_settings(resp3)).map_err(refused)?;

        let handler = push_handler(wake, channels.clone(), generation, backend);
        let connect = async {
            let con = client
                .get_connection_manager_with_config(timeouts.manager_config())
                .await?;
            let sub_con = sub_client
                .get_connection_manager_with_config(
                    timeouts
                        .manager_config()
                        .set_push_sender(handler)
                        .set_automatic_resubscription(),
                )
                .await?;
            redis::cmd("PING").exec_async(&mut con.clone()).await?;
            Ok::<_, redis::RedisError>((con, sub_con))
        };
        let (con, sub_con) = timeouts.connecting(&node, connect).await?;
        Ok(Self {
            client,
            con,
            subscriber: Subscriber::new(sub_con, channels, generation, backend),
            wait_pool: WaitPool::new(),
            timeouts,
            backend,
            resends: AtomicU64::new(0),
            coalescing: Some(Coalescing {
                acquires: Arc::new(Coalescer::new()),
                releases: Arc::new(Coalescer::new()),
            }),
        })
    }

    /// Every request goes as its own call. A Redlock node's acquire is one per attempt
    /// and node, and the late-grant bookkeeping counts each one's sends
    /// ([`resends`](Self::resends)); a Redlock lock costs five nodes' calls whatever
    /// shares them.
    pub(crate) fn alone(mut self) -> Self {
        self.coalescing = None;
        self
    }

    /// How many acquire requests were sent again after a dropped connection so far
    /// (`EVAL` after `NOSCRIPT` is not counted: the `EVALSHA` before it was not applied).
    /// While it stays the same, every grant answered meanwhile was applied exactly once,
    /// as its one request: Redlock tells by it whether a late grant that its release
    /// already deleted can be applied again afterwards (see
    /// `RedlockBackend::keep_late_grants`).
    pub(crate) fn resends(&self) -> u64 {
        self.resends.load(Ordering::SeqCst)
    }

    /// [`reconnecting`], counting a second send in [`resends`](Self::resends) before
    /// it is written.
    async fn resending<T, F, Fut>(&self, mut request: F) -> redis::RedisResult<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let mut sends = 0u32;
        reconnecting(|| {
            sends += 1;
            if sends > 1 {
                self.resends.fetch_add(1, Ordering::SeqCst);
            }
            request()
        })
        .await
    }

    pub(crate) fn subscriber(&self) -> &Subscriber {
        &self.subscriber
    }

    /// The command connection (a cheap clone), for backends built on this one.
    pub(crate) fn connection(&self) -> ConnectionManager {
        self.con.clone()
    }

    /// A new connection for `WAIT`, its response timeout leaving room for the longest.
    async fn wait_connection(&self) -> Result<MultiplexedConnection, LockError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeouts.connect))
            .set_response_timeout(Some(self.timeouts.response + MAX_REPLICA_WAIT));
        self.client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| LockError::backend("connect")(e).on_node(self.addr()))
    }

    /// The server's address (no credentials), for messages.
    pub(crate) fn addr(&self) -> String {
        self.client.get_connection_info().addr().to_string()
    }

    /// Every lock key under `prefix` matching `pattern` here (Redlock lists the union).
    pub(crate) async fn scan_keys(
        &self,
        prefix: &str,
        pattern: &str,
    ) -> Result<Vec<LockKey>, LockError> {
        scan_keys_on(&self.con, prefix, pattern).await
    }

    /// Every permit place (Redlock) under `prefix` whose name matches `glob`, with the
    /// lock key it is a place of.
    pub(crate) async fn scan_places(
        &self,
        prefix: &str,
        glob: &str,
    ) -> Result<Vec<(LockKey, LockKey)>, LockError> {
        scan_places_on(&self.con, prefix, glob).await
    }

    /// The server's role (`master`, `slave`), the first element of `ROLE`.
    pub(crate) async fn role(&self) -> Result<String, LockError> {
        let reply: Vec<Value> = redis::cmd("ROLE")
            .query_async(&mut self.con.clone())
            .await
            .map_err(LockError::backend("role"))?;
        match reply.first() {
            Some(Value::BulkString(role)) => Ok(String::from_utf8_lossy(role).into_owned()),
            Some(Value::SimpleString(role)) => Ok(role.clone()),
            _ => Err(LockError::Backend {
                operation: "role",
                node: Some(self.addr()),
                source: (redis::ErrorKind::Parse, "ROLE reply without a role").into(),
            }),
        }
    }

    /// The server's `maxmemory-policy`, from `INFO memory`.
    pub(crate) async fn eviction_policy(&self) -> Result<String, LockError> {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut self.con.clone())
            .await
            .map_err(LockError::backend("info"))?;
        parse_eviction_policy(&info)
    }

    /// `calls`, then `WAIT` for `rw`, as one pipeline on a `WAIT` connection of its own
    /// (see [`WaitPool`]): each call's reply, and how many replicas acknowledged them
    /// all. A pooled connection found broken (the server restarted) is dropped with the
    /// other idle ones and the pipeline sent again once on a fresh one (every call here
    /// is idempotent per token: an extend, a renewal, a keep). A pipeline cut short
    /// takes its connection with it (never pooled with a `WAIT` in flight).
    async fn replicated(
        &self,
        calls: &[ScriptCall],
        rw: ReplicaWait,
        operation: &'static str,
    ) -> Result<(Vec<Value>, u32), LockError> {
        let mut pipe = redis::pipe();
        for load in script_loads(calls) {
            pipe.add_command(load).ignore();
        }
        for call in calls {
            pipe.add_command(call.evalsha());
        }
        pipe.cmd("WAIT").arg(rw.replicas).arg(ttl_ms(rw.timeout));
        let pooled = self.wait_pool.take();
        let was_pooled = pooled.is_some();
        let mut con = match pooled {
            Some(con) => con,
            None => self.wait_connection().await?,
        };
        let mut reply = pipe.query_async::<Vec<Value>>(&mut con).await;
        if was_pooled && reply.as_ref().is_err_and(is_dropped) {
            self.wait_pool.clear();
            con = self.wait_connection().await?;
            reply = pipe.query_async(&mut con).await;
        }
        let mut replies = reply.map_err(LockError::backend(operation))?;
        self.wait_pool.put(con);
        let acked = replies.pop().ok_or_else(|| unexpected(operation, 0))?;
        let acked = decode(acked, operation)?;
        Ok((replies, acked))
    }

    /// Renews `batch` in one pipeline: on the command connection, or with `WAIT` for
    /// `rw` (see [`replicated`](Self::replicated)), each renewal then counting only
    /// where its lease's replicas acknowledged.
    async fn renew_part(
        &self,
        batch: &[Renewal<'_>],
        rw: Option<ReplicaWait>,
    ) -> Result<Vec<Renewed>, LockError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let groups = renew_groups(batch, RENEW_CHUNK);
        let calls = renew_calls(batch, &groups);
        let (replies, acked) = match rw {
            Some(rw) => {
                let (replies, acked) = self.replicated(&calls, rw, "renew").await?;
                (replies, Some(acked))
            }
            None => {
                let mut pipe = redis::pipe();
                for load in script_loads(&calls) {
                    pipe.add_command(load).ignore();
                }
                for call in &calls {
                    pipe.add_command(call.evalsha());
                }
                let replies: Vec<Value> = pipe
                    .query_async(&mut self.con.clone())
                    .await
                    .map_err(LockError::backend("renew"))?;
                (replies, None)
            }
        };
        let outcomes = decode_renewals(groups.iter().map(Vec::len), replies, self.backend);
        let outcomes = in_batch_order(batch.len(), &groups, outcomes);
        Ok(batch
            .iter()
            .zip(outcomes)
            .map(|(r, outcome)| replicated_outcome(r, outcome, acked))
            .collect())
    }

    /// An acquisition (of any kind) followed by `WAIT` for `rw.replicas`
    /// acknowledgements.
    async fn acquire_and_wait(
        &self,
        claim: &Claim<'_>,
        rw: ReplicaWait,
    ) -> Result<Attempt, LockError> {
        let call = acquire_call(claim, Publish::Channel);
        // WAIT counts the writes of its own connection and blocks it meanwhile: a
        // connection of its own. A pooled one found broken (the server restarted) is
        // dropped with the other idle ones, broken too, and the request retried once on
        // a fresh connection (the script is idempotent per token).
        let mut pipe = redis::pipe();
        pipe.add_command(call.load())
            .ignore()
            .add_command(call.evalsha())
            .cmd("WAIT")
            .arg(rw.replicas)
            .arg(ttl_ms(rw.timeout));
        //
        // Until its reply is read, the attempt is undone on this same connection if it
        // ends (cut short, cancelled, failed): see [`WaitAttempt`].
        let pooled = self.wait_pool.take();
        let was_pooled = pooled.is_some();
        let con = match pooled {
            Some(con) => con,
            None => self.wait_connection().await?,
        };
        let mut attempt = WaitAttempt::new(
            con,
            self.con.clone(),
            claim,
            (Publish::Channel, self.backend),
        );
        let mut reply = pipe.query_async::<(Value, u32)>(attempt.con()).await;
        if was_pooled && reply.as_ref().is_err_and(is_dropped) {
            self.wait_pool.clear();
            attempt.replace(self.wait_connection().await?);
            reply = pipe.query_async(attempt.con()).await;
        }
        let (reply, acked) = reply.map_err(LockError::backend("acquire"))?;
        self.wait_pool.put(attempt.finish());
        decode_acquire(reply, Some(acked))
    }
}

/// Single's extends and releases: on the connection manager, sent again once after a
/// dropped connection; with replicas to wait for, [`replicated`](SingleBackend::replicated).
impl LeaseSender for SingleBackend {
    type Con = ConnectionManager;

    const RESEND: Resend = Resend::OnceAfterDrop;

    fn command_con(&self) -> &ConnectionManager {
        &self.con
    }

    async fn send_waiting(
        &self,
        call: &ScriptCall,
        _key: &LockKey,
        rw: ReplicaWait,
        operation: &'static str,
    ) -> Result<(Value, u32), LockError> {
        let (replies, acked) = self
            .replicated(std::slice::from_ref(call), rw, operation)
            .await?;
        match <[Value; 1]>::try_from(replies) {
            Ok([reply]) => Ok((reply, acked)),
            Err(other) => Err(unexpected(operation, other.len())),
        }
    }
}

impl Store for SingleBackend {
    fn name(&self) -> &'static str {
        "single"
    }

    /// One request's bound (the connection manager's response timeout).
    fn request_timeout(&self, _ttl: Duration, _mode: Mode) -> Duration {
        self.timeouts.response
    }

    async fn acquire(&self, claim: &Claim<'_>) -> Result<Attempt, LockError> {
        let Claim {
            key,
            token,
            ttl,
            replicas,
            ..
        } = *claim;
        // Every kind `WAIT`s for its replicas (boxed: the uncontended path below does
        // not carry, and move, these futures' state).
        if let Some(rw) = replicas {
            return Box::pin(self.acquire_and_wait(claim, rw)).await;
        }
        let reply: Value = if by_script_call(claim) {
            let call = acquire_call(claim, Publish::Channel);
            Box::pin(self.resending(|| call.invoke(&self.con))).await
        } else {
            let coalesced = self.coalescing.as_ref().map(|c| (c, c.acquires.alone()));
            if let Some((c, None)) = coalesced {
                let request = AcquireRequest {
                    key: key.full().to_owned(),
                    fence: key.fence().to_owned(),
                    token,
                    ttl_ms: ttl_ms(ttl),
                };
                Box::pin(c.acquires.queue(&self.con, request)).await
            } else {
                let keys = [key.full(), key.fence()];
                let args = acquire_args(&token, ttl);
                self.resending(|| ACQUIRE.invoke(&self.con, &keys, args))
                    .await
            }
        }
        .map_err(LockError::backend("acquire"))?;
        decode_acquire(reply, None)
    }

    async fn acquire_together(
        &self,
        keys: &[&LockKey],
        token: Token,
        ttl: Duration,
    ) -> Result<Option<Together>, LockError> {
        let call = acquire_all_call(keys, token, ttl);
        let reply: Value = self
            .resending(|| call.invoke(&self.con))
            .await
            .map_err(LockError::backend("acquire"))?;
        decode_acquire_all(reply, keys.len()).map(Some)
    }

    /// True when our lock is gone because of this call: see [`release_lease`] (a 0
    /// reply after a re-send is released). A plain exclusive release made while others
    /// are in flight shares one call with them (see `coalesce`).
    async fn release(&self, lease: LeaseRef<'_>, keep: Duration) -> Result<bool, LockError> {
        // The plain exclusive release (the uncontended path) builds its request in place.
        let plain = lease.mode == Mode::Exclusive && keep.is_zero();
        let coalesced = self
            .coalescing
            .as_ref()
            .filter(|_| plain)
            .map(|c| (c, c.releases.alone()));
        if let Some((c, None)) = coalesced {
            let request = ReleaseRequest {
                key: lease.key.full().to_owned(),
                token: lease.token,
            };
            let released = Box::pin(c.releases.queue(&self.con, request))
                .await
                .and_then(|v| redis::from_redis_value::<i64>(v).map_err(Into::into))
                .map_err(LockError::backend("release"))?;
            return Ok(released == 1);
        }
        release_lease(self, lease, keep, Publish::Channel).await
    }

    /// See [`extend_lease`]: with the lease's replicas to wait for, the extend and a
    /// `WAIT` go as one pipeline on a `WAIT` connection (see
    /// [`replicated`](SingleBackend::replicated)).
    async fn extend(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<bool, LockError> {
        extend_lease(self, lease, ttl, Publish::Channel).await
    }

    /// One round trip for the whole batch: a pipeline of batched-renew scripts, led by a
    /// `SCRIPT LOAD` so a flushed script cache cannot fail it. Each chunk's reply is
    /// decoded on its own ([`chunk_outcomes`]). The renewals of leases waiting for
    /// replicas go at the same time as a pipeline of their own that ends in one `WAIT`
    /// (on a connection of its own): renewed only when acknowledged, else unknown.
    async fn renew(&self, batch: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        renew_in_parts(
            batch,
            |part, rw| async move { self.renew_part(&part, rw).await },
        )
        .await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        inspect_on(&self.con, key).await
    }

    async fn list(&self, prefix: &str, pattern: &str) -> Result<Vec<LockInfo>, LockError> {
        list_on(&self.con, prefix, pattern).await
    }

    async fn is_locked(&self, key: &LockKey) -> Result<bool, LockError> {
        exists_on(&self.con, key).await
    }

    async fn force_unlock(&self, key: &LockKey, seen: Option<Seen<'_>>) -> Result<bool, LockError> {
        force_unlock_on(&self.con, key, Publish::Channel, seen).await
    }

    async fn eviction_policies(&self) -> Result<Policies, LockError> {
        Ok(vec![(self.addr(), self.eviction_policy().await)])
    }

    async fn withdraw(&self, key: &LockKey, waiter: u64) -> Result<(), LockError> {
        withdraw_call(key, waiter, Publish::Channel)
            .invoke::<i64, _>(&self.con)
            .await
            .map(drop)
            .map_err(LockError::backend("withdraw"))
    }

    async fn subscribe(&self, key: &str, register: Register) -> Result<(), LockError> {
        self.subscriber.subscribe(key, register).await
    }

    async fn unsubscribe(&self, key: &str) -> Result<(), LockError> {
        self.subscriber.unsubscribe(key);
        Ok(())
    }

    fn listening(&self, key: &str) -> bool {
        self.subscriber.listening(key)
    }

    fn interests(&self) -> usize {
        self.subscriber.interests()
    }

    async fn settled(&self) {
        if let Some(c) = &self.coalescing {
            futures_util::future::join(c.acquires.settled(), c.releases.settled()).await;
        }
    }
}

/// One outcome per lock from the replies of a renew pipeline, chunk by chunk: a chunk
/// whose reply is missing or malformed leaves its own locks unknown.
fn decode_renewals(
    chunk_lens: impl Iterator<Item = usize>,
    replies: Vec<Value>,
    backend: &'static str,
) -> Vec<Renewed> {
    let mut replies = replies.into_iter();
    chunk_lens
        .flat_map(|len| {
            let reply = replies
                .next()
                .and_then(|r| redis::from_redis_value::<Vec<i64>>(r).ok());
            chunk_outcomes(len, reply, backend)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use redlock_testkit::{ChaosProxy, Direction, Fault, RedisServer};

    use super::*;

    use crate::token::Token;

    /// Review finding 8: the undo of an acquire + `WAIT` attempt cut short went on the
    /// command connection, not the pipeline's. When the pipeline is held up on its own
    /// connection (a frozen server reading the sockets in some order, a retransmission)
    /// that undo is applied first and finds nothing; the acquire lands after it and the
    /// key is held by nobody for the whole ttl.
    ///
    /// Deterministic: the pooled `WAIT` connection goes through a proxy that holds
    /// requests, the command connection does not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wait_acquire_cut_short_is_undone_after_it_lands() {
        let server = RedisServer::start();
        let proxy = ChaosProxy::start(server.addr()).await.unwrap();
        let timeouts = Timeouts {
            connect: Duration::from_secs(3),
            response: Duration::from_secs(1),
        };
        let backend = SingleBackend::connect(
            server.client().get_connection_info().clone(),
            timeouts,
            Wake::default(),
            "single",
        )
        .await
        .unwrap();
        let held_up = Client::open(proxy.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        backend.wait_pool.put(held_up);
        proxy.set_direction(Direction::ToServer, Fault::Blackhole);

        let key = LockKey::prefixed("lock:", "wait_undo_{1}").unwrap();
        let token = Token::random();
        let wait = ReplicaWait {
            replicas: 1,
            timeout: Duration::from_millis(100),
        };
        let ttl = Duration::from_secs(30);
        let cut = tokio::time::timeout(
            Duration::from_millis(300),
            backend.acquire(&Claim {
                key: &key,
                token,
                ttl,
                replicas: Some(wait),
                mode: Mode::Exclusive,
                intent: None,
                arrival: None,
            }),
        )
        .await;
        assert!(cut.is_err(), "the held-up attempt was not cut short");
        // What the manager does for an attempt cut short (`PendingAttempt` →
        // `Job::Abandon`): release its token on the command connection. It is applied
        // first and finds nothing.
        assert!(!backend
            .release(LeaseRef::new(&key, token, Mode::Exclusive), Duration::ZERO,)
            .await
            .unwrap());

        // The held-up acquire lands now, and whatever was sent after it on its
        // connection.
        proxy.heal();
        let exists = |server: &RedisServer| {
            server.cmd_sync(&["EXISTS", key.full()]).unwrap() == Value::Int(1)
        };
        let mut landed = false;
        for _ in 0..100 {
            if exists(&server) {
                landed = true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            !exists(&server),
            "the cut-short acquire left the key held by nobody for its ttl (landed: {landed})"
        );
        // The acquire was applied (it drew fencing token 1), then undone.
        assert_eq!(
            server.cmd_sync(&["GET", key.fence()]).unwrap(),
            Value::BulkString(b"1".to_vec()),
            "the held-up acquire never landed"
        );
        assert!(
            backend.wait_pool.take().is_none(),
            "a connection with a pipeline in flight went back to the pool"
        );
    }

    fn reply(flags: &[i64]) -> Value {
        Value::Array(flags.iter().map(|&f| Value::Int(f)).collect())
    }

    #[test]
    fn renew_short_chunk_reply_is_not_credited_to_its_neighbours() {
        let outcomes = decode_renewals(
            [2, 2].into_iter(),
            vec![reply(&[1]), reply(&[1, 0])],
            "single",
        );
        assert_eq!(
            outcomes,
            [
                Renewed::Unknown,
                Renewed::Unknown,
                Renewed::Yes,
                Renewed::Lost
            ]
        );
    }

    #[test]
    fn renew_missing_or_malformed_chunk_replies_are_unknown() {
        let outcomes = decode_renewals(
            [1, 2, 1].into_iter(),
            vec![Value::SimpleString("OK".into()), reply(&[0, 1])],
            "single",
        );
        assert_eq!(
            outcomes,
            [
                Renewed::Unknown,
                Renewed::Lost,
                Renewed::Yes,
                Renewed::Unknown
            ]
        );
    }
}
