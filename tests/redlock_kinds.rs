//! The other kinds of lock (read/write, permits, `lock_all`, `hold_at_least`) on Redlock
//! over 5 independent redis-server processes: a binary of their own, so that their load
//! does not share a process with the Redlock latency and straggler tests.

mod conformance;

use std::time::{Duration, Instant};

use conformance::backends::Redlock;
use redlock::{LockError, LockManager, LockOptions};
use redlock_testkit::{Fault, ProxiedSet, RedisSet};

kinds_tests!(Redlock::new());
fair_tests!(Redlock::new());
rules_tests!(Redlock::new());

#[tokio::test(flavor = "current_thread")]
async fn writer_waiting_behind_a_writer_keeps_new_readers_out() {
    conformance::kinds::writer_waiting_behind_a_writer_keeps_new_readers_out(&Redlock::new()).await;
}

/// Review finding 6: with every place of a permit taken, `try_permit` is `Ok(None)` and
/// `permit_with` waits until a release wakes it, whatever the count. Here 40 places and
/// every node 10 ms away each way: tried one after the other, the places took more than
/// the attempt's bound (3 per-node timeouts, 600 ms), and the call failed with
/// `Backend "acquire" timed out`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_set_of_permits_is_none_and_waits_for_a_release_at_any_count() {
    const N: u32 = 40;
    let set = ProxiedSet::start(3).await.unwrap();
    let holders = LockManager::builder()
        .redlock(set.urls())
        .build()
        .await
        .unwrap();
    let far = LockManager::builder()
        .redlock(set.proxy_urls())
        .build()
        .await
        .unwrap();
    set.set_all(Fault::Delay(Duration::from_millis(10)));
    let key = conformance::unique("full-permits");
    let mut held = Vec::new();
    for _ in 0..N {
        held.push(holders.permit(&key, N).await.expect("a free permit"));
    }
    let started = Instant::now();
    let none = far.try_permit(&key, N).await;
    let took = started.elapsed();
    assert!(matches!(none, Ok(None)), "{none:?} after {took:?}");
    let waiter = {
        let (far, key) = (far.clone(), key.clone());
        tokio::spawn(async move {
            let waiting = LockOptions::new().wait(Duration::from_secs(10));
            let guard = far.permit_with(&key, N, waiting).await;
            (Instant::now(), guard)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiter.is_finished(), "a permit of a full set");
    let released = Instant::now();
    held.pop().unwrap().release().await.unwrap();
    let (at, guard) = waiter.await.unwrap();
    let guard = guard.expect("the released permit");
    let after = at.duration_since(released);
    assert!(
        after < Duration::from_secs(2),
        "woken {after:?} after the release"
    );
    guard.release().await.unwrap();
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
