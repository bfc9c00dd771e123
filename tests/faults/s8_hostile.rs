//! Scenario 8: bad input and hostile replies. Each must give a clear error (or a working
//! lock), never a panic, a hang or a leaked lock.
//!
//! * property tests (proptest) over keys, ttl/wait/watchdog options and connection URLs;
//! * a server at `maxmemory` with `noeviction` (OOM replies);
//! * a replica answering `READONLY`, from the start and after a demotion while holding;
//! * `SCRIPT FLUSH` in a tight loop *during* a contended workload (`tests/single.rs`
//!   covers a flush between calls);
//! * hostile values: the lock key turned into a hash while held, and fencing counters that
//!   are not integers, at the top of the integer range, or negative (`tests/single.rs`
//!   covers a wrong-typed key before acquiring).

use std::error::Error as _;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use redis::AsyncCommands;
use redlock::{LockError, LockManager, LockOptions, MAX_KEY_LEN, MAX_TTL, MIN_TTL};
use redlock_faults::clock::now_ns;
use redlock_faults::history::History;
use redlock_faults::resource::Resource;
use redlock_testkit::{wait_until, RedisServer};

use crate::support::{
    in_process_section, require_redis, rounds, single, single_with, soak, unique, HEAVY,
};

/// The full text of an error and its sources.
fn chain(e: &LockError) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

/// The library's key rule, restated: empty, too long, or a '}' without a non-empty
/// `{tag}` is `InvalidKey`.
fn key_is_valid(key: &str) -> bool {
    let full = format!("lock:{key}");
    if key.is_empty() || full.len() > MAX_KEY_LEN {
        return false;
    }
    let tagged = full
        .find('{')
        .and_then(|open| full[open + 1..].find('}'))
        .is_some_and(|close| close > 0);
    tagged || !full.contains('}')
}

fn keys() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[a-z{}]{0,12}",
        "[^{}]{0,6}\\{[^}]{0,4}\\}.{0,4}",
        "\\PC{0,3}[\0\n\r ]\\PC{0,3}",
        (MAX_KEY_LEN - 8..MAX_KEY_LEN).prop_map(|n| "k".repeat(n)),
    ]
}

fn ttls() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        (0u64..2_000_000).prop_map(Duration::from_nanos),
        (1u64..60_000).prop_map(Duration::from_millis),
        (MAX_TTL.as_secs() - 2..MAX_TTL.as_secs() + 2).prop_map(Duration::from_secs),
        any::<u64>().prop_map(Duration::from_nanos),
        any::<u64>().prop_map(Duration::from_secs),
    ]
}

fn waits() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        (0u64..50).prop_map(Duration::from_millis),
        Just(Duration::MAX),
        any::<u64>().prop_map(Duration::from_secs),
    ]
}

#[test]
fn s8_property_keys_and_options() {
    require_redis!();
    let _heavy = HEAVY.blocking_lock();
    let server = RedisServer::start();
    let rt = runtime();
    let locks = rt.block_on(single(&server.url()));
    let cases = if soak() { 2000 } else { 160 };
    let (ok, invalid_key, invalid_option) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let mut runner = TestRunner::new(config(cases));
    let result = runner.run(
        &(keys(), ttls(), waits(), any::<bool>()),
        |(key, ttl, wait, watchdog)| {
            rt.block_on(async {
                let opts = LockOptions::new().ttl(ttl).wait(wait).watchdog(watchdog);
                let overflow = Instant::now().checked_add(wait).is_none();
                let r = tokio::time::timeout(Duration::from_secs(5), locks.lock_with(&key, opts))
                    .await
                    .map_err(|_| TestCaseError::fail("lock_with hung"))?;
                match r {
                    Ok(g) => {
                        prop_assert!(key_is_valid(&key), "accepted an invalid key {key:?}");
                        prop_assert!((MIN_TTL..=MAX_TTL).contains(&ttl));
                        prop_assert_eq!(g.key(), format!("lock:{key}"));
                        prop_assert!(g.fencing_token() >= 1);
                        match g.release().await {
                            // A 1-ms lock may be gone before the release.
                            Ok(()) | Err(LockError::Lost { .. }) => {}
                            Err(e) => return Err(TestCaseError::fail(format!("release: {e}"))),
                        }
                        prop_assert!(!locks.is_locked(&key).await.unwrap());
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(LockError::InvalidKey { .. }) => {
                        prop_assert!(!key_is_valid(&key), "rejected a valid key {key:?}");
                        invalid_key.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(LockError::InvalidOption { .. }) => {
                        prop_assert!(key_is_valid(&key));
                        prop_assert!(!(MIN_TTL..=MAX_TTL).contains(&ttl) || overflow);
                        invalid_option.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("{key:?}: {}", chain(&e)))),
                }
                Ok(())
            })
        },
    );
    println!(
        "s8 property keys/options: {cases} cases: {} locked and released, {} InvalidKey, {} \
         InvalidOption, no panic, no hang",
        ok.load(Ordering::Relaxed),
        invalid_key.load(Ordering::Relaxed),
        invalid_option.load(Ordering::Relaxed)
    );
    result.unwrap();
    // Nothing but fencing counters is left.
    let keys: Vec<String> = rt.block_on(async {
        let mut raw = server
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        raw.keys("*").await.unwrap()
    });
    let leaked: Vec<&String> = keys
        .iter()
        .filter(|k| !k.starts_with("lock:fence:{"))
        .collect();
    assert!(leaked.is_empty(), "left behind: {leaked:?}");
}

/// URLs built from loopback hosts only (no name resolution, no traffic leaves the machine).
fn urls(live: u16, dead: u16) -> impl Strategy<Value = String> {
    let scheme = prop_oneof![
        Just("redis://"),
        Just("rediss://"),
        Just("redis+unix://"),
        Just("unix://"),
        Just("http://"),
        Just(""),
        Just("redis:/"),
        Just("REDIS://"),
    ];
    let user = prop_oneof![
        Just(String::new()),
        Just("default@".to_owned()),
        Just(":nopass@".to_owned()),
        Just("nobody:wrong@".to_owned()),
        "[a-z%:@]{0,8}@",
    ];
    let host = prop_oneof![
        Just("127.0.0.1"),
        Just("localhost"),
        Just("[::1]"),
        Just(""),
        Just("127.0.0.1."),
        Just("[::1"),
        Just("%zz"),
    ];
    let port = prop_oneof![
        Just(format!(":{live}")),
        Just(format!(":{dead}")),
        Just(":0".to_owned()),
        Just(":99999".to_owned()),
        Just(":".to_owned()),
        Just(":-1".to_owned()),
        Just(":abc".to_owned()),
    ];
    let db = prop_oneof![
        Just(""),
        Just("/"),
        Just("/0"),
        Just("/15"),
        Just("/16"),
        Just("/99999999999"),
        Just("/x"),
    ];
    let query = prop_oneof![
        Just(""),
        Just("?protocol=resp3"),
        Just("?protocol=9"),
        Just("?db=3"),
        Just("?&&"),
        Just("?protocol="),
    ];
    let anything = (scheme, user, host, port, db.clone(), query.clone())
        .prop_map(|(s, u, h, p, d, q)| format!("{s}{u}{h}{p}{d}{q}"));
    // Mostly well-formed, so the connected paths are exercised too.
    let plausible = (
        prop_oneof![Just("127.0.0.1"), Just("localhost")],
        prop_oneof![
            Just(""),
            Just("default@"),
            Just(":anything@"),
            Just("nobody:x@")
        ],
        db,
        query,
    )
        .prop_map(move |(h, u, d, q)| format!("redis://{u}{h}:{live}{d}{q}"));
    prop_oneof![1 => anything, 1 => plausible]
}

#[test]
fn s8_property_urls() {
    require_redis!();
    let _heavy = HEAVY.blocking_lock();
    let server = RedisServer::start();
    let dead = redlock_testkit::free_port();
    let rt = runtime();
    let cases = if soak() { 1000 } else { 96 };
    let (ok, invalid, backend) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let slowest = std::sync::Mutex::new(Duration::ZERO);
    let mut runner = TestRunner::new(config(cases));
    let result = runner.run(&urls(server.port(), dead), |url| {
        rt.block_on(async {
            let started = Instant::now();
            let built = tokio::time::timeout(
                Duration::from_secs(5),
                LockManager::builder()
                    .single(&url)
                    .connect_timeout(Duration::from_millis(300))
                    .build(),
            )
            .await
            .map_err(|_| TestCaseError::fail(format!("{url}: build hung")))?;
            let took = started.elapsed();
            {
                let mut s = slowest.lock().unwrap();
                *s = (*s).max(took);
            }
            prop_assert!(took < Duration::from_secs(2), "{url}: build took {took:?}");
            match built {
                Ok(locks) => {
                    let key = unique("url");
                    match locks.try_lock(&key).await {
                        Ok(Some(g)) => g.release().await.unwrap(),
                        Ok(None) => return Err(TestCaseError::fail("fresh key held")),
                        // E.g. a db index the server does not have.
                        Err(LockError::Backend { .. }) => {}
                        Err(e) => return Err(TestCaseError::fail(format!("{url}: {e}"))),
                    }
                    ok.fetch_add(1, Ordering::Relaxed);
                }
                Err(LockError::InvalidOption { .. }) => {
                    invalid.fetch_add(1, Ordering::Relaxed);
                }
                Err(LockError::Backend { .. }) => {
                    backend.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => return Err(TestCaseError::fail(format!("{url}: {}", chain(&e)))),
            }
            Ok(())
        })
    });
    println!(
        "s8 property URLs: {cases} cases: {} connected, {} InvalidOption, {} Backend; \
         slowest build {:?} (connect timeout 300 ms)",
        ok.load(Ordering::Relaxed),
        invalid.load(Ordering::Relaxed),
        backend.load(Ordering::Relaxed),
        slowest.lock().unwrap()
    );
    result.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_out_of_memory_noeviction() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let server = RedisServer::builder()
        .args(["--maxmemory-policy", "noeviction"])
        .start();
    let locks = single(&server.url()).await;
    let ttl = Duration::from_millis(600);
    let held = locks
        .lock_with("oom_{held}", LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let mut raw = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // 2 MiB of data, then a limit of 1 MiB: every write that may grow memory is refused.
    let junk = vec![b'x'; 64 * 1024];
    let filled = 32;
    for i in 0..filled {
        let _: () = raw.set(format!("junk:{i}"), &junk).await.unwrap();
    }
    server
        .cmd_sync(&["CONFIG", "SET", "maxmemory", "1mb"])
        .unwrap();
    let oom: redis::RedisResult<()> = raw.set("probe", 1).await;
    assert!(
        oom.as_ref()
            .is_err_and(|e| e.code() == Some("OOM") || e.to_string().contains("OOM")),
        "not out of memory: {oom:?}"
    );

    let err = locks.try_lock("oom_{new}").await.unwrap_err();
    let text = chain(&err);
    assert!(matches!(err, LockError::Backend { .. }), "{text}");
    assert!(text.contains("OOM"), "{text}");
    let started = Instant::now();
    let err = locks
        .lock_with(
            "oom_{new}",
            LockOptions::new().wait(Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert!(matches!(err, LockError::Backend { .. }), "{}", chain(&err));
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    let exists: bool = raw.exists("lock:oom_{new}").await.unwrap();
    assert!(!exists, "a failed acquisition left its key");

    // A lock held before the server filled up is still renewed, extended and released.
    tokio::time::sleep(ttl * 2).await;
    let renewed = held.is_held();
    let extended = held.extend(ttl).await;
    let released = held.release().await;
    println!(
        "s8 OOM: {filled} x 64 KiB stored, maxmemory 1 MiB; acquire -> {text}; with wait 300 ms -> Backend after \
         {waited:?}; a lock taken before: still held after 2 ttl {renewed}, extend {extended:?}, \
         release {released:?}"
    );
    assert!(renewed, "renewal failed under OOM");
    assert!(extended.is_ok() && released.is_ok());

    // Memory back: locks work again.
    for i in 0..filled {
        let _: () = raw.del(format!("junk:{i}")).await.unwrap();
    }
    server
        .cmd_sync(&["CONFIG", "SET", "maxmemory", "0"])
        .unwrap();
    let g = locks
        .lock("oom_{new}")
        .await
        .expect("works after memory is freed");
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_replica_answers_readonly() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let master = RedisServer::start();
    let replica = RedisServer::builder().replica_of(master.port()).start();
    assert!(wait_until(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || replica
            .cmd_sync(&["INFO", "replication"])
            .ok()
            .and_then(|v| redis::from_redis_value::<String>(v).ok())
            .is_some_and(|s| s.contains("master_link_status:up"))
    ));
    let locks = single(&replica.url()).await;
    let err = locks.try_lock("ro_{1}").await.unwrap_err();
    let text = chain(&err);
    assert!(matches!(err, LockError::Backend { .. }), "{text}");
    assert!(text.to_lowercase().contains("read only replica"), "{text}");
    let started = Instant::now();
    let err = locks
        .lock_with(
            "ro_{1}",
            LockOptions::new().wait(Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert!(matches!(err, LockError::Backend { .. }), "{}", chain(&err));
    assert!(waited < Duration::from_secs(2));
    let forced = locks.force_unlock("ro_{1}").await;
    assert!(
        matches!(forced, Err(LockError::Backend { .. })),
        "{forced:?}"
    );
    assert!(!locks.is_locked("ro_{1}").await.unwrap());

    // A primary demoted (REPLICAOF) under a holder: its lock is lost, within the lease.
    let demoted = RedisServer::start();
    let holder = single(&demoted.url()).await;
    let ttl = Duration::from_millis(600);
    let g = holder
        .lock_with("ro_{2}", LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let port = master.port().to_string();
    let _ = demoted
        .cmd_sync(&["REPLICAOF", "127.0.0.1", &port])
        .unwrap();
    let demoted_at = Instant::now();
    let lost = tokio::time::timeout(ttl * 3, g.lost()).await.is_ok();
    let lost_after = demoted_at.elapsed();
    let release = g.release().await;
    println!(
        "s8 READONLY: on a replica acquire -> {text}; with wait 300 ms -> Backend after \
         {waited:?}; force_unlock -> Backend; a primary demoted under a holder: lost after \
         {lost_after:?} (ttl {ttl:?}), release -> {release:?}"
    );
    assert!(lost, "the lock on a demoted primary was not declared lost");
    assert!(lost_after <= ttl + Duration::from_millis(100));
    assert!(matches!(
        release,
        Err(LockError::Lost { .. } | LockError::Backend { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_script_flush_storm_during_contention() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let server = RedisServer::start();
    let res = RedisServer::start();
    let resource = Resource::open(&res.url(), "s8-flush").await.unwrap();
    let history = Arc::new(History::new());
    let key = format!("{{{}}}", unique("flush"));
    let stop = Arc::new(AtomicBool::new(false));
    let flushes = Arc::new(AtomicUsize::new(0));
    let flusher = {
        let (stop, flushes) = (stop.clone(), flushes.clone());
        let client = server.client();
        tokio::spawn(async move {
            let mut raw = client.get_multiplexed_async_connection().await.unwrap();
            // Bounded: stops on the flag, at most 100 000 flushes.
            for _ in 0..100_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let _: () = redis::cmd("SCRIPT")
                    .arg("FLUSH")
                    .query_async(&mut raw)
                    .await
                    .unwrap();
                flushes.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let per_task = rounds(15, 150);
    let errors = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for m in 0..3 {
        // Short ttl: the watchdog renews (batched script, SCRIPT LOAD first) all along.
        let locks = single_with(&server.url(), |b| b.default_ttl(Duration::from_millis(300))).await;
        for t in 0..3 {
            let (locks, key, resource, history, errors) = (
                locks.clone(),
                key.clone(),
                resource.clone(),
                history.clone(),
                errors.clone(),
            );
            tasks.push(tokio::spawn(async move {
                for _ in 0..per_task {
                    let g = match locks
                        .lock_with(&key, LockOptions::new().wait(Duration::from_secs(20)))
                        .await
                    {
                        Ok(g) => g,
                        Err(e) => {
                            eprintln!("s8 flush: lock: {}", chain(&e));
                            errors.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    };
                    let s = in_process_section(
                        &resource,
                        &format!("m{m}t{t}"),
                        g.fencing_token(),
                        now_ns(),
                        Duration::from_millis(fastrand::u64(0..5)),
                    )
                    .await;
                    history.record(s);
                    if let Err(e) = g.release().await {
                        eprintln!("s8 flush: release: {}", chain(&e));
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    flusher.await.unwrap();
    let state = resource.state().await.unwrap();
    let report = history.check();
    println!(
        "s8 SCRIPT FLUSH storm: {} flushes during {} lock/section/release cycles by 9 tasks on \
         3 managers; errors {}; checker: {report}; counter {} = commits {}",
        flushes.load(Ordering::Relaxed),
        9 * per_task,
        errors.load(Ordering::Relaxed),
        state.value,
        state.accepted.len()
    );
    assert_eq!(errors.load(Ordering::Relaxed), 0);
    assert!(report.ok(), "{report}");
    assert_eq!(report.overlaps, 0);
    assert!(state.problems().is_empty(), "{:?}", state.problems());
    assert_eq!(state.value as usize, 9 * per_task);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_hostile_values() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let server = RedisServer::start();
    let locks = single(&server.url()).await;
    let other = single(&server.url()).await;
    let mut raw = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();

    // The lock key replaced by a hash while held: lost at the next renewal, clear errors.
    let ttl = Duration::from_millis(300);
    let g = locks
        .lock_with("typed_{2}", LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let _: () = raw.del("lock:typed_{2}").await.unwrap();
    let _: () = raw.hset("lock:typed_{2}", "f", "v").await.unwrap();
    let lost = tokio::time::timeout(ttl, g.lost()).await.is_ok();
    let extend = g.extend(ttl).await;
    let release = g.release().await;
    let theirs = other
        .lock_with(
            "typed_{2}",
            LockOptions::new().wait(Duration::from_millis(200)),
        )
        .await;
    println!(
        "s8 hostile: lock key turned into a hash while held: lost {lost}, extend {:?}, release \
         {:?}, another acquire {:?}",
        extend.as_ref().map_err(LockError::kind),
        release.as_ref().map_err(LockError::kind),
        theirs.as_ref().map(|_| ()).map_err(LockError::kind)
    );
    assert!(lost, "not declared lost");
    assert!(matches!(
        extend,
        Err(LockError::Lost { .. } | LockError::Backend { .. })
    ));
    assert!(matches!(
        release,
        Err(LockError::Lost { .. } | LockError::Backend { .. })
    ));
    assert!(
        matches!(theirs, Err(LockError::Backend { .. })),
        "{theirs:?}"
    );

    // Fencing counters an operator (or an attacker) tampered with.
    for (name, value) in [
        ("nan", "abc"),
        ("max", "9223372036854775807"),
        ("neg", "-5"),
        ("zero", "0"),
    ] {
        let key = format!("fence_{{{name}}}");
        let counter = redlock_testkit::fence_key("lock:", &format!("lock:{key}"));
        let _: () = raw.set(counter, value).await.unwrap();
        let r = locks.try_lock(&key).await;
        let exists: bool = raw.exists(format!("lock:{key}")).await.unwrap();
        let outcome = match &r {
            Ok(Some(g)) => format!("acquired, token {}", g.fencing_token()),
            Ok(None) => "held?".to_owned(),
            Err(e) => chain(e),
        };
        println!("s8 hostile: fencing counter {value:?} -> {outcome}; lock key left: {exists}");
        match r {
            Ok(Some(g)) => {
                assert!(
                    g.fencing_token() >= 1,
                    "counter {value}: token {} issued",
                    g.fencing_token()
                );
                g.release().await.unwrap();
            }
            Err(LockError::Backend { .. }) => {
                assert!(
                    !exists,
                    "counter {value}: a failed acquisition left its key"
                );
            }
            other => panic!("counter {value}: {other:?}"),
        }
    }
}
