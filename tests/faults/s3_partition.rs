//! Scenario 3: the network between a holder and Redis is cut.
//!
//! The holder's manager talks to Redis through a [`ChaosProxy`]; another client talks to
//! Redis directly. While the holder holds the lock the proxy starts to blackhole (bytes
//! held, replies never come), to refuse (connections reset), or to delay every byte by a
//! whole ttl. The watchdog cannot renew, so the holder must declare the lock lost by its
//! local lease deadline (request start + ttl − drift), which comes before the key can
//! expire on the server: at the moment the other client is granted the lock, `is_held()`
//! is already false and `lost()` has already resolved. The holder's late write is then
//! rejected by the fenced resource. After healing, the holder's release says `Lost` and
//! the new holder keeps its lock.
//!
//! Two control faults must *not* lose the lock: a small delay (ttl/20 each way) and a
//! reset of every connection (the manager reconnects and renews).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::FutureExt as _;
use redlock::{LockManager, LockOptions};
use redlock_faults::clock::{self, now_ns};
use redlock_faults::history::{History, Section};
use redlock_faults::resource::{Begin, Resource};
use redlock_testkit::{ChaosProxy, Fault, RedisServer};

use crate::support::{
    in_process_section, instant_ns, rand_between, require_redis, rounds, single, unique, HEAVY,
};

const TTL: Duration = Duration::from_millis(1000);

/// What a cut round measured, in ms relative to the other client's grant.
struct Cut {
    /// A task awaiting `lost()` woke this long before the other client was granted
    /// (positive = before; includes the task's scheduling delay).
    lost_lead_ms: f64,
    /// The lease deadline (`valid_until`) this long before the grant.
    deadline_lead_ms: f64,
    /// The grant came this long after the cut.
    granted_after_cut_ms: f64,
    held_at_grant: bool,
    /// `lost()` was already resolved (ready at its first poll) at the grant.
    lost_ready_at_grant: bool,
    late_commit_accepted: bool,
    release: String,
}

async fn cut_round(
    lock: &RedisServer,
    fault: Fault,
    key: &str,
    other: &LockManager,
    resource: &Resource,
    history: &History,
) -> Cut {
    let proxy = ChaosProxy::start(lock.addr()).await.unwrap();
    let holder = single(&proxy.url()).await;
    let guard = Arc::new(
        holder
            .lock_with(
                key,
                LockOptions::new().ttl(TTL).wait(Duration::from_secs(5)),
            )
            .await
            .unwrap(),
    );
    let enter = now_ns();
    let token = guard.fencing_token();
    let lost_at = Arc::new(OnceLock::new());
    let watcher = {
        let (guard, lost_at) = (guard.clone(), lost_at.clone());
        tokio::spawn(async move {
            guard.lost().await;
            let _ = lost_at.set(now_ns());
        })
    };
    let mut section = Section::new("cut-holder", token, enter, 0);
    section.lost = true;
    let begun_at = now_ns();
    let Begin::Granted(value) = resource.begin(token).await.unwrap() else {
        panic!("the holder's begin was rejected");
    };
    section.begins.push((begun_at, true));
    // Cut at a random point of the renewal cycle (renewals every ttl/3).
    tokio::time::sleep(rand_between(Duration::ZERO, TTL / 3)).await;
    let cut = now_ns();
    proxy.set(fault);

    let theirs = other
        .lock_with(key, LockOptions::new().wait(TTL * 4))
        .await
        .expect("the cut-off holder's lock expires");
    let granted = now_ns();
    let held_at_grant = guard.is_held();
    let lost_ready_at_grant = guard.lost().now_or_never().is_some();
    let deadline_lead_ms = clock::ms(instant_ns(guard.valid_until()), granted);
    history.record(
        in_process_section(
            resource,
            "other",
            theirs.fencing_token(),
            granted,
            Duration::ZERO,
        )
        .await,
    );
    // The cut-off holder writes late, as one that did not check is_held() would.
    let late = resource.commit(token, value + 1).await.unwrap();
    section.commits.push((now_ns(), late));
    section.exit = now_ns();
    history.record(section);

    proxy.heal();
    let release = match tokio::time::timeout(
        Duration::from_secs(5),
        Arc::try_unwrap(guard).expect("one guard").release(),
    )
    .await
    {
        Ok(Ok(())) => "ok".to_owned(),
        Ok(Err(e)) => e.kind().to_owned(),
        Err(_) => "hung".to_owned(),
    };
    // Held bytes delivered after the heal must not disturb the new holder.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        theirs.is_held(),
        "the new holder lost its lock after the heal"
    );
    assert!(holder.try_lock(key).await.unwrap().is_none());
    theirs.release().await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(1), watcher).await;
    let lost_at = *lost_at.get().expect("lost() resolved");
    Cut {
        lost_lead_ms: clock::ms(lost_at, granted),
        deadline_lead_ms,
        granted_after_cut_ms: clock::ms(cut, granted),
        held_at_grant,
        lost_ready_at_grant,
        late_commit_accepted: late,
        release,
    }
}

/// A fault the lock must survive: held for two ttls, then released normally.
async fn control_round(lock: &RedisServer, fault: Option<Fault>, key: &str) -> (bool, String) {
    let proxy = ChaosProxy::start(lock.addr()).await.unwrap();
    let holder = single(&proxy.url()).await;
    let guard = holder
        .lock_with(
            key,
            LockOptions::new().ttl(TTL).wait(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    match fault {
        Some(f) => proxy.set(f),
        None => proxy.reset_all(),
    }
    tokio::time::sleep(TTL * 2).await;
    let held = guard.is_held();
    proxy.heal();
    let release = match guard.release().await {
        Ok(()) => "ok".to_owned(),
        Err(e) => e.kind().to_owned(),
    };
    (held, release)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_cut_off_holder_declares_loss_before_anyone_else_acquires() {
    require_redis!();
    let _heavy = HEAVY.lock().await;
    let lock = RedisServer::start();
    let res = RedisServer::start();
    let resource = Resource::open(&res.url(), "s3").await.unwrap();
    let other = single(&lock.url()).await;
    let history = History::new();
    let key = format!("{{{}}}", unique("s3"));
    let n = rounds(2, 12);
    let mut min_lead = f64::MAX;
    let mut cuts = 0;
    for i in 0..n {
        for fault in [Fault::Blackhole, Fault::Refuse, Fault::Delay(TTL)] {
            let c = cut_round(&lock, fault, &key, &other, &resource, &history).await;
            cuts += 1;
            println!(
                "s3 round {i} {fault:?}: other client granted {:.0} ms after the cut; the \
                 holder's lease deadline was {:.1} ms and its lost() watcher woke {:.1} ms \
                 before that grant; at the grant is_held() {} and lost() ready {}; late commit \
                 accepted {}; release after heal: {}",
                c.granted_after_cut_ms,
                c.deadline_lead_ms,
                c.lost_lead_ms,
                c.held_at_grant,
                c.lost_ready_at_grant,
                c.late_commit_accepted,
                c.release
            );
            assert!(
                !c.held_at_grant,
                "{fault:?}: is_held() at the other's grant"
            );
            assert!(
                c.lost_ready_at_grant,
                "{fault:?}: lost() pending at the grant"
            );
            // The watcher is a task woken by a timer: allow for scheduling noise.
            assert!(
                c.lost_lead_ms >= -20.0,
                "{fault:?}: lost() woke {:.1} ms after the other client acquired",
                -c.lost_lead_ms
            );
            assert!(
                c.deadline_lead_ms > 0.0,
                "{fault:?}: deadline after the grant"
            );
            assert!(!c.late_commit_accepted, "{fault:?}: stale write accepted");
            assert_eq!(c.release, "lost", "{fault:?}: release after the heal");
            min_lead = min_lead.min(c.lost_lead_ms);
        }
    }
    let mut survived = 0;
    let controls = rounds(1, 6);
    for i in 0..controls {
        for fault in [Some(Fault::Delay(TTL / 20)), None] {
            let (held, release) = control_round(&lock, fault, &key).await;
            let name = fault.map_or("reset_all".to_owned(), |f| format!("{f:?}"));
            println!("s3 control {i} {name}: held after 2 ttl {held}, release {release}");
            assert!(held, "{name}: the lock was lost");
            assert_eq!(release, "ok", "{name}");
            survived += 1;
        }
    }
    let state = resource.state().await.unwrap();
    history.settle(&state.accepted);
    let report = history.check();
    println!(
        "s3 summary: {cuts} cuts (blackhole, refuse, delay = ttl): in all, is_held() false and \
         lost() resolved when the other client was granted (lost() watcher woke at least \
         {min_lead:.1} ms before); {survived} survivable faults survived; checker: {report}; \
         resource problems {:?}",
        state.problems()
    );
    assert!(report.ok(), "{report}");
    assert!(state.problems().is_empty(), "{:?}", state.problems());
}
