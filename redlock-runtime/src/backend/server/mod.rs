//! What the Redis backends share: connection timeouts, script calls, the retry after a
//! dropped connection and reply decoding, with one module per concern: acquisition
//! requests and replies ([`acquire`]), reading locks ([`inspect`]), the requests of a
//! lease: extend, release, force-unlock, withdraw ([`lease`]), batched renewals
//! ([`renew`]) and the `WAIT` connections of leases with `min_replicas` ([`wait`]).
//! The single-server and cluster backends use it, so neither imports from the other
//! (Redlock uses it through its nodes, which are single-server backends).

mod acquire;
mod inspect;
mod lease;
mod renew;
mod wait;

use std::fmt;
use std::future::Future;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManagerConfig};
use redis::{Cmd, FromRedisValue, Value};

pub(crate) use self::acquire::{
    acquire_all_call, acquire_args, acquire_by_call, acquire_call, by_script_call, decode_acquire,
    decode_acquire_all,
};
pub(crate) use self::inspect::{
    decode_scan, exists_on, inspect_all, inspect_on, list_on, lock_keys, parse_eviction_policy,
    scan_cmd, scan_glob, scan_keys_on, scan_places_on, scan_unfinished, INSPECT_BATCH,
    MAX_SCAN_STEPS,
};
pub(crate) use self::lease::{
    extend_lease, force_unlock_on, release_call, release_lease, withdraw_call, LeaseSender, Resend,
};
pub(crate) use self::renew::{
    chunk_outcomes, in_batch_order, renew_call, renew_calls, renew_groups, renew_in_parts,
    replicated_outcome,
};
pub(crate) use self::wait::{WaitAttempt, WaitPool, MAX_REPLICA_WAIT};
use crate::scripts::LuaScript;
use crate::LockError;

/// Connection timeouts for Redis backends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    /// Opening a connection, and the whole of `connect`/`build` (default 3 s).
    pub(crate) connect: Duration,
    /// One request's reply (default 1 s).
    pub(crate) response: Duration,
}

impl Timeouts {
    /// A connection manager's settings: these timeouts, and a few quick reconnects.
    pub(crate) fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect))
            .set_response_timeout(Some(self.response))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500))
    }

    /// Runs a connection step (opening connections, the first `PING`) to `node` within
    /// the connect timeout; its error names `node`.
    pub(crate) async fn connecting<T>(
        &self,
        node: impl fmt::Display,
        connect: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, LockError> {
        tokio::time::timeout(self.connect, connect)
            .await
            .map_err(|_| LockError::timed_out("connect", self.connect).on_node(&node))?
            .map_err(|e| LockError::backend("connect")(e).on_node(&node))
    }
}

/// Milliseconds for Redis, at least 1.
pub(crate) fn ttl_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Pauses between the tries of a release made in the background, while it fails (a
/// dropped connection or a failover gets a few seconds to recover before the ttl is left
/// to free the lock): the watchdog's releases, the undo of a [`WaitAttempt`] whose
/// connection failed, and the release of a coalesced grant whose caller gave up.
pub(crate) const RELEASE_RETRIES: [Duration; 3] = [
    Duration::from_millis(200),
    Duration::from_millis(800),
    Duration::from_secs(2),
];

/// One script call: which script, with which keys and arguments.
///
/// The exclusive lock's uncontended calls build their requests directly, without
/// one; the other kinds' calls, and an exclusive attempt carrying a writer's intent,
/// go through here.
pub(crate) struct ScriptCall {
    script: &'static LuaScript,
    keys: Vec<String>,
    args: Vec<Vec<u8>>,
}

impl ScriptCall {
    /// `EVALSHA`, then `EVAL` on `NOSCRIPT` (see [`LuaScript::invoke`]).
    pub(crate) async fn invoke<T, C>(&self, con: &C) -> redis::RedisResult<T>
    where
        T: redis::FromRedisValue,
        C: ConnectionLike + Clone,
    {
        self.script.invoke(con, &self.keys, &self.args).await
    }

    /// The call as `EVALSHA`, for a pipeline led by a `SCRIPT LOAD` (see [`script_loads`]).
    pub(crate) fn evalsha(&self) -> Cmd {
        self.script.evalsha(&self.keys, &self.args)
    }

    /// The call as a self-contained `EVAL` (never answered `NOSCRIPT`).
    pub(crate) fn eval(&self) -> Cmd {
        self.script.eval(&self.keys, &self.args)
    }

    /// `SCRIPT LOAD` of the call's script, to lead a pipeline of its `EVALSHA`.
    pub(crate) fn load(&self) -> Cmd {
        self.script.load()
    }
}

/// The `SCRIPT LOAD`s leading a pipeline of `calls` (one per script), so that a
/// flushed script cache cannot fail their `EVALSHA`s.
pub(crate) fn script_loads(calls: &[ScriptCall]) -> Vec<Cmd> {
    let mut scripts: Vec<&'static LuaScript> = Vec::new();
    for call in calls {
        if !scripts.iter().any(|s| std::ptr::eq(*s, call.script)) {
            scripts.push(call.script);
        }
    }
    scripts.into_iter().map(LuaScript::load).collect()
}

pub(crate) fn unexpected(operation: &'static str, replies: usize) -> LockError {
    LockError::Backend {
        operation,
        node: None,
        source: redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected number of pipeline replies",
            replies.to_string(),
        )),
    }
}

/// Decodes one reply of a pipeline.
pub(crate) fn decode<T: FromRedisValue>(
    value: Value,
    operation: &'static str,
) -> Result<T, LockError> {
    redis::from_redis_value(value).map_err(|e| LockError::backend(operation)(e.into()))
}

/// Runs a request, and once more if the connection had dropped (the connection manager
/// reconnects on that error). Safe because every script is idempotent per token.
pub(crate) async fn reconnecting<T, F, Fut>(mut request: F) -> redis::RedisResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = redis::RedisResult<T>>,
{
    match request().await {
        Err(e) if is_dropped(&e) => request().await,
        other => other,
    }
}

/// Whether the connection went away under a request (the connection manager reconnects).
pub(crate) fn is_dropped(e: &redis::RedisError) -> bool {
    e.is_connection_dropped() || e.is_unrecoverable_error()
}
