//! The Lua scripts, one per operation (`scripts/*.lua`), hashed once per process.
//!
//! They are sent as `EVALSHA`; on `NOSCRIPT` (a restarted or flushed server) the same
//! call is repeated as `EVAL` on the same connection, which also caches the script.
//! Every script is idempotent per owner token, so a retried request cannot corrupt state.
//!
//! What is sent is the file without its comment lines: the server hashes an `EVAL`'s
//! whole body on every call (Redlock's releases and undos are `EVAL`s, never answered
//! `NOSCRIPT`), and the comments are two thirds of each file.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, RedisResult, ToRedisArgs};

/// A script body and its SHA1.
pub(crate) struct LuaScript {
    body: String,
    sha: String,
}

/// `SET NX PX` + fencing `INCR` (+ writer intent when held): see `scripts/acquire.lua`.
pub(crate) static ACQUIRE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("scripts/acquire.lua")));
/// A fair lock's attempt: its place in the key's queue, then (its turn) `acquire.lua`
/// itself: see `scripts/acquire_fair.lua`.
pub(crate) static ACQUIRE_FAIR: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(concat!(
        include_str!("scripts/acquire_fair.lua"),
        include_str!("scripts/acquire.lua")
    ))
});
/// Compare-token `DEL` + publish (or `PEXPIRE`, hold_at_least): see `scripts/release.lua`.
pub(crate) static RELEASE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("scripts/release.lua")));
/// Compare-token `PEXPIRE`: see `scripts/extend.lua`.
pub(crate) static ACQUIRE_BATCH: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("scripts/acquire_batch.lua")));
pub(crate) static RELEASE_BATCH: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("scripts/release_batch.lua")));
pub(crate) static EXTEND: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("scripts/extend.lua")));
/// Batched compare-token `PEXPIRE`: see `scripts/renew.lua`.
pub(crate) static RENEW: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("scripts/renew.lua")));
/// A reader's or permit holder's place (holders zset + marker): see
/// `scripts/acquire_shared.lua`.
pub(crate) static ACQUIRE_SHARED: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("scripts/acquire_shared.lua")));
/// Release of a shared place + publish: see `scripts/release_shared.lua`.
pub(crate) static RELEASE_SHARED: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("scripts/release_shared.lua")));
/// Batched renewal of shared places: see `scripts/renew_shared.lua`.
pub(crate) static RENEW_SHARED: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("scripts/renew_shared.lua")));
/// All-or-nothing `SET` of several keys of one slot + a fence each: see
/// `scripts/acquire_all.lua`.
pub(crate) static ACQUIRE_ALL: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("scripts/acquire_all.lua")));
/// Compare-token raise of the fencing counter (Redlock): see `scripts/fence_floor.lua`.
pub(crate) static FENCE_FLOOR: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("scripts/fence_floor.lua")));
/// A waiter's intent or fair place withdrawn, and whom it held back woken: see
/// `scripts/withdraw.lua`.
pub(crate) static WITHDRAW: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("scripts/withdraw.lua")));
/// A lock described for an operator, never its token: see `scripts/inspect.lua`.
pub(crate) static INSPECT: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("scripts/inspect.lua")));
/// An operator's `DEL` + publish, whoever holds the lock or only the grant shown: see
/// `scripts/force_unlock.lua`.
pub(crate) static FORCE_UNLOCK: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("scripts/force_unlock.lua")));

impl LuaScript {
    fn new(file: &'static str) -> Self {
        let body = without_comment_lines(file);
        let sha = redis::Script::new(&body).get_hash().to_owned();
        Self { body, sha }
    }

    /// `EVALSHA sha numkeys keys.. args..`.
    pub(crate) fn evalsha<K: ToRedisArgs, A: ToRedisArgs>(&self, keys: &[K], args: A) -> Cmd {
        self.call("EVALSHA", &self.sha, keys, args)
    }

    /// `EVAL body numkeys keys.. args..`.
    pub(crate) fn eval<K: ToRedisArgs, A: ToRedisArgs>(&self, keys: &[K], args: A) -> Cmd {
        self.call("EVAL", &self.body, keys, args)
    }

    /// `SCRIPT LOAD body`.
    pub(crate) fn load(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(&self.body);
        cmd
    }

    fn call<K: ToRedisArgs, A: ToRedisArgs>(
        &self,
        verb: &str,
        script: &str,
        keys: &[K],
        args: A,
    ) -> Cmd {
        // Sized for the common case (a verb, the script, a count, two keys, two
        // arguments) so building the request does not grow its buffers.
        let mut cmd = Cmd::with_capacity(8, 256 + script.len());
        cmd.arg(verb)
            .arg(script)
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        cmd
    }

    /// Runs the script: `EVALSHA`, then `EVAL` once if the server lost its script cache.
    pub(crate) async fn invoke<T, K, A, C>(&self, con: &C, keys: &[K], args: A) -> RedisResult<T>
    where
        T: FromRedisValue,
        K: ToRedisArgs,
        A: ToRedisArgs + Copy,
        C: ConnectionLike + Clone,
    {
        let mut con = con.clone();
        match self.evalsha(keys, args).query_async(&mut con).await {
            Err(e) if is_noscript(&e) => self.eval(keys, args).query_async(&mut con).await,
            other => other,
        }
    }
}

/// `file` without the lines that are only a comment (`--` first after any indentation).
/// The scripts have no long strings or long comments (`[[`), so no such line is inside
/// one.
fn without_comment_lines(file: &str) -> String {
    let mut body = String::with_capacity(file.len());
    for line in file.lines() {
        if !line.trim_start().starts_with("--") {
            body.push_str(line);
            body.push('\n');
        }
    }
    body
}

/// Whether the server answered `NOSCRIPT`.
pub(crate) fn is_noscript(e: &redis::RedisError) -> bool {
    e.code() == Some("NOSCRIPT")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_lose_only_their_comment_lines() {
        let file =
            "-- about\nlocal x = 1 -- kept: code before it\n  -- indented\nreturn '--' .. x\n";
        assert_eq!(
            without_comment_lines(file),
            "local x = 1 -- kept: code before it\nreturn '--' .. x\n"
        );
        for script in [
            &ACQUIRE,
            &RELEASE,
            &ACQUIRE_BATCH,
            &RELEASE_BATCH,
            &EXTEND,
            &RENEW,
            &ACQUIRE_SHARED,
            &RELEASE_SHARED,
            &RENEW_SHARED,
            &ACQUIRE_ALL,
            &FENCE_FLOOR,
            &INSPECT,
            &FORCE_UNLOCK,
        ] {
            // No long string or long comment for a stripped line to have been part of.
            assert!(!script.body.contains("[["), "{}", script.body);
            assert!(script
                .body
                .lines()
                .all(|l| !l.trim_start().starts_with("--")));
            assert_eq!(script.sha, redis::Script::new(&script.body).get_hash());
        }
    }
}
