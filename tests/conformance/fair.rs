//! The fair lock, written once and run on every backend (`fair_tests!`): the order of
//! arrival across managers, a release waking the first waiter alone, and the queue's
//! upkeep — a dead waiter dropped by the server's clock, a cancelled or timed-out one
//! leaving at once, a bounded queue.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock::{LockError, LockKind, LockManager, LockOptions};

use super::{eventually, manager, unique, Harness};

const MANAGERS: usize = 4;
const PER_MANAGER: usize = 8;

fn waiting(secs: u64) -> LockOptions {
    LockOptions::new().wait(Duration::from_secs(secs))
}

/// How many waiters the key's queue holds, as `inspect` shows it (0 when not held).
async fn queued(locks: &LockManager, key: &str) -> u32 {
    locks
        .inspect(key)
        .await
        .unwrap()
        .map_or(0, |info| info.queued)
}

/// Waits (bounded) until the key's queue holds `n` waiters; panics otherwise.
async fn until_queued(locks: &LockManager, key: &str, n: u32) {
    let seen = eventually(Duration::from_secs(10), || async {
        queued(locks, key).await == n
    })
    .await;
    assert!(
        seen,
        "the queue never held {n}: {}",
        queued(locks, key).await
    );
}

/// 4 managers × 8 waiters arrive one after another (each queued on the server before
/// the next starts), spread over the managers round-robin, behind a holder. They are
/// granted in exactly that order, with strictly increasing fencing tokens, each
/// hand-off woken by the release's notification (well under the 1 s heartbeat), and
/// `inspect` shows the kind and the queue's length.
pub async fn fair_grants_in_arrival_order<H: Harness>(h: &H) {
    let mut managers = Vec::new();
    for _ in 0..MANAGERS {
        managers.push(manager(h).await);
    }
    let key = unique("fair-order");
    let holder = managers[0].fair(&key).await.unwrap();
    assert_eq!(holder.kind(), LockKind::Fair);
    let grants = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..MANAGERS * PER_MANAGER {
        let locks = managers[i % MANAGERS].clone();
        let (waiter_key, grants) = (key.clone(), grants.clone());
        tasks.push(tokio::spawn(async move {
            let guard = locks
                .fair_with(&waiter_key, waiting(60))
                .await
                .expect("fair");
            let at = Instant::now();
            grants.lock().unwrap().push((i, guard.fencing_token(), at));
            guard.release().await.expect("release");
            at
        }));
        until_queued(&managers[0], &key, u32::try_from(i + 1).unwrap()).await;
    }
    let info = managers[1].inspect(&key).await.unwrap().expect("held");
    assert_eq!(info.kind, LockKind::Fair);
    assert_eq!(info.queued, 32);
    let released = Instant::now();
    let first_token = holder.fencing_token();
    holder.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    // A copy: no guard held across the awaits below.
    let grants = grants.lock().unwrap().clone();
    let order: Vec<usize> = grants.iter().map(|g| g.0).collect();
    assert_eq!(
        order,
        (0..32).collect::<Vec<_>>(),
        "granted out of arrival order"
    );
    let tokens: Vec<u64> = grants.iter().map(|g| g.1).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]) && tokens[0] > first_token,
        "fencing tokens not increasing: {tokens:?}"
    );
    let mut gaps: Vec<Duration> = std::iter::once(released)
        .chain(grants.iter().map(|g| g.2))
        .collect::<Vec<_>>()
        .windows(2)
        .map(|w| w[1].duration_since(w[0]))
        .collect();
    gaps.sort_unstable();
    let median = gaps[gaps.len() / 2];
    assert!(
        median < Duration::from_millis(300),
        "hand-offs not woken by notification: median {median:?} of {gaps:?}"
    );
    assert_eq!(queued(&managers[0], &key).await, 0);
}

/// A waiter at the head of the queue whose process dies (here: its runtime, and with
/// it its manager's background task, dropped without a word) holds up the waiter
/// behind it only until the server drops its place: about 3 s after it last asked
/// (plus the next waiter's heartbeat, at most 1 s). It does hold it up meanwhile: the
/// queue keeps its order.
pub async fn dead_fair_waiter_is_dropped_from_the_queue<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let key = unique("fair-ghost");
    let holder = a.fair(&key).await.unwrap();
    let builder = h.builder();
    let ghost_key = key.clone();
    let (queued_tx, queued_rx) = std::sync::mpsc::channel();
    let (die_tx, die_rx) = std::sync::mpsc::channel::<()>();
    let ghost = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let locks = builder.build().await.unwrap();
            let wait = tokio::spawn({
                let (locks, key) = (locks.clone(), ghost_key.clone());
                async move { locks.fair_with(&key, waiting(60)).await }
            });
            until_queued(&locks, &ghost_key, 1).await;
            queued_tx.send(()).unwrap();
            let _ = tokio::task::spawn_blocking(move || die_rx.recv()).await;
            drop(wait);
        });
        // Dropped with its tasks unfinished: nothing withdraws the place.
        drop(runtime);
    });
    queued_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("ghost queued");
    let behind = tokio::spawn({
        let (b, key) = (b.clone(), key.clone());
        async move {
            let guard = b.fair_with(&key, waiting(30)).await.expect("fair");
            (Instant::now(), guard)
        }
    });
    until_queued(&a, &key, 2).await;
    die_tx.send(()).unwrap();
    tokio::task::spawn_blocking(move || ghost.join().unwrap())
        .await
        .unwrap();
    let released = Instant::now();
    holder.release().await.unwrap();
    let (at, guard) = behind.await.unwrap();
    let waited = at.duration_since(released);
    assert!(
        waited > Duration::from_millis(500),
        "the dead waiter's place did not hold the queue: granted after {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(6),
        "a dead waiter held up the queue for {waited:?}"
    );
    guard.release().await.unwrap();
}

/// A waiter that is cancelled (its future dropped) or whose wait runs out leaves the
/// queue at once (well before its place would run out), and the waiter behind it is
/// served.
pub async fn cancelled_fair_waiter_leaves_no_place<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let key = unique("fair-cancel");
    let holder = a.fair(&key).await.unwrap();
    let cut = tokio::time::timeout(Duration::from_millis(500), b.fair_with(&key, waiting(30)));
    assert!(cut.await.is_err(), "got the key past its holder");
    let left = eventually(Duration::from_millis(1500), || async {
        queued(&a, &key).await == 0
    });
    assert!(left.await, "a cancelled waiter kept its place");
    let err = b
        .fair_with(&key, LockOptions::new().wait(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    let left = eventually(Duration::from_millis(1500), || async {
        queued(&a, &key).await == 0
    });
    assert!(left.await, "a timed-out waiter kept its place");
    assert!(b.try_fair(&key).await.unwrap().is_none(), "held");
    holder.release().await.unwrap();
    let start = Instant::now();
    let next = b.fair_with(&key, waiting(10)).await.unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    next.release().await.unwrap();
}

/// The queue on the server is bounded by the asking manager's `max_waiters_per_key`:
/// past it, `QueueFull`; and a one-attempt call never queues.
pub async fn a_full_fair_queue_refuses_with_queue_full<H: Harness>(h: &H) {
    let a = manager(h).await;
    let small = h.builder().max_waiters_per_key(2).build().await.unwrap();
    let key = unique("fair-full");
    let holder = a.fair(&key).await.unwrap();
    let mut waiters = Vec::new();
    for n in 1..=2 {
        let (a, waiter_key) = (a.clone(), key.clone());
        waiters.push(tokio::spawn(async move {
            a.fair_with(&waiter_key, waiting(30)).await
        }));
        until_queued(&small, &key, n).await;
    }
    let err = small.fair_with(&key, waiting(5)).await.unwrap_err();
    assert!(matches!(err, LockError::QueueFull { .. }), "{err}");
    assert!(small.try_fair(&key).await.unwrap().is_none());
    assert_eq!(queued(&a, &key).await, 2, "a refused call took a place");
    holder.release().await.unwrap();
    for w in waiters {
        w.await.unwrap().unwrap().release().await.unwrap();
    }
}

#[macro_export]
macro_rules! fair_tests {
    ($make:expr) => {
        $crate::fair_tests!(@each $make;
            fair_grants_in_arrival_order, dead_fair_waiter_is_dropped_from_the_queue,
            cancelled_fair_waiter_leaves_no_place, a_full_fair_queue_refuses_with_queue_full);
    };
    (@each $make:expr; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let harness = $make;
                conformance::fair::$name(&harness).await;
            }
        )*
    };
}
