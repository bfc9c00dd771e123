//! A fenced resource: a counter in Redis that checks fencing tokens on every access.
//!
//! This is the storage-side check of Kleppmann's "How to do distributed locking": the
//! resource keeps the highest fencing token it has seen and refuses anyone older. A
//! critical section uses it in two steps:
//!
//! 1. [`begin`](Resource::begin)`(token)`: accepted only if `token` is *greater* than every
//!    token seen so far (lower or equal: rejected); the resource then remembers `token`
//!    and returns the counter's value.
//! 2. [`commit`](Resource::commit)`(token, value)`: accepted only if `token` is still the
//!    highest seen, i.e. nobody newer has begun since; sets the counter.
//!
//! So a holder that lost its lock (paused, cut off, or its lock lost in a failover) and
//! writes late is rejected as soon as a newer holder has begun, and the read-modify-write
//! of two overlapping holders cannot both land: the counter stays exact. Each accepted
//! commit is journaled server-side, so the count is known even when the process that sent
//! it was killed before it could tell anyone.
//!
//! The resource lives on its own Redis server, apart from the lock servers the tests break.

use std::sync::LazyLock;

use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, RedisResult, Script};

/// Begin a section: `{1, value}` when the token is newer than all seen, else `{0, highest}`.
static BEGIN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
-- KEYS[1] highest token seen, KEYS[2] value, KEYS[3] stats hash; ARGV[1] token
local t = tonumber(ARGV[1])
local seen = tonumber(redis.call('GET', KEYS[1]) or '0')
if t == nil or t <= seen then
  redis.call('HINCRBY', KEYS[3], 'begin_rejected', 1)
  return {0, seen}
end
redis.call('SET', KEYS[1], ARGV[1])
return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
",
    )
});

/// Commit a section: `1` when the token is still the highest seen, else `0`.
static COMMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
-- KEYS[1] highest token seen, KEYS[2] value, KEYS[3] stats hash, KEYS[4] journal
-- ARGV[1] token, ARGV[2] new value
local seen = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) ~= seen then
  redis.call('HINCRBY', KEYS[3], 'commit_rejected', 1)
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('RPUSH', KEYS[4], ARGV[1])
return 1
",
    )
});

/// The answer to [`Resource::begin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begin {
    /// The token is the newest; the counter's value.
    Granted(u64),
    /// A token at least as new was seen before (the highest one).
    Rejected(u64),
}

/// What the resource went through, from its own records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// The counter.
    pub value: u64,
    /// The highest token seen.
    pub highest: u64,
    /// The tokens of the accepted commits, in the order they were applied.
    pub accepted: Vec<u64>,
    /// Rejected `begin`s.
    pub begin_rejected: u64,
    /// Rejected `commit`s.
    pub commit_rejected: u64,
}

impl State {
    /// The counter equals the number of accepted commits (each adds one), and accepted
    /// commits carry non-decreasing tokens (strictly increasing across sections).
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.value != self.accepted.len() as u64 {
            out.push(format!(
                "counter is {} but {} commits were accepted (lost update)",
                self.value,
                self.accepted.len()
            ));
        }
        for w in self.accepted.windows(2) {
            if w[1] < w[0] {
                out.push(format!("commit of token {} after token {}", w[1], w[0]));
            }
        }
        out
    }
}

/// A fenced counter named `name` on one Redis server.
#[derive(Clone)]
pub struct Resource {
    con: MultiplexedConnection,
    highest: String,
    value: String,
    stats: String,
    journal: String,
}

impl std::fmt::Debug for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resource")
            .field("value", &self.value)
            .finish_non_exhaustive()
    }
}

impl Resource {
    /// Connects to the resource server at `url`.
    ///
    /// # Errors
    /// When the server cannot be reached.
    pub async fn open(url: &str, name: &str) -> RedisResult<Self> {
        let con = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        Ok(Self {
            con,
            highest: format!("res:{{{name}}}:highest"),
            value: format!("res:{{{name}}}:value"),
            stats: format!("res:{{{name}}}:stats"),
            journal: format!("res:{{{name}}}:journal"),
        })
    }

    /// Starts a section with `token` (see the module docs).
    ///
    /// # Errors
    /// Redis errors.
    pub async fn begin(&self, token: u64) -> RedisResult<Begin> {
        let (ok, n): (i64, u64) = BEGIN
            .key(&self.highest)
            .key(&self.value)
            .key(&self.stats)
            .arg(token)
            .invoke_async(&mut self.con.clone())
            .await?;
        Ok(if ok == 1 {
            Begin::Granted(n)
        } else {
            Begin::Rejected(n)
        })
    }

    /// Ends a section with `token` by writing `value`; false when rejected.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn commit(&self, token: u64, value: u64) -> RedisResult<bool> {
        COMMIT
            .key(&self.highest)
            .key(&self.value)
            .key(&self.stats)
            .key(&self.journal)
            .arg(token)
            .arg(value)
            .invoke_async(&mut self.con.clone())
            .await
    }

    /// The resource's own record of what happened.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn state(&self) -> RedisResult<State> {
        let mut con = self.con.clone();
        let value: Option<u64> = con.get(&self.value).await?;
        let highest: Option<u64> = con.get(&self.highest).await?;
        let accepted: Vec<u64> = con.lrange(&self.journal, 0, -1).await?;
        let begin_rejected: Option<u64> = con.hget(&self.stats, "begin_rejected").await?;
        let commit_rejected: Option<u64> = con.hget(&self.stats, "commit_rejected").await?;
        Ok(State {
            value: value.unwrap_or(0),
            highest: highest.unwrap_or(0),
            accepted,
            begin_rejected: begin_rejected.unwrap_or(0),
            commit_rejected: commit_rejected.unwrap_or(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_problems() {
        let ok = State {
            value: 2,
            highest: 5,
            accepted: vec![3, 5],
            ..State::default()
        };
        assert!(ok.problems().is_empty());
        let lost = State {
            value: 1,
            accepted: vec![3, 5],
            ..State::default()
        };
        assert_eq!(lost.problems().len(), 1);
        let order = State {
            value: 2,
            accepted: vec![5, 3],
            ..State::default()
        };
        assert_eq!(order.problems().len(), 1);
    }
}
