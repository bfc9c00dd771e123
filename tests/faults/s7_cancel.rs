//! Scenario 7: a cancellation storm.
//!
//! Thousands of `lock_with()` calls, `#[distributed_lock]` calls, `release()` and
//! `extend()` futures are dropped at random points (a timeout, an aborted task on another
//! thread, a lost `select!`), by several managers and many tasks at once, on a few keys.
//! The ones that get the lock run a fenced critical section, itself possibly cut short.
//!
//! Afterwards: no lock key is left behind (checked well before the 5 s ttl, so every lock
//! was released, not merely expired), no watchdog still renews anything, every local queue
//! slot is free again (a full queue of waiters per key and manager all get the lock), and
//! the history of the sections that did run passes the checker.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redlock::{distributed_lock, LockError, LockManager, LockManagerBuilder, LockOptions};
use redlock_faults::clock::now_ns;
use redlock_faults::history::{History, Section};
use redlock_faults::resource::{Begin, Resource};
use redlock_testkit::{RedisServer, RedisSet};

use crate::support::{require_redis, rounds, HEAVY};

const KEYS: usize = 4;
const MANAGERS: usize = 3;
const TASKS: usize = 24;
const MAX_WAITERS: usize = 8;
const TTL: Duration = Duration::from_secs(5);

/// Records its section when dropped: at the end of the body, or wherever the body's future
/// was dropped (a commit sent without a reply seen is then of unknown fate).
struct Recorder<'a> {
    history: &'a History,
    section: Section,
    commit_in_flight: bool,
}

impl Drop for Recorder<'_> {
    fn drop(&mut self) {
        let mut s = std::mem::replace(&mut self.section, Section::new("", 0, 0, 0));
        s.exit = now_ns();
        s.commit_unknown = self.commit_in_flight;
        self.history.record(s);
    }
}

/// One critical section on `resource`, recorded even if cut short.
async fn section(resource: &Resource, history: &History, client: &str, token: u64) {
    let mut rec = Recorder {
        history,
        section: Section::new(client, token, now_ns(), 0),
        commit_in_flight: false,
    };
    let at = now_ns();
    match resource.begin(token).await {
        Ok(Begin::Granted(v)) => {
            rec.section.begins.push((at, true));
            tokio::time::sleep(Duration::from_micros(fastrand::u64(0..500))).await;
            rec.commit_in_flight = true;
            let ok = resource.commit(token, v + 1).await.unwrap_or(false);
            rec.commit_in_flight = false;
            rec.section.commits.push((now_ns(), ok));
        }
        Ok(Begin::Rejected(_)) => rec.section.begins.push((at, false)),
        Err(_) => {}
    }
}

#[derive(Debug)]
struct StormError;

impl From<LockError> for StormError {
    fn from(_: LockError) -> Self {
        StormError
    }
}

/// The annotated flavour: the same key as `storm_{k}`, the same section.
#[distributed_lock(key = "storm_<k>", ttl = "5s", wait = "2s", manager = locks, guard = g)]
async fn annotated(
    locks: &LockManager,
    k: usize,
    resource: &Resource,
    history: &History,
) -> Result<(), StormError> {
    section(resource, history, "annotated", g.fencing_token()).await;
    Ok(())
}

#[derive(Default)]
struct Counts {
    ops: AtomicUsize,
    acquired: AtomicUsize,
    cancelled: AtomicUsize,
    errors: AtomicUsize,
}

/// A random point to cut a future at: often at once, mostly within a few round trips.
fn cut() -> Duration {
    match fastrand::u8(0..10) {
        0 => Duration::ZERO,
        1..=4 => Duration::from_micros(fastrand::u64(0..1500)),
        5..=7 => Duration::from_micros(fastrand::u64(1500..20_000)),
        _ => Duration::from_micros(fastrand::u64(20_000..200_000)),
    }
}

struct Ctx {
    managers: Vec<LockManager>,
    resources: Vec<Resource>,
    histories: Vec<History>,
    counts: Counts,
}

async fn one_op(ctx: &Arc<Ctx>) {
    let m = &ctx.managers[fastrand::usize(0..MANAGERS)];
    let k = fastrand::usize(0..KEYS);
    let key = format!("storm_{{{k}}}");
    let opts = LockOptions::new().ttl(TTL).wait(Duration::from_secs(2));
    let c = &ctx.counts;
    c.ops.fetch_add(1, Ordering::Relaxed);
    let (res, hist) = (&ctx.resources[k], &ctx.histories[k]);
    match fastrand::u8(0..6) {
        // lock_with() dropped by a timeout; if it won, a section, then a random way out.
        0 | 1 => match tokio::time::timeout(cut(), m.lock_with(&key, opts)).await {
            Ok(Ok(g)) => {
                c.acquired.fetch_add(1, Ordering::Relaxed);
                section(res, hist, "guard", g.fencing_token()).await;
                match fastrand::u8(0..4) {
                    0 => drop(g),
                    1 => {
                        let _ = g.release().await;
                    }
                    2 => {
                        let _ = tokio::time::timeout(cut(), g.release()).await;
                    }
                    _ => {
                        let _ = tokio::time::timeout(cut(), g.extend(TTL)).await;
                        drop(g);
                    }
                }
            }
            Ok(Err(_)) => {
                c.errors.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                c.cancelled.fetch_add(1, Ordering::Relaxed);
            }
        },
        // lock_with() in a task aborted from here (dropped on another thread).
        2 => {
            let (ctx2, key2) = (ctx.clone(), key.clone());
            let m2 = m.clone();
            let task = tokio::spawn(async move {
                if let Ok(g) = m2.lock_with(&key2, opts).await {
                    ctx2.counts.acquired.fetch_add(1, Ordering::Relaxed);
                    section(
                        &ctx2.resources[k],
                        &ctx2.histories[k],
                        "task",
                        g.fencing_token(),
                    )
                    .await;
                }
            });
            tokio::time::sleep(cut()).await;
            task.abort();
            if matches!(task.await, Err(e) if e.is_cancelled()) {
                c.cancelled.fetch_add(1, Ordering::Relaxed);
            }
        }
        // An annotated call dropped at a random point (acquiring, or in its body).
        3 | 4 => match tokio::time::timeout(cut(), annotated(m, k, res, hist)).await {
            Ok(Ok(())) => {
                c.acquired.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(_)) => {
                c.errors.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                c.cancelled.fetch_add(1, Ordering::Relaxed);
            }
        },
        // A try_lock losing a select! against a timer.
        _ => {
            tokio::select! {
                r = m.try_lock(&key) => match r {
                    Ok(Some(g)) => {
                        c.acquired.fetch_add(1, Ordering::Relaxed);
                        section(res, hist, "try", g.fencing_token()).await;
                    }
                    Ok(None) => {}
                    Err(_) => { c.errors.fetch_add(1, Ordering::Relaxed); }
                },
                () = tokio::time::sleep(cut()) => {
                    c.cancelled.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Lock keys present on a server (fencing counters, `lock:fence:{..}`, do not match).
async fn lock_keys(server: &RedisServer) -> Vec<String> {
    let mut raw = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    raw.keys("lock:storm_*").await.unwrap()
}

async fn storm(
    name: &str,
    builder: impl Fn() -> LockManagerBuilder,
    servers: &[&RedisServer],
    ops: usize,
) {
    let res_server = RedisServer::start();
    let mut managers = Vec::new();
    for _ in 0..MANAGERS {
        managers.push(
            builder()
                .max_waiters_per_key(MAX_WAITERS)
                .build()
                .await
                .unwrap(),
        );
    }
    let mut resources = Vec::new();
    for k in 0..KEYS {
        resources.push(
            Resource::open(&res_server.url(), &format!("{name}-{k}"))
                .await
                .unwrap(),
        );
    }
    let ctx = Arc::new(Ctx {
        managers,
        resources,
        histories: (0..KEYS).map(|_| History::new()).collect(),
        counts: Counts::default(),
    });
    let started = Instant::now();
    let limit = Duration::from_secs(if crate::support::soak() { 120 } else { 20 });
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let ctx = ctx.clone();
        tasks.push(tokio::spawn(async move {
            // Bounded by the op count and the time limit.
            while ctx.counts.ops.load(Ordering::Relaxed) < ops && started.elapsed() < limit {
                one_op(&ctx).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let storm_time = started.elapsed();

    // Nothing left behind: checked at once, then after a grace far below the 5 s ttl.
    let mut right_after = 0;
    for s in servers {
        right_after += lock_keys(s).await.len();
    }
    let grace = Instant::now();
    let mut left = Vec::new();
    while grace.elapsed() < Duration::from_secs(1) {
        left.clear();
        for s in servers {
            left.extend(lock_keys(s).await);
        }
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cleared_in = grace.elapsed();
    let watched: usize = ctx.managers.iter().map(LockManager::watched_locks).sum();

    // Every queue slot is free: MAX_WAITERS waiters per key and manager all get the lock.
    let slots = Instant::now();
    let mut queue_full = 0;
    for k in 0..KEYS {
        let key = format!("storm_{{{k}}}");
        for (i, m) in ctx.managers.iter().enumerate() {
            let holder = &ctx.managers[(i + 1) % MANAGERS];
            let g = holder.lock(&key).await.expect("the key is free");
            let mut waiters = Vec::new();
            for _ in 0..MAX_WAITERS {
                let (m, key) = (m.clone(), key.clone());
                waiters.push(tokio::spawn(async move {
                    m.lock_with(&key, LockOptions::new().wait(Duration::from_secs(10)))
                        .await
                        .map(drop)
                }));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.release().await.unwrap();
            for w in waiters {
                match w.await.unwrap() {
                    Ok(()) => {}
                    Err(LockError::QueueFull { .. }) => queue_full += 1,
                    Err(e) => panic!("{name}: a waiter failed after the storm: {e}"),
                }
            }
        }
    }
    let slots_time = slots.elapsed();

    let mut sections = 0;
    let mut overlaps = 0;
    let mut violations = Vec::new();
    let mut problems = Vec::new();
    for k in 0..KEYS {
        let state = ctx.resources[k].state().await.unwrap();
        ctx.histories[k].settle(&state.accepted);
        let r = ctx.histories[k].check();
        sections += r.sections;
        overlaps += r.overlaps;
        violations.extend(r.violations);
        problems.extend(state.problems());
    }
    let c = &ctx.counts;
    println!(
        "s7 {name}: {} ops in {:.1} s by {TASKS} tasks on {MANAGERS} managers and {KEYS} keys: \
         {} acquired, {} dropped mid-flight, {} errors (Timeout/QueueFull); lock keys right \
         after: {right_after}, after {:.0} ms: {}; watched locks: {watched}; {} queued \
         waiters all served in {:.0} ms (QueueFull {queue_full}); checker: {sections} \
         sections, {overlaps} overlaps, {} violations; resource problems {:?}",
        c.ops.load(Ordering::Relaxed),
        storm_time.as_secs_f64(),
        c.acquired.load(Ordering::Relaxed),
        c.cancelled.load(Ordering::Relaxed),
        c.errors.load(Ordering::Relaxed),
        cleared_in.as_secs_f64() * 1e3,
        left.len(),
        KEYS * MANAGERS * MAX_WAITERS,
        slots_time.as_secs_f64() * 1e3,
        violations.len(),
        problems,
    );
    assert!(left.is_empty(), "{name}: lock keys left behind: {left:?}");
    assert_eq!(watched, 0, "{name}: the watchdog still renews locks");
    assert_eq!(queue_full, 0, "{name}: queue slots leaked");
    assert!(violations.is_empty(), "{name}: {violations:?}");
    assert!(problems.is_empty(), "{name}: {problems:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_cancellation_storm_single() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let server = RedisServer::start();
    let url = server.url();
    storm(
        "single",
        || LockManager::builder().single(&url),
        &[&server],
        rounds(5000, 50_000),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_cancellation_storm_redlock() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let set = RedisSet::start(3);
    let urls = set.urls();
    let nodes: Vec<&RedisServer> = set.nodes().iter().collect();
    storm(
        "redlock-3",
        || LockManager::builder().redlock(&urls),
        &nodes,
        rounds(2000, 20_000),
    )
    .await;
}
