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
use redlock::{LockError, LockManager, LockOptions};
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

/// The set's current master, as the Sentinels name it.
fn current_master(sent: &Sentinels) -> &RedisServer {
    let (_, port) = sent.current_master_addr();
    [sent.master(), sent.replica()]
        .into_iter()
        .find(|s| s.port() == port)
        .expect("the Sentinels name one of the data servers")
}

fn replicated(ttl: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl).min_replicas(1)
}

/// A lock written to a replica before it was granted survives kill -9 of the master:
/// the watchdog renews it on the promoted replica (without being rebuilt), past the
/// moment it would have expired there unrenewed, and the release deletes it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_lock_is_renewed_on_the_new_master() {
    let _one = ONE_SET.lock().unwrap_or_else(|e| e.into_inner());
    let mut sent = start();
    let locks = manager(&sent).await;
    let ttl = Duration::from_secs(8);
    let guard = locks
        .lock_with("stock_{renewed}", replicated(ttl))
        .await
        .unwrap();
    tokio::task::block_in_place(|| sent.kill_master());
    let killed = Instant::now();
    tokio::task::block_in_place(|| sent.wait_failover(Duration::from_secs(15)));
    // Unrenewed, the copy on the new master expires at most a ttl after the kill.
    tokio::time::sleep((ttl + Duration::from_secs(1)).saturating_sub(killed.elapsed())).await;
    let master = current_master(&sent);
    assert!(guard.is_held(), "the holder gave the lock up");
    assert!(
        master.exists("lock:stock_{renewed}"),
        "the lock expired on the new master: never renewed there"
    );
    assert!(master.pttl("lock:stock_{renewed}") > 0);
    guard.release().await.expect("released on the new master");
    assert!(!master.exists("lock:stock_{renewed}"));
}

/// A write the failover lost (no replica had it) is never held silently: the holder is
/// told `lost()` once its watchdog finds the new master without it, and another manager
/// (built before the failover) gets the lock there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_lost_in_the_failover_is_reported_lost() {
    let _one = ONE_SET.lock().unwrap_or_else(|e| e.into_inner());
    let mut sent = start();
    let first = manager(&sent).await;
    let second = manager(&sent).await;
    tokio::task::block_in_place(|| sent.partition_replica());
    let guard = first
        .lock_with(
            "stock_{lost}",
            LockOptions::new().ttl(Duration::from_secs(9)),
        )
        .await
        .unwrap();
    tokio::task::block_in_place(|| {
        sent.kill_master();
        sent.heal_replica();
        sent.wait_failover(Duration::from_secs(15));
    });
    assert!(
        !current_master(&sent).exists("lock:stock_{lost}"),
        "the write survived"
    );
    // The next renewal (every ttl/3 = 3 s) finds the new master without the lock.
    tokio::time::timeout(Duration::from_secs(15), guard.lost())
        .await
        .expect("the holder of a lost lock was never told");
    assert!(!guard.is_held());
    let theirs = second
        .lock_with(
            "stock_{lost}",
            LockOptions::new().wait(Duration::from_secs(10)),
        )
        .await
        .expect("the other manager follows the failover");
    assert!(current_master(&sent).exists("lock:stock_{lost}"));
    theirs.release().await.unwrap();
}

/// A waiter subscribed on the old master is subscribed again on the new one and woken
/// by the release there, long before the holder's ttl would have let it in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_a_release_on_the_new_master() {
    let _one = ONE_SET.lock().unwrap_or_else(|e| e.into_inner());
    let mut sent = start();
    let holder = manager(&sent).await;
    let waiter = manager(&sent).await;
    let guard = holder
        .lock_with("stock_{woken}", replicated(Duration::from_secs(40)))
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        let got = waiter
            .lock_with(
                "stock_{woken}",
                LockOptions::new().wait(Duration::from_secs(35)),
            )
            .await;
        (got.map(|g| g.fencing_token()), Instant::now(), waiter)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());
    tokio::task::block_in_place(|| {
        sent.kill_master();
        sent.wait_failover(Duration::from_secs(15));
    });
    let numsub = |sent: &Sentinels| {
        current_master(sent)
            .cmd_sync(&["PUBSUB", "NUMSUB", "lock:stock_{woken}"])
            .ok()
    };
    let subscribed = Some(Value::Array(vec![
        Value::BulkString(b"lock:stock_{woken}".to_vec()),
        Value::Int(1),
    ]));
    let moved =
        redlock_testkit::wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            numsub(&sent) == subscribed
        });
    assert!(
        moved,
        "the waiter never subscribed on the new master: {:?}",
        numsub(&sent)
    );
    assert!(!waiting.is_finished(), "the waiter got a lock still held");
    let released = Instant::now();
    guard.release().await.expect("released on the new master");
    let (got, at, _waiter) = waiting.await.unwrap();
    got.expect("the waiter got the lock");
    let after = at.duration_since(released);
    assert!(
        after < Duration::from_secs(5),
        "woken {after:?} after the release"
    );
}
