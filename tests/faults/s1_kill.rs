//! Scenario 1: a holder process is killed with SIGKILL while it holds the lock.
//!
//! Nothing releases the lock: its key lives until the ttl the watchdog last set runs out.
//! Another client waiting for it must get it after that moment, not before (the kill must
//! not free the lock early), and not much later (the waiter's fallback timer is the key's
//! remaining ttl). The kill lands at a random moment of the holder's work, sometimes
//! between its `begin` and `commit` on the fenced resource.

use std::time::Duration;

use redis::AsyncCommands;
use redlock::LockOptions;
use redlock_faults::clock::{self, now_ns};
use redlock_faults::history::History;
use redlock_faults::resource::Resource;
use redlock_testkit::RedisServer;

use crate::support::{
    holder_args, in_process_section, rand_between, require_redis, rounds, single, unique, Holder,
    HEAVY,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_killed_holder_frees_after_ttl_not_before() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let lock_server = RedisServer::start();
    let resource_server = RedisServer::start();
    let b = single(&lock_server.url()).await;
    let resource = Resource::open(&resource_server.url(), "s1").await.unwrap();
    let mut raw = lock_server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let history = History::new();
    let n = rounds(4, 40);
    let mut early = 0;
    let mut late_ms: Vec<f64> = Vec::new();
    // One key (and one resource) for every round: tokens must keep increasing across them.
    let key = unique("s1");
    for round in 0..n {
        let ttl_ms = [500u64, 800, 1200][round % 3];
        let ttl = Duration::from_millis(ttl_ms);
        let mut args = holder_args(&lock_server.url(), &resource_server.url(), "s1", &key);
        args.ttl_ms = ttl_ms;
        args.steps = 1;
        args.step_ms = ttl_ms / 2;
        let mut holder = Holder::spawn(&args);
        let acquired = holder.expect("acquired", Duration::from_secs(15)).await;
        let token = acquired.u64("token").unwrap();
        let enter = acquired.u64("at").unwrap();
        // Somewhere in the step (between begin and commit) or later, across renewals.
        tokio::time::sleep(rand_between(Duration::from_millis(5), ttl * 2)).await;
        let killed = holder.kill9();
        holder.drain(Duration::from_secs(1)).await;

        let full = format!("lock:{{{key}}}");
        let asked = now_ns();
        let pttl: i64 = raw.pttl(&full).await.unwrap();
        let expiry = asked + u64::try_from(pttl.max(0)).unwrap() * 1_000_000;
        let guard = b
            .lock_with(
                &format!("{{{key}}}"),
                LockOptions::new().wait(ttl * 3).ttl(Duration::from_secs(5)),
            )
            .await
            .expect("the lock frees once the ttl ran out");
        let granted = now_ns();
        // Expiry has millisecond precision on the server: allow 2 ms of rounding.
        if granted + 2_000_000 < expiry {
            early += 1;
        }
        let late = clock::ms(expiry, granted);
        late_ms.push(late);
        assert!(
            late < 500.0,
            "round {round}: the waiter got the lock {late:.1} ms after the key expired"
        );
        assert!(guard.fencing_token() > token);

        history.record(holder.section(token, enter, killed, true));
        let s = in_process_section(
            &resource,
            "b",
            guard.fencing_token(),
            granted,
            Duration::ZERO,
        )
        .await;
        history.record(s);
        guard.release().await.unwrap();
        println!(
            "s1 round {round}: ttl {ttl_ms} ms, killed {:.0} ms after acquiring (holder's last \
             step: {}), key had {pttl} ms left; the other client got it {late:+.1} ms after expiry",
            clock::ms(enter, killed),
            holder
                .events
                .last()
                .map_or("-".to_owned(), |(_, e)| e.name.clone()),
        );
    }
    let state = resource.state().await.unwrap();
    history.settle(&state.accepted);
    let report = history.check();
    println!(
        "s1 summary: {n} rounds; acquired before the ttl ran out: {early}; after expiry: \
         max {:.1} ms; checker: {report}; resource: {} commits, problems {:?}",
        late_ms.iter().copied().fold(0.0, f64::max),
        state.accepted.len(),
        state.problems()
    );
    assert_eq!(
        early, 0,
        "a killed holder's lock was granted before its ttl ran out"
    );
    assert!(report.ok(), "{report}");
    assert!(state.problems().is_empty(), "{:?}", state.problems());
}

/// The lock *server* is killed (-9) and restarted while a client holds a lock: without
/// persistence the restarted Redis has forgotten the lock and its fencing counter, so a
/// second client gets the lock (and the same token) while the first still holds it by its
/// lease; with `appendonly yes` + `appendfsync always` the lock survives the crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_redis_restart_with_and_without_persistence() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    for aof in [false, true] {
        let mut server = RedisServer::builder().aof(aof).start();
        let first = single(&server.url()).await;
        let key = format!("{{{}}}", unique("s1-restart"));
        let mine = first
            .lock_with(&key, LockOptions::new().ttl(Duration::from_secs(10)))
            .await
            .unwrap();
        tokio::task::block_in_place(|| server.restart());
        let second = single(&server.url()).await;
        let theirs = second.try_lock(&key).await.unwrap();
        let double = theirs.is_some() && mine.is_held();
        println!(
            "s1 redis restart ({}): first client token {}, still is_held() {}; second client \
             {}",
            if aof {
                "appendonly yes, appendfsync always"
            } else {
                "no persistence"
            },
            mine.fencing_token(),
            mine.is_held(),
            theirs
                .as_ref()
                .map_or("could not acquire: the lock survived".to_owned(), |g| {
                    format!(
                        "acquired token {} => {}",
                        g.fencing_token(),
                        if double {
                            "DOUBLE HOLDING"
                        } else {
                            "no overlap"
                        }
                    )
                }),
        );
        if aof {
            assert!(
                theirs.is_none(),
                "the lock did not survive a restart with AOF"
            );
        } else {
            // The documented limit: a restart without persistence forgets every lock.
            assert!(double);
            assert_eq!(theirs.as_ref().map(|g| g.fencing_token()), Some(1));
        }
    }
}
