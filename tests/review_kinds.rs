//! Review of the other kinds of lock (issue 13): adversarial tests on a real server
//! behind the testkit's proxy.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redlock::{LockManager, LockOptions};
use redlock_testkit::{ChaosProxy, Fault, RedisServer};

fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

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
        .single(&proxy.url())
        .response_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let other = LockManager::builder()
        .single(&server.url())
        .build()
        .await
        .unwrap();
    let key = unique("hold");
    let guard = locks
        .lock_with(&key, LockOptions::new().hold_at_least(Duration::from_secs(60)))
        .await
        .unwrap();
    proxy.set(Fault::Blackhole);
    let released = guard.release().await;
    assert!(released.is_err(), "released through a blackhole: {released:?}");
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
