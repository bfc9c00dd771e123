//! Regression tests for the interleavings of issue 11 that broke the safety invariants
//! (DESIGN.md, "Safety invariants"), each named after its bug and driven against real
//! redis-server processes through a delaying, blackholing or resetting proxy.
//!
//! Each test checks belief against the server: when another client has been granted the
//! lock, the first holder's `is_held()` (read after that grant returned) must be false.

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redlock::{LockGuard, LockManager, LockOptions};
use redlock_testkit::{ChaosProxy, Direction, Fault, RedisServer, RedisSet};

/// A `LockManager` through `proxy`, with every script already cached on the server (as
/// in any running system: a first `EVALSHA` answered `NOSCRIPT` would add a round trip).
async fn through(proxy: &ChaosProxy) -> LockManager {
    let locks = LockManager::builder()
        .single(&proxy.url())
        .build()
        .await
        .unwrap();
    let warm = locks.lock("warm_{0}").await.unwrap();
    warm.extend(Duration::from_secs(30)).await.unwrap();
    warm.release().await.unwrap();
    locks
}

/// Takes `key` with `locks` as soon as it is free (one attempt every 10 ms, up to
/// `bound`); `None` if it never was.
async fn take_when_free(locks: &LockManager, key: &str, bound: Duration) -> Option<LockGuard> {
    let until = Instant::now() + bound;
    while Instant::now() < until {
        if let Some(guard) = locks.try_lock(key).await.unwrap_or(None) {
            return Some(guard);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// The drift allowance the library subtracts from every ttl.
fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// Finding 1: the watchdog built a renewal (ttl 3 s) while an `extend(6 s)` was in flight;
/// Redis applied EXTEND then RENEW, the client booked the renewal with the 6 s ttl, and a
/// cut-off holder believed it held the lock after the server had given it to another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_racing_a_watchdog_renewal() {
    let server = RedisServer::start();
    let proxy = ChaosProxy::start(server.addr()).await.unwrap();
    let holder = through(&proxy).await;
    let other = LockManager::connect(&server.url()).await.unwrap();
    let key = "race_{1}";
    proxy.set(Fault::Delay(Duration::from_millis(150)));
    let ttl = Duration::from_secs(3);
    let guard = holder
        .lock_with(key, LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    // The acquire was sent at valid_until − (ttl − drift); the watchdog renews ttl/3 later.
    let sent = guard.valid_until() - (ttl - drift(ttl));
    let renewal = sent + ttl / 3;
    // Extend just before the renewal: the renewal is built while the extend is in flight.
    tokio::time::sleep_until((renewal - Duration::from_millis(50)).into()).await;
    guard.extend(Duration::from_secs(6)).await.unwrap();
    // Let the renewal's reply come back, then cut the holder off.
    tokio::time::sleep(Duration::from_millis(400)).await;
    proxy.set(Fault::Blackhole);
    let taken = take_when_free(&other, key, Duration::from_secs(10))
        .await
        .expect("the server frees the lock once the holder is cut off");
    assert!(
        !guard.is_held(),
        "the cut-off holder still believes it holds the lock ({:?} left) after another client got it",
        guard.valid_until().saturating_duration_since(Instant::now())
    );
    drop(taken);
}

/// Finding 2: a shrinking `extend(500 ms)` on a 30 s lock, cancelled by a 50 ms timeout,
/// was applied by the server but left the local deadline 30 s long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shrinking_extend_cancelled_by_a_timeout() {
    let server = RedisServer::start();
    let proxy = ChaosProxy::start(server.addr()).await.unwrap();
    let holder = through(&proxy).await;
    let other = LockManager::connect(&server.url()).await.unwrap();
    let key = "shrink_{1}";
    let guard = holder
        .lock_with(key, LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    proxy.set(Fault::Delay(Duration::from_millis(100)));
    let started = Instant::now();
    let cancelled = tokio::time::timeout(
        Duration::from_millis(50),
        guard.extend(Duration::from_millis(500)),
    )
    .await;
    assert!(
        cancelled.is_err(),
        "the extend was cut short by the timeout"
    );
    // The EXTEND reaches the server 100 ms after it was sent; then cut the holder off.
    tokio::time::sleep_until((started + Duration::from_millis(150)).into()).await;
    proxy.set(Fault::Blackhole);
    let taken = take_when_free(&other, key, Duration::from_secs(5))
        .await
        .expect("the shrunk lock expires on the server");
    assert!(
        !guard.is_held(),
        "the holder still believes it holds the lock ({:?} left) after another client got it",
        guard
            .valid_until()
            .saturating_duration_since(Instant::now())
    );
    drop(taken);
}

/// Finding 3: an attempt's undo was lost on one node; the next attempt reused the token,
/// counted that node's old grant (with its old expiry) as fresh, and another client got a
/// quorum (that node and one A never had) once it expired while A still believed it held
/// the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_stale_grant_after_a_lost_undo() {
    let set = RedisSet::start(3);
    let p1 = ChaosProxy::start(set.node(0).addr()).await.unwrap();
    let urls = set.urls();
    let a = LockManager::builder()
        .redlock([p1.url(), urls[1].clone(), urls[2].clone()])
        .build()
        .await
        .unwrap();
    let d = LockManager::builder().redlock(&urls).build().await.unwrap();
    // Scripts cached on every node, as in any running system.
    a.lock("warm_{1}").await.unwrap().release().await.unwrap();
    let key = "stale_{1}";
    let full = format!("lock:{key}");
    // Another client holds node 3 for 1.5 s.
    let mut n3 = set
        .node(2)
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(&full)
        .arg("someone else")
        .arg("PX")
        .arg(1500)
        .query_async(&mut n3)
        .await
        .unwrap();
    // Node 1 answers late: A's first attempt is granted there (at ~120 ms) after A
    // stopped waiting for it (the per-node timeout is 200 ms), and A undoes the attempt.
    p1.set(Fault::Delay(Duration::from_millis(120)));
    let t0 = Instant::now();
    let ttl = Duration::from_secs(3);
    let acquiring = tokio::spawn({
        let a = a.clone();
        async move {
            a.lock_with(
                key,
                LockOptions::new()
                    .ttl(ttl)
                    .wait(Duration::from_secs(8))
                    .watchdog(false),
            )
            .await
        }
    });
    // The undo for node 1, sent at ~200 ms, is still in the proxy: node 1 drops A's
    // connection, so it never arrives.
    tokio::time::sleep_until((t0 + Duration::from_millis(250)).into()).await;
    let mut n1 = set
        .node(0)
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut n1)
        .await
        .unwrap();
    p1.heal();
    let guard = acquiring.await.unwrap().expect("A gets the lock");
    // A renews nothing (no watchdog): D gets a quorum at the latest when A's ttl ends.
    let taken = take_when_free(&d, key, Duration::from_secs(6))
        .await
        .expect("D gets the lock once A's grants expire");
    assert!(
        !guard.is_held(),
        "A believes it holds the lock ({:?} left) while D got a quorum",
        guard
            .valid_until()
            .saturating_duration_since(Instant::now())
    );
    drop(taken);
}

/// Finding 8: `release()` whose reply was lost (the connection reset after Redis applied
/// it) was retried, found the key gone, and reported `Lost` although it had released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_a_lost_reply_reports_released() {
    let server = RedisServer::start();
    let proxy = ChaosProxy::start(server.addr()).await.unwrap();
    let holder = through(&proxy).await;
    let key = "lost_reply_{1}";
    let guard = holder.lock(key).await.unwrap();
    proxy.set(Fault::Delay(Duration::from_millis(200)));
    let release = tokio::spawn(guard.release());
    // The request reaches Redis at 200 ms; its reply would come back at 400 ms.
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set(Fault::Pass);
    proxy.reset_all();
    let outcome = release.await.unwrap();
    assert!(outcome.is_ok(), "released, but reported {outcome:?}");
    let mut raw = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let exists: bool = raw.exists(format!("lock:{key}")).await.unwrap();
    assert!(!exists);
}

/// Finding 8: a waiter cancelled while its `SUBSCRIBE` was in flight left the channel
/// subscribed on the server with nobody to unsubscribe it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_subscribe_leaks_no_subscription() {
    let server = RedisServer::start();
    let proxy = ChaosProxy::start(server.addr()).await.unwrap();
    let holder = LockManager::connect(&server.url()).await.unwrap();
    let waiter = through(&proxy).await;
    let key = "sub_leak_{1}";
    let full = format!("lock:{key}");
    let _held = holder.lock(key).await.unwrap();
    proxy.set(Fault::Delay(Duration::from_millis(300)));
    // First attempt: replies at ~600 ms; the SUBSCRIBE then reaches Redis at ~900 ms.
    let waited = tokio::time::timeout(
        Duration::from_millis(750),
        waiter.lock_with(key, LockOptions::new().wait(Duration::from_secs(5))),
    )
    .await;
    assert!(waited.is_err(), "cancelled while subscribing");
    proxy.heal();
    let mut raw = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let subscribed = || {
        let mut raw = raw.clone();
        let full = full.clone();
        async move {
            let (_, n): (String, u64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&full)
                .query_async::<Vec<(String, u64)>>(&mut raw)
                .await
                .unwrap()
                .pop()
                .unwrap();
            n
        }
    };
    let until = Instant::now() + Duration::from_secs(3);
    let mut n = subscribed().await;
    while n > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
        n = subscribed().await;
    }
    assert_eq!(n, 0, "the channel stayed subscribed after the waiter left");
    let _: () = raw.ping().await.unwrap();
}

/// Invariant 5: `wait` bounds the whole `lock()` call, plus at most one request. The
/// subscription a waiter makes before its next attempt was not bounded by the wait, so a
/// slow server made `lock()` take the wait plus two more round trips.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_wait_bounds_the_subscription() {
    let server = RedisServer::start();
    let proxy = ChaosProxy::start(server.addr()).await.unwrap();
    let holder = LockManager::connect(&server.url()).await.unwrap();
    let waiter = through(&proxy).await;
    let key = "slow_sub_{1}";
    let _held = holder.lock(key).await.unwrap();
    // Every round trip through the proxy takes 600 ms.
    proxy.set(Fault::Delay(Duration::from_millis(300)));
    let started = Instant::now();
    let outcome = waiter
        .lock_with(key, LockOptions::new().wait(Duration::from_millis(200)))
        .await;
    let took = started.elapsed();
    assert!(
        matches!(outcome, Err(redlock::LockError::Timeout { .. })),
        "{outcome:?}"
    );
    // The first attempt (one round trip) already outlasts the wait; nothing may follow.
    assert!(
        took < Duration::from_millis(1100),
        "lock() took {took:?} with a 200 ms wait and 600 ms round trips"
    );
}

/// Found by the nemesis of issue 13 (single server, a connection cut while two permits
/// of one key were being acquired): a permit acquire whose reply was lost (the connection
/// reset after Redis applied it) was sent again with the same token, found its place, and
/// read the counter back: the token another permit had got meanwhile. Two holders of the
/// key, one fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_permit_after_a_lost_reply_gets_a_token_of_its_own() {
    let server = RedisServer::start();
    let proxy = ChaosProxy::start(server.addr()).await.unwrap();
    let cut_off = through(&proxy).await;
    // The shared-acquire script cached too (a NOSCRIPT reply would be held below).
    cut_off
        .permit("warm_{0}", 1)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let direct = LockManager::builder()
        .single(&server.url())
        .build()
        .await
        .unwrap();
    let key = "retried_permit_{1}";
    let mut raw = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();

    proxy.set_direction(Direction::ToClient, Fault::Blackhole);
    let first = tokio::spawn(async move { cut_off.permit(key, 3).await });
    // Applied on the server, its reply held by the proxy (bounded: 2 s).
    let holders = format!("lock:{key}:~holders");
    let until = Instant::now() + Duration::from_secs(2);
    while raw.zcard::<_, u64>(&holders).await.unwrap() == 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(raw.zcard::<_, u64>(&holders).await.unwrap(), 1);
    let other = direct.permit(key, 3).await.unwrap();
    // The reply lost with its connection (the reset processed well before the heal,
    // which would deliver held bytes): the client sends the acquire again.
    proxy.reset_all();
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.heal();
    let first = first.await.unwrap().unwrap();
    assert_eq!(raw.zcard::<_, u64>(&holders).await.unwrap(), 2);
    let (first, other) = (first.fencing_token(), other.fencing_token());
    assert_ne!(first, other, "two permit holders share a fencing token");
    assert!(
        first > other,
        "the retry's token {first} is not above {other}"
    );
}
