//! `LockOptions::min_replicas` on one primary with a replica (real processes): `WAIT`
//! after the acquire, on the same connection; too few acknowledgements release the lock
//! and fail with `ReplicasUnavailable`.

use std::time::{Duration, Instant};

use redlock::{LockError, LockManager, LockOptions};
use redlock_testkit::{wait_until, RedisServer};

/// The replica is attached and streaming: two writes in a row on the primary show up on
/// it (the first may travel in the initial snapshot; right after a diskless sync the
/// primary streams nothing until the replica's first ACK, up to a second later).
fn linked(primary: &RedisServer, replica: &RedisServer) -> bool {
    (0..2).all(|i| {
        let stamp = format!("{i} {:?}", Instant::now());
        primary
            .cmd_sync(&["SET", "replication-probe", &stamp])
            .is_ok()
            && wait_until(Duration::from_secs(2), Duration::from_millis(10), || {
                replica.cmd_sync(&["GET", "replication-probe"]).ok()
                    == Some(redis::Value::BulkString(stamp.clone().into_bytes()))
            })
    })
}

fn exists(server: &RedisServer, key: &str) -> bool {
    server.cmd_sync(&["EXISTS", key]).ok() == Some(redis::Value::Int(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_with_a_live_and_a_stopped_replica() {
    let primary = RedisServer::start();
    let mut replica = RedisServer::builder().replica_of(primary.port()).start();
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
            linked(&primary, &replica)
        }),
        "replica attached"
    );
    let locks = LockManager::connect(&primary.url()).await.unwrap();
    let opts = |n| {
        LockOptions::new()
            .ttl(Duration::from_secs(2))
            .min_replicas(n)
    };

    // Attached replica: acknowledged, and the lock is on both servers.
    let guard = locks
        .lock_with("stock_{1}", opts(1))
        .await
        .expect("one replica acknowledges");
    assert!(
        exists(&replica, "lock:stock_{1}"),
        "replicated before the guard"
    );
    guard.release().await.unwrap();

    // More replicas than exist: WAIT times out (ttl/10 = 200 ms), nothing is left.
    let err = locks.lock_with("stock_{2}", opts(2)).await.unwrap_err();
    assert!(
        matches!(
            err,
            LockError::ReplicasUnavailable {
                acked: 1,
                wanted: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(!exists(&primary, "lock:stock_{2}"));

    // Stopped replica: no acknowledgement within the WAIT bound; the lock is released
    // and the error says so.
    replica.pause();
    let start = Instant::now();
    let err = locks.lock_with("stock_{3}", opts(1)).await.unwrap_err();
    let took = start.elapsed();
    assert!(
        matches!(
            err,
            LockError::ReplicasUnavailable {
                acked: 0,
                wanted: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.is_retryable());
    assert!(
        took >= Duration::from_millis(190) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert!(!exists(&primary, "lock:stock_{3}"), "no key left behind");
    // The lock is free for the next taker at once.
    locks
        .lock_with("stock_{3}", LockOptions::new().wait(Duration::ZERO))
        .await
        .expect("free")
        .release()
        .await
        .unwrap();
    // Plain locks are not held up by the stopped replica.
    let start = Instant::now();
    locks
        .lock("other_{1}")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert!(start.elapsed() < Duration::from_millis(200));

    replica.resume();
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
            linked(&primary, &replica)
        }),
        "replica caught up"
    );
    let guard = locks
        .lock_with("stock_{3}", opts(1).wait(Duration::from_secs(5)))
        .await
        .expect("acknowledged again once the replica is back");
    guard.release().await.unwrap();
}
