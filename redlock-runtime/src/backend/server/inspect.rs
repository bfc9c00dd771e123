//! Reading locks on one server or node: `inspect.lua`, `EXISTS`, and listing by `SCAN`,
//! step by step (never `KEYS`); and the `maxmemory-policy` a server reports.

use redis::aio::ConnectionLike;
use redis::{Cmd, Value};

use super::{reconnecting, ScriptCall};
use crate::info::{decode_inspect, LockInfo};
use crate::key::LockKey;
use crate::scripts::INSPECT;
use crate::LockError;

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

/// The call of `inspect.lua` for `key`.
pub(crate) fn inspect_call(key: &LockKey) -> ScriptCall {
    ScriptCall {
        script: &INSPECT,
        keys: vec![key.full().to_owned(), key.holders(), key.heartbeats()],
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
