//! A request in flight on a master the Sentinel backend leaves behind (a frozen master,
//! failed over) is given up when the master moves, not awaited until its own timeout:
//! its answer would not count anyway, and the caller's lock is granted by the new master
//! as soon as the manager has followed the failover.

use std::time::{Duration, Instant};

use redlock::{LockManager, LockOptions};
use redlock_testkit::Sentinels;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_flight_on_a_frozen_master_is_given_up_when_the_master_moves() {
    if !redlock_testkit::redis_available() {
        eprintln!("redis-server not found: skipping");
        return;
    }
    let mut sent = tokio::task::block_in_place(Sentinels::start);
    // A request to a frozen server waits out the response timeout: 30 s here, far
    // longer than a failover (~2-3 s with down-after-milliseconds 1000).
    let locks = LockManager::builder()
        .sentinel(sent.master_name(), sent.sentinel_urls())
        .response_timeout(Duration::from_secs(30))
        .build()
        .await
        .expect("the manager finds the master");
    let frozen = sent.master().port();
    sent.master_mut().pause();
    let paused = Instant::now();
    let guard = locks
        .lock_with(
            "report_{1}",
            LockOptions::new().wait(Duration::from_secs(60)),
        )
        .await
        .expect("granted on the new master");
    let granted = paused.elapsed();
    println!("granted {granted:?} after the master froze");
    let (_, promoted) = sent.current_master_addr();
    assert_ne!(promoted, frozen);
    assert!(
        granted < Duration::from_secs(15),
        "granted {granted:?} after the master froze: the request on the frozen master was \
         awaited to its 30 s timeout instead of being given up when the master moved"
    );
    guard.release().await.expect("release on the new master");
    sent.master_mut().resume();
}
