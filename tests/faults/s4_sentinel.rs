//! Scenario 4: a Redis primary with one replica and three Sentinels; the primary is killed
//! (-9) right after a client acquired a lock, and a Sentinel failover promotes the replica.
//!
//! Model: redlock has no Sentinel backend. A client uses `.single(<current primary URL>)`,
//! and after a failover a client builds a new manager on the new primary (as a Sentinel-
//! aware application would after `+switch-master`). The first client's manager keeps
//! pointing at the dead primary: its watchdog cannot renew, and its lease runs until its
//! local deadline (ttl 10 s, far longer than a failover).
//!
//! A *double-holding incident* is a round where the second client acquires the lock on the
//! new primary while the first still holds it by its own lease (`is_held()` true).
//!
//! Four variants:
//! * `partition`: before the acquire, the replica is cut off (`partition_replica`: SIGSTOP
//!   plus `CLIENT KILL TYPE replica`), so the write is acknowledged by no replica and lost
//!   in the failover: deterministic.
//! * `racy`: the primary is killed right after the acquire returns, with replication
//!   healthy: the write has usually reached the replica already (loopback).
//! * each without and with `min_replicas(1)`: then the acquire `WAIT`s for one replica;
//!   with the replica cut off it fails with `ReplicasUnavailable` (and releases), so nobody
//!   believes they hold a lock that could be lost.
//!
//! Expected: incidents without `min_replicas` (the documented limit of asynchronous
//! replication), zero with it. Fencing: the lost write took the fencing counter with it,
//! so the second client gets the *same* token; the fenced resource rejects its `begin`
//! (equal is not newer), which keeps the resource safe but shows that after a failover
//! tokens are not unique.

use std::time::{Duration, Instant};

use redis::Value;
use redlock::{LockError, LockOptions};
use redlock_faults::resource::{Begin, Resource};
use redlock_testkit::{RedisServer, Sentinels};

use crate::support::{require_redis, rounds, single, unique, HEAVY};

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
    incidents: usize,
    token_reused: usize,
    fencing_rejected: usize,
    failover_ms: Vec<u128>,
    restore_ms: Vec<u128>,
}

/// Restarts the server on `port` (killed by the round) as a replica of the current
/// primary and waits until it is attached and every sentinel counts it healthy; returns
/// how long that took.
fn restore(sent: &mut Sentinels, killed: u16) -> Duration {
    let started = Instant::now();
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
    // Sentinels refresh their view of replicas by polling (INFO every few seconds, more
    // slowly on a saturated machine), and may even fail over a second time: wait until
    // the whole set has settled. The bound is generous; the loop ends as soon as it has.
    sent.wait_healthy(Duration::from_secs(30));
    started.elapsed()
}

async fn round(sent: &mut Sentinels, v: Variant, key: &str, res_url: &str, t: &mut Tally) {
    t.rounds += 1;
    let res = &Resource::open(res_url, key).await.unwrap();
    let primary_url = sent.current_master_url();
    let killed = sent.current_master_addr().1;
    let first = single(&primary_url).await;
    if v.partition {
        tokio::task::block_in_place(|| sent.partition_replica());
    }
    let mut opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Duration::ZERO);
    if v.min_replicas > 0 {
        opts = opts.min_replicas(v.min_replicas);
    }
    let mine = first.lock_with(key, opts).await;
    tokio::task::block_in_place(|| sent.kill_master());
    let killed_at = Instant::now();
    if v.partition {
        tokio::task::block_in_place(|| sent.heal_replica());
    }
    let mine = match mine {
        Ok(g) => {
            t.acquired += 1;
            Some(g)
        }
        Err(LockError::ReplicasUnavailable { acked, .. }) => {
            assert_eq!(acked, 0);
            t.replicas_unavailable += 1;
            None
        }
        Err(e) => panic!("{v:?}: unexpected acquire error {e}"),
    };
    // The first holder starts its critical section on the resource.
    if let Some(g) = &mine {
        assert!(matches!(
            res.begin(g.fencing_token()).await.unwrap(),
            Begin::Granted(_)
        ));
    }
    tokio::task::block_in_place(|| sent.wait_failover(Duration::from_secs(15)));
    t.failover_ms.push(killed_at.elapsed().as_millis());

    let second = single(&sent.current_master_url()).await;
    let theirs = second
        .try_lock(key)
        .await
        .expect("try_lock on the new primary");
    let still_held = mine.as_ref().is_some_and(|g| g.is_held());
    let mut line = format!(
        "s4 {v:?}: first client {}, failover {} ms, second client {}",
        mine.as_ref()
            .map_or("got ReplicasUnavailable".to_owned(), |g| format!(
                "acquired token {}",
                g.fencing_token()
            )),
        t.failover_ms.last().copied().unwrap_or(0),
        theirs.as_ref().map_or(
            "could not acquire (the lock survived the failover)".to_owned(),
            |g| { format!("acquired token {}", g.fencing_token()) }
        ),
    );
    if let (Some(theirs), true) = (&theirs, still_held) {
        t.incidents += 1;
        let mine = mine.as_ref().map_or(0, |g| g.fencing_token());
        if theirs.fencing_token() <= mine {
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
            " => DOUBLE HOLDING (first still is_held()); the resource {} the second's begin",
            if fenced { "rejected" } else { "accepted" }
        ));
    } else if let Some(theirs) = &theirs {
        // The first client did not hold anything: the second begins normally.
        let _ = res.begin(theirs.fencing_token()).await.unwrap();
    }
    println!("{line}");
    drop(theirs);
    drop(mine);
    drop(first);
    drop(second);
    let restored = tokio::task::block_in_place(|| restore(sent, killed));
    t.restore_ms.push(restored.as_millis());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_sentinel_failover_loses_locks_unless_min_replicas() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let mut sent = tokio::task::block_in_place(Sentinels::start);
    let res_server = RedisServer::start();
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
            // A fresh key per round: a lock that survived the failover must not block the
            // next round.
            let key = format!("{{{}}}", unique("s4"));
            round(&mut sent, v, &key, &res_server.url(), &mut t).await;
        }
        tallies.push((v, t));
    }
    for (v, t) in &tallies {
        println!(
            "s4 summary {}{}: {} rounds, first client acquired {} (ReplicasUnavailable {}), \
             double-holding incidents {}, of which the second got a reused token {} and the \
             fenced resource rejected it {}; failover {:?} ms, restoring the replica {:?} ms",
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
            t.incidents,
            t.token_reused,
            t.fencing_rejected,
            t.failover_ms,
            t.restore_ms,
        );
    }
    for (v, t) in &tallies {
        if v.min_replicas > 0 {
            assert_eq!(t.incidents, 0, "{v:?}: double holding despite min_replicas");
            if v.partition {
                assert_eq!(t.replicas_unavailable, t.rounds, "{v:?}");
            }
        } else if v.partition {
            // The deterministic recipe: the write is always lost.
            assert_eq!(t.incidents, t.rounds, "{v:?}");
        }
        assert_eq!(
            t.incidents, t.fencing_rejected,
            "{v:?}: fencing missed an incident"
        );
    }
}
