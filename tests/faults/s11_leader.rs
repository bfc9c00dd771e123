//! Scenario 11 (issue 26): leader election with real processes.
//!
//! * `kill -9` of the leader process: nothing resigns, so a follower (in this process,
//!   campaigning with `leader_with`) is elected once the leader's lease ran out on the
//!   server, not before, and within a bound after it; the failover time from the kill is
//!   printed.
//! * SIGSTOP of the leader past its ttl, between a `begin` and a `commit` on the fenced
//!   resource: a new leader is elected meanwhile and writes under its higher term; when
//!   the old leader resumes, its `is_held()` is false and `lost()` resolves at once, and
//!   its late commit is refused by the resource (the history checker finds no stale write).
//! * A Sentinel failover under a leader: the primary is killed; the leader either keeps
//!   its leadership (its lock reached the replica) or loses it and someone is elected on
//!   the new primary; the terms of the writes the resource accepted never go back.

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redlock::{LockError, LockManager, LockOptions};
use redlock_faults::clock::{self, now_ns};
use redlock_faults::history::History;
use redlock_faults::protocol::Mode;
use redlock_faults::resource::{Begin, Resource};
use redlock_testkit::{RedisServer, Sentinels};

use crate::support::{
    holder_args, in_process_section, rand_between, require_redis, rounds, single, unique, Holder,
    HEAVY,
};

/// The full key of the leader lock `name` under the default prefix.
fn leader_key(name: &str) -> String {
    format!("lock:leader:{{{name}}}")
}

/// A follower's campaign in this process: elected at the returned `now_ns()`.
fn campaign(
    locks: &LockManager,
    name: &str,
) -> tokio::task::JoinHandle<Result<(redlock::Leadership, u64), LockError>> {
    let (locks, name) = (locks.clone(), name.to_owned());
    tokio::spawn(async move {
        let opts = LockOptions::new().ttl(Duration::from_secs(5));
        let leadership = locks.leader_with(&name, opts).await?;
        Ok((leadership, now_ns()))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s11_killed_leader_is_replaced_after_its_ttl() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let lock_server = RedisServer::start();
    let resource_server = RedisServer::start();
    let follower = single(&lock_server.url()).await;
    let resource = Resource::open(&resource_server.url(), "s11-kill")
        .await
        .unwrap();
    let mut raw = lock_server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let history = History::new();
    // One name (and one resource) for every round: terms must keep increasing across them.
    let name = unique("s11-kill");
    let mut failover_ms = Vec::new();
    let mut early = 0;
    for round in 0..rounds(3, 30) {
        let ttl_ms = [600u64, 1000, 1500][round % 3];
        let ttl = Duration::from_millis(ttl_ms);
        let mut args = holder_args(
            &lock_server.url(),
            &resource_server.url(),
            "s11-kill",
            &name,
        );
        args.mode = Mode::Leader;
        args.ttl_ms = ttl_ms;
        args.step_ms = ttl_ms / 2;
        let mut leader = Holder::spawn(&args);
        let elected = leader.expect("acquired", Duration::from_secs(15)).await;
        let term = elected.u64("token").unwrap();
        let enter = elected.u64("at").unwrap();
        let next = campaign(&follower, &name);
        // Somewhere in its work, or later, across renewals.
        tokio::time::sleep(rand_between(Duration::from_millis(5), ttl * 2)).await;
        assert!(!next.is_finished(), "elected while the leader lives");
        let killed = leader.kill9();
        leader.drain(Duration::from_secs(1)).await;
        let asked = now_ns();
        let pttl: i64 = raw.pttl(leader_key(&name)).await.unwrap();
        let expiry = asked + u64::try_from(pttl.max(0)).unwrap() * 1_000_000;
        let (leadership, at) = tokio::time::timeout(ttl * 3, next)
            .await
            .expect("a follower is elected after the ttl")
            .unwrap()
            .expect("elected");
        // Expiry has millisecond precision on the server: allow 2 ms of rounding.
        if at + 2_000_000 < expiry {
            early += 1;
        }
        let late = clock::ms(expiry, at);
        let failover = clock::ms(killed, at);
        failover_ms.push(failover);
        println!(
            "s11 kill round {round}: ttl {ttl_ms} ms, killed {:.0} ms after its election, lease \
             had {pttl} ms left; follower elected {failover:.0} ms after the kill ({late:+.1} ms \
             after expiry), term {term} -> {}",
            clock::ms(enter, killed),
            leadership.fencing_token()
        );
        assert!(
            late < 500.0,
            "round {round}: elected {late:.1} ms after the lease expired"
        );
        assert!(
            failover < (ttl_ms + 500) as f64,
            "round {round}: failover took {failover:.0} ms with a {ttl_ms} ms ttl"
        );
        assert!(leadership.fencing_token() > term, "terms go forward");
        history.record(leader.section(term, enter, killed, true));
        let s = in_process_section(
            &resource,
            "follower",
            leadership.fencing_token(),
            at,
            Duration::ZERO,
        )
        .await;
        history.record(s);
        leadership.resign().await.unwrap();
    }
    let state = resource.state().await.unwrap();
    history.settle(&state.accepted);
    let report = history.check();
    println!(
        "s11 kill summary: failover after kill -9 (ms): {failover_ms:.0?}; elected before the \
         lease expired: {early}; checker: {report}"
    );
    assert_eq!(
        early, 0,
        "a follower was elected before the killed leader's lease ran out"
    );
    assert!(report.ok(), "{report}");
    assert!(state.problems().is_empty(), "{:?}", state.problems());
}

/// What a resumed leader did after `resumed`: its commits accepted, its first
/// `is_held()`, and how long after the resume `lost()` resolved (ms).
fn after_resume(leader: &Holder, resumed: u64) -> (usize, Option<bool>, Option<f64>) {
    let after = |name: &str| -> Vec<redlock_faults::protocol::Event> {
        leader
            .all(name)
            .into_iter()
            .filter(|e| e.u64("at").is_some_and(|at| at >= resumed))
            .cloned()
            .collect()
    };
    let accepted_late = after("commit")
        .iter()
        .filter(|c| c.bool("ok") == Some(true))
        .count();
    let held_after = after("held").first().and_then(|e| e.bool("held"));
    let lost_after = after("lost")
        .first()
        .and_then(|e| e.u64("at"))
        .map(|at| clock::ms(resumed, at));
    (accepted_late, held_after, lost_after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s11_paused_leader_stops_believing_and_is_fenced_off() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let lock_server = RedisServer::start();
    let resource_server = RedisServer::start();
    let follower = single(&lock_server.url()).await;
    let resource = Resource::open(&resource_server.url(), "s11-pause")
        .await
        .unwrap();
    let history = History::new();
    let name = unique("s11-pause");
    for round in 0..rounds(2, 15) {
        let mut args = holder_args(
            &lock_server.url(),
            &resource_server.url(),
            "s11-pause",
            &name,
        );
        args.mode = Mode::Leader;
        args.ttl_ms = 600;
        args.steps = 3;
        args.step_ms = 300;
        args.hold_ms = 0;
        let mut leader = Holder::spawn(&args);
        let elected = leader.expect("acquired", Duration::from_secs(15)).await;
        let term = elected.u64("token").unwrap();
        let enter = elected.u64("at").unwrap();
        let begin = leader.expect("begin", Duration::from_secs(5)).await;
        assert_eq!(begin.bool("ok"), Some(true));
        // The leader now sleeps 300 ms before committing: freeze it there.
        let paused = leader.pause();
        let (leadership, at) =
            tokio::time::timeout(Duration::from_secs(10), campaign(&follower, &name))
                .await
                .expect("a new leader is elected while the old one is paused")
                .unwrap()
                .expect("elected");
        let new_term = leadership.fencing_token();
        assert!(new_term > term);
        let section = in_process_section(
            &resource,
            "follower",
            new_term,
            at,
            Duration::from_millis(20),
        )
        .await;
        assert!(
            section.commits.first().is_some_and(|c| c.1),
            "the new leader's write was refused"
        );
        history.record(section);
        let resumed = leader.resume();
        let done = leader.expect("done", Duration::from_secs(10)).await;
        assert!(leader.wait_exit(Duration::from_secs(5)).await);
        history.record(leader.section(term, enter, done.u64("at").unwrap(), true));
        let (accepted_late, held_after, lost_after) = after_resume(&leader, resumed);
        println!(
            "s11 pause round {round}: paused {:.0} ms; term {term} -> {new_term} elected {:.0} ms \
             into the pause; after the resume: is_held() {held_after:?}, lost() after \
             {lost_after:?} ms, late commits accepted {accepted_late}, result {:?}",
            clock::ms(paused, resumed),
            clock::ms(paused, at),
            done.get("result")
        );
        assert_eq!(accepted_late, 0, "a stale leader's write was accepted");
        assert_ne!(held_after, Some(true), "the resumed leader still believed");
        assert!(
            lost_after.is_some_and(|ms| ms < 200.0),
            "lost() did not resolve at once on resume: {lost_after:?}"
        );
        assert_eq!(done.get("result"), Some("lost"));
        // The new leader still leads: the old one's resignation did not touch its lock.
        assert!(leadership.is_held());
        let info = follower
            .leader_info(&name)
            .await
            .unwrap()
            .expect("a leader");
        assert_eq!(info.term, new_term);
        leadership.resign().await.unwrap();
    }
    let state = resource.state().await.unwrap();
    history.settle(&state.accepted);
    let report = history.check();
    println!("s11 pause summary: checker: {report}");
    assert!(report.ok(), "{report}");
    assert!(state.problems().is_empty(), "{:?}", state.problems());
}

/// Writes on `resource` while leader of `name` (`lead_with`, which campaigns again
/// whenever leadership is lost), every 50 ms, until `stop`; returns the terms it was
/// elected with. A body whose term the resource refuses waits for the loss of its
/// leadership (or `stop`).
async fn leader_writes(
    locks: LockManager,
    name: String,
    resource: Resource,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Vec<u64>, LockError> {
    let terms = std::sync::Mutex::new(Vec::new());
    let opts = LockOptions::new().ttl(Duration::from_secs(2));
    let mut stopped = stop.clone();
    let lead = locks.lead_with(&name, opts, |term| {
        terms.lock().unwrap().push(term);
        let (resource, mut stop) = (&resource, stop.clone());
        async move {
            // The term's section: one begin, then a commit every 50 ms while the
            // resource takes them (until someone newer began), bounded by `stop`.
            let Ok(Begin::Granted(mut value)) = resource.begin(term).await else {
                let _ = stop.wait_for(|s| *s).await;
                return;
            };
            while !*stop.borrow() {
                match resource.commit(term, value + 1).await {
                    Ok(true) => value += 1,
                    Ok(false) => {
                        let _ = stop.wait_for(|s| *s).await;
                        return;
                    }
                    Err(_) => {}
                }
                let _ = tokio::time::timeout(Duration::from_millis(50), stop.changed()).await;
            }
        }
    });
    // A follower campaigns until stopped.
    tokio::select! {
        led = lead => { led?; }
        _ = stopped.wait_for(|s| *s) => {}
    }
    Ok(terms.into_inner().unwrap())
}

/// A manager that follows the master through the Sentinels.
async fn sentinel_manager(sent: &Sentinels) -> LockManager {
    LockManager::builder()
        .sentinel(sent.master_name(), sent.sentinel_urls())
        .build()
        .await
        .expect("the manager finds the master through the Sentinels")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s11_sentinel_failover_under_a_leader() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let resource_server = RedisServer::start();
    // Without and with the leader's lock lost in the failover (the replica cut off).
    for partition in [false, true] {
        let mut sent = tokio::task::block_in_place(Sentinels::start);
        let name = unique("s11-sentinel");
        let resource = Resource::open(&resource_server.url(), &name).await.unwrap();
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let mut instances = Vec::new();
        for _ in 0..2 {
            let locks = sentinel_manager(&sent).await;
            let (name, resource, stop) = (name.clone(), resource.clone(), stop.clone());
            instances.push(tokio::spawn(leader_writes(locks, name, resource, stop)));
        }
        let observer = sentinel_manager(&sent).await;
        let written = |r: &Resource| {
            let r = r.clone();
            async move { r.state().await.unwrap().accepted.len() }
        };
        let started = Instant::now();
        while written(&resource).await < 5 {
            if started.elapsed() > Duration::from_secs(20) {
                let info = observer.leader_info(&name).await;
                let ended: Vec<bool> = instances.iter().map(|i| i.is_finished()).collect();
                panic!(
                    "nobody writes: leader {info:?}, instances ended {ended:?}, resource {:?}",
                    resource.state().await
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let before = observer
            .leader_info(&name)
            .await
            .unwrap()
            .expect("a leader");
        if partition {
            tokio::task::block_in_place(|| sent.partition_replica());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let writes_before = written(&resource).await;
        tokio::task::block_in_place(|| sent.kill_master());
        let killed = Instant::now();
        if partition {
            tokio::task::block_in_place(|| sent.heal_replica());
        }
        tokio::task::block_in_place(|| sent.wait_failover(Duration::from_secs(15)));
        let failed_over = killed.elapsed();
        // Three leases after the failover: a lost leadership is noticed and a leader
        // elected on the new primary.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let after = observer.leader_info(&name).await.unwrap();
        let writes_after = written(&resource).await;
        stop_tx.send(true).unwrap();
        let mut terms = Vec::new();
        for instance in instances {
            let led = tokio::time::timeout(Duration::from_secs(20), instance)
                .await
                .expect("the instances stop")
                .unwrap()
                .expect("lead");
            terms.push(led);
        }
        let state = resource.state().await.unwrap();
        println!(
            "s11 sentinel (replica cut off: {partition}): failover {failed_over:?}; leader before \
             term {} pid {:?}, after {:?}; terms per instance {terms:?}; accepted writes {} \
             before the kill, {} after the failover ({} in all), begins refused {}, commits \
             refused {}",
            before.term,
            before.pid,
            after.as_ref().map(|a| a.term),
            writes_before,
            writes_after.saturating_sub(writes_before),
            state.accepted.len(),
            state.begin_rejected,
            state.commit_rejected,
        );
        assert!(state.problems().is_empty(), "{:?}", state.problems());
        assert!(after.is_some(), "nobody leads after the failover");
        if !partition {
            assert!(
                writes_after > writes_before,
                "no write accepted after the failover"
            );
        }
    }
}
