//! `LockManagerBuilder::sentinel` on a master, a replica and three Sentinels (real
//! processes): discovery at `build`, and the manager following the master through
//! failovers (kill -9, SIGSTOP past `down-after-milliseconds`, a Sentinel killed during
//! the failover) without being rebuilt.
//!
//! One Sentinel set at a time (`ONE_SET`): their timers are timing-sensitive, and this
//! machine has two cores.

mod conformance;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use redis::Value;
use redlock::{LockError, LockGuard, LockManager, LockOptions};
use redlock_testkit::{ChaosProxy, Fault, RedisServer, Sentinels};

static ONE_SET: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Starts a Sentinel set (off the async worker: it blocks for ~2-3 s).
fn start() -> Sentinels {
    tokio::task::block_in_place(Sentinels::start)
}

async fn manager(sent: &Sentinels) -> LockManager {
    LockManager::builder()
        .sentinel(sent.master_name(), sent.sentinel_urls())
        .build()
        .await
        .expect("the manager finds the master through the Sentinels")
}

fn exists(server: &RedisServer, key: &str) -> bool {
    server.cmd_sync(&["EXISTS", key]).ok() == Some(Value::Int(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_finds_the_master_and_locks_on_it() {
    let _one = ONE_SET.lock().await;
    let sent = start();
    let locks = manager(&sent).await;
    let guard = locks.lock("stock_{1}").await.unwrap();
    assert!(exists(sent.master(), "lock:stock_{1}"));
    guard.release().await.unwrap();
    assert!(!exists(sent.master(), "lock:stock_{1}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_master_name_is_a_clear_error() {
    let _one = ONE_SET.lock().await;
    let sent = start();
    let started = Instant::now();
    let err = LockManager::builder()
        .sentinel("no-such-master", sent.sentinel_urls())
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err}");
    assert!(err.to_string().contains("no-such-master"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// The set's current master, as the Sentinels name it.
fn current_master(sent: &Sentinels) -> &RedisServer {
    let (_, port) = sent.current_master_addr();
    [sent.master(), sent.replica()]
        .into_iter()
        .find(|s| s.port() == port)
        .expect("the Sentinels name one of the data servers")
}

fn replicated(ttl: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl).min_replicas(1)
}

/// A lock written to a replica before it was granted survives kill -9 of the master:
/// the watchdog renews it on the promoted replica (without being rebuilt), past the
/// moment it would have expired there unrenewed, and the release deletes it there. Its
/// renewals count once a replica of the new master acknowledged them (`min_replicas`
/// holds for every renewal): the killed server comes back as that replica, within the
/// ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_lock_is_renewed_on_the_new_master() {
    let _one = ONE_SET.lock().await;
    let mut sent = start();
    let locks = manager(&sent).await;
    // Long enough for the failover and the killed server's return as the new master's
    // replica (its acknowledgements back every renewal there): with 12 s, CI run 6 lost the
    // lock on Valkey, rightly, when the two took longer than the ttl.
    let ttl = Duration::from_secs(30);
    let guard = locks
        .lock_with("stock_{renewed}", replicated(ttl))
        .await
        .unwrap();
    tokio::task::block_in_place(|| sent.kill_master());
    let killed = Instant::now();
    tokio::task::block_in_place(|| sent.wait_failover(Duration::from_secs(15)));
    tokio::task::block_in_place(|| sent.restore_killed(Duration::from_secs(30)));
    // Unrenewed, the copy on the new master expires at most a ttl after the kill.
    tokio::time::sleep((ttl + Duration::from_secs(1)).saturating_sub(killed.elapsed())).await;
    let master = current_master(&sent);
    assert!(guard.is_held(), "the holder gave the lock up");
    assert!(
        master.exists("lock:stock_{renewed}"),
        "the lock expired on the new master: never renewed there"
    );
    assert!(master.pttl("lock:stock_{renewed}") > 0);
    guard.release().await.expect("released on the new master");
    assert!(!master.exists("lock:stock_{renewed}"));
}

/// A write the failover lost (no replica had it) is never held silently: the holder is
/// told `lost()` once its watchdog finds the new master without it, and another manager
/// (built before the failover) gets the lock there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_lost_in_the_failover_is_reported_lost() {
    let _one = ONE_SET.lock().await;
    let mut sent = start();
    let first = manager(&sent).await;
    let second = manager(&sent).await;
    tokio::task::block_in_place(|| sent.partition_replica());
    let guard = first
        .lock_with(
            "stock_{lost}",
            LockOptions::new().ttl(Duration::from_secs(9)),
        )
        .await
        .unwrap();
    tokio::task::block_in_place(|| {
        sent.kill_master();
        sent.heal_replica();
        sent.wait_failover(Duration::from_secs(15));
    });
    assert!(
        !current_master(&sent).exists("lock:stock_{lost}"),
        "the write survived"
    );
    // The next renewal (every ttl/3 = 3 s) finds the new master without the lock.
    tokio::time::timeout(Duration::from_secs(15), guard.lost())
        .await
        .expect("the holder of a lost lock was never told");
    assert!(!guard.is_held());
    let theirs = second
        .lock_with(
            "stock_{lost}",
            LockOptions::new().wait(Duration::from_secs(10)),
        )
        .await
        .expect("the other manager follows the failover");
    assert!(current_master(&sent).exists("lock:stock_{lost}"));
    theirs.release().await.unwrap();
}

/// A waiter subscribed on the old master is subscribed again on the new one and woken
/// by the release there, long before the holder's ttl would have let it in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_a_release_on_the_new_master() {
    let _one = ONE_SET.lock().await;
    let mut sent = start();
    let holder = manager(&sent).await;
    let waiter = manager(&sent).await;
    let guard = holder
        .lock_with("stock_{woken}", replicated(Duration::from_secs(40)))
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        let got = waiter
            .lock_with(
                "stock_{woken}",
                LockOptions::new().wait(Duration::from_secs(35)),
            )
            .await;
        (got.map(|g| g.fencing_token()), Instant::now(), waiter)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());
    tokio::task::block_in_place(|| {
        sent.kill_master();
        sent.wait_failover(Duration::from_secs(15));
    });
    let numsub = |sent: &Sentinels| {
        current_master(sent)
            .cmd_sync(&["PUBSUB", "NUMSUB", "lock:stock_{woken}"])
            .ok()
    };
    let subscribed = Some(Value::Array(vec![
        Value::BulkString(b"lock:stock_{woken}".to_vec()),
        Value::Int(1),
    ]));
    let moved =
        redlock_testkit::wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            numsub(&sent) == subscribed
        });
    assert!(
        moved,
        "the waiter never subscribed on the new master: {:?}",
        numsub(&sent)
    );
    assert!(!waiting.is_finished(), "the waiter got a lock still held");
    let released = Instant::now();
    guard.release().await.expect("released on the new master");
    let (got, at, _waiter) = waiting.await.unwrap();
    got.expect("the waiter got the lock");
    let after = at.duration_since(released);
    assert!(
        after < Duration::from_secs(5),
        "woken {after:?} after the release"
    );
}

/// Sentinels that refuse connections, and one that accepts and never answers: `build`
/// fails with an error naming each, within the connect timeout (the Sentinels are asked
/// at once, not one timeout after another).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_sentinels_are_a_clear_error_within_the_connect_timeout() {
    let silent = RedisServer::start();
    let blackhole = ChaosProxy::start(silent.addr()).await.unwrap();
    blackhole.set(Fault::Blackhole);
    let closed: Vec<String> = (0..2)
        .map(|_| {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("redis://{}", listener.local_addr().unwrap())
        })
        .collect();
    let mut urls = closed.clone();
    urls.push(blackhole.url());
    let connect = Duration::from_millis(800);
    let started = Instant::now();
    let err = LockManager::builder()
        .sentinel("mymaster", urls)
        .connect_timeout(connect)
        .response_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, LockError::Backend { .. }), "{err}");
    let message = format!(
        "{err}: {}",
        std::error::Error::source(&err).map_or(String::new(), |s| s.to_string())
    );
    for url in &closed {
        let addr = url.trim_start_matches("redis://");
        assert!(message.contains(addr), "{addr} not named in: {message}");
    }
    assert!(took < connect + Duration::from_millis(500), "took {took:?}");
}

/// Grants seen by a workload: who holds each key now (the guard, to ask whether its
/// holder still believes it holds the lock), and each key's last fencing token.
#[derive(Default)]
struct Ledger {
    holders: HashMap<String, Weak<LockGuard>>,
    fences: HashMap<String, u64>,
    double_holdings: usize,
    fences_not_increasing: usize,
    grants: usize,
}

/// Three managers, two tasks each, locking three keys in turn with `min_replicas(1)`
/// (ttl 2 s, held 5 ms), every grant checked against the [`Ledger`].
struct Workload {
    ledger: Arc<Mutex<Ledger>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<HashMap<&'static str, usize>>>,
}

impl Workload {
    async fn start(sent: &Sentinels) -> Self {
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for m in 0..3 {
            let locks = manager(sent).await;
            for t in 0..2 {
                let (locks, ledger, stop) = (locks.clone(), ledger.clone(), stop.clone());
                tasks.push(tokio::spawn(run(locks, m * 2 + t, ledger, stop)));
            }
        }
        Self {
            ledger,
            stop,
            tasks,
        }
    }

    fn grants(&self) -> usize {
        self.ledger.lock().unwrap().grants
    }

    /// Waits (up to 20 s) for `n` more grants; false if they did not come. (Off the
    /// async workers: a worker blocked here would stall the holders queued on it past
    /// their leases.)
    fn progresses(&self, n: usize) -> bool {
        let from = self.grants();
        tokio::task::block_in_place(|| {
            redlock_testkit::wait_until(Duration::from_secs(20), Duration::from_millis(50), || {
                self.grants() >= from + n
            })
        })
    }

    /// Stops the tasks and checks the ledger; returns the errors the tasks saw, by kind.
    async fn finish(self) -> HashMap<&'static str, usize> {
        self.stop.store(true, Ordering::Release);
        let mut errors: HashMap<&'static str, usize> = HashMap::new();
        for task in self.tasks {
            for (kind, n) in task.await.unwrap() {
                *errors.entry(kind).or_default() += n;
            }
        }
        let l = self.ledger.lock().unwrap();
        println!("grants {}; errors {errors:?}", l.grants);
        assert_eq!(l.double_holdings, 0, "two holders of a key at once");
        assert_eq!(
            l.fences_not_increasing, 0,
            "a fencing token did not increase"
        );
        errors
    }
}

/// One task of a [`Workload`].
async fn run(
    locks: LockManager,
    me: usize,
    ledger: Arc<Mutex<Ledger>>,
    stop: Arc<AtomicBool>,
) -> HashMap<&'static str, usize> {
    let mut errors: HashMap<&'static str, usize> = HashMap::new();
    for round in 0..1_000_000usize {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let key = format!("load_{{{}}}", (me + round) % 3);
        let opts = replicated(Duration::from_secs(2)).wait(Duration::from_secs(5));
        let guard = match locks.lock_with(&key, opts).await {
            Ok(guard) => guard,
            Err(e) => {
                *errors.entry(e.kind()).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let guard = Arc::new(guard);
        {
            let mut l = ledger.lock().unwrap();
            l.grants += 1;
            // Two holders at once: the previous one still believes it holds the key.
            // (One stalled past its lease is told so, `is_held()` false: only fencing can
            // stop it, and the fencing check below covers that.)
            let previous = l.holders.insert(key.clone(), Arc::downgrade(&guard));
            if previous
                .and_then(|p| p.upgrade())
                .is_some_and(|p| p.is_held())
            {
                l.double_holdings += 1;
            }
            let last = l.fences.insert(key.clone(), guard.fencing_token());
            if last.is_some_and(|last| last >= guard.fencing_token()) {
                l.fences_not_increasing += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        {
            let mut l = ledger.lock().unwrap();
            if l.holders
                .get(&key)
                .is_some_and(|h| h.ptr_eq(&Arc::downgrade(&guard)))
            {
                l.holders.remove(&key);
            }
        }
        let guard = Arc::into_inner(guard).expect("the ledger keeps no strong reference");
        if let Err(e) = guard.release().await {
            *errors.entry(e.kind()).or_default() += 1;
        }
    }
    errors
}

/// kill -9 of the master while three managers contend for three keys with
/// `min_replicas(1)`: no two holders of a key at once, fencing tokens strictly
/// increasing per key across the failover, and locks granted again once the killed
/// server is back as a replica (`min_replicas` keeps its meaning: none before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_master_under_load_with_three_managers() {
    let _one = ONE_SET.lock().await;
    let mut sent = start();
    let load = Workload::start(&sent).await;
    assert!(load.progresses(20), "no grants before the kill");
    tokio::task::block_in_place(|| {
        sent.kill_master();
        sent.wait_failover(Duration::from_secs(15));
        sent.restore_killed(Duration::from_secs(30));
    });
    assert!(
        load.progresses(20),
        "no locks granted after the failover and the restore"
    );
    load.finish().await;
}

/// A tiny xorshift generator (the nemesis's choices; its seed is printed).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A randomized nemesis over the Sentinel set while the [`Workload`] runs: four faults
/// drawn from kill -9 of the master (then restored as a replica), a pause of the master
/// shorter than `down-after-milliseconds` (no failover: requests time out, nothing
/// moves), a pause past it (a failover; the old master comes back as a zombie and is
/// demoted), and the kill of a Sentinel (restarted after). After each, the set settles
/// and locks must be granted again; throughout, no double holding and fencing tokens
/// strictly increasing per key. `SENTINEL_NEMESIS_SEED` replays a run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_randomized_nemesis_of_failovers_and_pauses() {
    let _one = ONE_SET.lock().await;
    let seed = std::env::var("SENTINEL_NEMESIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    println!("SENTINEL_NEMESIS_SEED={seed}");
    let mut rng = Rng(seed);
    let mut sent = start();
    let load = Workload::start(&sent).await;
    assert!(load.progresses(20), "no grants before the faults");
    for step in 0..4 {
        let fault = rng.below(4);
        let started = Instant::now();
        let what = tokio::task::block_in_place(|| match fault {
            0 => {
                sent.kill_master();
                sent.wait_failover(Duration::from_secs(15));
                sent.restore_killed(Duration::from_secs(30));
                "kill -9 of the master"
            }
            1 => {
                let pause = Duration::from_millis(200 + rng.below(500));
                sent.current_master_mut().pause();
                std::thread::sleep(pause);
                sent.current_master_mut().resume();
                "a short pause of the master"
            }
            2 => {
                let old = sent.current_master_addr().1;
                sent.current_master_mut().pause();
                sent.wait_failover(Duration::from_secs(20));
                let paused = if sent.master().port() == old {
                    sent.master_mut()
                } else {
                    sent.replica_mut()
                };
                paused.resume();
                sent.wait_healthy(Duration::from_secs(40));
                "a pause of the master past down-after"
            }
            _ => {
                let i = rng.below(3) as usize;
                sent.kill_sentinel(i);
                std::thread::sleep(Duration::from_millis(500));
                sent.restart_sentinel(i);
                "the kill of a Sentinel"
            }
        });
        println!("step {step}: {what}, settled in {:?}", started.elapsed());
        assert!(load.progresses(10), "no grants after {what}");
    }
    load.finish().await;
}

/// A master paused (SIGSTOP) past `down-after-milliseconds` is replaced, and comes back
/// still calling itself master until the Sentinels demote it: no manager writes to it.
/// Locks taken after it came back are on the new master, not on it, and a lock held
/// across the pause is renewed on the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_master_that_comes_back_is_not_written_to() {
    let _one = ONE_SET.lock().await;
    let mut sent = start();
    let first = manager(&sent).await;
    let second = manager(&sent).await;
    let held = first
        .lock_with("stock_{held}", replicated(Duration::from_secs(10)))
        .await
        .unwrap();
    let old_port = sent.master().port();
    tokio::task::block_in_place(|| {
        sent.master_mut().pause();
        sent.wait_failover(Duration::from_secs(20));
        // The managers learn of the switch from the announcement (or within a poll, 1 s);
        // a master that came back before they heard of it would still be written to by
        // them (CI run N of stop 21: a lock not on the new master). The zombie comes back
        // after that here.
        std::thread::sleep(Duration::from_secs(2));
        sent.master_mut().resume();
    });
    let mut keys = Vec::new();
    for (i, locks) in [&first, &second].into_iter().enumerate() {
        for j in 0..10 {
            let key = format!("zombie_{{{i}_{j}}}");
            let guard = locks
                .lock_with(&key, LockOptions::new().wait(Duration::from_secs(10)))
                .await
                .expect("a lock after the failover");
            keys.push((format!("lock:{key}"), guard));
        }
    }
    let old = sent.master();
    assert_eq!(old.port(), old_port);
    let role = |s: &RedisServer| match s.cmd_sync(&["ROLE"]) {
        Ok(Value::Array(items)) => items.first().cloned(),
        _ => None,
    };
    let zombie = role(old) == Some(Value::BulkString(b"master".to_vec()));
    let on_old: Vec<&str> = keys
        .iter()
        .filter(|(k, _)| old.exists(k))
        .map(|(k, _)| k.as_str())
        .collect();
    let still_zombie = role(old) == Some(Value::BulkString(b"master".to_vec()));
    let new = current_master(&sent);
    assert_ne!(new.port(), old_port);
    assert!(
        keys.iter().all(|(k, _)| new.exists(k)),
        "a lock is not on the new master: {}",
        sent.describe()
    );
    if zombie && still_zombie {
        assert!(on_old.is_empty(), "written to the old master: {on_old:?}");
    } else {
        println!("the old master was demoted before the check; its keys come from the new one");
    }
    assert!(
        held.is_held(),
        "the lock held across the pause was given up"
    );
    assert!(new.exists("lock:stock_{held}"));
    for (_, guard) in keys {
        guard.release().await.unwrap();
    }
    held.release().await.unwrap();
}

/// The Sentinel a manager listens to for `+switch-master` is killed together with the
/// master: the other two still fail over, and the manager follows through them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_killed_during_the_failover() {
    let _one = ONE_SET.lock().await;
    let mut sent = start();
    let locks = manager(&sent).await;
    tokio::task::block_in_place(|| {
        sent.kill_master();
        sent.kill_sentinel(0);
        sent.wait_failover(Duration::from_secs(20));
    });
    let guard = locks
        .lock_with(
            "stock_{followed}",
            LockOptions::new().wait(Duration::from_secs(10)),
        )
        .await
        .expect("the manager follows the failover");
    assert!(current_master(&sent).exists("lock:stock_{followed}"));
    guard.release().await.unwrap();
}

/// Bad settings fail `build` with an `InvalidOption` naming the problem, before any
/// connection is tried.
#[tokio::test]
async fn bad_sentinel_settings_are_clear_errors() {
    let cases: [(&str, Vec<&str>, &str); 3] = [
        ("", vec!["redis://127.0.0.1:26379"], "master name is empty"),
        ("mymaster", vec![], "no Sentinel given"),
        (
            "mymaster",
            vec!["redis://127.0.0.1:26379", "nonsense://"],
            "Sentinel #2",
        ),
    ];
    for (name, urls, expected) in cases {
        let err = LockManager::builder()
            .sentinel(name, urls)
            .build()
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::InvalidOption { .. }), "{err}");
        assert!(err.to_string().contains(expected), "{err}");
    }
}

/// `SENTINEL FAILOVER` (a planned switch-over), asked of one Sentinel: the old master
/// becomes a replica (it answers writes with `READONLY`), but only after a while during
/// which it still takes writes, and the other Sentinels hear of the switch a couple of
/// seconds later. The manager moves on the announcement (it listens to the Sentinel that
/// led the switch, and takes the highest epoch any Sentinel reports, not the first
/// majority's answer); a lock held across the switch stays held, and new locks go to
/// the new master.
///
/// A lock asked for in the instant between the switch and the announcement's arrival is
/// granted by the old master and discarded by its demotion (this test saw it when it
/// locked at once): it is reported lost at its next renewal, and `min_replicas` refuses
/// it (the promoted replica no longer acknowledges the old master's writes). The held
/// lock's renewals count once the demoted master, now the new master's replica,
/// acknowledges them (the Sentinels demote it when they next look at it, up to ~10 s on
/// a loaded machine): its 30 s ttl leaves room for that, and the test waits until its
/// expiry on the new master was set after the switch-over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_failover_is_followed_at_once() {
    const HELD_TTL: Duration = Duration::from_secs(30);
    let _one = ONE_SET.lock().await;
    let sent = start();
    let locks = manager(&sent).await;
    let held = locks
        .lock_with("stock_{planned}", replicated(HELD_TTL))
        .await
        .unwrap();
    let old_port = sent.master().port();
    let _: Value = sent.sentinels()[0]
        .cmd_sync(&["SENTINEL", "FAILOVER", sent.master_name()])
        .expect("SENTINEL FAILOVER");
    let switched =
        redlock_testkit::wait_until(Duration::from_secs(15), Duration::from_millis(20), || {
            sent.current_master_addr().1 != old_port
        });
    assert!(switched, "no switch-over: {}", sent.describe());
    let switched_at = Instant::now();
    // The announcement reaches the manager at once (it listens to the Sentinel that led
    // the switch-over); well before the other Sentinels are told, a lock is on the new
    // master, while the old one still takes writes.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let fresh = locks
        .lock_with(
            "stock_{after}",
            LockOptions::new().wait(Duration::from_secs(10)),
        )
        .await
        .expect("a lock after the switch-over");
    let new = current_master(&sent);
    assert_ne!(new.port(), old_port);
    assert!(new.exists("lock:stock_{after}"), "not on the new master");
    // Renewed on the new master: its expiry there was set after the switch-over.
    let renewed_there = tokio::task::block_in_place(|| {
        redlock_testkit::wait_until(Duration::from_secs(40), Duration::from_millis(100), || {
            let since = HELD_TTL.saturating_sub(switched_at.elapsed()).as_millis();
            i128::from(new.pttl("lock:stock_{planned}")) > since as i128 + 1_000
        })
    });
    assert!(
        renewed_there,
        "not renewed on the new master: {}",
        sent.describe()
    );
    assert!(
        held.is_held(),
        "the lock held across the switch-over was given up"
    );
    fresh.release().await.unwrap();
    held.release().await.unwrap();
}

/// A request in flight on a master left behind (frozen, failed over) is given up when
/// the master moves, not awaited until its own timeout: its answer would not count
/// anyway, and the lock is granted by the new master as soon as the manager followed.
/// Before: granted 30.01 s after the master froze (the response timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_flight_on_a_frozen_master_is_given_up_when_the_master_moves() {
    let _one = ONE_SET.lock().await;
    let mut sent = start();
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

/// The Sentinel deployment as a conformance harness: managers follow the master the
/// Sentinels name; tampering goes to the current master.
struct SentinelHarness(Sentinels);

impl SentinelHarness {
    /// Runs `cmd` on the current master.
    async fn on_master(&self, cmd: &redis::Cmd) -> Value {
        redis::Client::open(self.0.current_master_url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
            .send_packed_command(cmd)
            .await
            .unwrap()
    }
}

impl conformance::Harness for SentinelHarness {
    fn builder(&self) -> redlock::LockManagerBuilder {
        LockManager::builder().sentinel(self.0.master_name(), self.0.sentinel_urls())
    }

    async fn delete(&self, full_key: &str) {
        self.on_master(redis::cmd("DEL").arg(full_key)).await;
    }

    async fn steal(&self, full_key: &str) {
        let set = redis::cmd("SET")
            .arg(full_key)
            .arg("someone-else")
            .arg("EX")
            .arg(60)
            .to_owned();
        self.on_master(&set).await;
    }

    async fn exists(&self, full_key: &str) -> bool {
        self.on_master(redis::cmd("EXISTS").arg(full_key)).await == Value::Int(1)
    }
}

/// Issue 23: the rules every request obeys (`tests/conformance/rules.rs`) through
/// Sentinel, on one set; and the operator's and the shutdown's behaviours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_on_every_path_through_sentinel() {
    let _one = ONE_SET.lock().await;
    let h = SentinelHarness(start());
    conformance::rules::kept_hold_is_renewed_by_nobody(&h).await;
    conformance::rules::every_shortened_hold_wakes_its_waiters(&h).await;
    conformance::rules::lock_all_holds_no_key_while_it_waits(&h).await;
    conformance::rules::kinds_exclude_each_other(&h).await;
    conformance::force_unlock_spares_a_later_grant(&h).await;
    conformance::a_kept_lock_is_shown_as_kept(&h).await;
    conformance::each_shared_holder_is_listed(&h).await;
    conformance::shutdown_frees_every_lock_at_once(&h).await;
}

/// Issue 26: the fair lock through Sentinel, on one set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_lock_through_sentinel() {
    let _one = ONE_SET.lock().await;
    let h = SentinelHarness(start());
    conformance::fair::fair_grants_in_arrival_order(&h).await;
    conformance::fair::dead_fair_waiter_is_dropped_from_the_queue(&h).await;
    conformance::fair::cancelled_fair_waiter_leaves_no_place(&h).await;
    conformance::fair::a_full_fair_queue_refuses_with_queue_full(&h).await;
}

/// Issue 26: leader election through Sentinel, on one set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_election_through_sentinel() {
    let _one = ONE_SET.lock().await;
    let h = SentinelHarness(start());
    conformance::leader::elected_follower_waits_and_takes_over_on_resign(&h).await;
    conformance::leader::terms_strictly_increase(&h).await;
    conformance::leader::lead_aborts_its_body_on_loss_and_campaigns_again(&h).await;
    conformance::leader::a_watch_sees_every_change(&h).await;
    conformance::leader::a_cancelled_campaign_leaves_no_lock(&h).await;
    conformance::leader::leader_rejects_bad_input(&h).await;
}
