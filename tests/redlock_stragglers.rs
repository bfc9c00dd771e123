//! Redlock requests still in flight after their call returned (review of `liveness`):
//! an extend's straggler must never land after a later extend of the same lock, and a
//! release that failed on a node before the vote was decided is retried there.

use std::time::{Duration, Instant};

use redlock::{LockManager, LockOptions};
use redlock_testkit::{lua_as_sent, unique, wait_until, ChaosProxy, Direction, Fault, RedisSet};

const EXTEND_LUA: &str = include_str!("../redlock-runtime/src/scripts/extend.lua");
const RELEASE_LUA: &str = include_str!("../redlock-runtime/src/scripts/release.lua");

async fn sleep_until(at: Instant) {
    tokio::time::sleep_until(at.into()).await;
}

/// Review finding 1 (NOSCRIPT variant). Node 2 lost its script cache and is 200 ms away
/// each way. `extend(3s)` (E1) is decided by nodes 0 and 1; its `EVALSHA` to node 2 gets
/// `NOSCRIPT`, and its `EVAL` would be written ~400 ms later. Meanwhile node 0 is
/// partitioned, the script is cached on node 2 again, and `extend(60s)` (E2) is
/// confirmed by nodes 1 and 2. If E1's `EVAL` then lands on node 2, nodes 0 and 2 expire
/// after 3 s while the lease believes 60 s: another client takes the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_extend_straggler_is_not_resent_after_a_later_extend() {
    let set = RedisSet::start(3);
    let p0 = ChaosProxy::start(set.node(0).addr()).await.unwrap();
    let p2 = ChaosProxy::start(set.node(2).addr()).await.unwrap();
    let urls = [p0.url(), set.node(1).url(), p2.url()];
    let locks = LockManager::builder()
        .redlock(urls)
        .redlock_node_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let other = LockManager::builder()
        .redlock(set.urls())
        .build()
        .await
        .unwrap();
    let key = unique("straggler");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .watchdog(false);
    let guard = locks.lock_with(&key, opts).await.unwrap();
    let full = guard.key().to_owned();
    // extend.lua cached on every node, as in any running system; then node 2 loses it.
    guard.extend(Duration::from_secs(30)).await.unwrap();
    // (Its request to node 2, if it was not answered yet, is by now.)
    tokio::time::sleep(Duration::from_millis(100)).await;
    set.node(2).cmd_sync(&["SCRIPT", "FLUSH"]).unwrap();
    p2.set(Fault::Delay(Duration::from_millis(200)));

    let t0 = Instant::now();
    guard.extend(Duration::from_secs(3)).await.expect("E1");
    assert!(
        t0.elapsed() < Duration::from_millis(150),
        "E1 decided by 0 and 1"
    );
    sleep_until(t0 + Duration::from_millis(100)).await;
    p0.set(Fault::Blackhole);
    let e2 = async {
        sleep_until(t0 + Duration::from_millis(150)).await;
        guard.extend(Duration::from_secs(60)).await
    };
    let reload = async {
        // After E1's EVALSHA hit node 2 (t0 + 200 ms), before E2's does (≥ t0 + 350 ms).
        sleep_until(t0 + Duration::from_millis(270)).await;
        set.node(2)
            .cmd_sync(&["SCRIPT", "LOAD", &lua_as_sent(EXTEND_LUA)])
            .unwrap();
    };
    let (e2, ()) = tokio::join!(e2, reload);
    e2.expect("E2 confirmed by nodes 1 and 2");
    // Every request of E1 and E2 has been applied or given up by now.
    sleep_until(t0 + Duration::from_millis(1500)).await;
    let node2 = set.node(2).pttl(&full);
    // Past E1's 3 s on node 0 (applied at t0) and on node 2 (applied at ~t0 + 600 ms
    // with the bug): both would be free.
    sleep_until(t0 + Duration::from_millis(4000)).await;
    assert!(guard.is_held());
    let stolen = other.try_lock(&key).await;
    assert!(
        matches!(stolen, Ok(None)),
        "another client took the lock while the holder still held it: {stolen:?} \
         (node 2's PTTL 1.5 s after E1 was {node2} ms)"
    );
    assert!(
        node2 > 30_000,
        "node 2 applied E1 (3 s) after E2 (60 s): PTTL {node2} ms"
    );
    p0.heal();
    p2.heal();
}

/// Review finding 1, for a kept late acquire grant. Node 2 is behind a proxy: its grant
/// (A, ttl 3 s) is applied but the reply is lost, and the connection reset; the acquire
/// was decided by nodes 0 and 1. `reconnecting` sends A again (A') once the connection
/// is back, as `EVALSHA`; node 2 lost its acquire script meanwhile, so A' becomes an
/// `EVAL` one round trip later. Node 0 is partitioned and `extend(60s)` (E) is confirmed
/// by nodes 1 and 2 in between: A's `EVAL` then runs the "own token → PEXPIRE 3 s"
/// branch after E on node 2, and nodes 0 and 2 expire after ~3 s while the lease believes
/// 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_late_grant_is_not_resent_after_an_extend() {
    const D: u64 = 300;
    let set = RedisSet::start(3);
    let p0 = ChaosProxy::start(set.node(0).addr()).await.unwrap();
    let p2 = ChaosProxy::start(set.node(2).addr()).await.unwrap();
    let urls = [p0.url(), set.node(1).url(), p2.url()];
    let locks = LockManager::builder()
        .redlock(urls)
        .redlock_node_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let other = LockManager::builder()
        .redlock(set.urls())
        .build()
        .await
        .unwrap();
    // Scripts cached on every node, as in any running system.
    locks
        .lock(&unique("warm"))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let key = unique("late_grant");
    p2.set_direction(Direction::ToClient, Fault::Blackhole);

    let t0 = Instant::now();
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(3))
        .watchdog(false);
    let guard = locks.lock_with(&key, opts).await.expect("nodes 0 and 1");
    assert!(t0.elapsed() < Duration::from_millis(100));
    let full = guard.key().to_owned();
    assert!(
        wait_until(Duration::from_secs(1), Duration::from_millis(5), || set
            .node(2)
            .exists(&full)),
        "node 2 applied A"
    );
    // Node 2 loses the acquire script (extend.lua and release.lua stay cached); the
    // reply to A is lost with the connection; the new one is D ms away each way.
    set.node(2).cmd_sync(&["SCRIPT", "FLUSH"]).unwrap();
    set.node(2)
        .cmd_sync(&["SCRIPT", "LOAD", &lua_as_sent(EXTEND_LUA)])
        .unwrap();
    set.node(2)
        .cmd_sync(&["SCRIPT", "LOAD", &lua_as_sent(RELEASE_LUA)])
        .unwrap();
    sleep_until(t0 + Duration::from_millis(60)).await;
    p2.reset_all();
    p2.set(Fault::Delay(Duration::from_millis(D)));
    sleep_until(t0 + Duration::from_millis(100)).await;
    p0.set(Fault::Blackhole);
    // The reconnect takes about one round trip (2D), then A' (EVALSHA) is sent and its
    // NOSCRIPT comes back 2D later: E is sent in between.
    sleep_until(t0 + Duration::from_millis(60 + 2 * D + D)).await;
    guard
        .extend(Duration::from_secs(60))
        .await
        .expect("E confirmed by nodes 1 and 2");
    sleep_until(t0 + Duration::from_millis(60 + 6 * D + 400)).await;
    let node2 = set.node(2).pttl(&full);
    // Past 3 s on node 0 (A at t0) and on node 2 (A' EVAL at ~t0 + 60 ms + 5D, with
    // the bug): both would be free.
    sleep_until(t0 + Duration::from_millis(60 + 5 * D + 3000 + 300)).await;
    assert!(guard.is_held());
    let stolen = other.try_lock(&key).await;
    assert!(
        matches!(stolen, Ok(None)),
        "another client took the lock while the holder still held it: {stolen:?} \
         (node 2's PTTL after E was {node2} ms)"
    );
    assert!(
        node2 > 30_000,
        "node 2 applied A' (3 s) after E (60 s): PTTL {node2} ms"
    );
    p0.heal();
    p2.heal();
}

/// Review finding 4: a node whose release failed before the vote was decided (its
/// command connection was just killed: the request fails at once) is retried in the
/// background, as the module doc promises, not left holding the key for its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_release_retries_a_node_that_failed_before_the_vote() {
    let set = RedisSet::start(3);
    let locks = LockManager::builder()
        .redlock(set.urls())
        .build()
        .await
        .unwrap();
    let key = unique("release_retry");
    let mut left_behind = 0;
    for _ in 0..5 {
        let guard = locks
            .lock_with(&key, LockOptions::new().ttl(Duration::from_secs(30)))
            .await
            .unwrap();
        let full = guard.key().to_owned();
        set.node(0)
            .cmd_sync(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"])
            .unwrap();
        // Let the client see the connection gone, so the release fails at once there.
        tokio::time::sleep(Duration::from_millis(50)).await;
        guard.release().await.expect("released on nodes 1 and 2");
        if !wait_until(Duration::from_secs(3), Duration::from_millis(20), || {
            !set.node(0).exists(&full)
        }) {
            left_behind += 1;
            set.node(0).cmd_sync(&["DEL", &full]).unwrap();
        }
    }
    assert_eq!(left_behind, 0, "the key stayed on node 0 after release");
}

/// Review finding 6: H holds nodes 0 and 1; node 2 has a stale key of someone else, and
/// node 1 answers the waiter later than node 2. The waiter's attempt is decided (lost)
/// by H(0) and stale(2) alone, which look like a split vote: it must not re-poll every
/// few tens of milliseconds for as long as H holds the lock (it waits for node 1's
/// answer, which shows H's quorum, then for H's release or expiry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_majority_holder_is_seen_behind_a_slow_node() {
    let set = RedisSet::start(3);
    let p1 = ChaosProxy::start(set.node(1).addr()).await.unwrap();
    let holder = LockManager::builder()
        .redlock(set.urls())
        .build()
        .await
        .unwrap();
    let waiter = LockManager::builder()
        .redlock([set.node(0).url(), p1.url(), set.node(2).url()])
        .build()
        .await
        .unwrap();
    let key = unique("split");
    let guard = holder
        .lock_with(&key, LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let full = guard.key().to_owned();
    // Node 2: someone else's stale key (a crashed client's partial grant).
    set.node(2)
        .cmd_sync(&["SET", &full, "stale", "PX", "30000"])
        .unwrap();
    p1.set(Fault::Delay(Duration::from_millis(10)));
    let before = set.node(0).command_calls(&["eval", "evalsha"]);
    let started = Instant::now();
    let wait = tokio::spawn({
        let key = key.clone();
        async move {
            waiter
                .lock_with(&key, LockOptions::new().wait(Duration::from_secs(5)))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let polls = set.node(0).command_calls(&["eval", "evalsha"]) - before;
    guard.release().await.unwrap();
    let won = wait
        .await
        .unwrap()
        .expect("the waiter gets the lock once H releases");
    assert!(started.elapsed() < Duration::from_millis(2500));
    assert!(
        polls <= 6,
        "the waiter re-polled {polls} times in 1.5 s while H held a quorum"
    );
    won.release().await.unwrap();
    p1.heal();
}

/// Issue 27: a late grant that the release there deleted was undone all the same, one
/// more script call (an `EVAL` that finds nothing) per late node on every quick lock +
/// release: Redlock-5 spent 12 script calls where 10 do. Node 4 is 50 ms away each way,
/// so its grant lands after the release was sent behind it on the same connection, and
/// that release deletes it: node 4 now sees an acquire and a release per lock, no undo.
/// (A late grant that no release deleted is still undone: `redlock_late_grant_is_not_resent_after_an_extend`,
/// `release_reaches_a_node_whose_reply_was_late`, the nemesis.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_late_grant_deleted_by_the_release_is_not_undone() {
    let set = RedisSet::start(5);
    let proxy = ChaosProxy::start(set.node(4).addr()).await.unwrap();
    let mut urls = set.urls();
    urls[4] = proxy.url();
    let locks = LockManager::builder().redlock(&urls).build().await.unwrap();
    let key = unique("late_deleted");
    // Scripts cached on every node, as in any running system.
    locks.lock(&key).await.unwrap().release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set(Fault::Delay(Duration::from_millis(50)));
    let scripts = || set.node(4).command_calls(&["eval", "evalsha"]);
    let before = scripts();
    let mut full = String::new();
    for _ in 0..3 {
        let guard = locks.lock(&key).await.unwrap();
        full = guard.key().to_owned();
        guard.release().await.unwrap();
    }
    // Every late answer (and any undo it would send) is in by then.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        scripts() - before,
        6,
        "an acquire and a release per lock, no undo"
    );
    for node in set.nodes() {
        assert!(!node.exists(&full), "released everywhere");
    }
}
