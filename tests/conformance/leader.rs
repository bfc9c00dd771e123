//! Leader election (issue 26) written once and run on every backend (`leader_tests!`):
//! elected, followers wait, a resignation hands over within round trips (woken by the
//! release notification, not by the ttl), terms strictly increase, `lead` stops its body
//! on loss and campaigns again, a watch sees every change, a cancelled campaign leaves no
//! lock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock::{LockError, LockManager, LockOptions};

use super::{eventually, manager, Harness};

/// A leader name no other test uses (no braces: the leader key adds its own hash tag).
pub fn leader_name(what: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The full key of the leader lock of `name` under `locks`' prefix.
pub fn leader_key(locks: &LockManager, name: &str) -> String {
    format!("{}leader:{{{name}}}", locks.prefix())
}

/// Checks the term a [`LeaderInfo`](redlock::LeaderInfo) shows against the leadership's:
/// equal, except on Redlock, where the node `inspect` reads may have counted higher than
/// the quorum that decided (as for `LockInfo::fencing_token`).
#[track_caller]
pub fn shows_term(locks: &LockManager, shown: u64, term: u64) {
    if locks.backend_name() == "redlock" {
        assert!(
            shown >= term,
            "shown term {shown} below the leader's {term}"
        );
    } else {
        assert_eq!(shown, term);
    }
}

/// A resignation wakes the follower at once: with a 30 s ttl, a hand-over that took
/// anything near the ttl was not woken by the notification.
const HANDOVER_BOUND: Duration = Duration::from_secs(2);

/// One leader at a time; a second campaigner waits; the leader's resignation elects it
/// within round trips, with a higher term; `leader_info` names each in turn.
pub async fn elected_follower_waits_and_takes_over_on_resign<H: Harness>(h: &H) {
    let name = leader_name("handover");
    let (a, b) = (manager(h).await, manager(h).await);
    let first = a.leader(&name).await.expect("elected");
    assert!(first.is_held());
    assert_eq!(first.name(), name);
    let info = a.leader_info(&name).await.unwrap().expect("a leader");
    shows_term(&a, info.term, first.fencing_token());
    assert_eq!(info.pid, Some(std::process::id()));
    assert_eq!(info.name, name);
    let follower = tokio::spawn({
        let (b, name) = (b.clone(), name.clone());
        async move {
            let leadership = b.leader(&name).await.expect("elected");
            (leadership, Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!follower.is_finished(), "two leaders at once");
    let term = first.fencing_token();
    let resigned = Instant::now();
    first.resign().await.expect("resign");
    let (second, at) = tokio::time::timeout(Duration::from_secs(20), follower)
        .await
        .expect("the follower is elected")
        .unwrap();
    let handover = at.duration_since(resigned);
    println!("{name}: resign -> follower elected in {handover:?}");
    assert!(
        handover < HANDOVER_BOUND,
        "the follower took {handover:?}: not woken by the resignation"
    );
    assert!(second.fencing_token() > term, "terms go forward");
    let info = b.leader_info(&name).await.unwrap().expect("a leader");
    shows_term(&b, info.term, second.fencing_token());
    second.resign().await.unwrap();
    assert!(a.leader_info(&name).await.unwrap().is_none());
}

/// Several managers campaign for one name, each leading a few times: never two leaders,
/// terms strictly increasing in the order of election.
pub async fn terms_strictly_increase<H: Harness>(h: &H) {
    const MANAGERS: usize = 3;
    const ROUNDS: usize = 4;
    let name = leader_name("terms");
    let active = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..MANAGERS {
        let locks = manager(h).await;
        let (name, active, terms) = (name.clone(), active.clone(), terms.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let leadership = locks.leader(&name).await.expect("elected");
                assert_eq!(active.fetch_add(1, Ordering::SeqCst), 0, "two leaders");
                terms.lock().unwrap().push(leadership.fencing_token());
                tokio::time::sleep(Duration::from_millis(5)).await;
                active.fetch_sub(1, Ordering::SeqCst);
                leadership.resign().await.expect("resign");
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("every campaign ends")
            .expect("task");
    }
    let terms = terms.lock().unwrap();
    assert_eq!(terms.len(), MANAGERS * ROUNDS);
    assert!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms not increasing: {terms:?}"
    );
}

/// Sets a flag when dropped: tells that `lead` dropped its body.
struct DropFlag(Arc<AtomicUsize>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// `lead`'s body is dropped when leadership is lost (the leader's lock removed behind
/// its back), and the campaign resumes: the body runs again under a higher term; when
/// it returns, `lead` resigns and returns its output.
pub async fn lead_aborts_its_body_on_loss_and_campaigns_again<H: Harness>(h: &H) {
    let name = leader_name("lead");
    let locks = manager(h).await;
    let key = leader_key(&locks, &name);
    let dropped = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(Mutex::new(Vec::new()));
    let opts = LockOptions::new().ttl(Duration::from_millis(600));
    let lead = tokio::spawn({
        let (locks, name, dropped, terms) =
            (locks.clone(), name.clone(), dropped.clone(), terms.clone());
        async move {
            locks
                .lead_with(&name, opts, |term| {
                    let first = terms.lock().unwrap().is_empty();
                    terms.lock().unwrap().push(term);
                    let flag = DropFlag(dropped.clone());
                    async move {
                        let _flag = flag;
                        if first {
                            // Works forever: only the loss stops it.
                            std::future::pending::<()>().await;
                        }
                        term
                    }
                })
                .await
        }
    });
    assert!(
        eventually(Duration::from_secs(10), || async {
            !terms.lock().unwrap().is_empty()
        })
        .await,
        "elected"
    );
    assert_eq!(dropped.load(Ordering::SeqCst), 0);
    h.delete(&key).await; // an operator removes the leader's lock
    let last = tokio::time::timeout(Duration::from_secs(20), lead)
        .await
        .expect("lead returns")
        .unwrap()
        .expect("lead");
    let terms = terms.lock().unwrap().clone();
    assert_eq!(terms.len(), 2, "campaigned again once: {terms:?}");
    assert!(terms[1] > terms[0], "terms go forward: {terms:?}");
    assert_eq!(last, terms[1]);
    assert_eq!(dropped.load(Ordering::SeqCst), 2, "both bodies dropped");
    assert!(
        eventually(Duration::from_secs(5), || async {
            locks.leader_info(&name).await.unwrap().is_none()
        })
        .await,
        "lead resigned after its body returned"
    );
}

/// A watch is told of each change: an election, a resignation (at once, by the
/// notification), the next election, and an expiry (at the ttl).
pub async fn a_watch_sees_every_change<H: Harness>(h: &H) {
    let name = leader_name("watch");
    let (a, b, observer) = (manager(h).await, manager(h).await, manager(h).await);
    let mut watch = observer.watch_leader(&name).await.unwrap();
    assert!(watch.current().is_none());
    assert_eq!(watch.name(), name);
    let first = a.leader(&name).await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(5), watch.changed())
        .await
        .expect("an election is seen")
        .unwrap()
        .expect("a leader");
    shows_term(&a, seen.term, first.fencing_token());
    assert_eq!(watch.current(), Some(&seen));

    // A resignation, heard at once (the ttl is 30 s).
    let resigned = Instant::now();
    first.resign().await.unwrap();
    let gone = tokio::time::timeout(HANDOVER_BOUND, watch.changed())
        .await
        .expect("the resignation is heard, not waited for at the ttl")
        .unwrap();
    assert!(gone.is_none(), "{gone:?}");
    println!(
        "{name}: resignation seen by a watch in {:?}",
        resigned.elapsed()
    );

    // The next leader, with a short lease, whose lock is then taken behind its back.
    let ttl = Duration::from_millis(800);
    let second = b
        .leader_with(&name, LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(5), watch.changed())
        .await
        .expect("the next election is seen")
        .unwrap()
        .expect("a leader");
    shows_term(&b, seen.term, second.fencing_token());
    h.steal(&leader_key(&b, &name)).await; // taken by someone else behind its back
    let stolen = tokio::time::timeout(Duration::from_secs(5), watch.changed())
        .await
        .expect("the change of holder is seen within the ttl")
        .unwrap();
    assert!(
        stolen.as_ref().is_none_or(|s| s.holder != seen.holder),
        "{stolen:?}"
    );
    second.lost().await;
    assert!(!second.is_held());
}

/// A campaign dropped at any point leaves no lock behind: dropped while waiting behind a
/// leader, and dropped right after it started on a free name (a grant in flight is
/// released in the background).
pub async fn a_cancelled_campaign_leaves_no_lock<H: Harness>(h: &H) {
    let name = leader_name("cancel");
    let (a, b) = (manager(h).await, manager(h).await);
    let leader = a.leader(&name).await.unwrap();
    let waiting = tokio::time::timeout(Duration::from_millis(200), b.leader(&name)).await;
    assert!(waiting.is_err(), "elected while another leads");
    leader.resign().await.unwrap();
    for delay_us in [0u64, 50, 200, 1000, 3000] {
        let campaign = tokio::spawn({
            let (b, name) = (b.clone(), name.clone());
            async move { b.leader(&name).await }
        });
        tokio::time::sleep(Duration::from_micros(delay_us)).await;
        campaign.abort();
        let _ = campaign.await;
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            a.leader_info(&name).await.unwrap().is_none()
        })
        .await,
        "a cancelled campaign left a leader behind"
    );
    // And the name is free at once for the next one.
    let next = tokio::time::timeout(Duration::from_secs(2), a.leader(&name))
        .await
        .expect("the name is free")
        .unwrap();
    next.resign().await.unwrap();
}

/// Names and options a campaign refuses before any I/O.
pub async fn leader_rejects_bad_input<H: Harness>(h: &H) {
    let locks = manager(h).await;
    assert!(matches!(
        locks.leader("").await,
        Err(LockError::InvalidKey { .. })
    ));
    assert!(matches!(
        locks.leader_info("").await,
        Err(LockError::InvalidKey { .. })
    ));
    let unrenewed = LockOptions::new().watchdog(false);
    assert!(matches!(
        locks.leader_with("x", unrenewed).await,
        Err(LockError::InvalidOption { .. })
    ));
    let bad_ttl = LockOptions::new().ttl(Duration::ZERO);
    assert!(matches!(
        locks.leader_with("x", bad_ttl).await,
        Err(LockError::InvalidOption { .. })
    ));
    // A leader's name does not collide with a lock of the same name.
    let name = leader_name("apart");
    let lock = locks.lock(&name).await.unwrap();
    let leadership = tokio::time::timeout(Duration::from_secs(2), locks.leader(&name))
        .await
        .expect("a lock of the same name is another key")
        .unwrap();
    leadership.resign().await.unwrap();
    lock.release().await.unwrap();
}

#[macro_export]
macro_rules! leader_tests {
    ($make:expr) => {
        $crate::leader_tests!(@each $make;
            elected_follower_waits_and_takes_over_on_resign, terms_strictly_increase,
            lead_aborts_its_body_on_loss_and_campaigns_again, a_watch_sees_every_change,
            a_cancelled_campaign_leaves_no_lock, leader_rejects_bad_input);
    };
    (@each $make:expr; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let harness = $make;
                conformance::leader::$name(&harness).await;
            }
        )*
    };
}
