//! The two backends every test binary can use: one real redis-server per harness, and
//! the in-memory store.

use redis::AsyncCommands;
use redlock::{LockManager, LockManagerBuilder, LockOptions};
use redlock_testkit::{RedisServer, RedisSet};

use super::Harness;

/// One redis-server per test, stopped on drop.
pub struct Single {
    pub server: RedisServer,
}

impl Single {
    pub fn new() -> Self {
        Self {
            server: RedisServer::start(),
        }
    }

    pub async fn raw(&self) -> redis::aio::MultiplexedConnection {
        self.server.connection().await
    }

    pub async fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.raw().await.keys("*").await.unwrap();
        keys.sort();
        keys
    }
}

impl Harness for Single {
    fn builder(&self) -> LockManagerBuilder {
        LockManager::builder().single(self.server.url())
    }

    async fn delete(&self, full_key: &str) {
        let n: i64 = self.raw().await.del(full_key).await.unwrap();
        assert_eq!(n, 1, "{full_key} was not there to delete");
    }

    async fn steal(&self, full_key: &str) {
        let _: () = self
            .raw()
            .await
            .set_ex(full_key, "someone-else", 60)
            .await
            .unwrap();
    }

    async fn exists(&self, full_key: &str) -> bool {
        self.raw().await.exists(full_key).await.unwrap()
    }
}

/// The in-memory backend: the managers of one process share one store.
pub struct Memory;

impl Memory {
    /// A manager without a prefix, to act on full keys.
    pub async fn admin() -> LockManager {
        LockManager::builder()
            .in_memory()
            .prefix("")
            .build()
            .await
            .unwrap()
    }
}

impl Harness for Memory {
    fn builder(&self) -> LockManagerBuilder {
        LockManager::builder().in_memory()
    }

    async fn delete(&self, full_key: &str) {
        let deleted = Self::admin().await.force_unlock(full_key).await.unwrap();
        assert!(deleted, "{full_key} was not there to delete");
    }

    async fn steal(&self, full_key: &str) {
        let thief = Self::admin().await;
        thief.force_unlock(full_key).await.unwrap();
        let guard = thief
            .lock_with(full_key, LockOptions::new().watchdog(false))
            .await
            .unwrap();
        std::mem::forget(guard);
    }

    async fn exists(&self, full_key: &str) -> bool {
        Self::admin().await.is_locked(full_key).await.unwrap()
    }
}

/// `PUBSUB NUMSUB` of each channel on one server.
pub fn numsub(server: &RedisServer, channels: &[String]) -> Vec<i64> {
    let mut args = vec!["PUBSUB", "NUMSUB"];
    args.extend(channels.iter().map(String::as_str));
    match server.cmd_sync(&args) {
        Ok(redis::Value::Array(items)) => items
            .chunks(2)
            .map(|pair| match pair.get(1) {
                Some(redis::Value::Int(n)) => *n,
                _ => 0,
            })
            .collect(),
        Ok(redis::Value::Map(pairs)) => pairs
            .iter()
            .map(|(_, n)| match n {
                redis::Value::Int(n) => *n,
                _ => 0,
            })
            .collect(),
        _ => vec![0],
    }
}

/// Kills every pub/sub client of one server; how many were killed.
pub fn kill_pubsub(server: &RedisServer) -> usize {
    match server.cmd_sync(&["CLIENT", "KILL", "TYPE", "pubsub"]) {
        Ok(redis::Value::Int(n)) => usize::try_from(n).unwrap_or(0),
        _ => 0,
    }
}

/// Five independent masters, stopped on drop.
pub struct Redlock {
    pub set: RedisSet,
}

impl Redlock {
    pub fn new() -> Self {
        Self {
            set: RedisSet::start(5),
        }
    }

    pub fn managers(&self) -> LockManagerBuilder {
        LockManager::builder().redlock(self.set.urls())
    }
}

impl Harness for Redlock {
    fn builder(&self) -> LockManagerBuilder {
        self.managers()
    }

    async fn delete(&self, full_key: &str) {
        let mut deleted = 0;
        for node in self.set.nodes() {
            let n: i64 = node.connection().await.del(full_key).await.unwrap();
            deleted += n;
        }
        assert!(deleted >= 3, "the lock was on {deleted} nodes");
    }

    async fn steal(&self, full_key: &str) {
        for node in self.set.nodes() {
            let _: () = node
                .connection()
                .await
                .set_ex(full_key, "someone-else", 60)
                .await
                .unwrap();
        }
    }

    async fn exists(&self, full_key: &str) -> bool {
        for node in self.set.nodes() {
            let there: bool = node.connection().await.exists(full_key).await.unwrap();
            if there {
                return true;
            }
        }
        false
    }
}
