//! `lock_all` on Redlock: one `acquire_all.lua` call per node (all keys or none there, one
//! token, a fence per key), won on a quorum with the same guarantees per key as a
//! one-key acquisition (late grants kept or undone, lost attempts undone everywhere,
//! fences vouched for by a quorum), against real redis-servers, frozen (SIGSTOP) or
//! behind a delaying proxy.
//!
//! Interleavings covered (node `n` slow or frozen, quorum 2 of 3):
//! - won on two nodes while `n`'s request is in flight; `n` applies it later: kept and
//!   released with the guard (`a_frozen_node_…`), or, landing after the release (its
//!   `EVAL` sent after `NOSCRIPT`), undone (`a_late_grant_…`);
//! - lost (a key held on a majority) while `n`'s request is in flight, `n` granting
//!   every key later: undone there (`a_lost_lock_all_…`);
//! - the future dropped while two nodes' requests are in flight: released behind them
//!   on the same connections (`a_cancelled_lock_all_…`);
//! - counters apart (a node restarted empty, or lagging): each key's token is the
//!   maximum of the deciding grants, vouched for by a quorum (`fencing_…`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock::{LockManager, LockOptions, MultiGuard};
use redlock_testkit::{lua_as_sent, wait_until, ChaosProxy, Fault, RedisServer, RedisSet};

fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Three keys of distinct slots (distinct hash tags), as `lock_all` is given them.
fn three_keys(prefix: &str) -> Vec<String> {
    (0..3)
        .map(|i| format!("{}_{{t{i}}}", unique(prefix)))
        .collect()
}

fn exists(server: &RedisServer, key: &str) -> bool {
    server.cmd_sync(&["EXISTS", key]).expect("EXISTS") == redis::Value::Int(1)
}

fn get_int(server: &RedisServer, key: &str) -> u64 {
    match server.cmd_sync(&["GET", key]).expect("GET") {
        redis::Value::BulkString(b) => String::from_utf8_lossy(&b).parse().expect("integer"),
        _ => 0,
    }
}

fn scripts_run(server: &RedisServer) -> u64 {
    server.command_calls(&["eval", "evalsha"])
}

/// Whether no key of `full` is on any node of `set`, within `bound`.
fn nothing_left(set: &RedisSet, full: &[String], bound: Duration) -> bool {
    wait_until(bound, Duration::from_millis(20), || {
        set.nodes()
            .iter()
            .all(|n| full.iter().all(|k| !exists(n, k)))
    })
}

fn prefixed(keys: &[String]) -> Vec<String> {
    keys.iter().map(|k| format!("lock:{k}")).collect()
}

/// A Redlock manager over `urls` (with `node_timeout` as its per-node timeout, if any),
/// its scripts cached on every node by one `lock_all`, as in any running system.
async fn warm_manager(
    urls: impl IntoIterator<Item = String>,
    node_timeout: Option<Duration>,
) -> LockManager {
    let mut builder = LockManager::builder().redlock(urls);
    if let Some(timeout) = node_timeout {
        builder = builder.redlock_node_timeout(timeout);
    }
    let locks = builder.build().await.unwrap();
    let warm = locks.lock_all(three_keys("warm")).await.unwrap();
    warm.release().await.unwrap();
    locks
}

/// Uncontended `lock_all` of 3 keys on a 3-node Redlock: one script call per node (it
/// took each key on its own, 3 calls per node, before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_all_is_one_script_call_per_node() {
    let set = RedisSet::start(3);
    let locks = warm_manager(set.urls(), None).await;
    let opts = || LockOptions::new().watchdog(false);
    let keys = three_keys("once");
    let full = prefixed(&keys);
    // Every node answered the warm-up's requests (the release returned on a quorum).
    assert!(nothing_left(&set, &full, Duration::from_secs(2)));
    let before: Vec<u64> = set.nodes().iter().map(scripts_run).collect();
    let guard = locks.lock_all_with(keys, opts()).await.unwrap();
    assert_eq!(guard.fencing_tokens().len(), 3);
    // The third node's request may still be in flight: every node has every key.
    assert!(wait_until(
        Duration::from_secs(2),
        Duration::from_millis(10),
        || set
            .nodes()
            .iter()
            .all(|n| full.iter().all(|k| exists(n, k)))
    ));
    let calls: Vec<u64> = set
        .nodes()
        .iter()
        .zip(&before)
        .map(|(n, b)| scripts_run(n) - b)
        .collect();
    assert_eq!(calls, [1, 1, 1], "script calls per node");
    guard.release().await.unwrap();
    assert!(nothing_left(&set, &full, Duration::from_secs(2)));
}

/// A node frozen during `lock_all`: won on the other two at once; the frozen node
/// applies its request on waking, a late grant kept as part of the lock, and the
/// guard's release removes it (no key left behind).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_node_during_lock_all_is_outvoted_and_its_late_grant_released() {
    let mut set = RedisSet::start(3);
    let locks = warm_manager(set.urls(), Some(Duration::from_secs(1))).await;
    let opts = || LockOptions::new().ttl(Duration::from_secs(10));
    let keys = three_keys("frozen");
    let full = prefixed(&keys);
    set.node_mut(2).pause();
    let start = Instant::now();
    let guard = locks.lock_all_with(keys, opts()).await;
    let took = start.elapsed();
    set.node_mut(2).resume();
    let guard = guard.expect("won on two of three");
    // Decided by the two live nodes, not by the per-node timeout (1 s).
    assert!(took < Duration::from_millis(900), "took {took:?}");
    assert!(
        wait_until(Duration::from_secs(3), Duration::from_millis(10), || {
            full.iter().all(|k| exists(set.node(2), k))
        }),
        "the frozen node applied its request on waking"
    );
    // Kept: still there well after its arrival (the lock's 10 s ttl).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        full.iter().all(|k| exists(set.node(2), k)),
        "late grant kept"
    );
    assert!(guard.is_held());
    guard.release().await.unwrap();
    assert!(
        nothing_left(&set, &full, Duration::from_secs(3)),
        "a key left behind"
    );
}

/// A late grant landing after the guard's release is undone. Node 2 is 300 ms away each
/// way and lost its script cache: its `EVALSHA` is answered `NOSCRIPT` after 600 ms, and
/// the `EVAL` then sent lands at ~900 ms, long after the release (sent at once, applied
/// there at ~300 ms, finding nothing). Without the undo, every key stays on node 2 for
/// the whole 10 s ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_grant_landing_after_the_release_is_undone() {
    let set = RedisSet::start(3);
    let proxy = ChaosProxy::start(set.node(2).addr()).await.unwrap();
    let urls = [set.node(0).url(), set.node(1).url(), proxy.url()];
    let locks = warm_manager(urls, Some(Duration::from_secs(1))).await;
    let opts = || LockOptions::new().ttl(Duration::from_secs(10));
    let keys = three_keys("late");
    let full = prefixed(&keys);
    set.node(2).cmd_sync(&["SCRIPT", "FLUSH"]).unwrap();
    proxy.set(Fault::Delay(Duration::from_millis(300)));
    let before = scripts_run(set.node(2));
    let guard = locks.lock_all_with(keys, opts()).await.unwrap();
    guard.release().await.unwrap();
    // The grant landed on node 2: its EVALSHA (NOSCRIPT), the release's 3 EVALs (one
    // per key, finding nothing), then its EVAL ...
    assert!(
        wait_until(Duration::from_secs(3), Duration::from_millis(10), || {
            scripts_run(set.node(2)) >= before + 5
        }),
        "node 2 ran the late grant"
    );
    // ... and was undone there, well before its ttl.
    assert!(
        nothing_left(&set, &full, Duration::from_secs(4)),
        "a late grant outlived the release"
    );
}

/// A lost `lock_all` (its middle key held on a majority) takes nothing anywhere, even on
/// the node whose request lands past the per-node timeout and grants every key there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_all_leaves_nothing_on_any_node() {
    let set = RedisSet::start(3);
    let proxy = ChaosProxy::start(set.node(2).addr()).await.unwrap();
    let urls = [set.node(0).url(), set.node(1).url(), proxy.url()];
    let locks = warm_manager(urls, None).await;
    let opts = || LockOptions::new().ttl(Duration::from_secs(10));
    let keys = three_keys("lost");
    let full = prefixed(&keys);
    // Someone else holds the middle key on nodes 0 and 1 (a majority), not on node 2.
    for i in 0..2 {
        set.node(i)
            .cmd_sync(&["SET", &full[1], "someone-else", "PX", "10000"])
            .unwrap();
    }
    proxy.set(Fault::Delay(Duration::from_millis(300)));
    let before = scripts_run(set.node(2));
    let got = locks.lock_all_with(keys, opts().wait(Duration::ZERO)).await;
    assert!(
        matches!(got, Err(redlock::LockError::Timeout { .. })),
        "{got:?}"
    );
    // Node 2 ran the attempt (granting every key there) ...
    assert!(
        wait_until(Duration::from_secs(3), Duration::from_millis(10), || {
            scripts_run(set.node(2)) > before
        }),
        "node 2 ran the attempt"
    );
    // ... and it was undone: nothing of ours anywhere, the holder's key untouched.
    let ours = [full[0].clone(), full[2].clone()];
    assert!(nothing_left(&set, &ours, Duration::from_secs(3)));
    assert!(wait_until(
        Duration::from_secs(3),
        Duration::from_millis(20),
        || !exists(set.node(2), &full[1])
    ));
    for i in 0..2 {
        assert!(
            exists(set.node(i), &full[1]),
            "the holder's key on node {i}"
        );
    }
}

/// Each key's fencing token is the maximum over the deciding grants, vouched for by a
/// quorum before the guard is handed out, so tokens strictly increase per key across
/// lock_alls, with counters forced apart differently per key and with nodes restarted
/// empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_per_key_across_restarts_and_lagging_counters() {
    let mut set = RedisSet::start(3);
    let locks = LockManager::builder()
        .redlock(set.urls())
        .build()
        .await
        .unwrap();
    let keys = three_keys("fences");
    let counters: Vec<String> = prefixed(&keys)
        .iter()
        .map(|k| redlock_testkit::fence_key("lock:", k))
        .collect();
    let mut last = vec![0u64; keys.len()];
    let opts = || LockOptions::new().wait(Duration::from_secs(10));
    let mut take = |guard: &MultiGuard| {
        let tokens = guard.fencing_tokens();
        for (k, (&t, l)) in tokens.iter().zip(&mut last).enumerate() {
            assert!(t > *l, "key {k}: token {t} after {l}");
            *l = t;
        }
        tokens
    };
    let g = locks.lock_all_with(keys.clone(), opts()).await.unwrap();
    take(&g);
    g.release().await.unwrap();

    // Counters apart, differently per key; any two nodes meet the maximum.
    let apart: [[u64; 3]; 3] = [[50, 50, 7], [7, 60, 60], [70, 3, 70]];
    for (c, values) in counters.iter().zip(apart) {
        for (i, v) in values.into_iter().enumerate() {
            set.node(i).cmd_sync(&["SET", c, &v.to_string()]).unwrap();
        }
    }
    let g = locks.lock_all_with(keys.clone(), opts()).await.unwrap();
    let tokens = take(&g);
    assert_eq!(tokens, [51, 61, 71], "the maximum of each key");
    for (k, c) in counters.iter().enumerate() {
        let vouching = set.nodes().iter().filter(|n| get_int(n, c) >= tokens[k]);
        assert!(vouching.count() >= 2, "key {k}: no quorum vouches");
    }
    // The laggards are raised while the lock is held.
    assert!(wait_until(
        Duration::from_secs(3),
        Duration::from_millis(10),
        || counters
            .iter()
            .zip(&tokens)
            .all(|(c, &t)| set.nodes().iter().all(|n| get_int(n, c) >= t))
    ));
    g.release().await.unwrap();

    // Nodes restart empty, one at a time (the delayed-restart rule: nothing is held).
    for restarted in 0..2 {
        set.node_mut(restarted).restart();
        let g = locks.lock_all_with(keys.clone(), opts()).await.unwrap();
        let tokens = take(&g);
        assert!(wait_until(
            Duration::from_secs(3),
            Duration::from_millis(10),
            || counters
                .iter()
                .zip(&tokens)
                .all(|(c, &t)| set.nodes().iter().all(|n| get_int(n, c) >= t))
        ));
        g.release().await.unwrap();
    }
}

/// `lock_all` dropped while two nodes' requests are in flight (300 ms away, the future
/// gone after 100 ms): what they grant when they land is released behind them, on
/// every node, for every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_lock_all_leaves_nothing_on_any_node() {
    let set = RedisSet::start(3);
    let p1 = ChaosProxy::start(set.node(1).addr()).await.unwrap();
    let p2 = ChaosProxy::start(set.node(2).addr()).await.unwrap();
    let urls = [set.node(0).url(), p1.url(), p2.url()];
    let locks = warm_manager(urls, Some(Duration::from_secs(1))).await;
    let opts = || LockOptions::new().ttl(Duration::from_secs(10));
    let keys = three_keys("cancel");
    let full = prefixed(&keys);
    let again = keys.clone();
    p1.set(Fault::Delay(Duration::from_millis(300)));
    p2.set(Fault::Delay(Duration::from_millis(300)));
    let before = scripts_run(set.node(2));
    let cut = tokio::time::timeout(
        Duration::from_millis(100),
        locks.lock_all_with(keys, opts()),
    )
    .await;
    assert!(cut.is_err(), "decided before the slow nodes answered");
    assert!(
        wait_until(Duration::from_secs(3), Duration::from_millis(10), || {
            scripts_run(set.node(2)) > before
        }),
        "node 2 ran the attempt after the cancel"
    );
    assert!(
        nothing_left(&set, &full, Duration::from_secs(4)),
        "a cancelled lock_all left a key"
    );
    // Free for anyone.
    p1.heal();
    p2.heal();
    let other = LockManager::builder()
        .redlock(set.urls())
        .build()
        .await
        .unwrap();
    let g = other
        .lock_all_with(again, LockOptions::new().wait(Duration::ZERO))
        .await
        .expect("free after the cancel");
    g.release().await.unwrap();
}

/// Two `lock_all`s naming the keys in opposite orders and single-key lockers, in loops
/// over two managers: never two holders of a key, exact counts, tokens strictly
/// increasing per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_order_lock_alls_and_single_lockers_exclude_each_other() {
    const ROUNDS: usize = 12;
    let set = RedisSet::start(3);
    let managers = [
        LockManager::builder()
            .redlock(set.urls())
            .build()
            .await
            .unwrap(),
        LockManager::builder()
            .redlock(set.urls())
            .build()
            .await
            .unwrap(),
    ];
    let a = format!("{}_{{a}}", unique("mx"));
    let b = format!("{}_{{b}}", unique("mx"));
    // Per key: holders now, holds counted (read-sleep-write: lost updates if two
    // held it at once), and the last token seen.
    #[derive(Default)]
    struct Key {
        holders: AtomicUsize,
        count: Mutex<usize>,
        last: Mutex<u64>,
    }
    let state: Arc<HashMap<String, Key>> = Arc::new(
        [&a, &b]
            .into_iter()
            .map(|k| (format!("lock:{k}"), Key::default()))
            .collect(),
    );
    let hold = |state: Arc<HashMap<String, Key>>, held: Vec<(String, u64)>| async move {
        for (k, token) in &held {
            let key = &state[k];
            assert_eq!(
                key.holders.fetch_add(1, Ordering::SeqCst),
                0,
                "two holders of {k}"
            );
            let mut last = key.last.lock().unwrap();
            assert!(*token > *last, "{k}: token {token} after {}", *last);
            *last = *token;
        }
        let counts: Vec<usize> = held
            .iter()
            .map(|(k, _)| *state[k].count.lock().unwrap())
            .collect();
        tokio::time::sleep(Duration::from_millis(2)).await;
        for ((k, _), c) in held.iter().zip(counts) {
            *state[k].count.lock().unwrap() = c + 1;
            state[k].holders.fetch_sub(1, Ordering::SeqCst);
        }
    };
    let opts = || LockOptions::new().wait(Duration::from_secs(30));
    let mut tasks = Vec::new();
    for (t, order) in [[&a, &b], [&b, &a]].into_iter().enumerate() {
        let (locks, state) = (managers[t].clone(), state.clone());
        let keys = [order[0].clone(), order[1].clone()];
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let g = locks.lock_all_with(keys.clone(), opts()).await.unwrap();
                let held = g
                    .keys()
                    .into_iter()
                    .map(str::to_owned)
                    .zip(g.fencing_tokens());
                hold(state.clone(), held.collect()).await;
                g.release().await.unwrap();
            }
        }));
    }
    for (t, key) in [&a, &b].into_iter().enumerate() {
        let (locks, state, key) = (managers[1 - t].clone(), state.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let g = locks.lock_with(&key, opts()).await.unwrap();
                hold(state.clone(), vec![(g.key().to_owned(), g.fencing_token())]).await;
                g.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    for (k, key) in state.iter() {
        assert_eq!(*key.count.lock().unwrap(), ROUNDS * 3, "{k}");
    }
    assert!(nothing_left(
        &set,
        &prefixed(&[a, b]),
        Duration::from_secs(3)
    ));
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    match server.cmd_sync(&["PTTL", key]).expect("PTTL") {
        redis::Value::Int(n) => n,
        other => panic!("PTTL replied {other:?}"),
    }
}

/// The keys of a `lock_all` share a token and `MultiGuard::extend` extends them at once:
/// the stragglers each extend leaves are settled per key, not per token (where the
/// second key's entry replaced the first's, whose straggler the next extend then
/// neither cut nor waited for). Node 2 lost its script cache and is 200 ms away each
/// way: E1 = `extend(6s)` (per-node timeout 600 ms) is decided by nodes 0 and 1, and its
/// `EVALSHA`s to node 2 get `NOSCRIPT`, their `EVAL`s to be written ~400 ms later. Node 0
/// is partitioned, the script cached on node 2 again, and E2 = `extend(60s)` confirmed by
/// nodes 1 and 2. A straggler of E1 landing after E2 would leave nodes 0 and 2 expiring
/// after 6 s while the lease believes 60 s: another client takes that key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_guard_extend_stragglers_are_settled_per_key() {
    const EXTEND_LUA: &str = include_str!("../redlock-runtime/src/scripts/extend.lua");
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
    let keys = vec![
        format!("{}_{{a}}", unique("settle")),
        format!("{}_{{b}}", unique("settle")),
    ];
    let full = prefixed(&keys);
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .watchdog(false);
    let guard = locks.lock_all_with(keys.clone(), opts).await.unwrap();
    // extend.lua cached on every node, as in any running system; then node 2 loses it.
    guard.extend(Duration::from_secs(30)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    set.node(2).cmd_sync(&["SCRIPT", "FLUSH"]).unwrap();
    p2.set(Fault::Delay(Duration::from_millis(200)));

    let t0 = Instant::now();
    let at = |ms: u64| tokio::time::sleep_until((t0 + Duration::from_millis(ms)).into());
    guard.extend(Duration::from_secs(6)).await.expect("E1");
    at(100).await;
    p0.set(Fault::Blackhole);
    let e2 = async {
        at(150).await;
        guard.extend(Duration::from_secs(60)).await
    };
    let reload = async {
        // After E1's EVALSHAs hit node 2 (t0 + 200 ms), before E2's do (≥ t0 + 350 ms).
        at(270).await;
        set.node(2)
            .cmd_sync(&["SCRIPT", "LOAD", &lua_as_sent(EXTEND_LUA)])
            .unwrap();
    };
    let (e2, ()) = tokio::join!(e2, reload);
    e2.expect("E2 confirmed by nodes 1 and 2");
    // Every request of E1 and E2 has been applied or given up by now.
    at(1500).await;
    let node2: Vec<i64> = full.iter().map(|k| pttl(set.node(2), k)).collect();
    // Past E1's 6 s on node 0 (applied at t0) and on node 2 (at ~t0 + 600 ms if resent).
    at(7000).await;
    assert!(guard.is_held());
    for key in &keys {
        let stolen = other.try_lock(key).await;
        assert!(
            matches!(stolen, Ok(None)),
            "{key} taken while held: {stolen:?} (node 2's PTTLs at 1.5 s: {node2:?})"
        );
    }
    assert!(
        node2.iter().all(|&p| p > 30_000),
        "node 2 applied E1 (6 s) after E2 (60 s): PTTLs {node2:?}"
    );
    p0.heal();
    p2.heal();
    guard.release().await.unwrap();
}
