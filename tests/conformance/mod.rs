//! The behaviour every backend must have, written once and run for each backend
//! (`tests/memory.rs`, `tests/single.rs`, and the cluster and Redlock suites).
//!
//! A backend is a [`Harness`]: it makes managers that share one lock store, and can
//! tamper with a lock behind its holder's back, as an operator or a bug would.
//! `conformance_tests!(harness_expr)` expands to one `#[tokio::test]` per behaviour.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock::{LockError, LockGuard, LockManager, LockManagerBuilder, LockOptions};

pub mod backends;
pub mod fair;
pub mod kinds;
pub mod leader;
pub mod rules;

/// A backend under test.
pub trait Harness: Send + Sync {
    /// A builder with the backend chosen; every manager from it shares one lock store.
    fn builder(&self) -> LockManagerBuilder;
    /// Deletes the full key whoever holds it.
    fn delete(&self, full_key: &str) -> impl Future<Output = ()> + Send;
    /// Replaces the lock's value with another owner's token.
    fn steal(&self, full_key: &str) -> impl Future<Output = ()> + Send;
    /// Whether the full key exists in the store.
    fn exists(&self, full_key: &str) -> impl Future<Output = bool> + Send;
}

/// A key no other test uses.
pub fn unique(name: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{name}_{{{}-{}}}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

pub async fn manager<H: Harness>(h: &H) -> LockManager {
    h.builder().build().await.expect("manager builds")
}

/// Polls `f` every 10 ms until true or `limit` passes.
pub async fn eventually<F, Fut>(limit: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    f().await
}

/// Several managers, several tasks each, a deliberately non-atomic read-modify-write
/// under the lock: the count is exact, never two holders, tokens strictly increase.
pub async fn mutual_exclusion<H: Harness>(h: &H) {
    const MANAGERS: usize = 3;
    const TASKS: usize = 4;
    const ROUNDS: usize = 15;
    let key = unique("counter");
    let counter = Arc::new(Mutex::new(0u64));
    let active = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..MANAGERS {
        let locks = manager(h).await;
        for _ in 0..TASKS {
            let (locks, key) = (locks.clone(), key.clone());
            let (counter, active, tokens) = (counter.clone(), active.clone(), tokens.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = locks
                        .lock_with(&key, LockOptions::new().wait(Duration::from_secs(30)))
                        .await
                        .expect("lock");
                    assert_eq!(active.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    tokens.lock().unwrap().push(guard.fencing_token());
                    let read = *counter.lock().unwrap();
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_micros(200)).await;
                    *counter.lock().unwrap() = read + 1;
                    active.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release");
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(*counter.lock().unwrap(), (MANAGERS * TASKS * ROUNDS) as u64);
    let tokens = tokens.lock().unwrap();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not increasing: {tokens:?}"
    );
}

/// Several managers and tasks spread over `keys`: exact per-key totals, never two
/// holders of one key, tokens strictly increasing per key.
pub async fn mutual_exclusion_over_keys<H: Harness>(h: &H, keys: Vec<String>, rounds: usize) {
    const MANAGERS: usize = 3;
    const TASKS: usize = 4;
    let keys = Arc::new(keys);
    let counters = Arc::new(Mutex::new(HashMap::<String, u64>::new()));
    let active: Arc<Vec<AtomicUsize>> =
        Arc::new((0..keys.len()).map(|_| AtomicUsize::new(0)).collect());
    let last_token = Arc::new(Mutex::new(HashMap::<String, u64>::new()));
    let mut tasks = Vec::new();
    for m in 0..MANAGERS {
        let locks = manager(h).await;
        for t in 0..TASKS {
            let (locks, keys) = (locks.clone(), keys.clone());
            let (counters, active, last_token) =
                (counters.clone(), active.clone(), last_token.clone());
            tasks.push(tokio::spawn(async move {
                for r in 0..rounds {
                    let k = (m * 5 + t * 3 + r) % keys.len();
                    let guard = locks
                        .lock_with(&keys[k], LockOptions::new().wait(Duration::from_secs(30)))
                        .await
                        .expect("lock");
                    assert_eq!(active[k].fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    {
                        let mut last = last_token.lock().unwrap();
                        let prev = last.insert(keys[k].clone(), guard.fencing_token());
                        assert!(
                            prev.is_none_or(|p| p < guard.fencing_token()),
                            "token {} after {prev:?}",
                            guard.fencing_token()
                        );
                    }
                    let read = counters.lock().unwrap().get(&keys[k]).copied().unwrap_or(0);
                    tokio::time::sleep(Duration::from_micros(300)).await;
                    counters.lock().unwrap().insert(keys[k].clone(), read + 1);
                    active[k].fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release");
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    let total: u64 = counters.lock().unwrap().values().sum();
    assert_eq!(total, (MANAGERS * TASKS * rounds) as u64);
}

/// A holder that vanishes without releasing (no drop, no watchdog) blocks others for
/// its ttl, and not longer.
pub async fn crashed_holder_frees_after_ttl<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let key = unique("crash");
    let ttl = Duration::from_millis(400);
    let guard = a
        .lock_with(&key, LockOptions::new().ttl(ttl).watchdog(false))
        .await
        .unwrap();
    let start = Instant::now();
    std::mem::forget(guard);
    let guard = b
        .lock_with(&key, LockOptions::new().wait(Duration::from_secs(5)))
        .await
        .expect("acquired after the ttl");
    let waited = start.elapsed();
    assert!(
        waited >= ttl - Duration::from_millis(50),
        "acquired too early: {waited:?}"
    );
    assert!(
        waited < ttl + Duration::from_millis(1500),
        "acquired too late: {waited:?}"
    );
    guard.release().await.unwrap();
}

/// The watchdog keeps a lock well past its ttl; nobody else gets it meanwhile.
pub async fn watchdog_keeps_the_lock<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let key = unique("watchdog");
    let guard = a
        .lock_with(&key, LockOptions::new().ttl(Duration::from_millis(300)))
        .await
        .unwrap();
    let end = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < end {
        assert!(
            b.try_lock(&key).await.unwrap().is_none(),
            "taken while renewed"
        );
        assert!(guard.is_held());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    guard.release().await.expect("still ours after 5 ttls");
}

/// Deleting the key behind the holder's back is detected: lost() resolves,
/// is_held() turns false, release() says Lost.
pub async fn lost_when_deleted<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let key = unique("deleted");
    let guard = locks
        .lock_with(&key, LockOptions::new().ttl(Duration::from_millis(300)))
        .await
        .unwrap();
    h.delete(guard.key()).await;
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("loss detected within a few ttls");
    assert!(!guard.is_held());
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}

/// Another owner's token in the key is detected as loss, and release does not delete
/// the other owner's lock.
pub async fn lost_when_stolen<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let key = unique("stolen");
    let guard = locks
        .lock_with(&key, LockOptions::new().ttl(Duration::from_millis(300)))
        .await
        .unwrap();
    let full = guard.key().to_owned();
    h.steal(&full).await;
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("loss detected");
    assert!(!guard.is_held());
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    assert!(h.exists(&full).await, "release deleted someone else's lock");
}

/// `inspect` tells who holds what, for each kind: the kind, this process as the owner
/// (host and pid), the grant's fencing token, when it was granted and the ttl left;
/// `None` once released. Neither `Debug` nor `Display` of it shows anything but those.
pub async fn inspect_tells_who_holds_what<H: Harness>(h: &H) {
    use redlock::LockKind;
    use std::time::SystemTime;
    let (locks, other) = (manager(h).await, manager(h).await);
    let key = unique("inspect");
    assert_eq!(other.inspect(&key).await.unwrap(), None, "free");
    let before = SystemTime::now() - Duration::from_secs(2);
    let ttl = Duration::from_secs(20);
    let check = |info: &redlock::LockInfo, kind, fence: u64, holders: u32| {
        assert_eq!(info.key, format!("{}{key}", locks.prefix()));
        assert_eq!(info.kind, kind);
        assert_eq!(info.holders, holders);
        assert_eq!(info.pid, Some(std::process::id()));
        assert!(info.host.as_deref().is_some_and(|h| !h.is_empty()));
        if locks.backend_name() == "redlock" {
            // The latest grant's node: at least the token issued (a node outside the
            // deciding quorum may have counted higher).
            assert!(info.fencing_token >= Some(fence), "{info:?}");
        } else {
            assert_eq!(info.fencing_token, Some(fence));
        }
        let at = info.acquired_at.expect("acquire time");
        assert!(
            at > before && at < SystemTime::now() + Duration::from_secs(2),
            "{at:?}"
        );
        assert!(info.held_for.is_some_and(|d| d < Duration::from_secs(10)));
        assert!(
            info.ttl.is_some_and(|t| t <= ttl && t > ttl / 2),
            "{info:?}"
        );
        assert_eq!(info.holder.len(), 16, "a 64-bit digest in hex");
        let shown = format!("{info:?} {info}");
        assert!(shown.contains(&fence.to_string()) && shown.contains(&kind.to_string()));
    };
    let guard = locks
        .lock_with(&key, LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let info = other.inspect(&key).await.unwrap().expect("held");
    check(&info, LockKind::Exclusive, guard.fencing_token(), 1);
    guard.release().await.unwrap();
    assert_eq!(other.inspect(&key).await.unwrap(), None, "released");

    let r1 = locks
        .read_with(&key, LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let r2 = locks
        .read_with(&key, LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let info = other.inspect(&key).await.unwrap().expect("read");
    check(&info, LockKind::Read, r2.fencing_token(), 2);
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    assert_eq!(other.inspect(&key).await.unwrap(), None, "readers gone");

    // Permits (on Redlock, each holder on a place, a key of its own).
    let p1 = locks
        .permit_with(&key, 3, LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let info = other.inspect(&key).await.unwrap().expect("permit");
    check(&info, LockKind::Permit, p1.fencing_token(), 1);
    let p2 = locks
        .permit_with(&key, 3, LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let info = other.inspect(&key).await.unwrap().expect("permits");
    check(&info, LockKind::Permit, p2.fencing_token(), 2);
    p1.release().await.unwrap();
    let info = other.inspect(&key).await.unwrap().expect("one permit left");
    assert_eq!(info.holders, 1, "{info:?}");
    // An operator's force_unlock removes the permits too.
    assert!(other.force_unlock(&key).await.unwrap());
    assert_eq!(other.inspect(&key).await.unwrap(), None, "forced");
    let p3 = other
        .permit_with(&key, 1, LockOptions::new().wait(Duration::ZERO))
        .await
        .expect("the place is free again");
    p3.release().await.unwrap();
    drop(p2);
    assert!(matches!(
        other.inspect("").await,
        Err(LockError::InvalidKey { .. })
    ));
}

/// Issue 24, item 11: `force_unlock_if_unchanged` deletes only the grant it was shown.
/// Of every kind: a grant after the one shown (another holder, a reader or permit
/// holder that joined) keeps the lock, untouched; the same holder extending is still the
/// lock shown; a lock gone is not found; the lock shown now is deleted, its waiters
/// free to take it.
pub async fn force_unlock_spares_a_later_grant<H: Harness>(h: &H) {
    let (locks, operator) = (manager(h).await, manager(h).await);
    let key = unique("shown");
    let ttl = LockOptions::new().ttl(Duration::from_secs(20));
    let show = || async { operator.inspect(&key).await.unwrap().expect("held") };

    // Exclusive: released and taken again while the operator looked.
    let first = locks.lock_with(&key, ttl.clone()).await.unwrap();
    let shown = show().await;
    first.release().await.unwrap();
    assert!(
        !operator.force_unlock_if_unchanged(&shown).await.unwrap(),
        "gone: nothing deleted"
    );
    let second = locks.lock_with(&key, ttl.clone()).await.unwrap();
    assert!(!operator.force_unlock_if_unchanged(&shown).await.unwrap());
    let now = show().await;
    assert!(now.fencing_token >= Some(second.fencing_token()), "{now:?}");
    assert_ne!(now.holder, shown.holder, "another holder");
    // The later holder keeps it, renewals and all.
    second.extend(Duration::from_secs(20)).await.unwrap();
    assert!(second.is_held());
    // The same holder extending is still the lock shown.
    let shown = show().await;
    second.extend(Duration::from_secs(25)).await.unwrap();
    assert!(operator.force_unlock_if_unchanged(&shown).await.unwrap());
    assert_eq!(operator.inspect(&key).await.unwrap(), None, "deleted");
    drop(second);

    // Readers: one joining after the show keeps them all.
    let r1 = locks.read_with(&key, ttl.clone()).await.unwrap();
    let shown = show().await;
    let r2 = locks.read_with(&key, ttl.clone()).await.unwrap();
    assert!(!operator.force_unlock_if_unchanged(&shown).await.unwrap());
    assert_eq!(show().await.holders, 2, "both readers kept");
    let shown = show().await;
    assert!(operator.force_unlock_if_unchanged(&shown).await.unwrap());
    assert_eq!(operator.inspect(&key).await.unwrap(), None);
    drop((r1, r2));

    // Permits (on Redlock, places of their own): the same.
    let p1 = locks.permit_with(&key, 3, ttl.clone()).await.unwrap();
    let shown = show().await;
    let p2 = locks.permit_with(&key, 3, ttl.clone()).await.unwrap();
    assert!(!operator.force_unlock_if_unchanged(&shown).await.unwrap());
    assert_eq!(show().await.holders, 2, "both permit holders kept");
    let shown = show().await;
    assert!(operator.force_unlock_if_unchanged(&shown).await.unwrap());
    assert_eq!(operator.inspect(&key).await.unwrap(), None);
    let p3 = operator
        .permit_with(&key, 1, LockOptions::new().wait(Duration::ZERO))
        .await
        .expect("the places are free again");
    p3.release().await.unwrap();
    drop((p1, p2));

    // A key of lock_all: its grant is the key's; a waiter is woken by the delete.
    let other = format!("{key}_too"); // the same slot on a cluster
    let both = locks
        .lock_all_with(&[key.clone(), other.clone()], ttl.clone())
        .await
        .unwrap();
    let shown = show().await;
    let waiting = {
        let (operator, key) = (operator.clone(), key.clone());
        tokio::spawn(async move {
            operator
                .lock_with(&key, LockOptions::new().wait(Duration::from_secs(15)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(operator.force_unlock_if_unchanged(&shown).await.unwrap());
    let taken = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("woken by the delete, not the 20 s ttl")
        .unwrap()
        .expect("the waiter took it");
    taken.release().await.unwrap();
    drop(both);

    // A lock shown by a manager of another prefix is not this one's.
    let mut foreign = shown.clone();
    foreign.key = format!("elsewhere:{key}");
    assert!(matches!(
        operator.force_unlock_if_unchanged(&foreign).await,
        Err(LockError::InvalidKey { .. })
    ));
}

/// A reader's place in `key` (`permits` `None`), or one of its `n` permits.
async fn shared_place(
    locks: &LockManager,
    key: &str,
    permits: Option<u32>,
    options: LockOptions,
) -> LockGuard {
    match permits {
        None => locks.read_with(key, options).await,
        Some(n) => locks.permit_with(key, n, options).await,
    }
    .unwrap()
}

/// Issue 24, item 12: a lock released with `hold_at_least` before its minimum hold is
/// shown as kept (no job runs under it), not as held by a running job: an exclusive lock,
/// one reader of two, one permit holder of two.
pub async fn a_kept_lock_is_shown_as_kept<H: Harness>(h: &H) {
    let (locks, operator) = (manager(h).await, manager(h).await);
    let key = unique("kept");
    let keep = LockOptions::new().hold_at_least(Duration::from_secs(20));
    let show = || async { operator.inspect(&key).await.unwrap().expect("held") };

    let running = locks.lock_with(&key, keep.clone()).await.unwrap();
    assert_eq!(show().await.kept, 0, "a running holder");
    running.release().await.unwrap();
    let kept = show().await;
    assert_eq!((kept.holders, kept.kept), (1, 1), "{kept:?}");
    assert!(kept.to_string().contains("kept by hold_at_least"), "{kept}");
    let listed = operator.list(&key).await.unwrap();
    assert_eq!(listed.iter().map(|i| i.kept).collect::<Vec<_>>(), [1]);
    assert!(operator.force_unlock(&key).await.unwrap());

    for permits in [None, Some(3)] {
        let take = |options: LockOptions| shared_place(&locks, &key, permits, options);
        let first = take(keep.clone()).await;
        let second = take(LockOptions::new()).await;
        first.release().await.unwrap();
        let shown = show().await;
        assert_eq!(
            (shown.holders, shown.kept),
            (2, 1),
            "{permits:?}: {shown:?}"
        );
        assert!(
            shown.to_string().contains("1 kept by hold_at_least"),
            "{shown}"
        );
        second.release().await.unwrap();
        let shown = show().await;
        assert_eq!(
            (shown.holders, shown.kept),
            (1, 1),
            "{permits:?}: {shown:?}"
        );
        assert!(operator.force_unlock(&key).await.unwrap());
    }
}

/// Issue 24, item 12: `watch` showed a permit's holders as one line, the latest grant's.
/// `inspect` lists each reader or permit holder by a name that is not its token and that
/// it keeps while kept by `hold_at_least`, with its own ttl; an exclusive lock lists none.
pub async fn each_shared_holder_is_listed<H: Harness>(h: &H) {
    let (locks, operator) = (manager(h).await, manager(h).await);
    let key = unique("each");
    let show = || async { operator.inspect(&key).await.unwrap().expect("held") };
    let exclusive = locks.lock(&key).await.unwrap();
    assert_eq!(show().await.shared, vec![], "an exclusive lock");
    exclusive.release().await.unwrap();

    let keep = LockOptions::new().hold_at_least(Duration::from_secs(20));
    for permits in [None, Some(3)] {
        let take = |options: LockOptions| shared_place(&locks, &key, permits, options);
        let first = take(keep.clone()).await;
        let second = take(LockOptions::new().ttl(Duration::from_secs(7))).await;
        let both = show().await.shared;
        let mut names: Vec<&str> = both.iter().map(|h| h.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 2, "{permits:?}: {both:?}");
        assert!(both.iter().all(|h| !h.kept), "{both:?}");
        for h in &both {
            let ttl = h.ttl.expect("a ttl");
            assert!(
                ttl <= redlock::DEFAULT_TTL && ttl > Duration::from_secs(1),
                "{h:?}"
            );
        }
        // Soonest to expire first: the 7 s holder.
        assert!(both[0].ttl < both[1].ttl, "{both:?}");

        first.release().await.unwrap();
        let kept = show().await.shared;
        let same: Vec<(&str, bool)> = kept.iter().map(|h| (h.name.as_str(), h.kept)).collect();
        assert_eq!(kept.len(), 2, "{permits:?}: {kept:?}");
        assert_eq!(same.iter().filter(|(_, k)| *k).count(), 1, "{kept:?}");
        assert!(
            same.iter().all(|(n, _)| names.contains(n)),
            "names kept: {kept:?} {names:?}"
        );

        let second_name = both[0].name.clone();
        second.release().await.unwrap();
        let last = show().await.shared;
        assert_eq!(last.len(), 1, "{permits:?}: {last:?}");
        assert!(last[0].kept && last[0].name != second_name, "{last:?}");
        assert!(operator.force_unlock(&key).await.unwrap());
    }
}

/// `list` shows the held locks under the manager's prefix, matching the pattern, of
/// every kind, and nothing kept beside them (fencing counters, holder sets, writer
/// intents, Redlock's permit places).
pub async fn list_shows_held_locks_only<H: Harness>(h: &H) {
    use redlock::LockKind;
    let prefix = unique("ls").replace(['{', '}'], "") + ":";
    let locks = h.builder().prefix(&prefix).build().await.unwrap();
    let other = h.builder().prefix(&prefix).build().await.unwrap();
    assert_eq!(other.list("").await.unwrap(), vec![]);
    let a = locks.lock("buy_{1}").await.unwrap();
    let b = locks.lock("buy_{2}").await.unwrap();
    let r = locks.read("report_{7}").await.unwrap();
    // A writer waiting behind the reader leaves an intent beside the key.
    let w = locks.lock_with(
        "report_{7}",
        LockOptions::new().wait(Duration::from_millis(50)),
    );
    assert!(matches!(w.await, Err(LockError::Timeout { .. })));
    let p1 = locks.permit("pool_{3}", 4).await.unwrap();
    let p2 = locks.permit("pool_{3}", 4).await.unwrap();
    let bare = locks.permit("pool", 4).await.unwrap();
    let all = other.list("").await.unwrap();
    let keys: Vec<&str> = all.iter().map(|i| i.key.as_str()).collect();
    let full = |k: &str| format!("{prefix}{k}");
    assert_eq!(
        keys,
        [
            full("buy_{1}"),
            full("buy_{2}"),
            full("pool"),
            full("pool_{3}"),
            full("report_{7}")
        ]
    );
    assert_eq!(all[0].fencing_token, Some(a.fencing_token()));
    assert_eq!((all[2].kind, all[2].holders), (LockKind::Permit, 1));
    assert_eq!((all[3].kind, all[3].holders), (LockKind::Permit, 2));
    assert_eq!(all[4].kind, LockKind::Read);
    let some = other.list("buy_*").await.unwrap();
    assert_eq!(some.len(), 2);
    assert_eq!(other.list("buy_{2}").await.unwrap().len(), 1);
    assert_eq!(other.list("buy_{[13]}").await.unwrap().len(), 1);
    assert_eq!(other.list("pool_{3}").await.unwrap().len(), 1);
    assert_eq!(
        other.list("pool").await.unwrap().len(),
        1,
        "the key without a tag"
    );
    for g in [a, b, r, p1, p2, bare] {
        g.release().await.unwrap();
    }
    assert_eq!(other.list("*").await.unwrap(), vec![]);
}

/// Dropping a guard releases it without waiting: the key disappears shortly.
pub async fn drop_releases<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let key = unique("drop");
    let guard = a.lock(&key).await.unwrap();
    let full = guard.key().to_owned();
    drop(guard);
    assert!(
        eventually(Duration::from_secs(2), || async { !h.exists(&full).await }).await,
        "a dropped guard's key remained"
    );
    let again = b
        .lock_with(&key, LockOptions::new().wait(Duration::from_secs(2)))
        .await
        .expect("free after drop");
    again.release().await.unwrap();
    assert!(!h.exists(&full).await, "key left behind");
}

/// Cancelled `lock()` futures leave no lock behind and free their queue slots.
pub async fn cancelled_lock_leaves_nothing<H: Harness>(h: &H) {
    let holder = manager(h).await;
    let waiter = h.builder().max_waiters_per_key(4).build().await.unwrap();
    let key = unique("cancel");
    let guard = holder.lock(&key).await.unwrap();
    let full = guard.key().to_owned();
    // Waiting futures dropped by a timeout, more times than the queue has slots.
    for _ in 0..12 {
        let r = tokio::time::timeout(Duration::from_millis(20), waiter.lock(&key)).await;
        assert!(r.is_err(), "should still be waiting");
    }
    guard.release().await.unwrap();
    // Futures dropped at random points while the lock is free.
    for i in 0..200u64 {
        let fut = waiter.lock(&key);
        let _ = tokio::time::timeout(Duration::from_micros(i * 37 % 900), fut).await;
    }
    assert!(
        eventually(Duration::from_secs(3), || async { !h.exists(&full).await }).await,
        "a cancelled acquisition left the lock behind"
    );
    // Every slot is free again: four waiters can queue at once.
    let guard = holder.lock(&key).await.unwrap();
    let mut queued = Vec::new();
    for _ in 0..4 {
        let (w, k) = (waiter.clone(), key.clone());
        queued.push(tokio::spawn(async move {
            w.lock_with(&k, LockOptions::new().wait(Duration::from_secs(10)))
                .await
                .map(drop)
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    guard.release().await.unwrap();
    for q in queued {
        q.await.unwrap().expect("queued waiter acquires");
    }
}

/// Tokens strictly increase across holders and across expiry, and start at 1 or more.
pub async fn fencing_across_expiry<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let key = unique("fence");
    let mut last = 0;
    for i in 0..10 {
        let locks = if i % 2 == 0 { &a } else { &b };
        let guard = locks
            .lock_with(
                &key,
                LockOptions::new()
                    .ttl(Duration::from_millis(30))
                    .watchdog(false)
                    .wait(Duration::from_secs(2)),
            )
            .await
            .unwrap();
        assert!(
            guard.fencing_token() > last,
            "token {} after {last}",
            guard.fencing_token()
        );
        last = guard.fencing_token();
        if i % 3 == 0 {
            std::mem::forget(guard); // let it expire
        } else {
            drop(guard);
        }
    }
}

/// Concurrent acquisitions over many keys never share a token per key.
pub async fn fencing_unique_under_concurrency<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let key = unique("fence_concurrent");
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (locks, key, seen) = (locks.clone(), key.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let g = locks.lock(&key).await.unwrap();
                assert!(
                    seen.lock().unwrap().insert(g.fencing_token()),
                    "token reused"
                );
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(seen.lock().unwrap().len(), 80);
}

/// Beyond max_waiters_per_key, lock() fails at once with QueueFull.
pub async fn queue_full<H: Harness>(h: &H) {
    let holder = manager(h).await;
    let waiter = h.builder().max_waiters_per_key(2).build().await.unwrap();
    let key = unique("queue");
    let guard = holder.lock(&key).await.unwrap();
    let mut queued = Vec::new();
    for _ in 0..2 {
        let (w, k) = (waiter.clone(), key.clone());
        queued.push(tokio::spawn(async move { w.lock(&k).await.map(drop) }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = Instant::now();
    let err = waiter.lock(&key).await.unwrap_err();
    assert!(matches!(err, LockError::QueueFull { .. }), "{err}");
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "QueueFull must be immediate"
    );
    guard.release().await.unwrap();
    for q in queued {
        q.await.unwrap().expect("queued waiters still acquire");
    }
}

/// A release wakes the next waiter through a notification: the hand-off takes
/// milliseconds, not the holder's 30 s ttl.
pub async fn notified_handoff_is_fast<H: Harness>(h: &H) -> Duration {
    let (a, b) = (manager(h).await, manager(h).await);
    let key = unique("handoff");
    let mut samples = Vec::new();
    for _ in 0..30 {
        let guard = a.lock(&key).await.unwrap();
        let (b2, k2) = (b.clone(), key.clone());
        let waiter = tokio::spawn(async move {
            let g = b2.lock(&k2).await.unwrap();
            let at = Instant::now();
            g.release().await.unwrap();
            at
        });
        tokio::time::sleep(Duration::from_millis(15)).await;
        let released = Instant::now();
        guard.release().await.unwrap();
        let acquired = waiter.await.unwrap();
        samples.push(acquired.saturating_duration_since(released));
    }
    samples.sort();
    let median = samples[samples.len() / 2];
    assert!(
        median < Duration::from_millis(20),
        "median hand-off {median:?}"
    );
    median
}

/// try_lock and wait(ZERO) make one attempt.
pub async fn one_attempt_apis<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let key = unique("try");
    let guard = a.try_lock(&key).await.unwrap().expect("free");
    assert!(b.try_lock(&key).await.unwrap().is_none());
    let err = b
        .lock_with(&key, LockOptions::new().wait(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }));
    let start = Instant::now();
    let err = b
        .lock_with(&key, LockOptions::new().wait(Duration::from_millis(150)))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }));
    assert!(start.elapsed() >= Duration::from_millis(140));
    assert!(a.is_locked(&key).await.unwrap());
    guard.release().await.unwrap();
    assert!(!a.is_locked(&key).await.unwrap());
}

/// extend() sets the remaining ttl; a lock without watchdog lives that long.
pub async fn extend_sets_ttl<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let key = unique("extend");
    let guard = a
        .lock_with(
            &key,
            LockOptions::new()
                .ttl(Duration::from_millis(200))
                .watchdog(false),
        )
        .await
        .unwrap();
    guard.extend(Duration::from_secs(3)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(guard.is_held());
    assert!(
        b.try_lock(&key).await.unwrap().is_none(),
        "extension did not hold"
    );
    assert!(matches!(
        guard.extend(Duration::ZERO).await,
        Err(LockError::InvalidOption { .. })
    ));
    guard.release().await.unwrap();
}

/// Without the watchdog a lock expires; is_held() says so from the local deadline and
/// lost() resolves.
pub async fn expiry_without_watchdog<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let key = unique("expiry");
    let guard = locks
        .lock_with(
            &key,
            LockOptions::new()
                .ttl(Duration::from_millis(100))
                .watchdog(false),
        )
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost");
    assert!(!guard.is_held());
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}

/// Explicit guards are not reentrant: the same task waits like anyone else.
pub async fn guards_are_not_reentrant<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let key = unique("reentry");
    let guard = locks.lock(&key).await.unwrap();
    let err = locks
        .lock_with(&key, LockOptions::new().wait(Duration::from_millis(100)))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }));
    guard.release().await.unwrap();
}

/// In one process, waiters acquire in arrival order.
pub async fn local_waiters_are_fifo<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let key = unique("fifo");
    let guard = locks.lock(&key).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (locks, key, order) = (locks.clone(), key.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = locks.lock(&key).await.unwrap();
            order.lock().unwrap().push(i);
            g.release().await.unwrap();
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    guard.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4, 5]);
}

/// Bad input is a clear error before any I/O, never a panic.
pub async fn bad_input_is_rejected<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let invalid_key = |r: Result<_, LockError>| matches!(r, Err(LockError::InvalidKey { .. }));
    assert!(invalid_key(locks.lock("").await.map(drop)));
    assert!(invalid_key(
        locks
            .lock(&"k".repeat(redlock::MAX_KEY_LEN))
            .await
            .map(drop)
    ));
    assert!(invalid_key(locks.lock("a{}b}").await.map(drop)));
    let invalid_option =
        |r: Result<_, LockError>| matches!(r, Err(LockError::InvalidOption { .. }));
    for opts in [
        LockOptions::new().ttl(Duration::ZERO),
        LockOptions::new().ttl(redlock::MAX_TTL + Duration::from_secs(1)),
        LockOptions::new().wait(Duration::MAX),
    ] {
        assert!(invalid_option(
            locks.lock_with("fine", opts).await.map(drop)
        ));
    }
    assert!(invalid_option(
        h.builder().max_waiters_per_key(0).build().await.map(drop)
    ));
    assert!(invalid_option(
        h.builder()
            .default_ttl(Duration::ZERO)
            .build()
            .await
            .map(drop)
    ));
    assert!(invalid_option(
        LockManager::builder().build().await.map(drop)
    ));
    // A valid but odd key works and keeps its exact bytes.
    let odd = unique("ключ with spaces\n");
    let g = locks.lock(&odd).await.unwrap();
    assert_eq!(g.key(), format!("lock:{odd}"));
    g.release().await.unwrap();
}

/// Everything users touch is Send + Sync + 'static, and futures are Send.
pub fn static_send_sync_checks(locks: &LockManager) {
    fn is_send<T: Send>(_: &T) {}
    fn send_sync_static<T: Send + Sync + 'static>() {}
    send_sync_static::<LockManager>();
    send_sync_static::<redlock::LockGuard>();
    send_sync_static::<LockError>();
    is_send(&locks.lock("k"));
    is_send(&locks.try_lock("k"));
    is_send(&locks.lock_with("k", LockOptions::new()));
}

/// A subscriber reconnect loses no wake-up. Many waiters (distinct keys, held by another
/// manager with a long ttl and no watchdog, so the ttl fallback is far away) are
/// subscribed and asleep; `kill_subscribers` drops the subscriber connections
/// (`CLIENT KILL TYPE pubsub`) and every holder releases right after, while the
/// subscriptions are being restored. A release the waiters did not hear leaves them
/// asleep until the fallback; every one must instead acquire within seconds.
///
/// `subscribed(channels)` counts the channels the server(s) count a subscriber on.
pub async fn subscriber_reconnect_loses_no_wake_up<H: Harness>(
    h: &H,
    subscribed: impl Fn(&[String]) -> usize,
    kill_subscribers: impl Fn() -> usize,
) {
    const WAITERS: usize = 150;
    let ttl = Duration::from_secs(60);
    let wait = Duration::from_secs(20);
    let (holder, waiter) = (manager(h).await, manager(h).await);
    let keys: Vec<String> = (0..WAITERS).map(|_| unique("resub")).collect();
    let mut guards = Vec::new();
    for key in &keys {
        let options = LockOptions::new().ttl(ttl).watchdog(false);
        guards.push(holder.lock_with(key, options).await.expect("holder locks"));
    }
    let tasks: Vec<_> = keys
        .iter()
        .map(|key| {
            let (waiter, key) = (waiter.clone(), key.clone());
            tokio::spawn(async move {
                let guard = waiter
                    .lock_with(&key, LockOptions::new().wait(wait))
                    .await?;
                let at = Instant::now();
                drop(guard);
                Ok::<_, LockError>(at)
            })
        })
        .collect();
    let channels: Vec<String> = keys.iter().map(|k| format!("lock:{k}")).collect();
    // A subscription that failed (Redlock bounds it by the short per-node timeout,
    // which a burst of 150 can miss) is asked for again a little later: all get there.
    eventually(Duration::from_secs(10), || async {
        subscribed(&channels) == WAITERS
    })
    .await;
    let listening = subscribed(&channels);
    assert_eq!(listening, WAITERS, "waiters listening for their release");
    // Each head's attempt after its subscription is done: all are asleep.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        kill_subscribers() >= 1,
        "a subscriber connection was killed"
    );
    let released = Instant::now();
    let releases = guards.into_iter().map(|g| async move { g.release().await });
    for r in futures::future::join_all(releases).await {
        r.expect("holder releases");
    }
    let mut late = Vec::new();
    let mut slowest = Duration::ZERO;
    for (key, task) in keys.iter().zip(tasks) {
        match task.await.expect("waiter task") {
            Ok(at) => {
                let took = at.saturating_duration_since(released);
                slowest = slowest.max(took);
                if took > Duration::from_secs(5) {
                    late.push(format!("{key}: {took:?}"));
                }
            }
            Err(e) => late.push(format!("{key}: {e}")),
        }
    }
    println!("subscriber reconnect: {WAITERS} waiters, slowest hand-off {slowest:?}");
    assert!(
        late.is_empty(),
        "{} of {WAITERS} waiters slept through their release: {late:?}",
        late.len()
    );
}

/// Issue 24, item 4: a guard dropped just before the process exited stayed locked for
/// its whole ttl. `shutdown` releases what every guard holds (watched or not, each
/// kind, `lock_all`'s keys) and the releases of guards dropped just before, at once;
/// a `hold_at_least` lock keeps its minimum hold; afterwards guards say they hold
/// nothing and the manager refuses new work.
pub async fn shutdown_frees_every_lock_at_once<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let other = manager(h).await;
    let [a, r, p, m1, m2, d, kept] = [
        "sd_lock",
        "sd_read",
        "sd_permit",
        "sd_all1",
        "sd_all2",
        "sd_dropped",
        "sd_kept",
    ]
    .map(unique);
    let long = || LockOptions::new().ttl(Duration::from_secs(60));
    let exclusive = locks.lock_with(&a, long()).await.unwrap();
    let reader = locks.read_with(&r, long().watchdog(false)).await.unwrap();
    let permit = locks.permit_with(&p, 2, long()).await.unwrap();
    let both = locks.lock_all_with([&m1, &m2], long()).await.unwrap();
    let kept_guard = locks
        .lock_with(&kept, long().hold_at_least(Duration::from_secs(60)))
        .await
        .unwrap();
    // Dropped just before the way out: its release is the background task's.
    drop(locks.lock_with(&d, long()).await.unwrap());

    locks.shutdown(Duration::from_secs(10)).await.unwrap();

    assert!(!exclusive.is_held() && !reader.is_held() && !permit.is_held());
    assert!(!kept_guard.is_held());
    for key in [&a, &m1, &m2, &d] {
        assert!(
            other.try_lock(key).await.unwrap().is_some(),
            "{key} still held after shutdown"
        );
    }
    assert!(
        other.try_write(&r).await.unwrap().is_some(),
        "{r} still read"
    );
    let places = [
        other.try_permit(&p, 2).await.unwrap(),
        other.try_permit(&p, 2).await.unwrap(),
    ];
    assert!(places.iter().all(Option::is_some), "{p}'s place still held");
    assert!(
        other.try_lock(&kept).await.unwrap().is_none(),
        "{kept}: hold_at_least ended by shutdown"
    );

    let clone = locks.clone();
    assert!(matches!(
        clone.lock("sd_after").await,
        Err(LockError::ShutDown)
    ));
    assert!(matches!(
        locks.try_read("sd_after").await,
        Err(LockError::ShutDown)
    ));
    assert!(matches!(
        exclusive.release().await,
        Err(LockError::NotHeld { .. })
    ));
    locks.shutdown(Duration::from_secs(1)).await.unwrap();
    drop((both, reader, permit, kept_guard));
}

/// One `#[tokio::test]` per behaviour, for the harness `$make` builds.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@each $make;
            mutual_exclusion, crashed_holder_frees_after_ttl, watchdog_keeps_the_lock,
            lost_when_deleted, lost_when_stolen, drop_releases, cancelled_lock_leaves_nothing,
            fencing_across_expiry, fencing_unique_under_concurrency, queue_full,
            notified_handoff_is_fast, one_attempt_apis, extend_sets_ttl,
            expiry_without_watchdog, guards_are_not_reentrant, local_waiters_are_fifo,
            bad_input_is_rejected, inspect_tells_who_holds_what, list_shows_held_locks_only,
            shutdown_frees_every_lock_at_once, force_unlock_spares_a_later_grant,
            a_kept_lock_is_shown_as_kept, each_shared_holder_is_listed);
    };
    (@each $make:expr; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let harness = $make;
                let _ = conformance::$name(&harness).await;
            }
        )*
    };
}
