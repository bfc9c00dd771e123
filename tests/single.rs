//! The conformance suite and Redis-specific behaviour on one real redis-server.

mod conformance;

use std::time::{Duration, Instant};

use conformance::backends::{self, Single};
use conformance::{manager, unique, Harness};
use redis::AsyncCommands;
use redlock::{LockError, LockManager, LockOptions};
use redlock_testkit::{fence_key, key_slot, RedisServer};

conformance_tests!(Single::new());
kinds_tests!(Single::new());
fair_tests!(Single::new());
rules_tests!(Single::new());
leader_tests!(Single::new());

/// The lock is stored under its full key, its fencing counter is its slot's
/// `lock:fence:{<tag>}` (shared by every key of the slot), the counter outlives the lock,
/// and nothing else is left behind.
#[tokio::test]
async fn stored_keys_are_the_lock_and_its_slot_counter() {
    let h = Single::new();
    let locks = manager(&h).await;
    let guard = locks.lock("buy_{42}").await.unwrap();
    assert_eq!(guard.key(), "lock:buy_{42}");
    let counter = fence_key("lock:", "lock:buy_{42}");
    assert_eq!(key_slot(counter.as_bytes()), key_slot(b"lock:buy_{42}"));
    let mut raw = h.raw().await;
    let mut expected = vec!["lock:buy_{42}".to_owned(), counter.clone()];
    expected.sort();
    assert_eq!(h.keys().await, expected);
    let pttl: i64 = raw.pttl("lock:buy_{42}").await.unwrap();
    assert!(
        pttl > 25_000 && pttl <= 30_000,
        "default ttl 30 s, got {pttl} ms"
    );
    guard.release().await.unwrap();
    assert_eq!(h.keys().await, std::slice::from_ref(&counter));
    let fence: u64 = raw.get(&counter).await.unwrap();
    assert_eq!(fence, 1);
    // Another key of the slot shares the counter.
    let guard = locks.lock("sell_{42}").await.unwrap();
    assert_eq!(guard.fencing_token(), 2);
    guard.release().await.unwrap();
    // An untagged key: the counter of the whole key's slot.
    let guard = locks.lock("jobs").await.unwrap();
    let counter = fence_key("lock:", "lock:jobs");
    assert_eq!(key_slot(counter.as_bytes()), key_slot(b"lock:jobs"));
    let n: i64 = raw.exists(&counter).await.unwrap();
    assert_eq!(n, 1);
    guard.release().await.unwrap();
}

/// Connecting checks the URL and the server at once, and writes nothing.
#[tokio::test]
async fn connect_errors_are_immediate_and_clear() {
    for url in [
        "not a url",
        "http://127.0.0.1:6379",
        "redis://127.0.0.1:99999",
    ] {
        let err = LockManager::connect(url).await.unwrap_err();
        assert!(
            matches!(
                err,
                LockError::InvalidOption { .. } | LockError::Backend { .. }
            ),
            "{url}: {err}"
        );
    }
    // Nothing listens on a freshly freed port.
    let port = redlock_testkit::free_port();
    let start = Instant::now();
    let err = LockManager::builder()
        .single(format!("redis://127.0.0.1:{port}"))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    let h = Single::new();
    let _locks = manager(&h).await;
    let keys: Vec<String> = h.raw().await.keys("*").await.unwrap();
    assert!(keys.is_empty(), "connect wrote {keys:?}");
}

/// A paused (SIGSTOP) server cannot hang connect: it fails within the connect timeout.
#[tokio::test]
async fn connect_to_a_frozen_server_times_out() {
    let mut h = Single::new();
    h.server.pause();
    let start = Instant::now();
    let err = h
        .builder()
        .connect_timeout(Duration::from_millis(400))
        .build()
        .await
        .unwrap_err();
    h.server.resume();
    assert!(matches!(err, LockError::Backend { .. }), "{err}");
    assert!(start.elapsed() < Duration::from_secs(2));
}

/// ACL user and password in the URL work; wrong credentials are a clear error.
#[tokio::test]
async fn acl_credentials_in_the_url() {
    let h = Single::new();
    h.server
        .cmd_sync(&[
            "ACL", "SETUSER", "locker", "on", ">s3cret", "~lock:*", "&lock:*", "+@all",
        ])
        .unwrap();
    let port = h.server.port();
    let locks = LockManager::connect(&format!("redis://locker:s3cret@127.0.0.1:{port}"))
        .await
        .expect("ACL user connects");
    let g = locks.lock("acl_{1}").await.unwrap();
    g.release().await.unwrap();
    let err = LockManager::connect(&format!("redis://locker:wrong@127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err}");
}

/// A restarted Redis (all locks and scripts gone) does not wedge a live manager.
#[tokio::test]
async fn survives_a_redis_restart() {
    let mut h = Single::new();
    let (a, b) = (manager(&h).await, manager(&h).await);
    let key = unique("restart");
    let g = a.lock(&key).await.unwrap();
    drop(g);
    h.server.kill9();
    // During the outage: a clear Backend error, or a wait within the budget.
    let start = Instant::now();
    let err = a
        .lock_with(&key, LockOptions::new().wait(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(
        matches!(err, LockError::Backend { .. } | LockError::Timeout { .. }),
        "{err}"
    );
    assert!(start.elapsed() < Duration::from_secs(3));
    h.server.restart();
    // Both managers work again within a bounded time.
    for locks in [&a, &b] {
        let g = locks
            .lock_with(&key, LockOptions::new().wait(Duration::from_secs(10)))
            .await
            .expect("works after restart");
        g.release().await.unwrap();
    }
    // A waiter parked across a restart is still woken by a release.
    let g = a.lock(&key).await.unwrap();
    let (b2, k2) = (b.clone(), key.clone());
    let waiter = tokio::spawn(async move { b2.lock(&k2).await.map(drop) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    g.release().await.unwrap();
    waiter.await.unwrap().unwrap();
    assert!(released.elapsed() < Duration::from_secs(5));
}

/// SCRIPT FLUSH between calls: NOSCRIPT is recovered transparently, batch renewals too.
#[tokio::test]
async fn script_flush_is_recovered() {
    let h = Single::new();
    let locks = manager(&h).await;
    let key = unique("flush");
    let g = locks
        .lock_with(&key, LockOptions::new().ttl(Duration::from_millis(300)))
        .await
        .unwrap();
    h.server.cmd_sync(&["SCRIPT", "FLUSH"]).unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(g.is_held(), "renewal failed after SCRIPT FLUSH");
    h.server.cmd_sync(&["SCRIPT", "FLUSH"]).unwrap();
    g.extend(Duration::from_secs(5)).await.unwrap();
    h.server.cmd_sync(&["SCRIPT", "FLUSH"]).unwrap();
    g.release().await.unwrap();
    h.server.cmd_sync(&["SCRIPT", "FLUSH"]).unwrap();
    locks.lock(&key).await.unwrap().release().await.unwrap();
}

/// Hostile state: a key of the wrong type is a Backend error, not a panic, and leaks
/// nothing; so is a fencing counter of the wrong type.
#[tokio::test]
async fn wrong_type_keys_are_clear_errors() {
    let h = Single::new();
    let locks = manager(&h).await;
    h.server
        .cmd_sync(&["HSET", "lock:typed_{1}", "f", "v"])
        .unwrap();
    let err = locks.lock("typed_{1}").await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err}");
    // The attempt above incremented the slot's counter before it met the hash (every
    // acquire counts first): replace it with a hash.
    let counter = fence_key("lock:", "lock:fenced_{1}");
    h.server.cmd_sync(&["DEL", &counter]).unwrap();
    h.server.cmd_sync(&["HSET", &counter, "f", "v"]).unwrap();
    let err = locks.lock("fenced_{1}").await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err}");
    let mut raw = h.raw().await;
    let exists: bool = raw.exists("lock:fenced_{1}").await.unwrap();
    assert!(!exists, "a failed acquisition left its lock key");
}

/// A client that knows the key but not the token can neither release nor extend:
/// the token is what proves ownership (128 random bits).
#[tokio::test]
async fn foreign_clients_cannot_release() {
    let h = Single::new();
    let locks = manager(&h).await;
    let g = locks.lock("owned_{1}").await.unwrap();
    let mut raw = h.raw().await;
    let value: Vec<u8> = raw.get("lock:owned_{1}").await.unwrap();
    assert!(
        value.len() > 16 && value[16..].starts_with(b"|1|"),
        "the token is 128 bits, the owner metadata follows"
    );
    let other = manager(&h).await;
    assert!(other.try_lock("owned_{1}").await.unwrap().is_none());
    assert!(g.is_held());
    g.release().await.unwrap();
}

/// Waiting is notified, and a waiter whose holder is a crashed process (no release
/// message) is woken by the ttl fallback, not before.
#[tokio::test]
async fn ttl_fallback_wakes_waiters_of_crashed_holders() {
    let h = Single::new();
    let (a, b) = (manager(&h).await, manager(&h).await);
    let key = unique("fallback");
    let g = a
        .lock_with(
            &key,
            LockOptions::new()
                .ttl(Duration::from_millis(600))
                .watchdog(false),
        )
        .await
        .unwrap();
    std::mem::forget(g);
    let start = Instant::now();
    b.lock(&key).await.unwrap().release().await.unwrap();
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(550) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
}

/// The hand-off median on one real server (printed for the closing note).
#[tokio::test]
async fn handoff_median_is_printed() {
    let h = Single::new();
    let median = conformance::notified_handoff_is_fast(&h).await;
    println!("notified hand-off median on one redis-server: {median:?}");
}

/// Without the `tls` feature a `rediss://` URL is refused up front with a clear error
/// (never a panic deep in the TLS stack), and the password is not echoed.
#[cfg(not(feature = "tls"))]
#[tokio::test]
async fn rediss_without_the_tls_feature_is_a_clear_error() {
    let err = LockManager::connect("rediss://user:hunter2@127.0.0.1:6380")
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

/// A release that fails because Redis is briefly down is retried in the background, so
/// the lock frees within seconds of Redis coming back, not at the end of its 30 s ttl
/// (the server keeps its data across the restart: AOF).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_releases_are_retried_in_the_background() {
    let mut server = redlock_testkit::RedisServer::builder().aof(true).start();
    let locks = LockManager::connect(&server.url()).await.unwrap();
    let dropped = locks.lock("retry_{dropped}").await.unwrap();
    let released = locks.lock("retry_{released}").await.unwrap();
    server.kill9();
    drop(dropped);
    let err = released.release().await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err}");
    server.restart();
    let back = Instant::now();
    for key in ["lock:retry_{dropped}", "lock:retry_{released}"] {
        let gone =
            redlock_testkit::wait_until(Duration::from_secs(8), Duration::from_millis(20), || {
                server.cmd_sync(&["EXISTS", key]).ok() == Some(redis::Value::Int(0))
            });
        assert!(
            gone,
            "{key} still held {:?} after Redis came back",
            back.elapsed()
        );
    }
    assert!(back.elapsed() < Duration::from_secs(10));
}

/// Locks and releases `key` once on an empty server: the one key left is its counter.
async fn counter_of(h: &Single, locks: &LockManager, key: &str) -> String {
    locks.lock(key).await.unwrap().release().await.unwrap();
    let keys = h.keys().await;
    assert_eq!(keys.len(), 1, "only the fencing counter is left: {keys:?}");
    keys.into_iter().next().unwrap()
}

/// Regression (issue 11, finding 4): `INCR` inside Lua came back as a double, so from a
/// counter of 2^53 − 1 two successive tokens were both 2^53.
#[tokio::test]
async fn fencing_tokens_stay_exact_above_2_pow_53() {
    let h = Single::new();
    let locks = manager(&h).await;
    let key = "exact_{53}";
    let counter = counter_of(&h, &locks, key).await;
    let mut raw = h.raw().await;
    let _: () = raw.set(&counter, (1u64 << 53) - 1).await.unwrap();
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let g = locks.lock(key).await.unwrap();
        tokens.push(g.fencing_token());
        g.release().await.unwrap();
    }
    assert_eq!(tokens, [1 << 53, (1 << 53) + 1, (1 << 53) + 2]);
    let stored: u64 = raw.get(&counter).await.unwrap();
    assert_eq!(stored, (1 << 53) + 2);
}

/// Regression (issue 11, finding 4): near 2^63 the token went through a double and
/// decoded to 0. The last value, i64::MAX, is issued exactly; after it `INCR` overflows,
/// which is a clear error that leaves no lock behind.
#[tokio::test]
async fn fencing_counter_near_2_pow_63_is_an_error_not_token_0() {
    let h = Single::new();
    let locks = manager(&h).await;
    let key = "exact_{63}";
    let counter = counter_of(&h, &locks, key).await;
    let mut raw = h.raw().await;
    let _: () = raw.set(&counter, i64::MAX - 1).await.unwrap();
    let g = locks.lock(key).await.unwrap();
    assert_eq!(g.fencing_token(), i64::MAX as u64);
    g.release().await.unwrap();
    let err = locks.lock(key).await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err}");
    let exists: bool = raw.exists(format!("lock:{key}")).await.unwrap();
    assert!(!exists, "the failed acquisition left its lock key");
    assert!(!locks.is_locked(key).await.unwrap());
    let stored: i64 = raw.get(&counter).await.unwrap();
    assert_eq!(stored, i64::MAX, "the counter is untouched");
}

/// Regression (issue 11, finding 7): every distinct key left a permanent counter, so
/// 1 000 distinct keys left 1 000 keys behind. Counters are per hash slot now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_counters_do_not_grow_with_distinct_keys() {
    let h = Single::new();
    let locks = manager(&h).await;
    let mut raw = h.raw().await;
    // 2 000 distinct keys in 4 slots, each taken twice: tokens increase per key.
    let mut first = Vec::new();
    for i in 0..2000 {
        let g = locks
            .lock(&format!("order_{{{}}}:{i}", i % 4))
            .await
            .unwrap();
        first.push(g.fencing_token());
        g.release().await.unwrap();
    }
    let dbsize: usize = redis::cmd("DBSIZE").query_async(&mut raw).await.unwrap();
    assert!(dbsize <= 4, "2 000 keys in 4 slots left {dbsize} keys");
    for i in (0..2000).step_by(97) {
        let g = locks
            .lock(&format!("order_{{{}}}:{i}", i % 4))
            .await
            .unwrap();
        assert!(
            g.fencing_token() > first[i],
            "key {i}: {} after {}",
            g.fencing_token(),
            first[i]
        );
        g.release().await.unwrap();
    }
    // 20 000 distinct untagged keys: at most one counter per slot.
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let locks = locks.clone();
            tokio::spawn(async move {
                for i in (t..20_000).step_by(8) {
                    locks
                        .lock(&format!("job-{i}"))
                        .await
                        .unwrap()
                        .release()
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let dbsize: usize = redis::cmd("DBSIZE").query_async(&mut raw).await.unwrap();
    assert!(dbsize <= 16384 + 4, "20 000 keys left {dbsize} keys");
    println!("20 000 distinct untagged keys + 2 000 in 4 slots: DBSIZE {dbsize}");
}

/// A server that may evict keys (an evicted lock key is granted to a second holder): a
/// warning by default, an error under `require_noeviction(true)`.
#[tokio::test]
async fn require_noeviction_refuses_a_server_that_may_evict_locks() {
    let evicting = RedisServer::builder()
        .args(["--maxmemory-policy", "allkeys-lru"])
        .start();
    let err = LockManager::builder()
        .single(evicting.url())
        .require_noeviction(true)
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err}");
    assert!(err.to_string().contains("allkeys-lru"), "{err}");
    let locks = LockManager::builder()
        .single(evicting.url())
        .build()
        .await
        .expect("only a warning by default");
    locks
        .lock("evictable")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // The default policy, noeviction, passes.
    let h = Single::new();
    h.builder().require_noeviction(true).build().await.unwrap();
}

/// A prefix with an unclosed `{` would put the fencing counters in other slots.
#[tokio::test]
async fn a_prefix_with_an_unclosed_brace_is_refused() {
    let h = Single::new();
    for prefix in ["lock{", "a{b:", "x{}:"] {
        let err = h.builder().prefix(prefix).build().await.unwrap_err();
        assert!(
            matches!(err, LockError::InvalidOption { .. }),
            "{prefix}: {err}"
        );
    }
    let locks = h.builder().prefix("app{7}:").build().await.unwrap();
    let g = locks.lock("jobs").await.unwrap();
    assert_eq!(g.key(), "app{7}:jobs");
    g.release().await.unwrap();
    assert_eq!(h.keys().await, [fence_key("app{7}:", "app{7}:jobs")]);
    // A user key that names a counter is refused.
    let counter = fence_key("lock:", "lock:x");
    let err = manager(&h)
        .await
        .lock(counter.strip_prefix("lock:").unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidKey { .. }), "{err}");
}

/// Regression (issue 11, finding 3, the script half): `acquire.lua` granted a request
/// that found its own token (a retry) without resetting the expiry, so a stale grant
/// with its old, nearly spent expiry was counted as fresh.
#[tokio::test]
async fn acquire_retry_with_own_token_resets_the_expiry() {
    let h = Single::new();
    let mut raw = h.raw().await;
    let acquire = redis::Script::new(include_str!("../redlock-runtime/src/scripts/acquire.lua"));
    let (key, counter) = ("lock:retry_{1}", fence_key("lock:", "lock:retry_{1}"));
    let run = |ttl: u64| {
        let mut cmd = acquire.key(key);
        cmd.key(&counter)
            .arg(b"own-token-16byte".as_slice())
            .arg(ttl);
        cmd
    };
    // A grant replies with its fencing token (an integer, or decimal digits).
    let first: u64 = run(60_000).invoke_async(&mut raw).await.unwrap();
    assert_eq!(first, 1);
    // Most of the first grant's ttl is spent; the retry asks for a fresh 60 s.
    let _: () = raw.pexpire(key, 100).await.unwrap();
    let retry: u64 = run(60_000).invoke_async(&mut raw).await.unwrap();
    assert_eq!(retry, first, "granted again, same token");
    let pttl: i64 = raw.pttl(key).await.unwrap();
    assert!(pttl > 50_000, "the retry's grant expires in {pttl} ms");
}

/// `wait` bounds the whole of `lock()`: with the server frozen (SIGSTOP), a call returns
/// within its wait plus about one request timeout (its `WAIT` included), whether it fails
/// on its first attempt, in its subscription, in a later attempt, or while opening the
/// connection `min_replicas` needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_bounds_lock_against_a_frozen_server() {
    let mut h = Single::new();
    let response = Duration::from_millis(500);
    let build = || h.builder().response_timeout(response).build();
    let (locks, cold) = (build().await.unwrap(), build().await.unwrap());
    let replica_wait = Duration::from_millis(200);
    let opts = |wait, replicas| {
        let o = LockOptions::new().ttl(replica_wait * 10).wait(wait);
        if replicas {
            o.min_replicas(1)
        } else {
            o
        }
    };
    // Warm: scripts cached, connections open (the `WAIT` one too: no replica, so it
    // fails after the WAIT timeout); one key is held by another manager.
    let held_key = unique("frozen");
    let _held = manager(&h).await.lock(&held_key).await.unwrap();
    let err = locks
        .lock_with(&unique("warm"), opts(Duration::ZERO, true))
        .await
        .unwrap_err();
    assert!(
        matches!(err, LockError::ReplicasUnavailable { .. }),
        "{err}"
    );
    h.server.pause();
    let mut report = Vec::new();
    for wait in [
        Duration::ZERO,
        Duration::from_millis(100),
        Duration::from_millis(700),
    ] {
        for (case, replicas) in [
            ("held key", false),
            ("free key", false),
            ("min_replicas", true),
            ("min_replicas, no connection yet", true),
        ] {
            let key = if case == "held key" {
                held_key.clone()
            } else {
                unique("frozen")
            };
            let manager = if case.ends_with("yet") { &cold } else { &locks };
            let start = Instant::now();
            let outcome = manager
                .lock_with(&key, opts(wait, replicas))
                .await
                .map(drop);
            let took = start.elapsed();
            let bound = wait
                + response * 2
                + if replicas {
                    replica_wait
                } else {
                    Duration::ZERO
                };
            let ok = outcome.is_err() && took < bound;
            report.push((
                ok,
                format!("wait {wait:?}, {case}: {took:?} (bound {bound:?}) {outcome:?}"),
            ));
        }
    }
    h.server.resume();
    let lines: Vec<String> = report
        .iter()
        .map(|(ok, line)| format!("{} {line}", if *ok { "ok  " } else { "SLOW" }))
        .collect();
    println!("{}", lines.join("\n"));
    assert!(report.iter().all(|(ok, _)| *ok), "{}", lines.join("\n"));
}

/// A release between the subscriber's disconnection and its resubscription still wakes
/// its waiter (see the conformance module).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriber_reconnect_loses_no_wake_up() {
    let h = Single::new();
    conformance::subscriber_reconnect_loses_no_wake_up(
        &h,
        |channels| {
            backends::numsub(&h.server, channels)
                .iter()
                .filter(|&&n| n == 1)
                .count()
        },
        || backends::kill_pubsub(&h.server),
    )
    .await;
}

/// `lock_all` on one server takes every key in one script call (all or nothing), not
/// one round trip per key; a miss takes nothing and is one call too.
#[tokio::test]
async fn lock_all_on_one_server_is_one_script_call() {
    let h = Single::new();
    let (a, b) = (manager(&h).await, manager(&h).await);
    // One hash slot, so one fencing counter: each key still gets a token of its own.
    let tag = unique("accounts");
    let keys = [format!("{tag}:1"), format!("{tag}:2"), format!("{tag}:3")];
    // The server learns the script (EVALSHA, NOSCRIPT, EVAL) once.
    a.lock_all(&keys).await.unwrap().release().await.unwrap();
    let before = h.server.command_calls(&["eval", "evalsha"]);
    let all = a.lock_all(&keys).await.unwrap();
    assert_eq!(h.server.command_calls(&["eval", "evalsha"]) - before, 1);
    let before = h.server.command_calls(&["eval", "evalsha"]);
    assert!(b.try_lock_all(&keys).await.unwrap().is_none());
    assert_eq!(h.server.command_calls(&["eval", "evalsha"]) - before, 1);
    let tokens = all.fencing_tokens();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    all.release().await.unwrap();
    for k in &keys {
        assert!(!h.exists(&format!("lock:{k}")).await, "{k} left behind");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn writer_waiting_behind_a_writer_keeps_new_readers_out() {
    conformance::kinds::writer_waiting_behind_a_writer_keeps_new_readers_out(&Single::new()).await;
}

/// The calls of `command` the server has answered (`INFO commandstats`).
async fn calls_of(h: &Single, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut h.raw().await)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Regression (issue 26 review, finding 4): an uncontended fair lock cost a `SUBSCRIBE`
/// round trip (and an `UNSUBSCRIBE` after) besides its acquire: its waiter subscribed
/// before its first attempt. Its arrival now goes first; only a waiter that is queued
/// subscribes (and asks again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_fair_lock_subscribes_to_nothing() {
    let h = Single::new();
    let locks = manager(&h).await;
    let key = unique("fair-alone");
    let before = calls_of(&h, "subscribe").await;
    for _ in 0..5 {
        locks.fair(&key).await.unwrap().release().await.unwrap();
    }
    assert_eq!(calls_of(&h, "subscribe").await, before, "subscribed");
    // Contended, a waiter does subscribe, and is woken by the release.
    let holder = locks.fair(&key).await.unwrap();
    let waiter = {
        let (locks, key) = (locks.clone(), key.clone());
        tokio::spawn(async move {
            locks
                .fair_with(&key, LockOptions::new().wait(Duration::from_secs(10)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(calls_of(&h, "subscribe").await, before + 1);
    let released = Instant::now();
    holder.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
    assert!(
        released.elapsed() < Duration::from_millis(800),
        "{:?}",
        released.elapsed()
    );
}
