//! Second review of the liveness merge (issue 12): adversarial tests on real servers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlock::{LockGuard, LockManager, LockOptions};
use redlock_testkit::{unique, ChaosProxy, Direction, Fault, ProxiedSet, RedisSet};

/// A small xorshift generator (no rand dependency in the tests).
struct Rng(u64);

impl Rng {
    fn seeded(salt: u64) -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        Rng((t ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// Who holds the lock, as the guards see it.
#[derive(Default)]
struct Ledger {
    holders: HashMap<u64, Arc<LockGuard>>,
    last_fence: u64,
    violations: Vec<String>,
    acquisitions: u64,
}

impl Ledger {
    fn check_exclusive(&mut self, when: &str) {
        let held: Vec<(u64, u64)> = self
            .holders
            .iter()
            .filter(|(_, g)| g.is_held())
            .map(|(&id, g)| (id, g.fencing_token()))
            .collect();
        if held.len() > 1 {
            self.violations.push(format!(
                "{when}: {} guards held at once: {held:?}",
                held.len()
            ));
        }
    }
}

/// Redlock under random chaos on every client–node path (delays, partitions that heal,
/// replies lost with a connection reset, resets, script cache flushes): at no instant
/// may two guards both report `is_held()`, and a guard still held when it is handed
/// out must carry a larger fencing token than every guard handed out before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_chaos_keeps_mutual_exclusion_and_fencing_order() {
    let set = RedisSet::start(3);
    let mut proxies = Vec::new();
    let mut managers = Vec::new();
    for _ in 0..2 {
        let mut urls = Vec::new();
        for n in 0..3 {
            let p = ChaosProxy::start(set.node(n).addr()).await.unwrap();
            urls.push(p.url());
            proxies.push(Arc::new(p));
        }
        managers.push(
            LockManager::builder()
                .redlock(urls)
                .response_timeout(Duration::from_millis(400))
                .build()
                .await
                .unwrap(),
        );
    }
    let key = unique("chaos");
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let ids = Arc::new(AtomicU64::new(0));
    let run_for = Duration::from_secs(
        std::env::var("REVIEW2_CHAOS_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10),
    );

    // The chaos: one fault at a time on a random path, healed shortly after.
    let chaos = {
        let proxies = proxies.clone();
        let stop = stop.clone();
        let urls = set.urls();
        let pids: Vec<u32> = (0..3).map(|n| set.node(n).pid()).collect();
        tokio::spawn(async move {
            let mut rng = Rng::seeded(7);
            let signal = |pid: u32, sig: &str| {
                let _ = std::process::Command::new("kill")
                    .args([sig, &pid.to_string()])
                    .status();
            };
            while !stop.load(Ordering::Relaxed) {
                let p = &proxies[rng.below(proxies.len() as u64) as usize];
                match rng.below(7) {
                    0 => p.set(Fault::Delay(rng.ms(5, 80))),
                    1 => p.set(Fault::Blackhole),
                    2 => p.set_direction(Direction::ToClient, Fault::Blackhole),
                    3 => {
                        p.set_direction(Direction::ToClient, Fault::Blackhole);
                        tokio::time::sleep(rng.ms(5, 60)).await;
                        p.reset_all();
                    }
                    4 => p.reset_all(),
                    5 => {
                        // A frozen node (GC pause, VM steal): SIGSTOP, then SIGCONT.
                        let pid = pids[rng.below(pids.len() as u64) as usize];
                        signal(pid, "-STOP");
                        tokio::time::sleep(rng.ms(100, 1500)).await;
                        signal(pid, "-CONT");
                    }
                    _ => {
                        let url = &urls[rng.below(urls.len() as u64) as usize];
                        if let Ok(client) = redis::Client::open(url.as_str()) {
                            if let Ok(mut c) = client.get_multiplexed_async_connection().await {
                                let _: Result<(), _> =
                                    redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut c).await;
                            }
                        }
                    }
                }
                tokio::time::sleep(rng.ms(20, 250)).await;
                p.heal();
                tokio::time::sleep(rng.ms(0, 80)).await;
            }
            for p in &proxies {
                p.heal();
            }
            for &pid in &pids {
                signal(pid, "-CONT");
            }
        })
    };

    // A monitor: at no instant two held guards.
    let monitor = {
        let (ledger, stop) = (ledger.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                ledger.lock().unwrap().check_exclusive("monitor");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };

    let mut workers = Vec::new();
    for (m, manager) in managers.iter().enumerate() {
        for w in 0..3 {
            let (manager, key, ledger, stop, ids) = (
                manager.clone(),
                key.clone(),
                ledger.clone(),
                stop.clone(),
                ids.clone(),
            );
            workers.push(tokio::spawn(async move {
                let mut rng = Rng::seeded((m * 10 + w) as u64 + 1);
                while !stop.load(Ordering::Relaxed) {
                    let opts = LockOptions::new()
                        .ttl(rng.ms(300, 1500))
                        .wait(Duration::from_millis(800));
                    let Ok(guard) = manager.lock_with(&key, opts).await else {
                        continue;
                    };
                    let guard = Arc::new(guard);
                    let id = ids.fetch_add(1, Ordering::Relaxed);
                    {
                        let mut l = ledger.lock().unwrap();
                        l.acquisitions += 1;
                        if guard.is_held() {
                            let fence = guard.fencing_token();
                            if fence <= l.last_fence {
                                let msg = format!(
                                    "fence {fence} handed out after {} (manager {m})",
                                    l.last_fence
                                );
                                l.violations.push(msg);
                            }
                            l.last_fence = l.last_fence.max(fence);
                        }
                        l.holders.insert(id, guard.clone());
                        l.check_exclusive("hand-out");
                    }
                    for _ in 0..rng.below(3) {
                        if rng.below(2) == 0 {
                            let _ = guard.extend(rng.ms(200, 2000)).await;
                        }
                        tokio::time::sleep(rng.ms(0, 60)).await;
                        ledger.lock().unwrap().check_exclusive("holding");
                    }
                    let guard = ledger.lock().unwrap().holders.remove(&id).unwrap();
                    if let Ok(guard) = Arc::try_unwrap(guard) {
                        if rng.below(4) == 0 {
                            drop(guard);
                        } else {
                            let _ = guard.release().await;
                        }
                    }
                }
            }));
        }
    }
    tokio::time::sleep(run_for).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .expect("a worker hung")
            .unwrap();
    }
    chaos.await.unwrap();
    monitor.await.unwrap();
    let l = ledger.lock().unwrap();
    eprintln!("acquisitions: {}", l.acquisitions);
    assert!(
        l.acquisitions > 10,
        "too few acquisitions: {}",
        l.acquisitions
    );
    assert!(l.violations.is_empty(), "{:#?}", l.violations);
}

/// Waiters on `n` distinct keys, each key held elsewhere and released at once: every
/// waiter must get its lock within a few round trips of the release (DESIGN invariant
/// 5), not after the other waiters' subscriptions. Returns, per waiter, how long after
/// the release it got the lock (`None`: it timed out although its key was free).
async fn burst_of_waiters(
    waiters: &LockManager,
    holder: &LockManager,
    n: usize,
    wait: Duration,
) -> Vec<Option<Duration>> {
    let keys: Vec<String> = (0..n).map(|_| unique("burst")).collect();
    let mut guards = Vec::new();
    for k in &keys {
        guards.push(
            holder
                .lock_with(k, LockOptions::new().ttl(Duration::from_secs(30)))
                .await
                .unwrap(),
        );
    }
    let released_at = Arc::new(Mutex::new(None::<std::time::Instant>));
    let tasks: Vec<_> = keys
        .iter()
        .map(|k| {
            let (waiters, k, released_at) = (waiters.clone(), k.clone(), released_at.clone());
            tokio::spawn(async move {
                let got = waiters
                    .lock_with(&k, LockOptions::new().wait(wait))
                    .await
                    .ok()?;
                let at = std::time::Instant::now();
                let released = (*released_at.lock().unwrap())?;
                drop(got);
                Some(at.saturating_duration_since(released))
            })
        })
        .collect();
    // Every waiter has made its first attempt and is queued by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    *released_at.lock().unwrap() = Some(std::time::Instant::now());
    futures::future::join_all(guards.into_iter().map(|g| g.release())).await;
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

fn summarize(latencies: &[Option<Duration>]) -> (usize, Duration) {
    let timed_out = latencies.iter().filter(|l| l.is_none()).count();
    let worst = latencies
        .iter()
        .flatten()
        .max()
        .copied()
        .unwrap_or_default();
    (timed_out, worst)
}

/// Single server, 5 ms away each way (a round trip of ~10 ms, a cross-zone link). 150
/// tasks wait on 150 distinct keys; all keys are released together. Each head awaits its
/// `SUBSCRIBE` before its next attempt, and a subscriber connection sends its
/// (un)subscriptions one at a time, each awaiting its reply (`Subscriber::ops`): the
/// last head is subscribed ~150 round trips later, and makes no attempt meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_burst_of_waiters_on_distinct_keys_is_woken_within_a_few_round_trips() {
    let server = redlock_testkit::RedisServer::start();
    let proxy = ChaosProxy::start(server.addr()).await.unwrap();
    let holder = LockManager::builder()
        .single(server.url())
        .build()
        .await
        .unwrap();
    let waiters = LockManager::builder()
        .single(proxy.url())
        .build()
        .await
        .unwrap();
    proxy.set(Fault::Delay(Duration::from_millis(5)));
    let latencies = burst_of_waiters(&waiters, &holder, 150, Duration::from_millis(1500)).await;
    let (timed_out, worst) = summarize(&latencies);
    eprintln!("single: {timed_out} of 150 timed out, worst hand-off {worst:?}");
    assert!(
        timed_out == 0 && worst < Duration::from_millis(600),
        "{timed_out} of 150 waiters timed out although their key was free for ~1.2 s; \
         the slowest of the others got its lock {worst:?} after the release (RTT ~10 ms)"
    );
}

/// The same over Redlock (3 nodes, each 5 ms away each way): `subscribe` returns at the
/// first node's confirmation, but every node's subscriber serialises too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_burst_of_waiters_on_distinct_keys_is_woken_within_a_few_round_trips() {
    let set = ProxiedSet::start(3).await.unwrap();
    let holder = LockManager::builder()
        .redlock(set.urls())
        .build()
        .await
        .unwrap();
    let waiters = LockManager::builder()
        .redlock(set.proxy_urls())
        .build()
        .await
        .unwrap();
    for p in set.proxies() {
        p.set(Fault::Delay(Duration::from_millis(5)));
    }
    let latencies = burst_of_waiters(&waiters, &holder, 150, Duration::from_millis(1500)).await;
    let (timed_out, worst) = summarize(&latencies);
    eprintln!("redlock: {timed_out} of 150 timed out, worst hand-off {worst:?}");
    assert!(
        timed_out == 0 && worst < Duration::from_millis(600),
        "{timed_out} of 150 waiters timed out although their key was free for ~1.2 s; \
         the slowest of the others got its lock {worst:?} after the release (RTT ~10 ms)"
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

/// Redlock: a waiter counts as listening as soon as *one* node confirmed its channel
/// (`RedlockBackend::listening`), and then never asks again on the nodes whose
/// `SUBSCRIBE` failed (the 1 s resubscription only runs while no node listens; the
/// connection manager's own resubscription only replays channels the server had
/// confirmed). A release published on a quorum of nodes that misses that one node is
/// then never heard, and the waiter sleeps for the holder's whole remaining ttl.
///
/// Two minority faults, at different times: W's paths to nodes 1 and 2 are down while
/// it subscribes (then heal), later its path to node 0 goes down. A quorum (1, 2) is up
/// for everyone throughout the release.
/// W's paths to nodes 1 and 2 are down (2.5 s) while it subscribes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_waiter_listening_on_one_node_still_hears_a_quorum_release() {
    one_node_listening(false).await;
}

/// W subscribed on every node; then its paths to nodes 1 and 2 are down for 2.5 s (its
/// subscriber connections there reset; their connection managers give up reconnecting
/// before the paths are back, and nothing asks them again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_waiter_resubscribes_after_a_blip_on_a_minority_of_nodes() {
    one_node_listening(true).await;
}

async fn one_node_listening(blip_after_subscribing: bool) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
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
    let key = unique("one_node");
    let guard = holder
        .lock_with(&key, LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let channel = guard.key().to_owned();

    // W's paths to nodes 1 and 2 are down while it starts waiting (and subscribing),
    // or for a while once it has subscribed everywhere.
    if !blip_after_subscribing {
        set.proxy(1).set(Fault::Refuse);
        set.proxy(2).set(Fault::Refuse);
    }
    let started = std::time::Instant::now();
    let wait = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        async move {
            let r = waiter
                .lock_with(&key, LockOptions::new().wait(Duration::from_secs(10)))
                .await;
            (std::time::Instant::now(), r)
        }
    });
    if blip_after_subscribing {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            numsub(set.servers(), &channel),
            [1, 1, 1],
            "W subscribed everywhere"
        );
        set.proxy(1).set(Fault::Refuse);
        set.proxy(2).set(Fault::Refuse);
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    set.proxy(1).heal();
    set.proxy(2).heal();
    // W's attempts now see H's quorum; it waits for H's release notification.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let subscribed = numsub(set.servers(), &channel);
    // Later, W's path to node 0 goes down; H releases on every node (a quorum, 1 and 2,
    // reaches W too).
    set.proxy(0).set(Fault::Blackhole);
    let released = std::time::Instant::now();
    guard.release().await.unwrap();
    let (at, got) = wait.await.unwrap();
    set.proxy(0).heal();
    let after = at.saturating_duration_since(released);
    eprintln!("subscribed before the release: {subscribed:?}; got the lock {after:?} after it");
    assert!(
        got.is_ok() && after < Duration::from_secs(3),
        "W got {:?} {after:?} after the release ({:?} after it started waiting); \
         W's subscriptions per node before the release: {subscribed:?}",
        got.map(drop),
        at - started
    );
}

/// Regression (review 2, finding 3): with one Redlock node frozen, every extend cost a
/// full per-node timeout. An extend first waited for the stragglers of the lock's
/// previous expiry-setting call (its acquisition's late grants, its last extend) to be
/// answered or cut at their per-node deadline; with a frozen node there always is one.
/// Now the next extend cuts an extend's stragglers at once (`RedlockBackend::settled`):
/// one already written is applied before the new extend on that connection, one not
/// written never will be. (The acquisition's late grants are still waited for, bounded
/// by its per-node timeout: cut unwritten, a grant would leave its node without the key
/// for good. So the extends here start once that timeout has passed.) Before:
/// back-to-back extends took 202 / 201 / 201 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_extend_with_a_frozen_node_costs_what_the_healthy_nodes_cost() {
    let mut set = RedisSet::start(3);
    let locks = LockManager::builder()
        .redlock(set.urls())
        .build()
        .await
        .unwrap();
    // Scripts cached everywhere.
    let g = locks.lock(&unique("warm")).await.unwrap();
    g.extend(Duration::from_secs(30)).await.unwrap();
    g.release().await.unwrap();
    set.node_mut(2).pause();
    let t = std::time::Instant::now();
    let guard = locks.lock(&unique("frozen_extend")).await.unwrap();
    let acquire = t.elapsed();
    // Past the acquisition's per-node timeout: its late grant to node 2 is cut.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut extends = Vec::new();
    for _ in 0..3 {
        let t = std::time::Instant::now();
        guard.extend(Duration::from_secs(30)).await.unwrap();
        extends.push(t.elapsed());
    }
    set.node_mut(2).resume();
    eprintln!("acquire {acquire:?}, extends {extends:?}");
    assert!(
        extends.iter().all(|e| *e < Duration::from_millis(100)),
        "with node 2 frozen: acquire {acquire:?}, back-to-back extends {extends:?} \
         (per-node timeout 200 ms)"
    );
}

/// Cluster: the shard subscriber sends every `SSUBSCRIBE` (whatever its shard) under one
/// lock held until the reply or its timeout (`ShardSubscriber::subscribe`), and a head
/// awaits its subscription before its next attempt. With one master frozen, the
/// subscriptions of waiters on that master's keys hold the lock one timeout each, and a
/// waiter on a healthy master's key, released meanwhile, neither subscribes nor tries
/// again until they are through. (Kept below the cluster's node timeout, 1 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_waiter_on_a_healthy_master_is_not_held_up_by_a_frozen_one() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let mut cluster = tokio::task::spawn_blocking(|| redlock_testkit::RedisCluster::start(3, 0))
        .await
        .unwrap();
    let waiter = LockManager::builder()
        .cluster(cluster.urls())
        .response_timeout(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let holder = LockManager::builder()
        .cluster(cluster.urls())
        .build()
        .await
        .unwrap();
    let name = unique("frozen_shard");
    let key_of = |i: usize| format!("{name}_{{{i}}}");
    let master = |k: &str| cluster.master_for_key(&format!("lock:{k}"));
    let healthy = key_of(0);
    let healthy_master = master(&healthy);
    let frozen: Vec<String> = (1..10_000)
        .map(key_of)
        .filter(|k| master(k) != healthy_master)
        .take(5)
        .collect();
    let frozen_master = master(&frozen[0]);
    let frozen: Vec<String> = frozen
        .into_iter()
        .filter(|k| master(k) == frozen_master)
        .collect();
    for k in frozen.iter().chain([&healthy]) {
        waiter.lock(k).await.unwrap().release().await.unwrap();
    }
    let held = holder.lock(&healthy).await.unwrap();

    cluster.node_mut(frozen_master).pause();
    let t0 = std::time::Instant::now();
    let stuck: Vec<_> = frozen
        .iter()
        .map(|k| {
            let (waiter, k) = (waiter.clone(), k.clone());
            tokio::spawn(async move {
                let _ = waiter
                    .lock_with(&k, LockOptions::new().wait(Duration::from_secs(2)))
                    .await;
            })
        })
        .collect();
    // Their attempts failed (~100-200 ms); their `SSUBSCRIBE`s now queue.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let w = {
        let (waiter, k) = (waiter.clone(), healthy.clone());
        tokio::spawn(async move {
            let r = waiter
                .lock_with(&k, LockOptions::new().wait(Duration::from_millis(400)))
                .await;
            (std::time::Instant::now(), r)
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let released = std::time::Instant::now();
    held.release().await.unwrap();
    let (at, got) = w.await.unwrap();
    tokio::time::sleep(Duration::from_millis(850).saturating_sub(t0.elapsed())).await;
    cluster.node_mut(frozen_master).resume();
    let stuck_n = stuck.len();
    for s in stuck {
        let _ = s.await;
    }
    let after = at.saturating_duration_since(released);
    eprintln!(
        "{} waiters on the frozen master; the healthy-key waiter got {:?} {after:?} after the release",
        stuck_n,
        got.as_ref().map(|_| ())
    );
    assert!(
        got.is_ok(),
        "the waiter on a healthy master's key got {:?} {after:?} after its release",
        got.map(drop)
    );
}
