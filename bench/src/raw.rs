//! The hand-written baselines: what a careful user writes with redis-rs alone.
//!
//! `SET key token NX PX ttl` to acquire and an `EVALSHA` compare-and-delete to release, on
//! one multiplexed connection with `TCP_NODELAY` on (as the library sets it). The polling
//! waiter retries `SET NX` after a fixed sleep.

use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::io::tcp::TcpSettings;
use redis::IntoConnectionInfo;

const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

pub type Res<T> = Result<T, String>;

pub fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// A multiplexed connection with `TCP_NODELAY`.
pub async fn connect(url: &str) -> Res<MultiplexedConnection> {
    let info = url
        .into_connection_info()
        .map_err(err)?
        .set_tcp_settings(TcpSettings::default().set_nodelay(true));
    let client = redis::Client::open(info).map_err(err)?;
    client.get_multiplexed_async_connection().await.map_err(err)
}

/// 16 random bytes, like the library's owner token.
pub fn token() -> [u8; 16] {
    let mut t = [0u8; 16];
    getrandom::fill(&mut t).expect("the OS random source");
    t
}

/// Raw redis-rs lock + compare-and-delete release.
#[derive(Clone)]
pub struct Raw {
    con: MultiplexedConnection,
    sha: String,
}

pub struct RawHeld {
    key: String,
    token: [u8; 16],
}

impl Raw {
    pub async fn connect(url: &str) -> Res<Self> {
        let mut con = connect(url).await?;
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(RELEASE)
            .query_async(&mut con)
            .await
            .map_err(err)?;
        Ok(Self { con, sha })
    }

    /// One `SET NX PX`: the lock, or `None` when someone holds it.
    pub async fn try_lock(&self, key: &str, ttl: Duration) -> Res<Option<RawHeld>> {
        let token = token();
        let ok: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(&token[..])
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .query_async(&mut self.con.clone())
            .await
            .map_err(err)?;
        Ok(ok.map(|_| RawHeld {
            key: key.to_owned(),
            token,
        }))
    }

    /// What a lock taken some other way (with `token`, on `key`) is released as.
    pub fn held(&self, key: &str, token: [u8; 16]) -> RawHeld {
        RawHeld {
            key: key.to_owned(),
            token,
        }
    }

    /// Compare-and-delete by `EVALSHA`; true when it was still ours.
    pub async fn release(&self, held: RawHeld) -> Res<bool> {
        let n: i64 = redis::cmd("EVALSHA")
            .arg(&self.sha)
            .arg(1)
            .arg(&held.key)
            .arg(&held.token[..])
            .query_async(&mut self.con.clone())
            .await
            .map_err(err)?;
        Ok(n == 1)
    }

    /// Uncontended lock + release; an error if the key was taken.
    pub async fn lock_release(&self, key: &str, ttl: Duration) -> Res<()> {
        let held = self
            .try_lock(key, ttl)
            .await?
            .ok_or_else(|| format!("raw: {key} unexpectedly held"))?;
        if self.release(held).await? {
            Ok(())
        } else {
            Err(format!("raw: {key} was lost"))
        }
    }

    /// The naive polling waiter: `SET NX`, else sleep `poll` and retry.
    pub async fn lock_polling(&self, key: &str, ttl: Duration, poll: Duration) -> Res<RawHeld> {
        loop {
            if let Some(held) = self.try_lock(key, ttl).await? {
                return Ok(held);
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// The median of `n` sequential `SET` round trips: the unit of `handoff_vs_rtt`.
    pub async fn set_rtt(&self, n: usize) -> Res<Duration> {
        let mut con = self.con.clone();
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            redis::cmd("SET")
                .arg("bench:rtt")
                .arg("x")
                .exec_async(&mut con)
                .await
                .map_err(err)?;
            v.push(t.elapsed());
        }
        v.sort();
        Ok(v[v.len() / 2])
    }
}
