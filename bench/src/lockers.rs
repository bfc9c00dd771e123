//! Every implementation under test behind one enum (no boxing: each arm is a direct call),
//! and the closed-loop runner for uncontended lock + release.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock::LockManager;
use tokio::task::JoinSet;

use crate::cpu::{proc_cpu, self_cpu};
use crate::raw::{err, Raw, Res};

/// The ttl every implementation asks for in the lock + release loops.
pub const TTL: Duration = Duration::from_secs(30);

pub const RSLOCK: &str = "rslock 0.10.0";
pub const ARL: &str = "async-redis-lock 0.4.0";

/// One implementation, connected.
pub enum Locker {
    Raw(Raw),
    /// The same raw lock + release on several servers at once (the machine's floor for
    /// Redlock: every node's SET NX in parallel, then every node's compare-and-delete).
    RawParallel(Vec<Raw>),
    Redlock(LockManager),
    /// `lock_all` of three keys (the key with three suffixes) + release.
    RedlockAll3(LockManager),
    Rslock(rslock::LockManager),
    Arl(async_redis_lock::Locker),
}

impl Locker {
    /// Acquires `key` (free) and releases it, waiting for both replies.
    pub async fn lock_release(&self, key: &str) -> Res<()> {
        match self {
            Self::Raw(r) => r.lock_release(key, TTL).await,
            Self::RawParallel(nodes) => {
                let held =
                    futures_util::future::join_all(nodes.iter().map(|r| r.try_lock(key, TTL)))
                        .await;
                let mut releases = Vec::with_capacity(nodes.len());
                for (r, held) in nodes.iter().zip(held) {
                    let held = held?.ok_or_else(|| format!("raw: {key} unexpectedly held"))?;
                    releases.push(r.release(held));
                }
                for released in futures_util::future::join_all(releases).await {
                    if !released? {
                        return Err(format!("raw: {key} was lost"));
                    }
                }
                Ok(())
            }
            Self::Redlock(m) => {
                let guard = m.lock(key).await.map_err(err)?;
                guard.release().await.map_err(err)
            }
            Self::RedlockAll3(m) => {
                let keys = [1, 2, 3].map(|k| format!("{key}:{k}"));
                let guard = m.lock_all(keys).await.map_err(err)?;
                guard.release().await.map_err(err)
            }
            Self::Rslock(m) => {
                let lock = m.lock(key, TTL).await.map_err(err)?;
                lock.release().await;
                Ok(())
            }
            Self::Arl(l) => {
                let lock = l.acquire(key).await.map_err(err)?;
                lock.release().await.map_err(err)
            }
        }
    }

    /// The key namespace of this implementation (the library adds its own `lock:`).
    pub fn key(&self, tag: &str, i: usize) -> String {
        match self {
            Self::Raw(_) => format!("raw:{tag}_{{{i}}}"),
            Self::RawParallel(_) => format!("rawp:{tag}_{{{i}}}"),
            Self::Redlock(_) | Self::RedlockAll3(_) => format!("{tag}_{{{i}}}"),
            Self::Rslock(_) => format!("rsl:{tag}_{{{i}}}"),
            Self::Arl(_) => format!("arl:{tag}_{{{i}}}"),
        }
    }
}

/// One closed-loop slice: throughput and the CPU time spent per operation, in this
/// process and in the servers.
#[derive(Debug, Clone, Copy)]
pub struct Slice {
    pub ops: u64,
    pub secs: f64,
    pub client_us_per_op: f64,
    pub server_us_per_op: f64,
}

/// `tasks` tasks, each locking and releasing its own key for `dur`. `servers` are the pids
/// whose CPU time is charged to the operations.
pub async fn closed_loop(
    locker: &Arc<Locker>,
    tag: &str,
    tasks: usize,
    dur: Duration,
    servers: &[u32],
) -> Res<Slice> {
    let server_cpu = || servers.iter().map(|&p| proc_cpu(p)).sum::<Duration>();
    let (c0, s0) = (self_cpu(), server_cpu());
    let start = Instant::now();
    let deadline = start + dur;
    let mut set = JoinSet::new();
    for i in 0..tasks {
        let locker = locker.clone();
        let key = locker.key(tag, i);
        set.spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                locker.lock_release(&key).await?;
                n += 1;
            }
            Ok::<u64, String>(n)
        });
    }
    let mut total = 0;
    while let Some(r) = set.join_next().await {
        total += r.map_err(err)??;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let per_op = |d: Duration| d.as_secs_f64() * 1e6 / total.max(1) as f64;
    Ok(Slice {
        ops: total,
        secs: elapsed,
        client_us_per_op: per_op(self_cpu().saturating_sub(c0)),
        server_us_per_op: per_op(server_cpu().saturating_sub(s0)),
    })
}
