//! Leader election (issue 26) beyond the conformance functions every backend runs
//! (`tests/conformance/leader.rs`): a scheduler on three managers, a campaign longer than
//! the manager's wait, a watch sharing a manager with a campaigner, and what a watch
//! leaves behind; on the in-memory backend and on one real redis-server. The process
//! faults (kill -9, SIGSTOP, a Sentinel failover) are `tests/faults/s11_leader.rs`.

mod conformance;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conformance::backends::{Memory, Single};
use conformance::leader::leader_name;
use conformance::{eventually, manager, Harness};
use redlock::{LeaderInfo, LeaderWatch, Leadership, LockManager, LockOptions};

/// Every type is `Send + Sync + 'static` and every future `Send`, so they can be spawned.
#[tokio::test]
async fn leader_types_and_futures_are_send() {
    fn is_send<T: Send>(_: &T) {}
    fn send_sync_static<T: Send + Sync + 'static>() {}
    send_sync_static::<Leadership>();
    send_sync_static::<LeaderWatch>();
    send_sync_static::<LeaderInfo>();
    let locks = LockManager::builder().in_memory().build().await.unwrap();
    is_send(&locks.leader("k"));
    is_send(&locks.leader_with("k", LockOptions::new()));
    is_send(&locks.lead("k", |_| async {}));
    is_send(&locks.leader_info("k"));
    is_send(&locks.watch_leader("k"));
    let leadership = locks.leader("k").await.unwrap();
    is_send(&leadership.lost());
    let mut watch = locks.watch_leader("k").await.unwrap();
    is_send(&watch.changed());
    is_send(&leadership.resign());
}

/// Three managers run a scheduler with `lead_with`: one tick every 40 ms, each leader
/// steps down after 3 ticks. Never two leaders at once, every tick run once, terms
/// never going back, a new term for each leadership.
async fn one_of_three_runs_each_tick<H: Harness>(h: &H) {
    const TICKS: usize = 15;
    let name = leader_name("scheduler");
    let active = Arc::new(AtomicUsize::new(0));
    let log = Arc::new(Mutex::new(Vec::<(usize, u64)>::new()));
    let mut instances = Vec::new();
    for id in 0..3 {
        let locks = manager(h).await;
        let (name, active, log) = (name.clone(), active.clone(), log.clone());
        instances.push(tokio::spawn(async move {
            let opts = LockOptions::new().ttl(Duration::from_secs(5));
            // Bounded: at most TICKS terms end before the last tick ran.
            for _ in 0..=TICKS {
                let done = locks
                    .lead_with(&name, opts.clone(), |term| {
                        let (active, log) = (active.clone(), log.clone());
                        async move {
                            assert_eq!(active.fetch_add(1, Ordering::SeqCst), 0, "two leaders");
                            let mut done = false;
                            for _ in 0..3 {
                                tokio::time::sleep(Duration::from_millis(40)).await;
                                let mut log = log.lock().unwrap();
                                if log.len() == TICKS {
                                    done = true;
                                    break;
                                }
                                log.push((id, term));
                            }
                            active.fetch_sub(1, Ordering::SeqCst);
                            done
                        }
                    })
                    .await
                    .expect("lead");
                if done {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    for i in instances {
        tokio::time::timeout(Duration::from_secs(30), i)
            .await
            .expect("the scheduler finishes")
            .unwrap();
    }
    let log = log.lock().unwrap();
    assert_eq!(log.len(), TICKS);
    assert!(
        log.windows(2).all(|w| w[0].1 <= w[1].1),
        "terms went back: {log:?}"
    );
    // Each leadership ran 3 ticks and stepped down: 5 terms, handed over 4 times (to
    // whichever follower won; no order among them is promised).
    let mut terms: Vec<u64> = log.iter().map(|l| l.1).collect();
    terms.dedup();
    assert_eq!(terms.len(), TICKS / 3, "{log:?}");
    let mut leaders: Vec<usize> = log.iter().map(|l| l.0).collect();
    leaders.sort_unstable();
    leaders.dedup();
    assert!(leaders.len() >= 2, "nobody took over: {log:?}");
}

/// A campaign outlives the manager's wait: with a 100 ms default wait, a follower keeps
/// campaigning behind a leader that holds for 1.5 s, and is elected at its resignation.
async fn a_campaign_outlives_the_managers_wait<H: Harness>(h: &H) {
    let name = leader_name("patient");
    let leader = manager(h).await;
    let follower = h
        .builder()
        .default_wait(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let first = leader.leader(&name).await.unwrap();
    let campaign = tokio::spawn({
        let name = name.clone();
        async move { follower.leader(&name).await.map(|l| (l, Instant::now())) }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!campaign.is_finished());
    let resigned = Instant::now();
    first.resign().await.unwrap();
    let (second, at) = tokio::time::timeout(Duration::from_secs(5), campaign)
        .await
        .expect("elected")
        .unwrap()
        .expect("no error ends the campaign");
    assert!(at.duration_since(resigned) < Duration::from_secs(2));
    second.resign().await.unwrap();
}

/// A watch and a campaign on the same manager share the key's local queue: the watch
/// does not hold the campaign back (elected at once at the resignation), and once both
/// are done, no subscription interest is left.
async fn a_watch_does_not_hold_back_a_campaign_of_its_manager<H: Harness>(h: &H) {
    let name = leader_name("shared");
    let (a, b) = (manager(h).await, manager(h).await);
    let first = a.leader(&name).await.unwrap();
    let mut watch = b.watch_leader(&name).await.unwrap();
    let watching = tokio::spawn(async move {
        let mut seen = Vec::new();
        // Bounded: the resignation and the next election.
        for _ in 0..2 {
            match tokio::time::timeout(Duration::from_secs(10), watch.changed()).await {
                Ok(Ok(Some(info))) => seen.push(Some(info.term)),
                Ok(Ok(None)) => seen.push(None),
                other => panic!("watch: {other:?}"),
            }
            if seen.last().is_some_and(Option::is_some) {
                break;
            }
        }
        seen
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let campaign = tokio::spawn({
        let (b, name) = (b.clone(), name.clone());
        async move { b.leader(&name).await.map(|l| (l, Instant::now())) }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let resigned = Instant::now();
    first.resign().await.unwrap();
    let (second, at) = tokio::time::timeout(Duration::from_secs(5), campaign)
        .await
        .expect("elected")
        .unwrap()
        .unwrap();
    let handover = at.duration_since(resigned);
    assert!(handover < Duration::from_secs(2), "{handover:?}");
    let seen = watching.await.unwrap();
    assert_eq!(
        seen.last().copied().flatten(),
        Some(second.fencing_token()),
        "{seen:?}"
    );
    second.resign().await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            a.subscription_interests() == 0 && b.subscription_interests() == 0
        })
        .await,
        "interests left: {} and {}",
        a.subscription_interests(),
        b.subscription_interests()
    );
}

mod memory {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_of_three_runs_each_tick() {
        super::one_of_three_runs_each_tick(&Memory).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_campaign_outlives_the_managers_wait() {
        super::a_campaign_outlives_the_managers_wait(&Memory).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watch_does_not_hold_back_a_campaign_of_its_manager() {
        super::a_watch_does_not_hold_back_a_campaign_of_its_manager(&Memory).await;
    }
}

mod single {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_of_three_runs_each_tick() {
        super::one_of_three_runs_each_tick(&Single::new()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_campaign_outlives_the_managers_wait() {
        super::a_campaign_outlives_the_managers_wait(&Single::new()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watch_does_not_hold_back_a_campaign_of_its_manager() {
        super::a_watch_does_not_hold_back_a_campaign_of_its_manager(&Single::new()).await;
    }
}
