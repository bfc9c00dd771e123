//! Redlock wake-ups and undos (review 2, finding 1's smaller defects): what a waiter's
//! subscriptions and a failed attempt cost the nodes, counted on the servers.

use std::time::{Duration, Instant};

use redlock::{LockError, LockManager, LockOptions};
use redlock_testkit::{lua_as_sent, unique, wait_until, Direction, Fault, ProxiedSet, RedisSet};

const ACQUIRE_LUA: &str = include_str!("../redlock-runtime/src/scripts/acquire.lua");

/// Waits until a first lock + release of `full` on a fresh `set`, which returned once a
/// quorum answered, has reached every node: the acquire script is cached there (the
/// first acquire loads it) and `full` is gone (the release follows the acquire on the
/// same connection). On a loaded machine the node outside the quorum gets both late,
/// and what a test then counts or faults on it must not include them (an `EVALSHA`
/// answered `NOSCRIPT` behind a blackholed reply is never sent again as `EVAL`).
fn first_round_reached_every_node(set: &RedisSet, full: &str) {
    let sha = redis::Script::new(&lua_as_sent(ACQUIRE_LUA))
        .get_hash()
        .to_owned();
    let reached = |n: usize| {
        let cached = set.node(n).cmd_sync(&["SCRIPT", "EXISTS", &sha]);
        cached == Ok(redis::Value::Array(vec![redis::Value::Int(1)])) && !set.node(n).exists(full)
    };
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(10), || {
            (0..set.len()).all(reached)
        }),
        "the first lock + release of {full} reached every node"
    );
}

/// Waits until every node of `set` grants `full` (a lock returns once a quorum did).
fn held_on_every_node(set: &RedisSet, full: &str) {
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(10), || {
            (0..set.len()).all(|n| set.node(n).exists(full))
        }),
        "{full} granted on every node"
    );
}

/// Smaller defect "extra attempt per late Redlock node": the push handler woke the head
/// on any node's first confirmation of its channel. A node confirming after `subscribe`
/// returned (here node 2, 300 ms away each way) cost the sleeping head one more full
/// attempt, for nothing: the channel was already heard. A waiter behind a holder of
/// the whole ttl makes two attempts (the one before it queued, the one after it
/// subscribed) and then sleeps until the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_late_node_confirmation_costs_the_waiter_no_extra_attempt() {
    let set = ProxiedSet::start(3).await.unwrap();
    let holder = LockManager::builder()
        .redlock(set.urls())
        .build()
        .await
        .unwrap();
    // A per-node timeout that a loaded machine does not miss on the healthy nodes (a
    // subscription that timed out would make the waiter poll).
    let waiter = LockManager::builder()
        .redlock(set.proxy_urls())
        .redlock_node_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let key = unique("late_confirm");
    waiter.lock(&key).await.unwrap().release().await.unwrap();
    first_round_reached_every_node(set.servers(), &format!("lock:{key}"));
    let guard = holder
        .lock_with(
            &key,
            LockOptions::new()
                .ttl(Duration::from_secs(30))
                .watchdog(false),
        )
        .await
        .unwrap();
    // Node 0 may grant the holder after the holder's quorum did: not the waiter's call.
    held_on_every_node(set.servers(), &format!("lock:{key}"));
    set.proxy(2).set(Fault::Delay(Duration::from_millis(300)));
    set.node(0).cmd_sync(&["CONFIG", "RESETSTAT"]).unwrap();
    let wait = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        async move {
            waiter
                .lock_with(&key, LockOptions::new().wait(Duration::from_secs(10)))
                .await
        }
    });
    // Node 2's confirmation arrives ~600 ms after the `SUBSCRIBE` was sent.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let attempts = set.node(0).command_calls(&["eval", "evalsha"]);
    guard.release().await.unwrap();
    let got = wait.await.unwrap();
    set.proxy(2).heal();
    assert!(
        got.is_ok(),
        "the waiter acquires after the release: {got:?}"
    );
    got.unwrap().release().await.unwrap();
    println!("late node confirmation: {attempts} attempts while waiting");
    assert_eq!(
        attempts, 2,
        "the waiter made {attempts} attempts in 2 s behind a 30 s holder (node 0's script calls)"
    );
}

/// Smaller defect "a failed Redlock attempt is undone twice": the backend undoes a
/// failed attempt in the background without a wake-up, and the manager released it once
/// more (`PendingAttempt` → `Job::Abandon`), with `PUBLISH`, retried by the watchdog
/// four times: node 0, which granted, received five release scripts for one failed
/// `try_lock`, and the first of them to land woke its waiters. Nodes 1 and 2 refuse
/// connections: the attempt fails with `QuorumUnavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_failed_attempt_is_undone_once_without_a_wake_up() {
    let set = ProxiedSet::start(3).await.unwrap();
    // A node bound far above any reply time here: an attempt cut by its bound (3 × the
    // node timeout, 600 ms by default) is rightly released once more by the manager, with
    // a wake-up, and a loaded machine (CI run 3) got there.
    let locks = LockManager::builder()
        .redlock(set.proxy_urls())
        .redlock_node_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let key = unique("undo_once");
    let full = format!("lock:{key}");
    locks.lock(&key).await.unwrap().release().await.unwrap();
    first_round_reached_every_node(set.servers(), &full);
    set.proxy(1).set(Fault::Refuse);
    set.proxy(2).set(Fault::Refuse);
    set.node(0).cmd_sync(&["CONFIG", "RESETSTAT"]).unwrap();
    let err = locks.try_lock(&key).await.unwrap_err();
    assert!(matches!(err, LockError::QuorumUnavailable { .. }), "{err}");
    // Past every retry of a background release (0.2 + 0.8 + 2 s, plus its rounds).
    tokio::time::sleep(Duration::from_millis(4000)).await;
    // The release script goes as `EVAL`, the acquire script as `EVALSHA`.
    let releases = set.node(0).command_calls(&["eval"]);
    let publishes = set.node(0).command_calls(&["publish"]);
    set.proxy(1).heal();
    set.proxy(2).heal();
    assert!(!set.node(0).exists(&full), "node 0's grant was undone");
    println!("failed attempt: {releases} release scripts, {publishes} PUBLISH on node 0");
    assert_eq!(
        (releases, publishes),
        (1, 0),
        "one silent undo expected on node 0 (release scripts, PUBLISH)"
    );
}

/// Guard for the above: the manager's release of a failed attempt also covered the nodes
/// whose request failed before the attempt was decided (a request may be applied and
/// its reply lost). The backend's undo covers them now. Node 1 applies the grant, its
/// reply is held and the connection reset; node 2 refuses: `QuorumUnavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_failed_attempt_leaves_nothing_on_a_node_whose_reply_was_lost() {
    let set = ProxiedSet::start(3).await.unwrap();
    // A per-node timeout long enough that node 1's failure decides the attempt (rather
    // than leaving node 1 in flight, undone once it answers).
    let locks = LockManager::builder()
        .redlock(set.proxy_urls())
        .redlock_node_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let key = unique("undo_lost_reply");
    let full = format!("lock:{key}");
    locks.lock(&key).await.unwrap().release().await.unwrap();
    first_round_reached_every_node(set.servers(), &full);
    set.proxy(2).set(Fault::Refuse);
    set.proxy(1)
        .set_direction(Direction::ToClient, Fault::Blackhole);
    let reset = async {
        // Within the 2 s per-node timeout.
        for _ in 0..100 {
            if set.node(1).exists(&full) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(set.node(1).exists(&full), "node 1 applied the grant");
        // Connections reset, the held reply discarded (replies stay held: not flushed
        // before the reset), and the retry after the reset refused.
        set.proxy(1)
            .set_direction(Direction::ToServer, Fault::Refuse);
    };
    let started = Instant::now();
    let (attempt, ()) = tokio::join!(locks.try_lock(&key), reset);
    let decided = started.elapsed();
    let err = attempt.map(|g| g.is_some()).unwrap_err();
    assert!(matches!(err, LockError::QuorumUnavailable { .. }), "{err}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    set.proxy(1).heal();
    let start = Instant::now();
    let mut gone = false;
    while start.elapsed() < Duration::from_secs(8) {
        if !set.node(0).exists(&full) && !set.node(1).exists(&full) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    set.proxy(2).heal();
    assert!(
        gone,
        "the failed attempt's grants are left: node 0 {}, node 1 {}",
        set.node(0).exists(&full),
        set.node(1).exists(&full)
    );
    println!(
        "attempt failed after {decided:?}; lost-reply grant undone within {:?}",
        start.elapsed()
    );
}

/// Subscribers on `channel` per node (`PUBSUB NUMSUB`).
fn numsub(set: &RedisSet, channel: &str) -> Vec<i64> {
    (0..set.len())
        .map(
            |n| match set.node(n).cmd_sync(&["PUBSUB", "NUMSUB", channel]) {
                Ok(redis::Value::Array(v)) => match v.get(1) {
                    Some(redis::Value::Int(k)) => *k,
                    _ => -1,
                },
                _ => -1,
            },
        )
        .collect()
}

/// Review 2, finding 1 (the margin): a waiter listening on exactly N − quorum + 1 nodes
/// hears every successful release, but only just: one more node lost and a release can
/// go unheard. Node 2's `SUBSCRIBE` fails (W's path to it refused while W subscribes);
/// W listens on nodes 0 and 1, which is enough, and sleeps: nothing in the wait loop
/// asks node 2 again. It is asked again in the background once its path is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_waiter_at_the_threshold_asks_a_missing_node_again() {
    let set = ProxiedSet::start(3).await.unwrap();
    let holder = LockManager::builder()
        .redlock(set.urls())
        .build()
        .await
        .unwrap();
    let waiter = LockManager::builder()
        .redlock(set.proxy_urls())
        .build()
        .await
        .unwrap();
    let key = unique("margin");
    let guard = holder
        .lock_with(&key, LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let channel = guard.key().to_owned();
    set.proxy(2).set(Fault::Refuse);
    let wait = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        async move {
            let r = waiter
                .lock_with(&key, LockOptions::new().wait(Duration::from_secs(15)))
                .await;
            (Instant::now(), r)
        }
    });
    // Longer than the connection manager's own reconnection attempts.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let before = numsub(set.servers(), &channel);
    assert_eq!(before, [1, 1, 0], "W listens on nodes 0 and 1");
    set.proxy(2).heal();
    let healed = Instant::now();
    let mut after = before;
    while healed.elapsed() < Duration::from_secs(8) && after != [1, 1, 1] {
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = numsub(set.servers(), &channel);
    }
    let asked = healed.elapsed();
    let released = Instant::now();
    guard.release().await.unwrap();
    let (at, got) = wait.await.unwrap();
    let took = at.saturating_duration_since(released);
    println!("missing node: {after:?} {asked:?} after its path healed");
    assert_eq!(after, [1, 1, 1], "node 2 asked again in the background");
    assert!(
        got.is_ok() && took < Duration::from_secs(1),
        "W got {:?} {took:?} after the release",
        got.map(drop)
    );
}
