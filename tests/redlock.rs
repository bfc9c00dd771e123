//! Redlock over 5 independent redis-server processes: the conformance suite, node
//! failures (kill -9, SIGSTOP, late replies), fencing across restarts, and latency.

mod conformance;

use std::time::{Duration, Instant};

use conformance::backends::{self, Redlock};
use conformance::unique;
use redis::AsyncCommands;
use redlock::{LockError, LockManager, LockOptions};
use redlock_testkit::{wait_until, ChaosProxy, Fault, RedisServer, RedisSet};

conformance_tests!(Redlock::new());
leader_tests!(Redlock::new());

/// Several managers and tasks over many keys: exact counts, never two holders, and
/// tokens strictly increasing per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_over_many_keys() {
    let h = Redlock::new();
    let keys: Vec<String> = (0..6).map(|i| unique(&format!("many{i}"))).collect();
    conformance::mutual_exclusion_over_keys(&h, keys, 10).await;
}

/// With 2 of 5 nodes killed the lock still works; with 3 killed it fails fast with
/// QuorumUnavailable (and takes nothing); once a node is back it works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dead_nodes_are_tolerated_three_are_quorum_unavailable() {
    let mut h = Redlock::new();
    let (a, b) = (
        h.managers().build().await.unwrap(),
        h.managers().build().await.unwrap(),
    );
    let key = unique("dead");
    a.lock(&key).await.unwrap().release().await.unwrap();
    h.set.node_mut(0).kill9();
    h.set.node_mut(1).kill9();
    for _ in 0..5 {
        let g = a.lock(&key).await.expect("works with 3 of 5");
        assert!(b.try_lock(&key).await.unwrap().is_none(), "two holders");
        g.release().await.unwrap();
    }
    // A lock held across the failures stays held by the majority's renewals.
    let held = a
        .lock_with(&key, LockOptions::new().ttl(Duration::from_millis(600)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(held.is_held(), "renewals on 3 of 5 keep the lock");
    held.release().await.unwrap();

    h.set.node_mut(2).kill9();
    // One attempt (wait 0): QuorumUnavailable at once.
    let start = Instant::now();
    let err = b
        .lock_with(&key, LockOptions::new().wait(Duration::ZERO))
        .await
        .unwrap_err();
    let took = start.elapsed();
    println!("redlock: QuorumUnavailable with 3 of 5 nodes down after {took:?}");
    let quorum_unavailable = |err: &LockError| {
        matches!(
            err,
            LockError::QuorumUnavailable {
                reached: 2,
                needed: 3,
                ..
            }
        )
    };
    assert!(quorum_unavailable(&err), "{err}");
    assert!(err.is_retryable());
    assert!(took < Duration::from_secs(1), "took {took:?}");
    // With a wait, the attempts are retried until it is spent; the last error is
    // returned, about one attempt after the deadline.
    let wait = Duration::from_millis(800);
    let start = Instant::now();
    let err = b
        .lock_with(&key, LockOptions::new().wait(wait))
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(quorum_unavailable(&err), "{err}");
    assert!(took >= wait && took < wait * 2, "took {took:?}");
    // What a failed attempt took is released in the background, at once.
    for i in 3..5 {
        assert!(
            wait_until(Duration::from_secs(3), Duration::from_millis(10), || {
                !h.set.node(i).exists(&format!("lock:{key}"))
            }),
            "a failed attempt left its key"
        );
    }
    h.set.node_mut(2).restart();
    // The connection to the restarted node comes back within a few attempts, which
    // `lock` retries within its wait.
    let start = Instant::now();
    let g = b.lock(&key).await.expect("working again after the restart");
    println!(
        "redlock: working again {:?} after the restart",
        start.elapsed()
    );
    g.release().await.unwrap();
}

/// A node frozen (SIGSTOP) for longer than the ttl neither hangs nor breaks anything:
/// requests are bounded by the per-node timeout, the held lock keeps its majority, and
/// after SIGCONT the node's expired copy is simply gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_paused_past_the_ttl() {
    let mut h = Redlock::new();
    let (a, b) = (
        h.managers().build().await.unwrap(),
        h.managers().build().await.unwrap(),
    );
    let key = unique("paused");
    let ttl = Duration::from_millis(500);
    let guard = a
        .lock_with(&key, LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    // The lock may be handed out on 4 of 5 grants, with node 0's still in flight (its
    // first `EVALSHA` answered `NOSCRIPT`, the `EVAL` not yet applied): frozen then, node
    // 0 would apply it on waking, a late grant the lock rightly keeps and renews. This
    // test is about a node frozen while it holds its copy.
    let full = guard.key().to_owned();
    assert!(
        wait_until(Duration::from_secs(2), Duration::from_millis(5), || {
            h.set.node(0).exists(&full)
        }),
        "node 0 granted its copy"
    );
    h.set.node_mut(0).pause();
    let paused = Instant::now();
    let mut slowest = Duration::ZERO;
    while paused.elapsed() < ttl * 3 {
        let start = Instant::now();
        assert!(
            b.try_lock(&key).await.unwrap().is_none(),
            "taken while held"
        );
        let other = b
            .lock(&unique("free"))
            .await
            .expect("other keys still work");
        other.release().await.unwrap();
        slowest = slowest.max(start.elapsed());
        assert!(guard.is_held(), "renewals on 4 of 5 keep the lock");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.set.node_mut(0).resume();
    println!("redlock: slowest try_lock + lock + release with one node frozen: {slowest:?}");
    // Two round trips, each bounded by the per-node timeout (ttl/10 = 50 ms here for
    // the try_lock, 200 ms for the others).
    assert!(slowest < Duration::from_secs(2), "{slowest:?}");
    assert!(guard.is_held());
    assert!(
        wait_until(Duration::from_secs(2), Duration::from_millis(20), || {
            !h.set.node(0).exists(&full)
        }),
        "the frozen node's copy expired in wall-clock time"
    );
    guard.release().await.unwrap();
    let g = b.lock(&key).await.expect("free after release");
    g.release().await.unwrap();
}

/// A node whose acquire reply comes too late (here: a proxy delays it past the per-node
/// timeout) applies the SET anyway; the release still reaches it and removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_reaches_a_node_whose_reply_was_late() {
    let h = Redlock::new();
    let proxy = ChaosProxy::start(h.set.node(4).addr()).await.unwrap();
    let mut urls = h.set.urls();
    urls[4] = proxy.url();
    let locks = LockManager::builder().redlock(&urls).build().await.unwrap();
    let key = unique("late");
    // Scripts cached on every node, as in any running system.
    locks.lock(&key).await.unwrap().release().await.unwrap();
    proxy.set(Fault::Delay(Duration::from_millis(300)));
    let guard = locks
        .lock_with(&key, LockOptions::new().ttl(Duration::from_secs(10)))
        .await
        .expect("4 of 5 in time");
    let full = guard.key().to_owned();
    let late = h.set.node(4);
    assert!(
        wait_until(Duration::from_secs(3), Duration::from_millis(20), || late
            .exists(&full)),
        "the late node applied the SET"
    );
    guard.release().await.expect("released on a quorum");
    assert!(
        wait_until(Duration::from_secs(3), Duration::from_millis(20), || {
            !late.exists(&full)
        }),
        "the release reached the late node"
    );
    for node in h.set.nodes() {
        assert!(!node.exists(&full));
    }
}

/// Fencing tokens stay increasing when nodes restart empty (no persistence), and
/// disagreeing counters are settled before a token is handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_across_node_restarts() {
    let mut h = Redlock::new();
    let locks = h.managers().build().await.unwrap();
    let key = unique("restarts");
    let fence_key = redlock_testkit::fence_key("lock:", &format!("lock:{key}"));
    let mut last = 0;
    let mut take = |token: u64| {
        assert!(token > last, "token {token} after {last}");
        last = token;
    };
    for _ in 0..5 {
        let g = locks.lock(&key).await.unwrap();
        take(g.fencing_token());
        g.release().await.unwrap();
    }
    // Two nodes come back empty: their counters restart from 0.
    h.set.node_mut(0).restart();
    h.set.node_mut(1).restart();
    // Let the manager notice the dropped connections and reconnect.
    for _ in 0..3 {
        let _ = locks.is_locked(&key).await;
    }
    let g = locks
        .lock_with(&key, LockOptions::new().wait(Duration::from_secs(10)))
        .await
        .unwrap();
    take(g.fencing_token());
    let token = g.fencing_token();
    // The restarted nodes were raised to the token (in the background: a quorum of
    // up-to-date nodes already vouched for it).
    for i in 0..2 {
        assert!(
            wait_until(Duration::from_secs(2), Duration::from_millis(10), || h
                .set
                .node(i)
                .get_int(&fence_key)
                == i64::try_from(token).unwrap()),
            "node {i} did not catch up"
        );
    }
    g.release().await.unwrap();

    // Counters that disagree, two nodes behind (as many lost counters as Redlock-5
    // tolerates): [50, 50, 50, 7, 7]. Any quorum meets a node at 50.
    for i in 0..5 {
        let v = if i < 3 { "50" } else { "7" };
        h.set.node(i).cmd_sync(&["SET", &fence_key, v]).unwrap();
    }
    let g = locks.lock(&key).await.unwrap();
    assert_eq!(g.fencing_token(), 51, "the maximum over the quorum");
    take(51);
    let vouching = (0..5)
        .filter(|&i| h.set.node(i).get_int(&fence_key) >= 51)
        .count();
    assert!(
        vouching >= 3,
        "a quorum vouches for the token before it is handed out ({vouching} nodes)"
    );
    // The others are raised while the lock is held.
    for i in 0..5 {
        assert!(
            wait_until(Duration::from_secs(2), Duration::from_millis(10), || {
                h.set.node(i).get_int(&fence_key) >= 51
            }),
            "node {i} did not catch up"
        );
    }
    g.release().await.unwrap();
    let g = locks.lock(&key).await.unwrap();
    assert_eq!(g.fencing_token(), 52, "all counters agree again");
    g.release().await.unwrap();
}

/// The per-node timeout bounds every request, so an acquisition against a frozen
/// majority is QuorumUnavailable after about one timeout (with a wait: once the wait is
/// spent, retrying meanwhile), never a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_majority_is_quorum_unavailable_quickly() {
    let mut h = Redlock::new();
    let locks = h
        .managers()
        .redlock_node_timeout(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    for i in 0..3 {
        h.set.node_mut(i).pause();
    }
    let mut took = Vec::new();
    for wait in [Duration::ZERO, Duration::from_millis(500)] {
        let start = Instant::now();
        let err = locks
            .lock_with(&unique("frozen"), LockOptions::new().wait(wait))
            .await
            .unwrap_err();
        took.push((wait, start.elapsed()));
        assert!(matches!(err, LockError::QuorumUnavailable { .. }), "{err}");
    }
    for i in 0..3 {
        h.set.node_mut(i).resume();
    }
    // The wait plus about one attempt (100 ms) and its undo (100 ms).
    for (wait, took) in took {
        assert!(took >= wait, "gave up early: {took:?}");
        assert!(took < wait + Duration::from_millis(600), "took {took:?}");
    }
}

/// Redlock has no `WAIT`: asking for replicas is an InvalidOption, not a silent no-op.
#[tokio::test]
async fn min_replicas_is_rejected() {
    let h = Redlock::new();
    let locks = h.managers().build().await.unwrap();
    let err = locks
        .lock_with("replicas", LockOptions::new().min_replicas(1))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err}");
}

/// Building checks every node: a dead one is an error within the connect timeout; an
/// empty list is an InvalidOption.
#[tokio::test]
async fn build_checks_every_node() {
    let h = Redlock::new();
    let mut urls = h.set.urls();
    urls[2] = format!("redis://127.0.0.1:{}", redlock_testkit::free_port());
    let start = Instant::now();
    let err = LockManager::builder()
        .redlock(&urls)
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err}");
    assert!(start.elapsed() < Duration::from_secs(2));
    let none: [&str; 0] = [];
    let err = LockManager::builder()
        .redlock(none)
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err}");
    // Owned strings work as well as &str.
    let owned: Vec<String> = h.set.urls();
    let locks = LockManager::builder().redlock(owned).build().await.unwrap();
    assert_eq!(locks.backend_name(), "redlock");
}

/// Uncontended lock+release latency, Redlock over 5 masters vs one server, measured in
/// the same run (printed for the closing note).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_redlock_vs_single() {
    const ROUNDS: usize = 200;
    let h = Redlock::new();
    let single = RedisServer::start();
    let red = h.managers().build().await.unwrap();
    let one = LockManager::connect(&single.url()).await.unwrap();
    async fn median(locks: &LockManager, key: &str) -> Duration {
        for _ in 0..20 {
            locks.lock(key).await.unwrap().release().await.unwrap();
        }
        let mut samples = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            let start = Instant::now();
            locks.lock(key).await.unwrap().release().await.unwrap();
            samples.push(start.elapsed());
        }
        samples.sort();
        samples[ROUNDS / 2]
    }
    let key = unique("latency");
    // Interleaved twice, to even out machine noise.
    let s1 = median(&one, &key).await;
    let r1 = median(&red, &key).await;
    let s2 = median(&one, &key).await;
    let r2 = median(&red, &key).await;
    let (s, r) = (s1.min(s2), r1.min(r2));
    // The machine's own floor: one raw PING vs five in parallel (5 servers share the
    // cores with the client here; on separate hosts this ratio is close to 1).
    let mut cons = Vec::new();
    for node in h.set.nodes() {
        cons.push(node.connection().await);
    }
    let raw_samples = |parallel: usize| {
        let cons = cons[..parallel].to_vec();
        async move {
            let mut samples = Vec::with_capacity(ROUNDS);
            for i in 0..ROUNDS + 20 {
                let start = Instant::now();
                futures::future::join_all(cons.iter().map(|c| async move {
                    let _: () = redis::cmd("PING")
                        .query_async(&mut c.clone())
                        .await
                        .unwrap();
                }))
                .await;
                if i >= 20 {
                    samples.push(start.elapsed());
                }
            }
            samples.sort();
            samples[ROUNDS / 2]
        }
    };
    let (raw1, raw5) = (raw_samples(1).await, raw_samples(5).await);
    println!(
        "lock+release median over {ROUNDS}: redlock-5 {r:?}, single {s:?}, ratio {:.2} \
         (machine floor: raw PING x5 in parallel {raw5:?} vs x1 {raw1:?}, ratio {:.2})",
        r.as_secs_f64() / s.as_secs_f64(),
        raw5.as_secs_f64() / raw1.as_secs_f64()
    );
    assert!(r < s * 10, "redlock {r:?} vs single {s:?}");
}

/// Regression (issue 11, finding 4): counters above 2^53 passed through Lua doubles, so
/// nodes disagreeing by one settled on a rounded maximum (2^53 + 4 for 2^53 + 3). The
/// floor is compared exactly now, and every node ends at the exact token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_floor_settles_on_the_exact_max_above_2_pow_53() {
    let h = Redlock::new();
    let locks = h.managers().build().await.unwrap();
    let key = unique("floor53");
    locks.lock(&key).await.unwrap().release().await.unwrap();
    let mut counters: Vec<String> = h.set.node(0).connection().await.keys("*").await.unwrap();
    assert_eq!(counters.len(), 1, "only the counter is left: {counters:?}");
    let counter = counters.remove(0);
    // [2^53+2, 2^53+2, 2^53+2, 2^53+1, 2^53+1]: after the INCRs three nodes hold the
    // maximum 2^53+3 (odd: not a double) and any quorum meets one of them; the others
    // are raised to it exactly (before the token is handed out when they are part of
    // the deciding quorum, else in the background).
    let base = 1u64 << 53;
    for i in 0..5 {
        let v = if i < 3 { base + 2 } else { base + 1 };
        h.set
            .node(i)
            .cmd_sync(&["SET", &counter, &v.to_string()])
            .unwrap();
    }
    let g = locks.lock(&key).await.unwrap();
    assert_eq!(g.fencing_token(), base + 3);
    for i in 0..5 {
        let mut con = h.set.node(i).connection().await;
        let mut v = String::new();
        for _ in 0..200 {
            v = con.get(&counter).await.unwrap();
            if v == (base + 3).to_string() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(v, (base + 3).to_string(), "node {i}");
    }
    g.release().await.unwrap();
    let g = locks.lock(&key).await.unwrap();
    assert_eq!(g.fencing_token(), base + 4, "all counters agree again");
    g.release().await.unwrap();
}

/// Every Redlock node's `maxmemory-policy` is checked at build: one node that may evict
/// lock keys fails `require_noeviction(true)`.
#[tokio::test]
async fn require_noeviction_checks_every_redlock_node() {
    let h = Redlock::new();
    h.managers().require_noeviction(true).build().await.unwrap();
    h.set
        .node(3)
        .cmd_sync(&["CONFIG", "SET", "maxmemory-policy", "volatile-lru"])
        .unwrap();
    let err = h
        .managers()
        .require_noeviction(true)
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("volatile-lru"), "{msg}");
    assert!(
        msg.contains(&h.set.node(3).port().to_string()),
        "names the node: {msg}"
    );
    h.managers()
        .build()
        .await
        .expect("only a warning by default");
}

/// Waits (bounded) until `key` is gone from `server`, polling without blocking the runtime.
async fn gone_within(server: &RedisServer, key: &str, bound: Duration) -> bool {
    let mut con = server.connection().await;
    let until = Instant::now() + bound;
    loop {
        let there: bool = con.exists(key).await.expect("EXISTS");
        if !there {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Lock+release p50 over `nodes` masters with one of them frozen (SIGSTOP), then no key
/// left on any node once it resumed, with the manager dropped before that.
async fn lock_release_with_one_frozen(nodes: usize) -> Duration {
    let mut set = RedisSet::start(nodes);
    let locks = LockManager::builder()
        .redlock(set.urls())
        .build()
        .await
        .unwrap();
    let key = unique(&format!("frozen{nodes}"));
    let full = format!("lock:{key}");
    // Scripts cached on every node, as in any running system.
    for _ in 0..3 {
        locks.lock(&key).await.unwrap().release().await.unwrap();
    }
    set.node_mut(0).pause();
    let mut samples = Vec::new();
    for _ in 0..15 {
        let start = Instant::now();
        let guard = locks.lock(&key).await.expect("a quorum is up");
        guard.release().await.expect("released on a quorum");
        samples.push(start.elapsed());
    }
    // Requests still in flight to the frozen node are finished by background tasks,
    // which must not need the manager.
    drop(locks);
    samples.sort();
    let p50 = samples[samples.len() / 2];
    println!(
        "redlock-{nodes} with one node frozen: lock+release p50 {p50:?}, max {:?}",
        samples[samples.len() - 1]
    );
    set.node_mut(0).resume();
    for i in 0..nodes {
        assert!(
            gone_within(set.node(i), &full, Duration::from_secs(10)).await,
            "node {i} kept {full} after the frozen node resumed"
        );
    }
    p50
}

/// Regression (issue 12, item 1): with 1 of N nodes frozen, every lock and every release
/// waited for the per-node timeout (200 ms) before returning, although a quorum had
/// answered within a millisecond.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_frozen_node_does_not_slow_every_call() {
    for nodes in [3, 5] {
        let p50 = lock_release_with_one_frozen(nodes).await;
        // Far below one per-node timeout (the old code paid two per lock+release).
        assert!(
            p50 < Duration::from_millis(100),
            "redlock-{nodes}: lock+release p50 {p50:?} with one node frozen"
        );
    }
}

/// `is_locked` and `inspect` of a key no quorum holds look for its permit places by a
/// `SCAN` of the nodes: they take the first quorum of scans, so a frozen node (its
/// requests bounded only by a 10 s response timeout here) does not hold them up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_lookups_do_not_wait_for_a_frozen_node() {
    let mut h = Redlock::new();
    let locks = h
        .managers()
        .response_timeout(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    let (free, permits) = (unique("free"), unique("permits"));
    let permit = locks.permit(&permits, 2).await.unwrap();
    h.set.node_mut(0).pause();
    let start = Instant::now();
    let free_locked = locks.is_locked(&free).await;
    let permit_locked = locks.is_locked(&permits).await;
    let info = locks.inspect(&permits).await;
    let took = start.elapsed();
    h.set.node_mut(0).resume();
    assert!(!free_locked.unwrap(), "a free key locked");
    assert!(permit_locked.unwrap(), "the permit holder not seen");
    assert_eq!(
        info.unwrap().map(|i| i.kind),
        Some(redlock::LockKind::Permit)
    );
    // Three lookups: each would wait out the frozen node's 10 s if it waited for every scan.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    permit.release().await.unwrap();
}

/// Regression (issue 12, item 2): a waiter losing to a holder of a quorum won the free
/// node, and its undo there PUBLISHed a wake-up that woke the waiter itself: it retried
/// at once, won the free node again, undid it again — thousands of script calls per
/// second on the free node for as long as the holder held the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_loser_does_not_wake_itself() {
    let set = RedisSet::start(3);
    let locks = LockManager::builder()
        .redlock(set.urls())
        .build()
        .await
        .unwrap();
    let key = unique("loser");
    let full = format!("lock:{key}");
    locks.lock(&key).await.unwrap().release().await.unwrap();
    // Another client holds nodes 0 and 1, a quorum; node 2 is free.
    for i in 0..2 {
        set.node(i)
            .cmd_sync(&["SET", &full, "another-holder", "PX", "20000"])
            .unwrap();
    }
    set.node(2).cmd_sync(&["CONFIG", "RESETSTAT"]).unwrap();
    let wait = Duration::from_secs(1);
    let start = Instant::now();
    let err = locks
        .lock_with(&key, LockOptions::new().wait(wait))
        .await
        .unwrap_err();
    let waited = start.elapsed();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    let calls = set.node(2).command_calls(&["eval", "evalsha"]);
    println!("redlock loser: {calls} script calls on the free node in {waited:?}");
    assert!(
        calls < 100,
        "{calls} script calls on the free node while waiting {waited:?}"
    );
    // What the waiter won on the free node was undone.
    assert!(gone_within(set.node(2), &full, Duration::from_secs(5)).await);
}

/// A release between the subscribers' disconnection and their resubscription still
/// wakes its waiter: the subscriber connections of every node are killed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriber_reconnect_loses_no_wake_up() {
    let h = Redlock::new();
    conformance::subscriber_reconnect_loses_no_wake_up(
        &h,
        // Listening on N - quorum + 1 = 2 of the 3 nodes: a release reaches one of them.
        |channels| {
            let per_node: Vec<Vec<i64>> = h
                .set
                .nodes()
                .iter()
                .map(|node| backends::numsub(node, channels))
                .collect();
            (0..channels.len())
                .filter(|&i| per_node.iter().filter(|n| n.get(i) == Some(&1)).count() >= 2)
                .count()
        },
        || h.set.nodes().iter().map(backends::kill_pubsub).sum(),
    )
    .await;
}

/// `lock` does not give up on the first `QuorumUnavailable` while it has wait budget:
/// with a majority frozen for a moment (a few per-node timeouts), a `lock` with a 5 s
/// wait retries and acquires once the nodes answer again; with a zero wait it still
/// fails after its one attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_unavailable_is_retried_within_the_wait() {
    let mut h = Redlock::new();
    let locks = h
        .managers()
        .redlock_node_timeout(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let key = unique("quorum_retry");
    locks.lock(&key).await.unwrap().release().await.unwrap();
    for i in 0..3 {
        h.set.node_mut(i).pause();
    }
    let err = locks
        .lock_with(&key, LockOptions::new().wait(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::QuorumUnavailable { .. }), "{err}");
    let (l2, k2) = (locks.clone(), key.clone());
    let start = Instant::now();
    let waiting = tokio::spawn(async move {
        l2.lock_with(&k2, LockOptions::new().wait(Duration::from_secs(5)))
            .await
    });
    tokio::time::sleep(Duration::from_millis(600)).await;
    for i in 0..3 {
        h.set.node_mut(i).resume();
    }
    let guard = waiting
        .await
        .unwrap()
        .expect("acquired once the majority answers again");
    let took = start.elapsed();
    println!("redlock: acquired {took:?} after a majority froze for 600 ms");
    assert!(took >= Duration::from_millis(600), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    guard.release().await.unwrap();
}

/// Issue 12, item 6: each node's renewal batch was bounded by min(200 ms, the shortest
/// ttl in it / 10), so one 100 ms-ttl lock renewed alongside thousands of 10 s locks
/// cut every node's request to 10 ms: none of them was renewed, on any node, while
/// short locks came and went. Renewals are now grouped by ttl, each group bounded by
/// its own ttl and its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_renewals_survive_many_locks_and_one_short_ttl() {
    const LOCKS: usize = 20_000;
    const TTL: Duration = Duration::from_secs(10);
    let set = RedisSet::start(3);
    let locks = LockManager::builder()
        .redlock(set.urls())
        .default_ttl(TTL)
        .build()
        .await
        .unwrap();
    let tag = unique("many_short");
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for a in 0..64 {
        let (locks, tag) = (locks.clone(), tag.clone());
        tasks.spawn(async move {
            let mut held = Vec::new();
            for i in (a..LOCKS).step_by(64) {
                let key = format!("{tag}_{i}");
                // A node's reply can miss the 200 ms bound on a saturated machine: that
                // says nothing about renewals, so the attempt is retried (bounded).
                let mut tries = 0;
                let guard = loop {
                    match locks.lock(&key).await {
                        Err(LockError::QuorumUnavailable { .. }) if tries < 10 => tries += 1,
                        other => break other.unwrap(),
                    }
                };
                held.push(guard);
            }
            held
        });
    }
    let mut guards = Vec::with_capacity(LOCKS);
    while let Some(held) = tasks.join_next().await {
        guards.extend(held.unwrap());
    }
    let taken = start.elapsed();
    // The first round renews the locks taken within its slack (ttl/6) together, at about
    // ttl/3 after the first was taken; later rounds renew them together again. Short
    // locks join from then on, always one held: a new one every 40 ms, the previous
    // one dropped.
    tokio::time::sleep_until((start + TTL * 2 / 5).into()).await;
    let churn = {
        let (locks, tag) = (locks.clone(), tag.clone());
        tokio::spawn(async move {
            let short = LockOptions::new().ttl(Duration::from_millis(100));
            let mut previous = None;
            for i in 0..1000 {
                let key = format!("{tag}_short_{i}");
                // A 100 ms ttl means a 10 ms bound per node: a saturated machine can miss
                // it, which only skips one short lock.
                if let Ok(guard) = locks.lock_with(&key, short.clone()).await {
                    previous = Some(guard);
                }
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            drop(previous);
        })
    };
    // Renewals are ttl/6 to ttl/3 (1.7-3.3 s) apart: at least two rounds.
    tokio::time::sleep(Duration::from_millis(7500)).await;
    churn.abort();
    let held = guards.iter().filter(|g| g.is_held()).count();
    // Unrenewed since the first round, keys would have at most 10 − 7.5 s left. A lock
    // lives on a majority: one node's renewal of a chunk may miss its 200 ms bound on a
    // saturated machine (that node's copies then miss a round, as the lock allows), but
    // every key must be fresh on at least two of the three nodes.
    let since = start.elapsed();
    let mut fresh_on = vec![0usize; guards.len()];
    let mut stale = Vec::new();
    for node in set.nodes() {
        let mut con = node.connection().await;
        let mut not_fresh = 0;
        for (c, chunk) in guards.chunks(1000).enumerate() {
            let mut pipe = redis::pipe();
            for g in chunk {
                pipe.pttl(g.key());
            }
            let pttls: Vec<i64> = pipe.query_async(&mut con).await.unwrap();
            for (i, &ms) in pttls.iter().enumerate() {
                if ms >= 5000 {
                    fresh_on[c * 1000 + i] += 1;
                } else {
                    not_fresh += 1;
                }
            }
        }
        stale.push(not_fresh);
    }
    let short_of_a_majority = fresh_on.iter().filter(|&&n| n < 2).count();
    assert_eq!(
        (held, short_of_a_majority),
        (LOCKS, 0),
        "(locks held, keys renewed in the last 5 s on fewer than 2 nodes), {since:?} after \
         the first was taken (all taken in {taken:?}); keys per node not renewed: {stale:?}"
    );
    let most_stale = stale.iter().max().copied().unwrap_or(0);
    assert!(
        most_stale <= LOCKS / 20,
        "a node missed renewing {most_stale} of {LOCKS} keys: {stale:?}"
    );
}

/// The channels `server` has subscribers for (`PUBSUB CHANNELS`).
fn pubsub_channels(server: &RedisServer) -> Vec<String> {
    match server
        .cmd_sync(&["PUBSUB", "CHANNELS"])
        .expect("PUBSUB CHANNELS")
    {
        redis::Value::Array(items) | redis::Value::Set(items) => items
            .into_iter()
            .map(|v| match v {
                redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                other => format!("{other:?}"),
            })
            .collect(),
        other => panic!("PUBSUB CHANNELS reply {other:?}"),
    }
}

/// Regression (review of `liveness`, finding 2): a new local queue saw the key's channel
/// still listened to through an earlier queue's interest, whose unsubscribe was waiting
/// behind another key's `SUBSCRIBE` to a slow node, and registered no interest of its
/// own. That old interest was then dropped and the channel unsubscribed, so the
/// holder's release went unheard and the waiter slept until its wait ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_queue_subscribes_while_an_old_interest_is_being_dropped() {
    let set = RedisSet::start(3);
    // Node 2 answers 100 ms late: its subscriber's (un)subscriptions queue behind each
    // other for a round trip each.
    let proxy = ChaosProxy::start(set.node(2).addr()).await.unwrap();
    proxy.set(Fault::Delay(Duration::from_millis(50)));
    let urls = vec![set.node(0).url(), set.node(1).url(), proxy.url()];
    let waiter = LockManager::builder().redlock(urls).build().await.unwrap();
    let holder = LockManager::builder()
        .redlock(set.urls())
        .build()
        .await
        .unwrap();
    let (key, other) = (unique("requeue"), unique("requeue_other"));
    // Scripts cached on every node.
    waiter.lock(&key).await.unwrap().release().await.unwrap();
    let other_guard = holder.lock(&other).await.unwrap();
    let held = holder.lock(&key).await.unwrap();
    // Task A waits for the key; its queue's interest is confirmed on every node.
    let a = {
        let waiter = waiter.clone();
        let key = key.clone();
        tokio::spawn(async move { waiter.lock(&key).await })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    // A waiter on another key keeps node 2's subscriber busy with a `SUBSCRIBE`.
    let w = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            waiter
                .lock_with(&other, LockOptions::new().wait(Duration::from_secs(3)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    // A gets the key: its queue empties and its interest is to be dropped.
    held.release().await.unwrap();
    a.await
        .unwrap()
        .expect("A acquires")
        .release()
        .await
        .unwrap();
    // At once, the key is taken again and task B waits for it in a new queue.
    let held = holder.lock(&key).await.unwrap();
    let b = {
        let waiter = waiter.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let guard = waiter
                .lock_with(&key, LockOptions::new().wait(Duration::from_secs(5)))
                .await;
            (guard, start.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (guard, _) = b.await.unwrap();
    let woken = released.elapsed();
    guard
        .expect("B acquires once the holder releases")
        .release()
        .await
        .unwrap();
    // A release is heard: B is woken, not left to its fallback or its wait.
    assert!(
        woken < Duration::from_millis(500),
        "B acquired {woken:?} after the release"
    );
    other_guard.release().await.unwrap();
    let _ = w.await.unwrap();
}

/// Regression (review of `liveness`, finding 3): with one node frozen, the node's
/// background `SUBSCRIBE` held its subscriber's lock while the queue's unsubscribe
/// waited for it, and the unsubscribe was dropped at the per-node timeout: the interest
/// stayed counted forever and the node kept the channel subscribed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_unsubscribes_are_not_lost_behind_a_frozen_node() {
    let mut set = RedisSet::start(3);
    let waiter = LockManager::builder()
        .redlock(set.urls())
        .build()
        .await
        .unwrap();
    let holder = LockManager::builder()
        .redlock(set.urls())
        .build()
        .await
        .unwrap();
    let warm = unique("unsub_warm");
    waiter.lock(&warm).await.unwrap().release().await.unwrap();
    set.node_mut(2).pause();
    let frozen_at = Instant::now();
    let mut rounds = 0;
    while rounds < 10 && frozen_at.elapsed() < Duration::from_millis(2500) {
        let key = unique("unsub");
        let held = holder.lock(&key).await.expect("a quorum is up");
        let task = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                waiter
                    .lock_with(&key, LockOptions::new().wait(Duration::from_secs(5)))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        held.release().await.unwrap();
        task.await
            .unwrap()
            .expect("the waiter acquires")
            .release()
            .await
            .unwrap();
        rounds += 1;
    }
    assert!(
        rounds >= 5,
        "only {rounds} rounds while the node was frozen"
    );
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(frozen_at.elapsed())).await;
    set.node_mut(2).resume();
    // Everything queued behind the frozen node drains once it answers again.
    let drained = async {
        for _ in 0..200 {
            if waiter.subscription_interests() == 0
                && set.nodes().iter().all(|n| pubsub_channels(n).is_empty())
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    };
    assert!(
        drained.await,
        "after {rounds} waits: {} interests left; channels on the nodes: {:?}",
        waiter.subscription_interests(),
        set.nodes().iter().map(pubsub_channels).collect::<Vec<_>>()
    );
}

/// CI flake of stop 30 (`a_kept_lock_is_shown_as_kept`): a reader's release returns once
/// a quorum removed it, and `inspect` counted the readers as the most any node lists, so
/// a node the release had not reached yet still counted the gone reader. The count is the
/// readers a quorum lists. Here the release reaches node 4 through a proxy 300 ms late,
/// while the operator reads node 4 directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_released_on_a_quorum_is_not_counted_by_a_late_node() {
    let h = Redlock::new();
    let proxy = ChaosProxy::start(h.set.node(4).addr()).await.unwrap();
    let mut urls = h.set.urls();
    urls[4] = proxy.url();
    let locks = LockManager::builder().redlock(&urls).build().await.unwrap();
    let operator = h.managers().build().await.unwrap();
    let key = unique("late_reader");
    let first = locks.read(&key).await.unwrap();
    let second = locks.read(&key).await.unwrap();
    proxy.set(Fault::Delay(Duration::from_millis(300)));
    second.release().await.expect("released on a quorum");
    let shown = operator.inspect(&key).await.unwrap().expect("still read");
    assert_eq!((shown.holders, shown.shared.len()), (1, 1), "{shown:?}");
    proxy.set(Fault::Pass);
    first.release().await.unwrap();
}
