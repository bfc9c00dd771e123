//! The other kinds of lock (read/write, permits, `lock_all`, `hold_at_least`) on Redlock
//! over 5 independent redis-server processes: a binary of their own, so that their load
//! does not share a process with the Redlock latency and straggler tests.

mod conformance;

use std::time::Duration;

use conformance::backends::Redlock;
use redlock::{LockError, LockManager, LockOptions};
use redlock_testkit::RedisSet;

kinds_tests!(Redlock::new());

#[tokio::test(flavor = "current_thread")]
async fn writer_waiting_behind_a_writer_keeps_new_readers_out() {
    conformance::kinds::writer_waiting_behind_a_writer_keeps_new_readers_out(&Redlock::new()).await;
}

/// Review finding 8: a ttl no Redlock grant can be valid for (at or below the drift
/// allowance, 1 % of the ttl + 2 ms) made a free key read as held: `try_lock` said
/// `None`, `lock` waited its whole wait for `Timeout`. It is refused up front, with the
/// minimum named, at every entry point: each kind, `lock_all`, `extend`, the default
/// ttl and the macro's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_below_the_redlock_minimum_is_refused_up_front() {
    let set = RedisSet::start(3);
    let locks = LockManager::builder()
        .redlock(set.urls())
        .build()
        .await
        .unwrap();
    let key = conformance::unique("short-ttl");
    let two = Duration::from_millis(2);
    let short = LockOptions::new().ttl(two).wait(Duration::from_millis(300));
    let refused = |what: &str, result: Result<(), LockError>| match result {
        Err(LockError::InvalidOption { reason }) => {
            assert!(reason.contains("5ms"), "{what}: {reason}")
        }
        other => panic!("{what}: {other:?}"),
    };
    refused(
        "lock_with",
        locks.lock_with(&key, short.clone()).await.map(drop),
    );
    refused(
        "read_with",
        locks.read_with(&key, short.clone()).await.map(drop),
    );
    refused(
        "write_with",
        locks.write_with(&key, short.clone()).await.map(drop),
    );
    let permit = locks.permit_with(&key, 2, short.clone()).await.map(drop);
    refused("permit_with", permit);
    let both = locks.lock_all_with([key.as_str(), "other"], short.clone());
    refused("lock_all_with", both.await.map(drop));
    refused("the macro's ttl", macro_ttl(&locks, &key).await);
    let guard = locks.lock(&key).await.unwrap();
    refused("extend", guard.extend(two).await);
    assert!(guard.is_held());
    guard.release().await.unwrap();
    let built = LockManager::builder()
        .redlock(set.urls())
        .default_ttl(two)
        .build()
        .await
        .map(drop);
    refused("default_ttl", built);
    // The minimum itself is grantable.
    let five = LockOptions::new()
        .ttl(Duration::from_millis(5))
        .watchdog(false);
    let guard = locks.lock_with(&key, five).await;
    assert!(guard.is_ok(), "{guard:?}");
}

#[redlock::distributed_lock(key = "<key>", manager = locks, ttl = "2ms", wait = "300ms")]
async fn macro_ttl(locks: &LockManager, key: &str) -> Result<(), LockError> {
    Ok(())
}
