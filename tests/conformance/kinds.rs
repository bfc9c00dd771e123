//! The behaviours of the other kinds of lock — read/write, permits, several keys at once,
//! `hold_at_least` — written once and run on every backend (`kinds_tests!`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock::{LockError, LockKind, LockOptions};

use super::{eventually, manager, unique, Harness};

const MANAGERS: usize = 3;
const TASKS: usize = 4;

fn waiting(secs: u64) -> LockOptions {
    LockOptions::new().wait(Duration::from_secs(secs))
}

/// Raises `high` to `now` if higher.
fn high_water(high: &AtomicUsize, now: usize) {
    high.fetch_max(now, Ordering::SeqCst);
}

/// Checks fencing tokens recorded in grant order (each pushed while its lock was held,
/// with whether it was exclusive): none is 0; an exclusive grant's token is above every
/// token recorded before it, a shared grant's above every exclusive one before it (a
/// writer fences out everyone before it, and is fenced out by everyone after it). Shared
/// holders at the same time each get a token of their own, except on Redlock: there a
/// token is the highest of the counters of the nodes that granted it, and two readers
/// granted at once by different majorities can draw the same highest value.
fn fenced_in_grant_order(tokens: &[(u64, bool)], backend: &str) {
    assert!(tokens.iter().all(|&(t, _)| t > 0), "token 0 issued");
    let (mut highest, mut highest_exclusive) = (0, 0);
    for &(token, exclusive) in tokens {
        if exclusive {
            assert!(token > highest, "exclusive token {token} after {highest}");
        } else {
            assert!(
                token > highest_exclusive,
                "shared token {token} after exclusive {highest_exclusive}"
            );
        }
        highest = highest.max(token);
        if exclusive {
            highest_exclusive = token;
        }
    }
    if backend != "redlock" {
        let mut distinct: Vec<u64> = tokens.iter().map(|&(t, _)| t).collect();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            tokens.len(),
            "a fencing token was issued twice"
        );
    }
}

/// Readers and writers of one key from several managers and tasks: a writer is alone
/// (no reader, no other writer), readers do overlap, the writers' non-atomic counter
/// is exact, and fencing tokens fence ([`fenced_in_grant_order`]).
pub async fn readers_share_writers_exclude<H: Harness>(h: &H) {
    const ROUNDS: usize = 8;
    let key = unique("rw");
    let readers = Arc::new(AtomicUsize::new(0));
    let writers = Arc::new(AtomicUsize::new(0));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let counter = Arc::new(Mutex::new(0u64));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let backend = manager(h).await.backend_name();
    for m in 0..MANAGERS {
        let locks = manager(h).await;
        for t in 0..TASKS {
            let (locks, key) = (locks.clone(), key.clone());
            let (readers, writers, most_readers) =
                (readers.clone(), writers.clone(), most_readers.clone());
            let (counter, tokens) = (counter.clone(), tokens.clone());
            tasks.push(tokio::spawn(async move {
                for r in 0..ROUNDS {
                    // One task in three writes each round.
                    if (m + t + r) % 3 == 0 {
                        let guard = locks.write_with(&key, waiting(30)).await.expect("write");
                        assert_eq!(guard.kind(), LockKind::Exclusive);
                        tokens.lock().unwrap().push((guard.fencing_token(), true));
                        assert_eq!(writers.fetch_add(1, Ordering::SeqCst), 0, "two writers");
                        assert_eq!(
                            readers.load(Ordering::SeqCst),
                            0,
                            "a reader beside a writer"
                        );
                        let read = *counter.lock().unwrap();
                        tokio::time::sleep(Duration::from_micros(300)).await;
                        *counter.lock().unwrap() = read + 1;
                        writers.fetch_sub(1, Ordering::SeqCst);
                        guard.release().await.expect("release write");
                    } else {
                        let guard = locks.read_with(&key, waiting(30)).await.expect("read");
                        assert_eq!(guard.kind(), LockKind::Read);
                        tokens.lock().unwrap().push((guard.fencing_token(), false));
                        let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                        high_water(&most_readers, now);
                        assert_eq!(
                            writers.load(Ordering::SeqCst),
                            0,
                            "a writer beside a reader"
                        );
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        assert_eq!(
                            writers.load(Ordering::SeqCst),
                            0,
                            "a writer beside a reader"
                        );
                        readers.fetch_sub(1, Ordering::SeqCst);
                        guard.release().await.expect("release read");
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    let writes = (0..MANAGERS)
        .flat_map(|m| (0..TASKS).flat_map(move |t| (0..ROUNDS).map(move |r| (m + t + r) % 3)))
        .filter(|&x| x == 0)
        .count();
    assert_eq!(*counter.lock().unwrap(), writes as u64);
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), MANAGERS * TASKS * ROUNDS);
    fenced_in_grant_order(&tokens, backend);
    assert!(
        most_readers.load(Ordering::SeqCst) > 1,
        "readers never overlapped"
    );
}

/// A writer waiting behind readers gets the key although readers keep coming:
/// new readers queue behind a waiting writer (the writer's intent is on the server,
/// so readers of other managers see it).
pub async fn writer_not_starved_by_readers<H: Harness>(h: &H) {
    let key = unique("starve");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
    // Overlapping readers from two managers: without writer preference there is
    // always a reader, and the writer waits forever.
    for _ in 0..2 {
        let locks = manager(h).await;
        for i in 0..3u64 {
            let (locks, key, stop) = (locks.clone(), key.clone(), stop.clone());
            readers.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(7 * i)).await;
                let end = Instant::now() + Duration::from_secs(20);
                while !stop.load(Ordering::SeqCst) && Instant::now() < end {
                    match locks.read_with(&key, waiting(10)).await {
                        Ok(guard) => {
                            tokio::time::sleep(Duration::from_millis(30)).await;
                            drop(guard);
                        }
                        Err(LockError::Timeout { .. }) => {}
                        Err(e) => panic!("read: {e}"),
                    }
                }
            }));
        }
    }
    let writer = manager(h).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = Instant::now();
    let guard = writer
        .write_with(&key, waiting(15))
        .await
        .expect("the writer got in past a stream of readers");
    let waited = start.elapsed();
    stop.store(true, Ordering::SeqCst);
    guard.release().await.unwrap();
    for r in readers {
        r.await.expect("reader task");
    }
    assert!(waited < Duration::from_secs(5), "writer waited {waited:?}");
}

/// Readers waiting for a writer (in two managers) all get in once it releases, by
/// notification: well before the writer's 30 s ttl, and together.
pub async fn write_release_wakes_every_reader<H: Harness>(h: &H) {
    const READERS: usize = 6;
    let key = unique("wake-readers");
    let writer = manager(h).await;
    let guard = writer.write(&key).await.unwrap();
    let holding = Arc::new(AtomicUsize::new(0));
    let all_in = Arc::new(tokio::sync::Notify::new());
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let locks = manager(h).await;
        for _ in 0..READERS / 2 {
            let (locks, key, holding, all_in) =
                (locks.clone(), key.clone(), holding.clone(), all_in.clone());
            tasks.push(tokio::spawn(async move {
                let guard = locks.read_with(&key, waiting(20)).await.expect("read");
                let at = Instant::now();
                if holding.fetch_add(1, Ordering::SeqCst) + 1 == READERS {
                    all_in.notify_waiters();
                }
                // Held until every reader is in: they hold it together.
                let _ = tokio::time::timeout(Duration::from_secs(10), async {
                    while holding.load(Ordering::SeqCst) < READERS {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
                .await;
                drop(guard);
                at
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        holding.load(Ordering::SeqCst),
        0,
        "a reader got in beside the writer"
    );
    let released = Instant::now();
    guard.release().await.unwrap();
    for t in tasks {
        let at = t.await.expect("reader");
        let after = at.duration_since(released);
        assert!(
            after < Duration::from_secs(5),
            "a reader got in {after:?} after the release"
        );
    }
}

/// At most `n` permit holders at once, from several managers and tasks; all `n` are
/// used, and tokens fence ([`fenced_in_grant_order`]).
pub async fn at_most_n_permit_holders<H: Harness>(h: &H) {
    const N: u32 = 3;
    const ROUNDS: usize = 6;
    let key = unique("permits");
    let holding = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let backend = manager(h).await.backend_name();
    for _ in 0..MANAGERS {
        let locks = manager(h).await;
        for _ in 0..TASKS {
            let (locks, key) = (locks.clone(), key.clone());
            let (holding, most, done, tokens) =
                (holding.clone(), most.clone(), done.clone(), tokens.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = locks
                        .permit_with(&key, N, waiting(30))
                        .await
                        .expect("permit");
                    assert_eq!(guard.kind(), LockKind::Permit);
                    tokens.lock().unwrap().push((guard.fencing_token(), false));
                    let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(now <= N as usize, "{now} permit holders of {N}");
                    high_water(&most, now);
                    tokio::time::sleep(Duration::from_millis(4)).await;
                    holding.fetch_sub(1, Ordering::SeqCst);
                    done.fetch_add(1, Ordering::SeqCst);
                    guard.release().await.expect("release permit");
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(done.load(Ordering::SeqCst), MANAGERS * TASKS * ROUNDS);
    assert_eq!(
        most.load(Ordering::SeqCst),
        N as usize,
        "never {N} holders at once"
    );
    let tokens = tokens.lock().unwrap().clone();
    fenced_in_grant_order(&tokens, backend);
}

/// A permit holder that vanishes (no release, no watchdog) gives its permit back after
/// its ttl, by the server's clock, and not before.
pub async fn killed_permit_holder_frees_after_ttl<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let key = unique("permit-crash");
    let ttl = Duration::from_millis(400);
    let kept = b.permit(&key, 2).await.unwrap();
    let vanished = a
        .permit_with(&key, 2, LockOptions::new().ttl(ttl).watchdog(false))
        .await
        .unwrap();
    let start = Instant::now();
    std::mem::forget(vanished);
    let guard = b
        .permit_with(&key, 2, waiting(5))
        .await
        .expect("the vanished holder's permit came back");
    let waited = start.elapsed();
    assert!(
        waited >= ttl - Duration::from_millis(50),
        "too early: {waited:?}"
    );
    assert!(
        waited < ttl + Duration::from_millis(1500),
        "too late: {waited:?}"
    );
    assert!(kept.is_held(), "the live holder's permit was taken too");
    guard.release().await.unwrap();
    kept.release().await.unwrap();
}

/// Releasing a permit wakes a waiter by notification, well before the holders' ttl.
pub async fn permit_release_wakes_a_waiter<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let key = unique("permit-wake");
    let first = a.permit(&key, 2).await.unwrap();
    let second = a.permit(&key, 2).await.unwrap();
    assert!(
        b.try_permit(&key, 2).await.unwrap().is_none(),
        "a third permit of 2"
    );
    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            let guard = b.permit_with(&key, 2, waiting(20)).await.expect("permit");
            (Instant::now(), guard)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    first.release().await.unwrap();
    let (at, guard) = waiter.await.unwrap();
    let after = at.duration_since(released);
    assert!(
        after < Duration::from_secs(5),
        "woken {after:?} after the release"
    );
    assert!(second.is_held());
    guard.release().await.unwrap();
    second.release().await.unwrap();
}

/// `is_locked`, asked by another manager, sees every kind of holder: readers, permit
/// holders (on Redlock, keys of their own: the key's places) and an exclusive holder,
/// and none once each has released.
pub async fn is_locked_sees_every_kind<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let key = unique("is-locked");
    assert!(!b.is_locked(&key).await.unwrap(), "locked before anyone");
    let reader = a.read(&key).await.unwrap();
    assert!(b.is_locked(&key).await.unwrap(), "a reader not seen");
    reader.release().await.unwrap();
    assert!(!b.is_locked(&key).await.unwrap(), "locked after the reader");
    let permit = a.permit(&key, 3).await.unwrap();
    assert!(b.is_locked(&key).await.unwrap(), "a permit holder not seen");
    permit.release().await.unwrap();
    assert!(!b.is_locked(&key).await.unwrap(), "locked after the permit");
    let writer = a.lock(&key).await.unwrap();
    assert!(
        b.is_locked(&key).await.unwrap(),
        "the exclusive holder not seen"
    );
    writer.release().await.unwrap();
    assert!(!b.is_locked(&key).await.unwrap(), "locked after the writer");
}

/// The watchdog renews readers and permits like exclusive locks.
pub async fn watchdog_keeps_readers_and_permits<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let (rkey, pkey) = (unique("renew-read"), unique("renew-permit"));
    let ttl = LockOptions::new().ttl(Duration::from_millis(300));
    let reader = a.read_with(&rkey, ttl.clone()).await.unwrap();
    let permit = a.permit_with(&pkey, 1, ttl).await.unwrap();
    let end = Instant::now() + Duration::from_millis(1200);
    while Instant::now() < end {
        assert!(
            b.try_write(&rkey).await.unwrap().is_none(),
            "written over a reader"
        );
        assert!(
            b.try_permit(&pkey, 1).await.unwrap().is_none(),
            "a second permit of 1"
        );
        assert!(reader.is_held() && permit.is_held());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    reader
        .release()
        .await
        .expect("reader still held after 4 ttls");
    permit
        .release()
        .await
        .expect("permit still held after 4 ttls");
}

/// Extending one reader, shorter or longer, never cuts another reader's time, and a
/// reader's extend sets its own remaining ttl.
pub async fn extending_one_reader_keeps_the_others<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let key = unique("extend-read");
    let long = a
        .read_with(&key, LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let short = b
        .read_with(
            &key,
            LockOptions::new()
                .ttl(Duration::from_secs(30))
                .watchdog(false),
        )
        .await
        .unwrap();
    short.extend(Duration::from_millis(200)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!short.is_held(), "the shortened reader outlived its ttl");
    assert!(long.is_held());
    assert!(
        b.try_write(&key).await.unwrap().is_none(),
        "shortening one reader freed the key of the other"
    );
    long.extend(Duration::from_secs(5)).await.unwrap();
    assert!(matches!(short.release().await, Err(LockError::Lost { .. })));
    long.release().await.unwrap();
    let w = b
        .try_write(&key)
        .await
        .unwrap()
        .expect("free after the last reader");
    w.release().await.unwrap();
}

/// Money moves between accounts under `lock_all`, tasks naming the two keys in opposite
/// orders: every task finishes (no deadlock), the total is unchanged and the number of
/// transfers exact.
pub async fn lock_all_in_opposite_orders_finishes<H: Harness>(h: &H) {
    const ROUNDS: usize = 6;
    let (x, y) = (unique("account"), unique("account"));
    let balances = Arc::new(Mutex::new([1000i64, 1000i64]));
    let transfers = Arc::new(AtomicUsize::new(0));
    let active = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for m in 0..MANAGERS {
        let locks = manager(h).await;
        for t in 0..TASKS {
            let (locks, x, y) = (locks.clone(), x.clone(), y.clone());
            let (balances, transfers, active) =
                (balances.clone(), transfers.clone(), active.clone());
            tasks.push(tokio::spawn(async move {
                for r in 0..ROUNDS {
                    let forward = (m + t + r) % 2 == 0;
                    let keys = if forward { [&x, &y] } else { [&y, &x] };
                    let guard = locks
                        .lock_all_with(keys, waiting(30))
                        .await
                        .expect("lock_all");
                    assert_eq!(guard.keys().len(), 2);
                    assert!(guard.keys()[0] < guard.keys()[1], "keys not sorted");
                    assert_eq!(active.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    let [a, b] = *balances.lock().unwrap();
                    tokio::time::sleep(Duration::from_micros(300)).await;
                    let amount = if forward { 7 } else { -7 };
                    *balances.lock().unwrap() = [a - amount, b + amount];
                    transfers.fetch_add(1, Ordering::SeqCst);
                    active.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release");
                }
            }));
        }
    }
    let all = async {
        for t in tasks {
            t.await.expect("task");
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("lock_all tasks deadlocked");
    assert_eq!(transfers.load(Ordering::SeqCst), MANAGERS * TASKS * ROUNDS);
    let [a, b] = *balances.lock().unwrap();
    assert_eq!(a + b, 2000, "money appeared or vanished");
}

/// A `lock_all` that cannot have every key takes none: after a miss, the keys it could
/// have taken are free; a held `MultiGuard` releases every key, by `release` or drop.
pub async fn lock_all_leaves_no_key_behind<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let (x, y, z) = (unique("all"), unique("all"), unique("all"));
    let held = a.lock(&y).await.unwrap();
    assert!(b.try_lock_all([&x, &y, &z]).await.unwrap().is_none());
    let err = b
        .lock_all_with(
            [&z, &y, &x],
            LockOptions::new().wait(Duration::from_millis(200)),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    for k in [&x, &z] {
        assert!(
            !b.is_locked(k).await.unwrap(),
            "{k} left held by a failed lock_all"
        );
    }
    held.release().await.unwrap();
    let all = b.lock_all([&x, &y, &z]).await.unwrap();
    let full: Vec<String> = all.keys().iter().map(|k| k.to_string()).collect();
    let tokens = all.fencing_tokens();
    assert_eq!(tokens.len(), 3);
    assert!(tokens.iter().all(|&t| t > 0));
    assert!(all.is_held());
    all.release().await.unwrap();
    for k in &full {
        assert!(!h.exists(k).await, "{k} left behind by release");
    }
    let dropped = b.lock_all([&x, &z]).await.unwrap();
    drop(dropped);
    for k in [&x, &z] {
        assert!(
            eventually(Duration::from_secs(2), || async {
                !b.is_locked(k).await.unwrap()
            })
            .await,
            "{k} left behind by drop"
        );
    }
    assert!(matches!(
        b.lock_all(Vec::<String>::new()).await,
        Err(LockError::InvalidKey { .. })
    ));
}

/// `hold_at_least`: released early, the key stays taken until the period is over;
/// released after it, the key is free at once.
pub async fn hold_at_least_keeps_the_key<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let key = unique("hold");
    let hold = Duration::from_millis(700);
    let granted = Instant::now();
    let guard = a
        .lock_with(&key, LockOptions::new().hold_at_least(hold))
        .await
        .unwrap();
    guard.release().await.unwrap();
    assert!(
        b.try_lock(&key).await.unwrap().is_none(),
        "free before the period"
    );
    let again = b
        .lock_with(&key, waiting(5))
        .await
        .expect("free after the period");
    let waited = granted.elapsed();
    assert!(
        waited >= hold - Duration::from_millis(20),
        "free after {waited:?}"
    );
    again.release().await.unwrap();
    // Released after the period: free at once.
    let late = a
        .lock_with(
            &key,
            LockOptions::new().hold_at_least(Duration::from_millis(100)),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    late.release().await.unwrap();
    assert!(
        b.try_lock(&key).await.unwrap().is_some(),
        "kept past its period"
    );
}

/// Regression (kinds review): a `lock_all_with(.., hold_at_least(d))` that missed a key
/// (or was cancelled while waiting for one) released the keys it had already taken with
/// the `hold_at_least` keep, so a call that never got its guard left those keys held
/// for the whole period. Only a granted `MultiGuard` keeps its keys.
pub async fn lock_all_miss_keeps_no_key_for_hold_at_least<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let mut keys = [unique("allhold"), unique("allhold")];
    keys.sort();
    let [first, second] = keys;
    let hold = Duration::from_secs(60);
    // The second key (in the order lock_all takes them) is held: the first is taken,
    // then given back.
    let held = a.lock(&second).await.unwrap();
    let err = b
        .lock_all_with(
            [&first, &second],
            LockOptions::new()
                .hold_at_least(hold)
                .wait(Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    let free = a
        .lock_with(&first, waiting(2))
        .await
        .expect("the first key held on by a failed lock_all for its hold_at_least");
    free.release().await.unwrap();
    // Cancelled while waiting for the second key.
    let cut = tokio::time::timeout(
        Duration::from_millis(300),
        b.lock_all_with([&first, &second], LockOptions::new().hold_at_least(hold)),
    )
    .await;
    assert!(cut.is_err(), "lock_all got a held key");
    let free = a
        .lock_with(&first, waiting(2))
        .await
        .expect("the first key held on by a cancelled lock_all for its hold_at_least");
    free.release().await.unwrap();
    held.release().await.unwrap();
    // A granted guard keeps its keys for the period.
    let all = b
        .lock_all_with([&first, &second], LockOptions::new().hold_at_least(hold))
        .await
        .unwrap();
    all.release().await.unwrap();
    assert!(a.try_lock(&first).await.unwrap().is_none(), "not kept");
}

/// Regression (kinds review): a writer whose wait was cancelled (its future dropped)
/// left its intent on the server for the rest of its wait, and every new reader was
/// refused until then (here 30 s) though no writer was waiting any more. The intent is
/// withdrawn (and the readers woken) when a writer stops waiting without the lock.
pub async fn cancelled_writer_keeps_no_reader_out<H: Harness>(h: &H) {
    let (a, b, c) = (manager(h).await, manager(h).await, manager(h).await);
    let key = unique("intent");
    let reader = a.read(&key).await.unwrap();
    let cut =
        tokio::time::timeout(Duration::from_millis(300), b.write_with(&key, waiting(30))).await;
    assert!(cut.is_err(), "the writer got in past a reader");
    let start = Instant::now();
    let second = c
        .read_with(&key, waiting(10))
        .await
        .expect("a reader kept out by a cancelled writer's intent");
    let waited = start.elapsed();
    assert!(waited < Duration::from_secs(5), "reader waited {waited:?}");
    // A writer that timed out leaves no intent either.
    let err = b
        .write_with(&key, LockOptions::new().wait(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    let third = c
        .read_with(&key, waiting(5))
        .await
        .expect("a reader kept out by a timed-out writer's intent");
    for g in [reader, second, third] {
        g.release().await.unwrap();
    }
}

/// Regression (kinds review, memory parity): the in-memory backend registered a
/// writer's intent only while readers held the key, where the scripts register it
/// whoever holds it. A writer waiting behind another writer then had no intent, and a
/// reader arriving as the first writer released got in before it (writer preference
/// broken on that backend only). Run on a current-thread runtime: the woken second
/// writer cannot run between the release and the reader's attempt, so without its
/// intent the reader always gets in.
pub async fn writer_waiting_behind_a_writer_keeps_new_readers_out<H: Harness>(h: &H) {
    let (a, b, c) = (manager(h).await, manager(h).await, manager(h).await);
    let key = unique("wbw");
    let first = a.write(&key).await.unwrap();
    let second = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            let guard = b.write_with(&key, waiting(10)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            guard.release().await.unwrap();
        })
    };
    // The second writer has waited (and been refused) by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.release().await.unwrap();
    let reader = c.try_read(&key).await.unwrap();
    assert!(
        reader.is_none(),
        "a reader got in while a writer was waiting for the key"
    );
    second.await.unwrap();
    let reader = c
        .read_with(&key, waiting(5))
        .await
        .expect("a reader after the writers");
    reader.release().await.unwrap();
}

/// Regression (kinds review): a release within `hold_at_least` shortens the key's
/// expiry to the end of the period but published nothing, so a waiter in another
/// manager slept on until the expiry it had been told before (here the 10 s ttl), long
/// after the key was free. Now such a release wakes the waiters, which ask again and
/// wait for the period's end. For every kind: the writer waits for the exclusive
/// holder, then for a reader; a permit waiter for a permit holder.
pub async fn release_within_hold_at_least_wakes_waiters_at_its_end<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let ttl = Duration::from_secs(10);
    let hold = Duration::from_millis(500);
    let opts = || LockOptions::new().ttl(ttl).hold_at_least(hold);
    for kind in ["exclusive", "read", "permit"] {
        let key = unique("keepwake");
        let holder = match kind {
            "exclusive" => a.lock_with(&key, opts()).await.unwrap(),
            "read" => a.read_with(&key, opts()).await.unwrap(),
            _ => a.permit_with(&key, 1, opts()).await.unwrap(),
        };
        let waiter = {
            let (b, key) = (b.clone(), key.clone());
            tokio::spawn(async move {
                let start = Instant::now();
                let wait = LockOptions::new().wait(Duration::from_secs(20));
                let guard = if kind == "permit" {
                    b.permit_with(&key, 1, wait).await
                } else {
                    b.write_with(&key, wait).await
                };
                (guard.map(drop), start.elapsed())
            })
        };
        // The waiter has been refused (told about the 10 s ttl) and sleeps.
        tokio::time::sleep(Duration::from_millis(200)).await;
        holder.release().await.unwrap();
        let (got, waited) = waiter.await.unwrap();
        got.unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert!(
            waited < Duration::from_secs(5),
            "{kind}: the waiter got the key after {waited:?}, the period ended after {hold:?}"
        );
    }
}

/// A permit holder and an exclusive or read holder of one key exclude each other, the
/// same on every backend (review finding 7: on Redlock, whose permits live in places,
/// keys of their own, they coexisted): a permit holder keeps out `lock`, `write` and
/// `read` of the key, an exclusive holder and a reader keep out `permit`.
pub async fn permit_and_exclusive_or_read_holders_exclude_each_other<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let key = unique("permit-vs-kinds");
    let permit = a.permit(&key, 3).await.unwrap();
    assert!(
        b.try_lock(&key).await.unwrap().is_none(),
        "an exclusive lock beside a permit holder"
    );
    assert!(
        b.try_write(&key).await.unwrap().is_none(),
        "a writer beside a permit holder"
    );
    assert!(
        b.try_read(&key).await.unwrap().is_none(),
        "a reader beside a permit holder"
    );
    let second = b.try_permit(&key, 3).await.unwrap();
    assert!(second.is_some(), "permits share");
    drop(second);
    permit.release().await.unwrap();
    let writer = a.lock(&key).await.unwrap();
    assert!(
        b.try_permit(&key, 3).await.unwrap().is_none(),
        "a permit beside an exclusive holder"
    );
    writer.release().await.unwrap();
    let reader = a.read(&key).await.unwrap();
    assert!(
        b.try_permit(&key, 3).await.unwrap().is_none(),
        "a permit beside a reader"
    );
    reader.release().await.unwrap();
    let waiting = LockOptions::new().wait(Duration::from_secs(5));
    let permit = b.permit_with(&key, 3, waiting.clone()).await;
    assert!(permit.is_ok(), "no permit once the reader left: {permit:?}");
    drop(permit);
    let writer = b.lock_with(&key, waiting).await;
    assert!(writer.is_ok(), "no lock once the permits left: {writer:?}");
}

/// Bad input of the new calls is a clear error.
pub async fn kinds_reject_bad_input<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let key = unique("bad");
    assert!(matches!(
        locks.permit(&key, 0).await,
        Err(LockError::InvalidOption { .. })
    ));
    assert!(matches!(
        locks.read("").await,
        Err(LockError::InvalidKey { .. })
    ));
    assert!(matches!(
        locks.lock_all(["ok", ""]).await,
        Err(LockError::InvalidKey { .. })
    ));
    assert!(matches!(
        locks
            .read_with(&key, LockOptions::new().hold_at_least(Duration::MAX))
            .await,
        Err(LockError::InvalidOption { .. })
    ));
    assert!(matches!(
        locks.lock(&format!("{key}:~holders")).await,
        Err(LockError::InvalidKey { .. })
    ));
    // A reader keeps out a writer, and a writer a reader.
    let reader = locks.read(&key).await.unwrap();
    assert!(locks.try_lock(&key).await.unwrap().is_none());
    reader.release().await.unwrap();
    let writer = locks.lock(&key).await.unwrap();
    assert!(locks.try_read(&key).await.unwrap().is_none());
    writer.release().await.unwrap();
}

/// One `#[tokio::test]` per behaviour of the other kinds, for the harness `$make` builds.
#[macro_export]
macro_rules! kinds_tests {
    ($make:expr) => {
        $crate::kinds_tests!(@each $make;
            readers_share_writers_exclude, writer_not_starved_by_readers,
            write_release_wakes_every_reader, at_most_n_permit_holders,
            killed_permit_holder_frees_after_ttl, permit_release_wakes_a_waiter,
            watchdog_keeps_readers_and_permits, extending_one_reader_keeps_the_others,
            is_locked_sees_every_kind,
            lock_all_in_opposite_orders_finishes, lock_all_leaves_no_key_behind,
            hold_at_least_keeps_the_key, kinds_reject_bad_input,
            lock_all_miss_keeps_no_key_for_hold_at_least, cancelled_writer_keeps_no_reader_out,
            release_within_hold_at_least_wakes_waiters_at_its_end,
            permit_and_exclusive_or_read_holders_exclude_each_other);
    };
    (@each $make:expr; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let harness = $make;
                conformance::kinds::$name(&harness).await;
            }
        )*
    };
}
