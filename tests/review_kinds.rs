//! Review of the other kinds of lock (issue 13): adversarial tests on a real server
//! behind the testkit's proxy.

use std::time::{Duration, Instant};

use redlock::{LockManager, LockOptions};
use redlock_testkit::{unique, ChaosProxy, Direction, Fault, ProxiedSet, RedisServer};

/// Regression: a `release` of a `hold_at_least` lock whose request failed (a timeout,
/// here a blackholed server) handed the retry to the background as an abandoned
/// attempt, which deletes at once: once the server answered again, the key was freed
/// long before its period was over (the at-most-once-per-period promise broken). The
/// background retry keeps the key until the period ends, as the first request would
/// have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_hold_at_least_release_is_retried_with_its_keep() {
    let server = RedisServer::start();
    let proxy = ChaosProxy::start(server.addr()).await.unwrap();
    let locks = LockManager::builder()
        .single(proxy.url())
        .response_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let other = LockManager::builder()
        .single(server.url())
        .build()
        .await
        .unwrap();
    let key = unique("hold");
    let guard = locks
        .lock_with(
            &key,
            LockOptions::new().hold_at_least(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    proxy.set(Fault::Blackhole);
    let released = guard.release().await;
    assert!(
        released.is_err(),
        "released through a blackhole: {released:?}"
    );
    proxy.set(Fault::Pass);
    // The background retries run within ~3 s (200 ms, 800 ms, 2 s apart).
    let healed = Instant::now();
    while healed.elapsed() < Duration::from_secs(4) {
        assert!(
            other.is_locked(&key).await.unwrap(),
            "freed {:?} after the server answered again, within its 60 s hold_at_least",
            healed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A reader whose `read` was cancelled while its request was on the wire (delayed by
/// the proxy), applied by the server after the future was dropped: the manager releases
/// that place in the background (the abandoned attempt carries its mode), so a writer
/// gets the key at once, not after the reader's 30 s ttl. Checked safe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_read_applied_late_is_given_back() {
    let server = RedisServer::start();
    let proxy = ChaosProxy::start(server.addr()).await.unwrap();
    let locks = LockManager::builder()
        .single(proxy.url())
        .build()
        .await
        .unwrap();
    let other = LockManager::builder()
        .single(server.url())
        .build()
        .await
        .unwrap();
    let key = unique("cread");
    // Connected (scripts loaded) before the delay.
    locks.read(&key).await.unwrap().release().await.unwrap();
    // Applied at once, its reply late: the future is dropped before it comes.
    proxy.set_direction(
        Direction::ToClient,
        Fault::Delay(Duration::from_millis(500)),
    );
    let reading = {
        let (locks, key) = (locks.clone(), key.clone());
        tokio::spawn(async move {
            tokio::time::timeout(Duration::from_millis(250), locks.read(&key)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        other.is_locked(&key).await.unwrap(),
        "the read was not applied: the test proves nothing"
    );
    assert!(
        reading.await.unwrap().is_err(),
        "the read was not cut short"
    );
    proxy.set(Fault::Pass);
    let start = Instant::now();
    let writer = other
        .write_with(&key, LockOptions::new().wait(Duration::from_secs(10)))
        .await
        .expect("the cancelled reader's place was never given back");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    writer.release().await.unwrap();
}

/// The same on Redlock for a permit: the place being tried when the `permit` future was
/// dropped is recorded under the attempt's token, and the background release frees it
/// on every node. Checked safe. (Replies 500 ms late: the probe of the places answers
/// at ~500 ms, the place is applied then and answers at ~1 s, when the permit's hold on
/// the key is sent and applied; the future is dropped at 1.25 s, both halves applied.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_redlock_permit_applied_late_is_given_back() {
    let set = ProxiedSet::start(3).await.unwrap();
    let locks = LockManager::builder()
        .redlock(set.proxy_urls())
        .redlock_node_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let other = LockManager::builder()
        .redlock(set.urls())
        .build()
        .await
        .unwrap();
    let key = unique("cpermit");
    locks
        .permit(&key, 1)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    set.set_direction_all(
        Direction::ToClient,
        Fault::Delay(Duration::from_millis(500)),
    );
    let taking = {
        let (locks, key) = (locks.clone(), key.clone());
        tokio::spawn(async move {
            tokio::time::timeout(Duration::from_millis(1250), locks.permit(&key, 1)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        other.try_permit(&key, 1).await.unwrap().is_none(),
        "the permit was not applied: the test proves nothing"
    );
    assert!(
        taking.await.unwrap().is_err(),
        "the permit was not cut short"
    );
    set.set_all(Fault::Pass);
    let start = Instant::now();
    let permit = other
        .permit_with(&key, 1, LockOptions::new().wait(Duration::from_secs(10)))
        .await
        .expect("the cancelled permit's place was never given back");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    permit.release().await.unwrap();
}

/// A `lock_all` on one server (one atomic script) cancelled with its request applied and
/// its reply late: every key is given back at once (one abandoned attempt per key), so
/// another caller takes them well before the 30 s ttl. Checked safe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_lock_all_applied_late_is_given_back() {
    let server = RedisServer::start();
    let proxy = ChaosProxy::start(server.addr()).await.unwrap();
    let locks = LockManager::builder()
        .single(proxy.url())
        .build()
        .await
        .unwrap();
    let other = LockManager::builder()
        .single(server.url())
        .build()
        .await
        .unwrap();
    let keys = [unique("call"), unique("call"), unique("call")];
    locks
        .lock_all(&keys)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.set_direction(
        Direction::ToClient,
        Fault::Delay(Duration::from_millis(500)),
    );
    let taking = {
        let (locks, keys) = (locks.clone(), keys.clone());
        tokio::spawn(async move {
            tokio::time::timeout(Duration::from_millis(250), locks.lock_all(&keys)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    for k in &keys {
        assert!(
            other.is_locked(k).await.unwrap(),
            "{k} not applied: the test proves nothing"
        );
    }
    assert!(taking.await.unwrap().is_err(), "lock_all was not cut short");
    proxy.set(Fault::Pass);
    let start = Instant::now();
    let all = other
        .lock_all_with(&keys, LockOptions::new().wait(Duration::from_secs(10)))
        .await
        .expect("the cancelled lock_all's keys were never given back");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    all.release().await.unwrap();
}
