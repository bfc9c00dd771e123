//! Scenario 5: Redlock over 5 independent masters while nodes are killed (-9), restarted
//! empty, and paused, under a contended workload.
//!
//! The *delayed-restart rule* (redis.io's Redlock page): a crashed node without
//! persistence must stay down longer than the longest ttl in use, so every lock it knew
//! has expired or been renewed on the others before it answers again. Here the ttl is
//! 1 s and a killed node comes back empty after 1.2-2 s. At most two nodes are faulty at
//! a time, so a quorum (3) is always reachable. Paused (SIGSTOP) nodes keep their data and
//! come back after 0.1-2 s.
//!
//! Expected: zero mutual-exclusion violations and an exact counter on every key. Token
//! order is reported too: Redlock documents what restarts can do to it (see
//! `backend/redlock.rs`).

use std::time::{Duration, Instant};

use redlock::{LockManager, LockOptions};
use redlock_testkit::{RedisServer, RedisSet};

use crate::support::{require_redis, soak, unique, HEAVY};
use crate::workload::Workload;

const TTL: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct Chaos {
    kills: usize,
    restarts: usize,
    pauses: usize,
    max_faulty: usize,
    /// What happened when.
    log: Vec<(Instant, String)>,
}

/// Kills, restarts and pauses random nodes for `duration`; leaves every node running.
fn chaos(set: &mut RedisSet, duration: Duration) -> Chaos {
    let started = Instant::now();
    let mut c = Chaos::default();
    // (node, when to bring it back, killed?)
    let mut faulty: Vec<(usize, Instant, bool)> = Vec::new();
    // Bounded by time, and by a count as a backstop.
    for _ in 0..100_000 {
        let now = Instant::now();
        if now.duration_since(started) >= duration {
            break;
        }
        faulty.retain(|&(i, back, killed)| {
            if now < back {
                return true;
            }
            if killed {
                set.node_mut(i).restart();
                c.restarts += 1;
                c.log.push((Instant::now(), format!("restarted {i}")));
            } else {
                set.node_mut(i).resume();
                c.log.push((Instant::now(), format!("resumed {i}")));
            }
            false
        });
        if faulty.len() < 2 && fastrand::u8(0..6) == 0 {
            let healthy: Vec<usize> = (0..set.len())
                .filter(|i| !faulty.iter().any(|f| f.0 == *i))
                .collect();
            let i = healthy[fastrand::usize(0..healthy.len())];
            if fastrand::bool() {
                set.node_mut(i).kill9();
                c.kills += 1;
                c.log.push((Instant::now(), format!("killed {i}")));
                // The delayed-restart rule: down for longer than the ttl.
                let down = TTL + Duration::from_millis(fastrand::u64(200..1000));
                faulty.push((i, Instant::now() + down, true));
            } else {
                set.node_mut(i).pause();
                c.pauses += 1;
                c.log.push((Instant::now(), format!("paused {i}")));
                let paused = Duration::from_millis(fastrand::u64(100..2000));
                faulty.push((i, Instant::now() + paused, false));
            }
            c.max_faulty = c.max_faulty.max(faulty.len());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for (i, _, killed) in faulty {
        if killed {
            set.node_mut(i).restart();
            c.restarts += 1;
        } else {
            set.node_mut(i).resume();
        }
    }
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_redlock_with_nodes_killed_restarted_and_paused() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let mut set = RedisSet::start(5);
    let urls = set.urls();
    let res = RedisServer::start();
    let mut managers = Vec::new();
    for _ in 0..3 {
        managers.push(
            LockManager::builder()
                .redlock(&urls)
                .build()
                .await
                .expect("redlock manager"),
        );
    }
    let keys: Vec<String> = (0..3).map(|_| format!("{{{}}}", unique("s5"))).collect();
    let w = Workload::new(keys, &res.url()).await;
    let duration = Duration::from_secs(if soak() { 120 } else { 10 });
    let opts = LockOptions::new().ttl(TTL).wait(Duration::from_secs(5));
    let tasks = w.start(&managers, 3, opts, duration + Duration::from_secs(30));
    let started = Instant::now();
    let c = tokio::task::block_in_place(|| chaos(&mut set, duration));
    w.stop();
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = started.elapsed();
    // Every manager works on every key once all nodes are back.
    for m in &managers {
        for k in &w.keys {
            let g = m
                .lock_with(k, LockOptions::new().wait(Duration::from_secs(10)))
                .await
                .expect("works after the chaos");
            g.release().await.unwrap();
        }
    }
    if std::env::var("REDLOCK_FAULTS_VERBOSE").is_ok() {
        let mut all: Vec<(Instant, String)> = c.log.clone();
        all.extend(w.error_log());
        all.sort_by_key(|e| e.0);
        for (at, what) in all {
            println!("  {:8.1} ms  {what}", (at - started).as_secs_f64() * 1e3);
        }
    }
    let (report, problems, states) = w.check().await;
    let commits: usize = states.iter().map(|s| s.accepted.len()).sum();
    println!(
        "s5 redlock-5: {:.1} s, {} kills (restarted empty after ttl + 0.2-1 s: {} restarts), {} \
         pauses, at most {} nodes faulty at once; errors {:?}; checker: {report}; {commits} \
         commits, resource problems {problems:?}",
        elapsed.as_secs_f64(),
        c.kills,
        c.restarts,
        c.pauses,
        c.max_faulty,
        w.errors(),
    );
    assert!(report.sections > 0);
    assert_eq!(
        report.exclusion_violations, 0,
        "mutual exclusion broken: {report}"
    );
    assert!(problems.is_empty(), "{problems:?}");
}
