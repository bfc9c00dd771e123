//! `LockManagerBuilder::sentinel` on a master, a replica and three Sentinels (real
//! processes): discovery at `build`, and the manager following the master through
//! failovers (kill -9, SIGSTOP past `down-after-milliseconds`, a Sentinel killed during
//! the failover) without being rebuilt.
//!
//! One Sentinel set at a time (`ONE_SET`): their timers are timing-sensitive, and this
//! machine has two cores.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::Value;
use redlock::{LockError, LockManager};
use redlock_testkit::{RedisServer, Sentinels};

static ONE_SET: Mutex<()> = Mutex::new(());

/// Starts a Sentinel set (off the async worker: it blocks for ~2-3 s).
fn start() -> Sentinels {
    tokio::task::block_in_place(Sentinels::start)
}

async fn manager(sent: &Sentinels) -> LockManager {
    LockManager::builder()
        .sentinel(sent.master_name(), sent.sentinel_urls())
        .build()
        .await
        .expect("the manager finds the master through the Sentinels")
}

fn exists(server: &RedisServer, key: &str) -> bool {
    server.cmd_sync(&["EXISTS", key]).ok() == Some(Value::Int(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_finds_the_master_and_locks_on_it() {
    let _one = ONE_SET.lock().unwrap_or_else(|e| e.into_inner());
    let sent = start();
    let locks = manager(&sent).await;
    let guard = locks.lock("stock_{1}").await.unwrap();
    assert!(exists(sent.master(), "lock:stock_{1}"));
    guard.release().await.unwrap();
    assert!(!exists(sent.master(), "lock:stock_{1}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_master_name_is_a_clear_error() {
    let _one = ONE_SET.lock().unwrap_or_else(|e| e.into_inner());
    let sent = start();
    let started = Instant::now();
    let err = LockManager::builder()
        .sentinel("no-such-master", sent.sentinel_urls())
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err}");
    assert!(err.to_string().contains("no-such-master"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}
