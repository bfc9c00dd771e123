//! What the Redis backends share: connection timeouts, acquire-reply decoding, renewal
//! arguments and replies, the retry after a dropped connection, and the `WAIT`
//! connections of acquisitions with `min_replicas` ([`WaitPool`], [`WaitAttempt`]).
//! The single-server and cluster backends use it, so neither imports from the other
//! (Redlock uses it through its nodes, which are single-server backends).

use std::fmt;
use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManagerConfig};
use redis::{FromRedisValue, Value};

use redis::Cmd;

use super::{Attempt, Claim, Renewed, Seen, Together};
use crate::error::chain;
use crate::info::{decode_inspect, owner_suffix, unix_ms_now, LockInfo};
use crate::key::LockKey;
use crate::kind::Mode;
use crate::scripts::{
    LuaScript, ACQUIRE, ACQUIRE_ALL, ACQUIRE_SHARED, EXTEND, FORCE_UNLOCK, INSPECT, RELEASE,
    RELEASE_SHARED, RENEW, RENEW_SHARED,
};
use crate::token::Token;
use crate::wire::{LeaseRef, Publish, Renewal, ReplicaWait};
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

/// Keys a `SCAN` step looks at (`COUNT`): each step keeps Redis busy well under a
/// millisecond, so listing never blocks it the way `KEYS` would.
pub(crate) const SCAN_COUNT: usize = 1000;

/// The most `SCAN` steps one listing takes on one node (a bound, never reached: a scan
/// of a billion keys takes a million).
pub(crate) const MAX_SCAN_STEPS: usize = 1 << 24;

/// Lock keys inspected (or, on Redlock, force-released) at once, in one pipelined burst on
/// the multiplexed connection.
pub(crate) const INSPECT_BATCH: usize = 64;

/// The `SCAN MATCH` glob for `pattern` under `prefix`: the prefix with its glob
/// characters escaped, then the pattern as given (`*` when empty).
pub(crate) fn scan_glob(prefix: &str, pattern: &str) -> String {
    let mut glob = String::with_capacity(prefix.len() + pattern.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            glob.push('\\');
        }
        glob.push(c);
    }
    glob.push_str(if pattern.is_empty() { "*" } else { pattern });
    glob
}

/// `SCAN cursor MATCH glob COUNT n`, as a command.
pub(crate) fn scan_cmd(cursor: u64, glob: &str) -> Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(glob)
        .arg("COUNT")
        .arg(SCAN_COUNT);
    cmd
}

/// A `SCAN` reply: the next cursor, and the lock keys among the names (not the fencing
/// counters, holder sets, writer intents or permit places, nor names that are not
/// UTF-8 or not under `prefix`).
pub(crate) fn decode_scan(prefix: &str, reply: Value) -> Result<(u64, Vec<LockKey>), LockError> {
    let (cursor, names) = decode_scan_names(reply)?;
    Ok((cursor, lock_keys(prefix, names)))
}

/// A `SCAN` reply: the next cursor and the names.
fn decode_scan_names(reply: Value) -> Result<(u64, Vec<Vec<u8>>), LockError> {
    let (cursor, names): (String, Vec<Vec<u8>>) =
        redis::from_redis_value(reply).map_err(|e| LockError::backend("scan")(e.into()))?;
    let cursor = cursor.parse().map_err(|_| {
        LockError::backend("scan")(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "SCAN cursor is not a number",
            cursor,
        )))
    })?;
    Ok((cursor, names))
}

/// The lock keys among `names`.
pub(crate) fn lock_keys(prefix: &str, names: Vec<Vec<u8>>) -> Vec<LockKey> {
    names
        .into_iter()
        .filter_map(|name| String::from_utf8(name).ok())
        .filter(|name| name.starts_with(prefix))
        .filter_map(|name| LockKey::new(prefix, name).ok())
        .collect()
}

/// The permit places (Redlock) among `names`, each with the lock key it is a place of.
fn places(prefix: &str, names: Vec<Vec<u8>>) -> Vec<(LockKey, LockKey)> {
    names
        .into_iter()
        .filter_map(|name| String::from_utf8(name).ok())
        .filter_map(|name| LockKey::place_owner(prefix, &name))
        .map(|(owner, i)| {
            let place = owner.place(i);
            (owner, place)
        })
        .collect()
}

/// Every lock held among `keys`, inspected [`INSPECT_BATCH`] at a time on `con`.
pub(crate) async fn inspect_all<C>(con: &C, keys: &[LockKey]) -> Result<Vec<LockInfo>, LockError>
where
    C: ConnectionLike + Clone,
{
    let mut out = Vec::new();
    for batch in keys.chunks(INSPECT_BATCH) {
        let infos =
            futures_util::future::try_join_all(batch.iter().map(|k| inspect_on(con, k))).await?;
        out.extend(infos.into_iter().flatten());
    }
    Ok(out)
}

/// Every lock key under `prefix` matching `pattern` on one server (`SCAN`, step by step).
pub(crate) async fn scan_keys_on<C>(
    con: &C,
    prefix: &str,
    pattern: &str,
) -> Result<Vec<LockKey>, LockError>
where
    C: ConnectionLike + Clone,
{
    let glob = scan_glob(prefix, pattern);
    scan_steps(con, &glob, |names| async { Ok(lock_keys(prefix, names)) }).await
}

/// Every permit place (Redlock) under `prefix` whose name matches `glob` on one server,
/// with the lock key it is a place of.
pub(crate) async fn scan_places_on<C>(
    con: &C,
    prefix: &str,
    glob: &str,
) -> Result<Vec<(LockKey, LockKey)>, LockError>
where
    C: ConnectionLike + Clone,
{
    scan_steps(con, glob, |names| async { Ok(places(prefix, names)) }).await
}

/// Every lock under `prefix` matching `pattern` on one server: `SCAN` step by step,
/// each step's locks inspected before the next.
pub(crate) async fn list_on<C>(
    con: &C,
    prefix: &str,
    pattern: &str,
) -> Result<Vec<LockInfo>, LockError>
where
    C: ConnectionLike + Clone,
{
    let glob = scan_glob(prefix, pattern);
    scan_steps(con, &glob, |names| async move {
        inspect_all(con, &lock_keys(prefix, names)).await
    })
    .await
}

/// `SCAN MATCH glob` of one server, each step's names turned into results by `step`
/// before the next step is asked for.
async fn scan_steps<C, T, F, Fut>(con: &C, glob: &str, mut step: F) -> Result<Vec<T>, LockError>
where
    C: ConnectionLike + Clone,
    F: FnMut(Vec<Vec<u8>>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<T>, LockError>>,
{
    let mut out = Vec::new();
    let mut cursor = 0;
    for _ in 0..MAX_SCAN_STEPS {
        let reply: Value = scan_cmd(cursor, glob)
            .query_async(&mut con.clone())
            .await
            .map_err(LockError::backend("scan"))?;
        let (next, names) = decode_scan_names(reply)?;
        out.extend(step(names).await?);
        if next == 0 {
            return Ok(out);
        }
        cursor = next;
    }
    Err(scan_unfinished())
}

/// A scan that did not finish within [`MAX_SCAN_STEPS`].
pub(crate) fn scan_unfinished() -> LockError {
    LockError::backend("scan")(redis::RedisError::from((
        redis::ErrorKind::Client,
        "SCAN did not finish",
        format!("{MAX_SCAN_STEPS} steps"),
    )))
}

/// The `maxmemory_policy` field of an `INFO memory` reply.
pub(crate) fn parse_eviction_policy(info: &str) -> Result<String, LockError> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("maxmemory_policy:"))
        .map(str::to_owned)
        .ok_or_else(|| LockError::Backend {
            operation: "info",
            node: None,
            source: redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "INFO memory has no maxmemory_policy field",
            )),
        })
}

/// The fence of a grant, or `{pttl, holder}` when held, from `acquire.lua`.
///
/// A grant whose fence is not a positive integer that fits a `u64` is an error, never
/// token 0: the caller gives the lock back (the manager's pending-attempt release). A
/// holder that is not 16 hex digits is simply not named.
pub(crate) fn decode_acquire(reply: Value, replicas: Option<u32>) -> Result<Attempt, LockError> {
    let items = match reply {
        Value::Array(items) => items,
        fence => {
            return Ok(Attempt::Acquired {
                fence: parse_fence(&fence)?,
                replicas,
            })
        }
    };
    let mut items = items.into_iter();
    let Some(pttl) = items.next() else {
        return Err(LockError::unexpected_reply(
            "acquire",
            "an empty array".to_owned(),
        ));
    };
    let pttl: i64 =
        redis::from_redis_value(pttl).map_err(|e| LockError::backend("acquire")(e.into()))?;
    let holder = items
        .next()
        .and_then(|h| redis::from_redis_value::<String>(h).ok())
        .filter(|h| h.len() == 16)
        .and_then(|h| u64::from_str_radix(&h, 16).ok());
    Ok(Attempt::Held {
        remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
        holder,
    })
}

/// The call of `acquire_all.lua` for `keys` (every key, then every key's counter).
pub(crate) fn acquire_all_call(keys: &[&LockKey], token: Token, ttl: Duration) -> ScriptCall {
    let full = keys.iter().map(|k| k.full().to_owned());
    let fences = keys.iter().map(|k| k.fence().to_owned());
    ScriptCall {
        script: &ACQUIRE_ALL,
        keys: full.chain(fences).collect(),
        args: vec![
            token.as_bytes().to_vec(),
            ttl_ms(ttl).to_string().into_bytes(),
            owner_suffix(Mode::Exclusive).as_bytes().to_vec(),
            unix_ms_now().to_string().into_bytes(),
        ],
    }
}

/// The arguments of the plain exclusive `acquire.lua` call (no writer intent): token,
/// ttl and the owner metadata.
pub(crate) fn acquire_args(
    token: &Token,
    ttl: Duration,
) -> (&[u8], u64, &'static str, &'static str, &'static str, u64) {
    (
        token.as_bytes(),
        ttl_ms(ttl),
        owner_suffix(Mode::Exclusive),
        "",
        "",
        unix_ms_now(),
    )
}

/// The call of `inspect.lua` for `key`.
pub(crate) fn inspect_call(key: &LockKey) -> ScriptCall {
    ScriptCall {
        script: &INSPECT,
        keys: vec![key.full().to_owned(), key.holders()],
        args: Vec::new(),
    }
}

/// [`inspect_call`] on `con`, sent again once if the connection dropped (it writes
/// nothing).
pub(crate) async fn inspect_on<C>(con: &C, key: &LockKey) -> Result<Option<LockInfo>, LockError>
where
    C: ConnectionLike + Clone,
{
    let call = inspect_call(key);
    let reply: Value = reconnecting(|| call.invoke(con))
        .await
        .map_err(LockError::backend("inspect"))?;
    decode_inspect(key.full(), reply)
}

/// Whether `key` is held (by anyone, of any kind), asked on `con`.
pub(crate) async fn exists_on<C>(con: &C, key: &LockKey) -> Result<bool, LockError>
where
    C: ConnectionLike + Clone,
{
    redis::cmd("EXISTS")
        .arg(key.full())
        .query_async(&mut con.clone())
        .await
        .map_err(LockError::backend("exists"))
}

/// The withdrawal of writer `waiter`'s intent on `key`: its `ZREM`, and a wake-up by
/// `publish` for the readers it kept out.
pub(crate) fn withdraw_pipe(key: &LockKey, waiter: u64, publish: Publish) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.cmd("ZREM")
        .arg(key.intents())
        .arg(waiter)
        .cmd(publish.command())
        .arg(key.full())
        .arg("");
    pipe
}

/// `force_unlock.lua` for `key` on `con` (waking by `publish`), whoever holds it or only
/// the grant `seen`: true when something was deleted. Not sent again after a dropped
/// connection: the caller asks.
pub(crate) async fn force_unlock_on<C>(
    con: &C,
    key: &LockKey,
    publish: Publish,
    seen: Option<Seen<'_>>,
) -> Result<bool, LockError>
where
    C: ConnectionLike + Clone,
{
    let holder = seen.and_then(|s| s.holder).unwrap_or_default();
    let fence = seen.and_then(|s| s.fence).map(|f| f.to_string());
    let call = ScriptCall {
        script: &FORCE_UNLOCK,
        keys: vec![key.full().to_owned(), key.holders(), key.intents()],
        args: vec![
            publish.command().as_bytes().to_vec(),
            holder.as_bytes().to_vec(),
            fence.unwrap_or_default().into_bytes(),
        ],
    };
    let deleted: i64 = call
        .invoke(con)
        .await
        .map_err(LockError::backend("force_unlock"))?;
    Ok(deleted == 1)
}

/// An `acquire_all.lua` reply for `n` keys: `{1, fence..}` or `{0, i, pttl, holder}`.
pub(crate) fn decode_acquire_all(reply: Value, n: usize) -> Result<Together, LockError> {
    let Value::Array(items) = reply else {
        return Err(LockError::unexpected_reply(
            "acquire",
            format!("{reply:?} from acquire_all"),
        ));
    };
    let mut items = items.into_iter();
    match items.next() {
        Some(Value::Int(1)) => {
            let fences = items
                .map(|f| parse_fence(&f))
                .collect::<Result<Vec<_>, _>>()?;
            if fences.len() != n {
                return Err(LockError::unexpected_reply(
                    "acquire",
                    format!("{} fences for {n} keys", fences.len()),
                ));
            }
            Ok(Together::Acquired(fences))
        }
        Some(Value::Int(0)) => {
            let pttl = items
                .nth(1)
                .and_then(|p| redis::from_redis_value::<i64>(p).ok());
            Ok(Together::Held(
                pttl.and_then(|p| u64::try_from(p).ok())
                    .map(Duration::from_millis),
            ))
        }
        other => Err(LockError::unexpected_reply(
            "acquire",
            format!("{other:?} leading an acquire_all reply"),
        )),
    }
}

/// The fencing token in a grant: an integer, or the counter's decimal digits, exactly.
fn parse_fence(value: &Value) -> Result<u64, LockError> {
    let digits = match value {
        Value::Int(n) => {
            return u64::try_from(*n)
                .ok()
                .filter(|&fence| fence >= 1)
                .ok_or_else(|| {
                    LockError::unexpected_reply(
                        "acquire",
                        format!("fencing token {n} is not positive"),
                    )
                })
        }
        Value::BulkString(bytes) => bytes.as_slice(),
        Value::SimpleString(s) => s.as_bytes(),
        other => {
            return Err(LockError::unexpected_reply(
                "acquire",
                format!("fencing token {other:?}"),
            ))
        }
    };
    std::str::from_utf8(digits)
        .ok()
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|&fence| fence >= 1)
        .ok_or_else(|| {
            LockError::unexpected_reply(
                "acquire",
                format!(
                    "fencing token {:?} is not a positive 64-bit integer",
                    String::from_utf8_lossy(digits)
                ),
            )
        })
}

/// The longest `WAIT` a lock asks for (min(ttl/10, 1 s)).
pub(crate) const MAX_REPLICA_WAIT: Duration = Duration::from_secs(1);

/// Idle `WAIT` connections kept for reuse, per backend.
const IDLE_WAIT_CONNECTIONS: usize = 8;

/// Connections for `WAIT`, which blocks the connection it is sent on.
///
/// Each acquisition with `min_replicas` takes a connection of its own for its
/// `acquire` + `WAIT` pipeline (an idle one, or a new one), so concurrent acquisitions
/// never queue behind each other's `WAIT`; up to [`IDLE_WAIT_CONNECTIONS`] are kept for
/// reuse. Only a connection whose pipeline completed is given back: one whose request
/// was cancelled or failed may still have a reply (or a blocked `WAIT`) in flight, so it
/// is dropped.
pub(crate) struct WaitPool<C> {
    idle: Mutex<Vec<C>>,
}

impl<C> WaitPool<C> {
    pub(crate) fn new() -> Self {
        Self {
            idle: Mutex::new(Vec::new()),
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<C>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An idle connection, if any.
    pub(crate) fn take(&self) -> Option<C> {
        self.idle().pop()
    }

    /// Gives back a connection whose pipeline completed.
    pub(crate) fn put(&self, con: C) {
        let mut idle = self.idle();
        if idle.len() < IDLE_WAIT_CONNECTIONS {
            idle.push(con);
        }
    }

    /// Drops every idle connection (the server went away: they are all broken).
    pub(crate) fn clear(&self) {
        self.idle().clear();
    }
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

/// The `WAIT` connection of an acquire pipeline in flight, which undoes the attempt on
/// that same connection when it is dropped before the pipeline's reply was read.
///
/// The manager releases the token of an attempt that was cut short, cancelled or
/// failed ([`Job::Abandon`](crate::engine::Job::Abandon)), on the command connection. Requests
/// on two connections are not ordered: after a server freeze (or a retransmission on
/// one connection) that release may be applied before the acquire, find nothing, and
/// leave the key to nobody for its whole ttl. So an attempt whose reply was not read
/// sends its release on the pipeline's own connection, where the server applies it
/// after the acquire whatever happened to the acquire, and the connection is not given
/// back to the pool. If that release fails (the connection broke, which settles the
/// acquire's fate), it is retried on `fallback` after a pause, a few times.
pub(crate) struct WaitAttempt<C, F>
where
    C: ConnectionLike + Clone + Send + 'static,
    F: ConnectionLike + Clone + Send + 'static,
{
    con: Option<C>,
    fallback: F,
    /// The claim's release, as a self-contained `EVAL` (never answered `NOSCRIPT`,
    /// applied whenever it is delivered).
    undo: Cmd,
    /// The claim's key, for logs.
    key: String,
    backend: &'static str,
}

impl<C, F> WaitAttempt<C, F>
where
    C: ConnectionLike + Clone + Send + 'static,
    F: ConnectionLike + Clone + Send + 'static,
{
    /// Arms the undo of `claim`'s acquire about to be sent on `con` (its release, of
    /// whichever kind), which wakes by `publish`; `backend` names the backend in logs.
    pub(crate) fn new(
        con: C,
        fallback: F,
        claim: &Claim<'_>,
        (publish, backend): (Publish, &'static str),
    ) -> Self {
        let lease = LeaseRef::new(claim.key, claim.token, claim.mode);
        Self {
            con: Some(con),
            fallback,
            undo: release_call(lease, Duration::ZERO, publish).eval(),
            key: claim.key.full().to_owned(),
            backend,
        }
    }

    /// The connection to send the pipeline on.
    pub(crate) fn con(&mut self) -> &mut C {
        self.con.as_mut().expect("armed until finished")
    }

    /// Moves the pipeline to another connection (the first one broke: the acquire sent
    /// on it was settled when it closed).
    pub(crate) fn replace(&mut self, con: C) {
        self.con = Some(con);
    }

    /// The pipeline's reply was read: disarms, and gives the connection back.
    pub(crate) fn finish(mut self) -> C {
        self.con.take().expect("armed until finished")
    }
}

impl<C, F> Drop for WaitAttempt<C, F>
where
    C: ConnectionLike + Clone + Send + 'static,
    F: ConnectionLike + Clone + Send + 'static,
{
    fn drop(&mut self) {
        let Some(mut con) = self.con.take() else {
            return;
        };
        // No runtime: it is shutting down, and the ttl frees the lock.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (mut fallback, key, release, backend) = (
            self.fallback.clone(),
            std::mem::take(&mut self.key),
            self.undo.clone(),
            self.backend,
        );
        runtime.spawn(async move {
            let mut outcome = release.query_async::<i64>(&mut con).await;
            drop(con);
            for pause in RELEASE_RETRIES {
                let Err(e) = &outcome else {
                    return;
                };
                tracing::debug!(
                    target: "redlock",
                    key,
                    backend,
                    error = %chain(e),
                    "undo of a WAIT acquire failed"
                );
                tokio::time::sleep(pause).await;
                outcome = release.query_async::<i64>(&mut fallback).await;
            }
            if outcome.is_err() {
                tracing::debug!(
                    target: "redlock",
                    key,
                    backend,
                    "undo of a WAIT acquire failed; the ttl will free the lock"
                );
            }
        });
    }
}

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

/// An acquisition attempt: `acquire_shared.lua` for a reader or a permit,
/// `acquire.lua` with the writer's intent for an exclusive claim.
pub(crate) fn acquire_call(claim: &Claim<'_>) -> ScriptCall {
    let key = claim.key;
    let token = claim.token.as_bytes().to_vec();
    let ttl = ttl_ms(claim.ttl).to_string().into_bytes();
    match claim.mode {
        Mode::Exclusive => {
            let mut keys = vec![key.full().to_owned(), key.fence().to_owned()];
            let mut args = vec![token, ttl, owner_suffix(claim.mode).as_bytes().to_vec()];
            match claim.intent {
                Some(intent) => {
                    keys.push(key.intents());
                    args.push(intent.waiter.to_string().into_bytes());
                    args.push(ttl_ms(intent.until).to_string().into_bytes());
                }
                None => args.extend([Vec::new(), Vec::new()]),
            }
            args.push(unix_ms_now().to_string().into_bytes());
            ScriptCall {
                script: &ACQUIRE,
                keys,
                args,
            }
        }
        Mode::Read | Mode::Permit(_) => {
            let (limit, honour_intents) = match claim.mode {
                Mode::Permit(n) => (n, "0"),
                _ => (0, "1"),
            };
            ScriptCall {
                script: &ACQUIRE_SHARED,
                keys: vec![
                    key.full().to_owned(),
                    key.holders(),
                    key.fence().to_owned(),
                    key.intents(),
                ],
                args: vec![
                    token,
                    ttl,
                    claim.mode.marker().as_bytes().to_vec(),
                    limit.to_string().into_bytes(),
                    honour_intents.as_bytes().to_vec(),
                    owner_suffix(claim.mode).as_bytes().to_vec(),
                ],
            }
        }
    }
}

/// Whether an attempt goes through [`acquire_call`] (a reader, a permit, a writer with
/// an intent) rather than the plain exclusive request the uncontended path builds in
/// place.
pub(crate) fn by_script_call(claim: &Claim<'_>) -> bool {
    claim.mode.is_shared() || claim.intent.is_some()
}

/// One attempt through [`acquire_call`] on `con`, sent again once if the connection
/// dropped under it (a retry finding its own place is granted again, with a token of
/// its own).
pub(crate) async fn acquire_by_call<C>(con: &C, claim: &Claim<'_>) -> Result<Attempt, LockError>
where
    C: ConnectionLike + Clone,
{
    let call = acquire_call(claim);
    let reply: Value = reconnecting(|| call.invoke(con))
        .await
        .map_err(LockError::backend("acquire"))?;
    decode_acquire(reply, None)
}

/// A release: compare-token delete (or keep, with `keep` > 0) and a wake-up by `publish`.
pub(crate) fn release_call(lease: LeaseRef<'_>, keep: Duration, publish: Publish) -> ScriptCall {
    let key = lease.key;
    let token = lease.token.as_bytes().to_vec();
    let keep = ttl_ms_or_zero(keep).to_string().into_bytes();
    if lease.mode.is_shared() {
        ScriptCall {
            script: &RELEASE_SHARED,
            keys: vec![key.full().to_owned(), key.holders()],
            args: vec![
                token,
                publish.command().as_bytes().to_vec(),
                lease.mode.marker().as_bytes().to_vec(),
                keep,
            ],
        }
    } else {
        ScriptCall {
            script: &RELEASE,
            keys: vec![key.full().to_owned()],
            args: vec![token, publish.command().as_bytes().to_vec(), keep],
        }
    }
}

/// An extend of `lease` to `ttl`: `extend.lua` for the key alone, `renew_shared.lua` for
/// one place; either wakes by `publish` when the hold gets shorter (waiters were told
/// the later expiry).
pub(crate) fn extend_call(lease: LeaseRef<'_>, ttl: Duration, publish: Publish) -> ScriptCall {
    if !lease.mode.is_shared() {
        return ScriptCall {
            script: &EXTEND,
            keys: vec![lease.key.full().to_owned()],
            args: vec![
                lease.token.as_bytes().to_vec(),
                ttl_ms(ttl).to_string().into_bytes(),
                publish.command().as_bytes().to_vec(),
            ],
        };
    }
    let renewal = Renewal {
        key: lease.key,
        token: lease.token,
        ttl,
        mode: lease.mode,
        replicas: lease.replicas,
    };
    let mut call = renew_call(std::slice::from_ref(&renewal));
    call.args.push(publish.command().as_bytes().to_vec());
    call
}

/// Whether an [`extend_call`]'s reply says extended (`extend.lua`: 1; `renew_shared.lua`:
/// `[1]`).
pub(crate) fn decode_extended(reply: Value) -> Result<bool, LockError> {
    match reply {
        Value::Array(flags) => Ok(matches!(flags.as_slice(), [Value::Int(1)])),
        other => decode::<i64>(other, "extend").map(|flag| flag == 1),
    }
}

/// `Ok` when `acked` replicas meet what the lease of `key` waits for, else
/// [`LockError::ReplicasUnavailable`].
pub(crate) fn replicas_met(key: &LockKey, rw: ReplicaWait, acked: u32) -> Result<(), LockError> {
    if acked >= rw.replicas {
        return Ok(());
    }
    Err(LockError::ReplicasUnavailable {
        key: key.full().to_owned(),
        acked,
        wanted: rw.replicas,
    })
}

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

/// `d` in whole milliseconds, rounded up (a keep is never cut short), 0 for zero (a
/// keep of 0 deletes at once).
fn ttl_ms_or_zero(d: Duration) -> u64 {
    let partial = !d.subsec_nanos().is_multiple_of(1_000_000);
    u64::try_from(d.as_millis() + u128::from(partial)).unwrap_or(u64::MAX)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_replies_decode_to_exact_fences_or_the_holder() {
        let fence = |reply| match decode_acquire(reply, None) {
            Ok(Attempt::Acquired { fence, .. }) => Ok(fence),
            Ok(other) => panic!("not a grant: {other:?}"),
            Err(e) => Err(e.to_string()),
        };
        // Below 2^53 the script sends an integer; above, the counter's digits.
        assert_eq!(fence(Value::Int(7)), Ok(7));
        let max = Value::BulkString(u64::MAX.to_string().into_bytes());
        assert_eq!(fence(max), Ok(u64::MAX));
        for bad in [
            Value::Int(0),
            Value::Int(-3),
            Value::BulkString(b"18446744073709551616".to_vec()),
            Value::BulkString(b"12a".to_vec()),
            Value::Nil,
        ] {
            assert!(fence(bad.clone()).is_err(), "{bad:?} was taken for a fence");
        }
        let held = Value::Array(vec![
            Value::Int(1500),
            Value::BulkString(b"00000000000000ff".to_vec()),
        ]);
        match decode_acquire(held, None).unwrap() {
            Attempt::Held { remaining, holder } => {
                assert_eq!(remaining, Some(Duration::from_millis(1500)));
                assert_eq!(holder, Some(255));
            }
            other => panic!("not held: {other:?}"),
        }
    }
}
