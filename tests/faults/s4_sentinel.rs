//! Scenario 4: a Redis primary with one replica and three Sentinels; the primary is killed
//! (-9) right after a client acquired a lock, and a Sentinel failover promotes the replica.
//!
//! Model: two managers built with `LockManager::builder().sentinel(..)` at the start, before
//! any fault, and never rebuilt: they must find the new master by themselves after every
//! failover (and after every restore of the killed server as a replica). The *first* holds
//! the lock taken right before the kill; the *second*, right after the kill, calls
//! `lock_with` with a generous wait on a fresh key, which is granted once it follows the
//! failover (the figure "kill -9 → first lock on the new master"), then tries the first's
//! key.
//!
//! Per round:
//! * if the second gets the first's key, the first's write was lost in the failover. The
//!   first must then be told: its watchdog's next renewal goes to the new master, finds no
//!   token, and `lost()` resolves — checked within 15 s of the failover, and timed from the
//!   kill. A *double-holding incident* is a round where the second was granted the key
//!   while the first's `is_held()` was still true (it had not renewed on the new master
//!   yet): the documented limit of asynchronous replication.
//! * if the second does not get it, the lock survived: the first's `extend` succeeds on the
//!   new master (a compare-token script: its token is there). With `min_replicas(1)` the
//!   extend counts only once a replica acknowledged it, so the killed server is first
//!   restored as the new master's replica (until then the extend is refused with
//!   `ReplicasUnavailable`: an expiry no replica holds would not survive the next
//!   failover).
//!
//! Four variants:
//! * `partition`: before the acquire, the replica is cut off (`partition_replica`: SIGSTOP
//!   plus `CLIENT KILL TYPE replica`), so the write is acknowledged by no replica and lost
//!   in the failover: deterministic.
//! * `racy`: the primary is killed right after the acquire returns, with replication
//!   healthy: the write has usually reached the replica already (loopback).
//! * each without and with `min_replicas(1)`: then the acquire `WAIT`s for one replica;
//!   with the replica cut off it fails with `ReplicasUnavailable` (and releases), so nobody
//!   believes they hold a lock that could be lost; with replication healthy the promoted
//!   replica has the lock, which survives.
//!
//! Fencing: a lost write took the fencing counter with it, so the second client gets the
//! *same* token as the first; the fenced resource rejects its `begin` (equal is not newer),
//! which keeps the resource safe but shows that after a failover tokens are not unique.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;
use redlock::{LockError, LockGuard, LockManager, LockOptions};
use redlock_faults::resource::{Begin, Resource};
use redlock_testkit::{RedisServer, Sentinels};

use crate::support::{require_redis, rounds, unique, HEAVY};

/// The first holder's lease: renewed every ~3.3 s.
const TTL: Duration = Duration::from_secs(10);

/// How long after the failover the first holder of a lost write may take to be told.
const LOSS_BOUND: Duration = Duration::from_secs(15);

#[derive(Debug, Clone, Copy)]
struct Variant {
    partition: bool,
    min_replicas: u32,
}

#[derive(Debug, Default)]
struct Tally {
    rounds: usize,
    acquired: usize,
    replicas_unavailable: usize,
    /// Rounds where the second client was granted the first's key (the write was lost).
    taken_over: usize,
    /// Of those, rounds where the first still believed it held the lock.
    incidents: usize,
    /// Rounds where the first's lock was still there on the new master.
    survived: usize,
    token_reused: usize,
    fencing_rejected: usize,
    failover_ms: Vec<u128>,
    first_lock_ms: Vec<u128>,
    lost_ms: Vec<u128>,
    restore_ms: Vec<u128>,
}

/// A manager that follows the master through the Sentinels.
async fn sentinel_manager(sent: &Sentinels) -> LockManager {
    LockManager::builder()
        .sentinel(sent.master_name(), sent.sentinel_urls())
        .build()
        .await
        .expect("the manager finds the master through the Sentinels")
}

/// The data server listening on `port`.
fn server_at(sent: &Sentinels, port: u16) -> &RedisServer {
    if sent.master().port() == port {
        sent.master()
    } else {
        sent.replica()
    }
}

/// Restarts the server on `port` (killed by the round) as a replica of the current
/// primary (unless `reattached` already) and waits until it is attached and every
/// sentinel counts it healthy; returns how long that took.
fn restore(sent: &mut Sentinels, killed: u16, reattached: bool) -> Duration {
    let started = Instant::now();
    if !reattached {
        reattach(sent, killed);
    }
    // Sentinels refresh their view of replicas by polling (INFO every few seconds, more
    // slowly on a saturated machine), and may even fail over a second time: wait until
    // the whole set has settled. The bound is generous; the loop ends as soon as it has.
    sent.wait_healthy(Duration::from_secs(30));
    started.elapsed()
}

/// Restarts the server on `killed` as a replica of the current primary, without waiting
/// for the sentinels to see it.
fn reattach(sent: &mut Sentinels, killed: u16) {
    let (_, primary) = sent.current_master_addr();
    let server: &mut RedisServer = if sent.master().port() == killed {
        sent.master_mut()
    } else {
        sent.replica_mut()
    };
    server.restart();
    let _: Value = server
        .cmd_sync(&["REPLICAOF", "127.0.0.1", &primary.to_string()])
        .expect("REPLICAOF");
}

/// Each manager takes and releases a probe lock: both work on the current master before
/// the round's fault (after a restore, the Sentinels may have failed over once more).
async fn probe(managers: [&LockManager; 2]) {
    for m in managers {
        let key = unique("s4-probe");
        let g = m
            .lock_with(&key, LockOptions::new().wait(Duration::from_secs(10)))
            .await
            .expect("a manager works before the round");
        g.release().await.expect("probe release");
    }
}

/// `extend` on the first holder's guard after the failover, repeated (bounded) while its
/// manager has not followed the master yet, or the master's restored replica has not
/// caught up (`min_replicas`): `Ok` when its token is on the new master.
async fn extend_after_failover(g: &LockGuard) -> Result<(), LockError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match g.extend(TTL).await {
            Err(LockError::Backend { .. } | LockError::ReplicasUnavailable { .. })
                if Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            answer => return answer,
        }
    }
}

async fn round(
    sent: &mut Sentinels,
    [first, second]: [&LockManager; 2],
    v: Variant,
    res_url: &str,
    t: &mut Tally,
) {
    t.rounds += 1;
    // A fresh key per round: a lock that survived the failover must not block the next.
    let key = format!("{{{}}}", unique("s4"));
    let res = &Resource::open(res_url, &key).await.unwrap();
    probe([first, second]).await;
    let killed = sent.current_master_addr().1;
    if v.partition {
        tokio::task::block_in_place(|| sent.partition_replica());
    }
    let mut opts = LockOptions::new().ttl(TTL).wait(Duration::ZERO);
    if v.min_replicas > 0 {
        opts = opts.min_replicas(v.min_replicas);
    }
    let mine = first.lock_with(&key, opts).await;
    tokio::task::block_in_place(|| sent.kill_master());
    let killed_at = Instant::now();
    // The second client wants a lock at once: granted once its manager followed the
    // failover.
    let fresh = tokio::spawn({
        let second = second.clone();
        let fresh = format!("{{{}}}", unique("s4-fresh"));
        async move {
            let g = second
                .lock_with(
                    &fresh,
                    LockOptions::new().ttl(TTL).wait(Duration::from_secs(30)),
                )
                .await;
            (g, killed_at.elapsed())
        }
    });
    if v.partition {
        tokio::task::block_in_place(|| sent.heal_replica());
    }
    let mine = match mine {
        Ok(g) => {
            t.acquired += 1;
            Some(Arc::new(g))
        }
        Err(LockError::ReplicasUnavailable { acked, .. }) => {
            assert_eq!(acked, 0);
            t.replicas_unavailable += 1;
            None
        }
        Err(e) => panic!("{v:?}: unexpected acquire error {e}"),
    };
    // When the first holder is told its lock is gone, measured from the kill.
    let mut told = mine.clone().map(|g| {
        tokio::spawn(async move {
            g.lost().await;
            killed_at.elapsed()
        })
    });
    // The first holder starts its critical section on the resource.
    if let Some(g) = &mine {
        assert!(matches!(
            res.begin(g.fencing_token()).await.unwrap(),
            Begin::Granted(_)
        ));
    }
    tokio::task::block_in_place(|| sent.wait_failover(Duration::from_secs(15)));
    let failed_over_at = Instant::now();
    t.failover_ms.push(killed_at.elapsed().as_millis());
    let promoted = sent.current_master_addr().1;
    assert_ne!(promoted, killed);

    let (fresh, first_lock) = fresh.await.expect("the fresh lock task");
    let fresh = fresh.unwrap_or_else(|e| {
        panic!("{v:?}: no lock on the new master within 30 s of the kill: {e}")
    });
    assert_eq!(
        server_at(sent, promoted)
            .cmd_sync(&["EXISTS", fresh.key()])
            .ok(),
        Some(Value::Int(1)),
        "{v:?}: the fresh lock is not on the new master {promoted}"
    );
    t.first_lock_ms.push(first_lock.as_millis());

    let theirs = second
        .try_lock(&key)
        .await
        .expect("try_lock on the new primary");
    let still_held = mine.as_ref().is_some_and(|g| g.is_held());
    let mut line = format!(
        "s4 {v:?}: first client {}, failover {} ms, first lock on the new master {} ms \
         after the kill, second client {}",
        mine.as_ref()
            .map_or("got ReplicasUnavailable".to_owned(), |g| format!(
                "acquired token {}",
                g.fencing_token()
            )),
        t.failover_ms.last().copied().unwrap_or(0),
        first_lock.as_millis(),
        theirs.as_ref().map_or(
            "could not acquire (the lock survived the failover)".to_owned(),
            |g| { format!("acquired token {}", g.fencing_token()) }
        ),
    );
    let mut reattached = false;
    match (&mine, &theirs) {
        (Some(mine), Some(theirs)) => {
            // The write was lost: the first must be told, by its watchdog.
            t.taken_over += 1;
            let handle = told.as_mut().expect("a task per held lock");
            let lost_after = tokio::time::timeout_at((failed_over_at + LOSS_BOUND).into(), handle)
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{v:?}: the first holder was not told its lock was lost within \
                     {LOSS_BOUND:?} of the failover (is_held() {})",
                        mine.is_held()
                    )
                })
                .expect("the lost() task");
            told = None;
            assert!(!mine.is_held());
            t.lost_ms.push(lost_after.as_millis());
            if theirs.fencing_token() <= mine.fencing_token() {
                t.token_reused += 1;
            }
            let fenced = matches!(
                res.begin(theirs.fencing_token()).await.unwrap(),
                Begin::Rejected(_)
            );
            if fenced {
                t.fencing_rejected += 1;
            }
            line.push_str(&format!(
                "; the first was told lost() {} ms after the kill",
                lost_after.as_millis()
            ));
            if still_held {
                t.incidents += 1;
                line.push_str(" => DOUBLE HOLDING (first still is_held() at the grant)");
            }
            line.push_str(&format!(
                "; the resource {} the second's begin",
                if fenced { "rejected" } else { "accepted" }
            ));
        }
        (Some(mine), None) => {
            // The lock survived: its token is on the new master. With `min_replicas`, an
            // extend needs a replica of the new master: the killed server, restored.
            if v.min_replicas > 0 {
                tokio::task::block_in_place(|| reattach(sent, killed));
                reattached = true;
            }
            extend_after_failover(mine)
                .await
                .unwrap_or_else(|e| panic!("{v:?}: the surviving lock cannot be extended: {e}"));
            assert!(mine.is_held());
            t.survived += 1;
            line.push_str("; the first extended it on the new master");
        }
        (None, Some(theirs)) => {
            // The first did not hold anything: the second begins normally.
            let _ = res.begin(theirs.fencing_token()).await.unwrap();
        }
        (None, None) => panic!("{v:?}: nobody holds {key}, yet the second could not take it"),
    }
    println!("{line}");
    if let Some(told) = told {
        // Not resolved when the lock survived; it holds a reference to the guard.
        told.abort();
        let _ = told.await;
    }
    drop(theirs);
    drop(mine);
    drop(fresh);
    let restored = tokio::task::block_in_place(|| restore(sent, killed, reattached));
    t.restore_ms.push(restored.as_millis());
}

/// `min/median/max` of `v`, in ms.
fn spread(v: &[u128]) -> String {
    let mut v = v.to_vec();
    v.sort_unstable();
    match (v.first(), v.get(v.len() / 2), v.last()) {
        (Some(lo), Some(mid), Some(hi)) => format!("{lo}/{mid}/{hi}"),
        _ => "-".to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_sentinel_failover_loses_locks_unless_min_replicas() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let mut sent = tokio::task::block_in_place(Sentinels::start);
    let res_server = RedisServer::start();
    // Built once, before any fault: they follow every failover by themselves.
    let first = sentinel_manager(&sent).await;
    let second = sentinel_manager(&sent).await;
    let variants = [
        (
            Variant {
                partition: true,
                min_replicas: 0,
            },
            rounds(2, 10),
        ),
        (
            Variant {
                partition: true,
                min_replicas: 1,
            },
            rounds(2, 10),
        ),
        (
            Variant {
                partition: false,
                min_replicas: 0,
            },
            rounds(1, 10),
        ),
        (
            Variant {
                partition: false,
                min_replicas: 1,
            },
            rounds(1, 10),
        ),
    ];
    let mut tallies = Vec::new();
    for (v, n) in variants {
        let mut t = Tally::default();
        for _ in 0..n {
            round(&mut sent, [&first, &second], v, &res_server.url(), &mut t).await;
        }
        tallies.push((v, t));
    }
    for (v, t) in &tallies {
        println!(
            "s4 summary {}{}: {} rounds, first client acquired {} (ReplicasUnavailable {}), \
             its lock survived {}, was taken over {} (of which double-holding incidents {}), \
             the second got a reused token {} and the fenced resource rejected it {}; \
             failover {:?} ms, kill -9 to the first lock on the new master {:?} ms, \
             kill -9 to the first holder's lost() {:?} ms, restoring the replica {:?} ms",
            if v.partition {
                "partitioned replica"
            } else {
                "racy kill"
            },
            if v.min_replicas > 0 {
                ", min_replicas(1)"
            } else {
                ", no min_replicas"
            },
            t.rounds,
            t.acquired,
            t.replicas_unavailable,
            t.survived,
            t.taken_over,
            t.incidents,
            t.token_reused,
            t.fencing_rejected,
            t.failover_ms,
            t.first_lock_ms,
            t.lost_ms,
            t.restore_ms,
        );
    }
    let all = |f: fn(&Tally) -> &Vec<u128>| -> Vec<u128> {
        tallies.iter().flat_map(|(_, t)| f(t).clone()).collect()
    };
    println!(
        "s4 figures (min/median/max ms): failover {}, kill -9 to the first lock on the new \
         master {}, kill -9 to lost() of an unreplicated lock {}",
        spread(&all(|t| &t.failover_ms)),
        spread(&all(|t| &t.first_lock_ms)),
        spread(&all(|t| &t.lost_ms)),
    );
    for (v, t) in &tallies {
        if v.min_replicas > 0 {
            assert_eq!(t.taken_over, 0, "{v:?}: a lock lost despite min_replicas");
            if v.partition {
                assert_eq!(t.replicas_unavailable, t.rounds, "{v:?}");
            } else {
                assert_eq!(t.survived, t.rounds, "{v:?}");
            }
        } else if v.partition {
            // The deterministic recipe: the write is always lost.
            assert_eq!(t.taken_over, t.rounds, "{v:?}");
        }
        assert_eq!(
            t.token_reused, t.fencing_rejected,
            "{v:?}: fencing missed a reused token"
        );
    }
}

/// Coalescing across a failover: 32 tasks of one Sentinel manager lock and release keys
/// of their own in a loop, so that past two calls in flight their requests share calls,
/// and the master is killed (-9) under them. Every lock + release is answered, granted or
/// failed, within a bound (none waits forever on a batch the kill cut), and once the
/// replica is promoted every task locks and releases again on the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_shared_calls_cut_by_a_failover_answer_every_caller() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let mut sent = tokio::task::block_in_place(Sentinels::start);
    let locks = sentinel_manager(&sent).await;
    let failed_over = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let granted_pairs = Arc::new(AtomicU32::new(0));
    let tasks: Vec<_> = (0..32)
        .map(|task| {
            let (locks, failed_over, stop) = (locks.clone(), failed_over.clone(), stop.clone());
            let granted_pairs = granted_pairs.clone();
            tokio::spawn(async move {
                let (mut before, mut after, mut errors) = (0u32, 0u32, Vec::new());
                let options = LockOptions::new()
                    .ttl(Duration::from_secs(5))
                    .wait(Duration::from_secs(2));
                for n in 0..100_000u32 {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    let since_failover = failed_over.load(Ordering::Acquire);
                    // A key per attempt: a lock that the kill left behind on the promoted
                    // replica (its release failed) holds a key nobody asks for again.
                    let key = format!("shared_calls_{task}_{n}");
                    let pair = async {
                        locks
                            .lock_with(&key, options.clone())
                            .await?
                            .release()
                            .await
                    };
                    let outcome = tokio::time::timeout(Duration::from_secs(30), pair)
                        .await
                        .unwrap_or_else(|_| {
                            panic!("task {task}: a lock + release unanswered for 30 s")
                        });
                    match outcome {
                        Ok(_) if since_failover => after += 1,
                        Ok(_) => {
                            before += 1;
                            granted_pairs.fetch_add(1, Ordering::AcqRel);
                        }
                        Err(e) => {
                            errors.push(e.to_string());
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
                (before, after, errors)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The requests did share calls: fewer script calls than the requests answered.
    let granted = granted_pairs.load(Ordering::Acquire);
    let calls = sent.master().command_calls(&["evalsha", "eval"]);
    assert!(
        granted > 0 && calls < 2 * u64::from(granted),
        "{calls} script calls for {granted} lock + release pairs before the kill"
    );
    tokio::task::block_in_place(|| sent.kill_master());
    tokio::task::block_in_place(|| sent.wait_failover(Duration::from_secs(30)));
    failed_over.store(true, Ordering::Release);
    // Long enough for the manager to follow the Sentinels and for every task to go round.
    tokio::time::sleep(Duration::from_secs(8)).await;
    stop.store(true, Ordering::Release);
    let mut errors = 0;
    for (task, t) in tasks.into_iter().enumerate() {
        let (before, after, failed) = t.await.expect("task panicked");
        assert!(before > 0, "task {task}: nothing granted before the kill");
        assert!(
            after > 0,
            "task {task}: nothing granted after the failover; its errors: {failed:?}"
        );
        errors += failed.len();
    }
    eprintln!("s4 shared calls: {errors} lock + release errors across the failover");
}
