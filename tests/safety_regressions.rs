//! Regression tests for the interleavings of issue 11 that broke the safety invariants
//! (DESIGN.md, "Safety invariants"), each named after its bug and driven against real
//! redis-server processes through a delaying, blackholing or resetting proxy.
//!
//! Each test checks belief against the server: when another client has been granted the
//! lock, the first holder's `is_held()` (read after that grant returned) must be false.
//! The two races on a lease's expiry (findings 1 and 2) run for every kind of lease: an
//! exclusive lock, a reader (its place in the `<key>:~holders` zset) and a permit (the
//! same zset on one server, an exclusive place key `<key>:~permit:<i>` on Redlock), on
//! one server and on Redlock.

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redlock::{LockGuard, LockManager, LockOptions};
use redlock_testkit::{ChaosProxy, Direction, Fault, ProxiedSet, RedisServer, RedisSet};

/// A `LockManager` through `proxy`, with every script already cached on the server (as
/// in any running system: a first `EVALSHA` answered `NOSCRIPT` would add a round trip).
async fn through(proxy: &ChaosProxy) -> LockManager {
    let locks = LockManager::builder()
        .single(proxy.url())
        .build()
        .await
        .unwrap();
    warm(&locks).await;
    locks
}

/// Caches every script an acquire, extend and release of each kind runs.
async fn warm(locks: &LockManager) {
    let warm = locks.lock("warm_{0}").await.unwrap();
    warm.extend(Duration::from_secs(30)).await.unwrap();
    warm.release().await.unwrap();
    // Readers and permits share their scripts (acquire_shared, renew_shared as the
    // extend, release_shared); a permit on Redlock is an exclusive place.
    let warm = locks.read("warm_{0}").await.unwrap();
    warm.extend(Duration::from_secs(30)).await.unwrap();
    warm.release().await.unwrap();
}

/// What a test holds: an exclusive lock, a reader, or the one permit of a key.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Exclusive,
    Read,
    Permit,
}

impl Kind {
    /// Takes `key` in this kind.
    async fn take(self, locks: &LockManager, key: &str, options: LockOptions) -> LockGuard {
        match self {
            Self::Exclusive => locks.lock_with(key, options).await,
            Self::Read => locks.read_with(key, options).await,
            Self::Permit => locks.permit_with(key, 1, options).await,
        }
        .unwrap()
    }

    /// One attempt at what excludes a holder of this kind: the lock itself, the writer
    /// of a reader, the one permit.
    async fn try_rival(self, locks: &LockManager, key: &str) -> Option<LockGuard> {
        match self {
            Self::Exclusive => locks.try_lock(key).await,
            Self::Read => locks.try_write(key).await,
            Self::Permit => locks.try_permit(key, 1).await,
        }
        .unwrap_or(None)
    }
}

/// Takes what excludes a `kind` holder of `key` with `locks` as soon as it is free (one
/// attempt every 10 ms, up to `bound`); `None` if it never was.
async fn take_when_free(
    locks: &LockManager,
    kind: Kind,
    key: &str,
    bound: Duration,
) -> Option<LockGuard> {
    let until = Instant::now() + bound;
    while Instant::now() < until {
        if let Some(guard) = kind.try_rival(locks, key).await {
            return Some(guard);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// The drift allowance the library subtracts from every ttl.
fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// A holder whose every request goes through proxies, and another client that reaches
/// the servers directly.
struct Rig {
    holder: LockManager,
    other: LockManager,
    /// The one-way delay of finding 1's race and the ttl finding 2's shrinking extend
    /// asks for: on Redlock a request's round trip must stay under its per-node timeout
    /// (ttl/10 at most).
    race_delay: Duration,
    shrink_to: Duration,
    servers: Servers,
}

/// The servers and the holder's proxies, stopped when the rig is dropped.
enum Servers {
    Single {
        _server: RedisServer,
        proxy: ChaosProxy,
    },
    Redlock(ProxiedSet),
}

impl Rig {
    /// One server behind one proxy; the exclusive findings' delays.
    async fn single() -> Self {
        let server = RedisServer::start();
        let proxy = ChaosProxy::start(server.addr()).await.unwrap();
        let holder = through(&proxy).await;
        let other = LockManager::connect(&server.url()).await.unwrap();
        Self {
            holder,
            other,
            race_delay: Duration::from_millis(150),
            shrink_to: Duration::from_millis(500),
            servers: Servers::Single {
                _server: server,
                proxy,
            },
        }
    }

    /// Three Redlock nodes, each behind a proxy for the holder.
    async fn redlock() -> Self {
        let set = ProxiedSet::start(3).await.unwrap();
        let holder = LockManager::builder()
            .redlock(set.proxy_urls())
            .redlock_node_timeout(Duration::from_secs(1))
            .build()
            .await
            .unwrap();
        warm(&holder).await;
        let other = LockManager::builder()
            .redlock(set.urls())
            .build()
            .await
            .unwrap();
        Self {
            holder,
            other,
            race_delay: Duration::from_millis(50),
            shrink_to: Duration::from_secs(3),
            servers: Servers::Redlock(set),
        }
    }

    fn set(&self, fault: Fault) {
        match &self.servers {
            Servers::Single { proxy, .. } => proxy.set(fault),
            Servers::Redlock(set) => set.set_all(fault),
        }
    }
}

/// Finding 1: the watchdog built a renewal (ttl 3 s) while an `extend(6 s)` was in flight;
/// Redis applied EXTEND then RENEW, the client booked the renewal with the 6 s ttl, and a
/// cut-off holder believed it held the lock after the server had given it to another.
async fn extend_racing_a_watchdog_renewal_of(kind: Kind, rig: Rig) {
    let key = "race_{1}";
    rig.set(Fault::Delay(rig.race_delay));
    let ttl = Duration::from_secs(3);
    let guard = kind
        .take(&rig.holder, key, LockOptions::new().ttl(ttl))
        .await;
    // The acquire was sent at valid_until − (ttl − drift); the watchdog renews ttl/3 later.
    let sent = guard.valid_until() - (ttl - drift(ttl));
    let renewal = sent + ttl / 3;
    // Extend just before the renewal: the renewal is built while the extend is in flight.
    tokio::time::sleep_until((renewal - Duration::from_millis(50)).into()).await;
    guard.extend(Duration::from_secs(6)).await.unwrap();
    // Let the renewal's reply come back, then cut the holder off.
    tokio::time::sleep(Duration::from_millis(400)).await;
    rig.set(Fault::Blackhole);
    let taken = take_when_free(&rig.other, kind, key, Duration::from_secs(10))
        .await
        .expect("the server frees the lock once the holder is cut off");
    assert!(
        !guard.is_held(),
        "the cut-off holder still believes it holds the lock ({:?} left) after another client got it",
        guard.valid_until().saturating_duration_since(Instant::now())
    );
    drop(taken);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_racing_a_watchdog_renewal() {
    extend_racing_a_watchdog_renewal_of(Kind::Exclusive, Rig::single().await).await;
}

/// Finding 1 for a reader: its renewal and extend both set its score in the holders
/// zset (and the key's expiry with the latest holder).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_extend_racing_a_watchdog_renewal() {
    extend_racing_a_watchdog_renewal_of(Kind::Read, Rig::single().await).await;
}

/// Finding 1 for a permit (the holders zset, as a reader's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_extend_racing_a_watchdog_renewal() {
    extend_racing_a_watchdog_renewal_of(Kind::Permit, Rig::single().await).await;
}

/// Finding 1 on Redlock: extend and renewals go to every node, decided by a quorum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_extend_racing_a_watchdog_renewal() {
    extend_racing_a_watchdog_renewal_of(Kind::Exclusive, Rig::redlock().await).await;
}

/// Finding 1 for a reader on Redlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_read_extend_racing_a_watchdog_renewal() {
    extend_racing_a_watchdog_renewal_of(Kind::Read, Rig::redlock().await).await;
}

/// Finding 1 for a permit on Redlock: the extend and the renewals go to the permit's
/// place, an exclusive key of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_permit_extend_racing_a_watchdog_renewal() {
    extend_racing_a_watchdog_renewal_of(Kind::Permit, Rig::redlock().await).await;
}

/// The one-way delay of finding 2's race.
const SHRINK_DELAY: Duration = Duration::from_millis(100);

/// Finding 2: a shrinking `extend(500 ms)` on a 30 s lock, cancelled by a 50 ms timeout,
/// was applied by the server but left the local deadline 30 s long.
async fn shrinking_extend_cancelled_by_a_timeout_of(kind: Kind, rig: Rig) {
    let key = "shrink_{1}";
    let guard = kind
        .take(
            &rig.holder,
            key,
            LockOptions::new().ttl(Duration::from_secs(30)),
        )
        .await;
    // Every node's grant lands first (on Redlock an extend waits for the late grants of
    // its acquisition, which the delay below would hold back).
    tokio::time::sleep(Duration::from_millis(200)).await;
    rig.set(Fault::Delay(SHRINK_DELAY));
    let started = Instant::now();
    let cancelled = tokio::time::timeout(SHRINK_DELAY / 2, guard.extend(rig.shrink_to)).await;
    assert!(
        cancelled.is_err(),
        "the extend was cut short by the timeout"
    );
    // The extend reaches the server(s) one delay after it was sent; then cut the holder
    // off (before its reply).
    tokio::time::sleep_until((started + SHRINK_DELAY * 3 / 2).into()).await;
    rig.set(Fault::Blackhole);
    let taken = take_when_free(&rig.other, kind, key, Duration::from_secs(5))
        .await
        .expect("the shrunk lock expires on the server");
    assert!(
        !guard.is_held(),
        "the holder still believes it holds the lock ({:?} left) after another client got it",
        guard
            .valid_until()
            .saturating_duration_since(Instant::now())
    );
    drop(taken);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shrinking_extend_cancelled_by_a_timeout() {
    shrinking_extend_cancelled_by_a_timeout_of(Kind::Exclusive, Rig::single().await).await;
}

/// Finding 2 for a reader: the shrinking extend sets its score in the holders zset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_shrinking_extend_cancelled_by_a_timeout() {
    shrinking_extend_cancelled_by_a_timeout_of(Kind::Read, Rig::single().await).await;
}

/// Finding 2 for a permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_shrinking_extend_cancelled_by_a_timeout() {
    shrinking_extend_cancelled_by_a_timeout_of(Kind::Permit, Rig::single().await).await;
}

/// Finding 2 on Redlock (a 3 s shrink: a 500 ms one's per-node timeout, 50 ms, would be
/// shorter than the round trip).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_shrinking_extend_cancelled_by_a_timeout() {
    shrinking_extend_cancelled_by_a_timeout_of(Kind::Exclusive, Rig::redlock().await).await;
}

/// Finding 2 for a reader on Redlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_read_shrinking_extend_cancelled_by_a_timeout() {
    shrinking_extend_cancelled_by_a_timeout_of(Kind::Read, Rig::redlock().await).await;
}

/// Finding 2 for a permit on Redlock: the extend goes to the permit's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_permit_shrinking_extend_cancelled_by_a_timeout() {
    shrinking_extend_cancelled_by_a_timeout_of(Kind::Permit, Rig::redlock().await).await;
}

/// Finding 3: an attempt's undo was lost on one node; the next attempt reused the token,
/// counted that node's old grant (with its old expiry) as fresh, and another client got a
/// quorum (that node and one A never had) once it expired while A still believed it held
/// the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_stale_grant_after_a_lost_undo() {
    let set = RedisSet::start(3);
    let p1 = ChaosProxy::start(set.node(0).addr()).await.unwrap();
    let urls = set.urls();
    let a = LockManager::builder()
        .redlock([p1.url(), urls[1].clone(), urls[2].clone()])
        .build()
        .await
        .unwrap();
    let d = LockManager::builder().redlock(&urls).build().await.unwrap();
    // Scripts cached on every node, as in any running system.
    a.lock("warm_{1}").await.unwrap().release().await.unwrap();
    let key = "stale_{1}";
    let full = format!("lock:{key}");
    // Another client holds node 3 for 1.5 s.
    let mut n3 = set.node(2).connection().await;
    let _: () = redis::cmd("SET")
        .arg(&full)
        .arg("someone else")
        .arg("PX")
        .arg(1500)
        .query_async(&mut n3)
        .await
        .unwrap();
    // Node 1 answers late: A's first attempt is granted there (at ~120 ms) after A
    // stopped waiting for it (the per-node timeout is 200 ms), and A undoes the attempt.
    p1.set(Fault::Delay(Duration::from_millis(120)));
    let t0 = Instant::now();
    let ttl = Duration::from_secs(3);
    let acquiring = tokio::spawn({
        let a = a.clone();
        async move {
            a.lock_with(
                key,
                LockOptions::new()
                    .ttl(ttl)
                    .wait(Duration::from_secs(8))
                    .watchdog(false),
            )
            .await
        }
    });
    // The undo for node 1, sent at ~200 ms, is still in the proxy: node 1 drops A's
    // connection, so it never arrives.
    tokio::time::sleep_until((t0 + Duration::from_millis(250)).into()).await;
    let mut n1 = set.node(0).connection().await;
    let _: () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut n1)
        .await
        .unwrap();
    p1.heal();
    let guard = acquiring.await.unwrap().expect("A gets the lock");
    // A renews nothing (no watchdog): D gets a quorum at the latest when A's ttl ends.
    let taken = take_when_free(&d, Kind::Exclusive, key, Duration::from_secs(6))
        .await
        .expect("D gets the lock once A's grants expire");
    assert!(
        !guard.is_held(),
        "A believes it holds the lock ({:?} left) while D got a quorum",
        guard
            .valid_until()
            .saturating_duration_since(Instant::now())
    );
    drop(taken);
}

/// Finding 8: `release()` whose reply was lost (the connection reset after Redis applied
/// it) was retried, found the key gone, and reported `Lost` although it had released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_a_lost_reply_reports_released() {
    let server = RedisServer::start();
    let proxy = ChaosProxy::start(server.addr()).await.unwrap();
    let holder = through(&proxy).await;
    let key = "lost_reply_{1}";
    let guard = holder.lock(key).await.unwrap();
    proxy.set(Fault::Delay(Duration::from_millis(200)));
    let release = tokio::spawn(guard.release());
    // The request reaches Redis at 200 ms; its reply would come back at 400 ms.
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set(Fault::Pass);
    proxy.reset_all();
    let outcome = release.await.unwrap();
    assert!(outcome.is_ok(), "released, but reported {outcome:?}");
    let mut raw = server.connection().await;
    let exists: bool = raw.exists(format!("lock:{key}")).await.unwrap();
    assert!(!exists);
}

/// Finding 8: a waiter cancelled while its `SUBSCRIBE` was in flight left the channel
/// subscribed on the server with nobody to unsubscribe it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_subscribe_leaks_no_subscription() {
    let server = RedisServer::start();
    let proxy = ChaosProxy::start(server.addr()).await.unwrap();
    let holder = LockManager::connect(&server.url()).await.unwrap();
    let waiter = through(&proxy).await;
    let key = "sub_leak_{1}";
    let full = format!("lock:{key}");
    let _held = holder.lock(key).await.unwrap();
    proxy.set(Fault::Delay(Duration::from_millis(300)));
    // First attempt: replies at ~600 ms; the SUBSCRIBE then reaches Redis at ~900 ms.
    let waited = tokio::time::timeout(
        Duration::from_millis(750),
        waiter.lock_with(key, LockOptions::new().wait(Duration::from_secs(5))),
    )
    .await;
    assert!(waited.is_err(), "cancelled while subscribing");
    proxy.heal();
    let mut raw = server.connection().await;
    let subscribed = || {
        let mut raw = raw.clone();
        let full = full.clone();
        async move {
            let (_, n): (String, u64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&full)
                .query_async::<Vec<(String, u64)>>(&mut raw)
                .await
                .unwrap()
                .pop()
                .unwrap();
            n
        }
    };
    let until = Instant::now() + Duration::from_secs(3);
    let mut n = subscribed().await;
    while n > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
        n = subscribed().await;
    }
    assert_eq!(n, 0, "the channel stayed subscribed after the waiter left");
    let _: () = raw.ping().await.unwrap();
}

/// Invariant 5: `wait` bounds the whole `lock()` call, plus at most one request. The
/// subscription a waiter makes before its next attempt was not bounded by the wait, so a
/// slow server made `lock()` take the wait plus two more round trips.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_wait_bounds_the_subscription() {
    let server = RedisServer::start();
    let proxy = ChaosProxy::start(server.addr()).await.unwrap();
    let holder = LockManager::connect(&server.url()).await.unwrap();
    let waiter = through(&proxy).await;
    let key = "slow_sub_{1}";
    let _held = holder.lock(key).await.unwrap();
    // Every round trip through the proxy takes 600 ms.
    proxy.set(Fault::Delay(Duration::from_millis(300)));
    let started = Instant::now();
    let outcome = waiter
        .lock_with(key, LockOptions::new().wait(Duration::from_millis(200)))
        .await;
    let took = started.elapsed();
    assert!(
        matches!(outcome, Err(redlock::LockError::Timeout { .. })),
        "{outcome:?}"
    );
    // The first attempt (one round trip) already outlasts the wait; nothing may follow.
    assert!(
        took < Duration::from_millis(1100),
        "lock() took {took:?} with a 200 ms wait and 600 ms round trips"
    );
}

/// Found by the nemesis of issue 13 (single server, a connection cut while two permits
/// of one key were being acquired): a permit acquire whose reply was lost (the connection
/// reset after Redis applied it) was sent again with the same token, found its place, and
/// read the counter back: the token another permit had got meanwhile. Two holders of the
/// key, one fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_permit_after_a_lost_reply_gets_a_token_of_its_own() {
    let server = RedisServer::start();
    let proxy = ChaosProxy::start(server.addr()).await.unwrap();
    let cut_off = through(&proxy).await;
    let direct = LockManager::builder()
        .single(server.url())
        .build()
        .await
        .unwrap();
    let key = "retried_permit_{1}";
    let mut raw = server.connection().await;

    proxy.set_direction(Direction::ToClient, Fault::Blackhole);
    let first = tokio::spawn(async move { cut_off.permit(key, 3).await });
    // Applied on the server, its reply held by the proxy (bounded: 2 s).
    let holders = format!("lock:{key}:~holders");
    let until = Instant::now() + Duration::from_secs(2);
    while raw.zcard::<_, u64>(&holders).await.unwrap() == 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(raw.zcard::<_, u64>(&holders).await.unwrap(), 1);
    let other = direct.permit(key, 3).await.unwrap();
    // The reply lost with its connection (the reset processed well before the heal,
    // which would deliver held bytes): the client sends the acquire again.
    proxy.reset_all();
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.heal();
    let first = first.await.unwrap().unwrap();
    assert_eq!(raw.zcard::<_, u64>(&holders).await.unwrap(), 2);
    let (first, other) = (first.fencing_token(), other.fencing_token());
    assert_ne!(first, other, "two permit holders share a fencing token");
    assert!(
        first > other,
        "the retry's token {first} is not above {other}"
    );
}
