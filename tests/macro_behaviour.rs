//! `#[distributed_lock]` at run time: what the expansion does with a real lock, on a
//! real redis-server and on the in-memory backend.
//!
//! Each behaviour is an `async fn` over a [`Harness`] run once per backend
//! (`single::name` and `memory::name`); the tests that look at what Redis stores are
//! Redis-only. Every annotated function takes its manager explicitly (`manager =`):
//! the process-wide global manager is exercised in `tests/macro_global.rs`, a binary of
//! its own. Bounds on time are generous and check meaning (released rather than expired,
//! aborted rather than run to the end), never speed.

mod conformance;

use std::fmt;
use std::future::IntoFuture;
use std::num::ParseIntError;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conformance::backends::{Memory, Single};
use conformance::{eventually, manager, Harness};
use redis::AsyncCommands;
use redlock::{distributed_lock, LockError, LockKind, LockManager, LockOptions};
use tokio::sync::Notify;

/// One `#[tokio::test]` per behaviour and backend: `single::$name` and `memory::$name`.
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod single {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(&super::Single::new()).await;
                }
            )*
        }
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(&super::Memory).await;
                }
            )*
        }
    };
}

on_every_backend!(
    mutual_exclusion_across_managers,
    key_templates_become_hash_tagged_keys,
    the_macro_and_the_guard_api_take_the_same_lock,
    guard_gives_increasing_fencing_tokens,
    reentrant_call_runs_inside_the_outer_lock,
    reentrancy_is_per_call_chain,
    error_via_question_mark_releases,
    early_return_releases,
    panic_releases,
    cancelled_body_releases,
    cancelled_wait_leaves_nothing,
    wait_zero_is_one_attempt,
    on_lost_abort_drops_the_body,
    on_lost_abort_without_watchdog_ends_at_ttl,
    on_lost_continue_returns_the_body_result,
    self_manager_and_tenant_placeholder,
    async_trait_method_holds_the_lock,
    axum_handler_over_loopback_http,
    read_mode_shares_with_readers_not_writers,
    permits_admit_exactly_n,
    keys_lock_all_in_any_order,
    hold_at_least_keeps_the_key_after_return,
    read_call_is_not_reentered,
);

// ---------------------------------------------------------------------------------------
// Helpers

/// An id no other call in this process uses: every behaviour locks its own keys, since
/// the in-memory store is shared by the whole test binary.
fn fresh_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1_000);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Long enough that a lock seen free within [`PROMPTLY`] was released, not expired.
const LONG_TTL: Duration = Duration::from_secs(30);
/// A generous bound for things that happen "at once".
const PROMPTLY: Duration = Duration::from_secs(3);

/// Asserts `full_key` disappears within [`PROMPTLY`] (well inside its 30 s ttl) and that
/// another manager can then take it without waiting for any expiry.
async fn assert_released<H: Harness>(h: &H, full_key: &str, user_key: &str) {
    assert!(
        eventually(PROMPTLY, || async { !h.exists(full_key).await }).await,
        "{full_key} still held {PROMPTLY:?} later (ttl 30 s): not released"
    );
    let other = manager(h).await;
    let guard = other
        .lock_with(user_key, LockOptions::new().wait(PROMPTLY))
        .await
        .expect("another manager acquires at once");
    guard.release().await.unwrap();
}

/// A body's signals to the test: `entered` once it holds the lock, then it waits for
/// `go` before returning.
struct Gate {
    entered: Notify,
    go: Notify,
}

impl Gate {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            entered: Notify::new(),
            go: Notify::new(),
        })
    }

    async fn pass(&self) {
        self.entered.notify_one();
        self.go.notified().await;
    }
}

// ---------------------------------------------------------------------------------------
// Mutual exclusion and fencing

/// What the contenders share: a counter updated with a deliberately non-atomic
/// read-modify-write, the number of bodies running, and the tokens in entry order.
#[derive(Default)]
struct Contended {
    counter: Mutex<u64>,
    active: AtomicUsize,
    tokens: Mutex<Vec<u64>>,
}

#[distributed_lock(key = "counter_<id>", manager = locks, ttl = "10s", wait = "30s", guard = g)]
async fn increment(locks: &LockManager, id: u64, shared: &Contended) -> Result<(), LockError> {
    assert_eq!(
        shared.active.fetch_add(1, Ordering::SeqCst),
        0,
        "two holders"
    );
    shared.tokens.lock().unwrap().push(g.fencing_token());
    let read = *shared.counter.lock().unwrap();
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_micros(200)).await;
    *shared.counter.lock().unwrap() = read + 1;
    shared.active.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

/// Three managers, four tasks each, calling one annotated function: the count is exact,
/// never two bodies at once, fencing tokens strictly increase in entry order.
async fn mutual_exclusion_across_managers<H: Harness>(h: &H) {
    const MANAGERS: usize = 3;
    const TASKS: usize = 4;
    const ROUNDS: usize = 10;
    let id = fresh_id();
    let shared = Arc::new(Contended::default());
    let mut tasks = Vec::new();
    for _ in 0..MANAGERS {
        let locks = manager(h).await;
        for _ in 0..TASKS {
            let (locks, shared) = (locks.clone(), shared.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    increment(&locks, id, &shared).await.expect("increment");
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    let total = (MANAGERS * TASKS * ROUNDS) as u64;
    assert_eq!(*shared.counter.lock().unwrap(), total);
    let tokens = shared.tokens.lock().unwrap();
    assert_eq!(tokens.len() as u64, total);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not increasing: {tokens:?}"
    );
}

#[distributed_lock(key = "token_<id>", manager = locks, guard = g)]
async fn token(locks: &LockManager, id: u64) -> Result<(u64, String, bool), LockError> {
    Ok((g.fencing_token(), g.key().to_owned(), g.is_held()))
}

/// `guard = g` is the held lock: its key, and a fencing token that starts at 1 and
/// grows with every acquisition, by the macro or by hand.
async fn guard_gives_increasing_fencing_tokens<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let id = fresh_id();
    let (first, key, held) = token(&locks, id).await.unwrap();
    assert_eq!(first, 1, "a fresh key's first token");
    assert_eq!(key, format!("lock:token_{{{id}}}"));
    assert!(held);
    let (second, _, _) = token(&locks, id).await.unwrap();
    assert!(second > first);
    let by_hand = locks.lock(&format!("token_{{{id}}}")).await.unwrap();
    assert!(by_hand.fencing_token() > second);
    by_hand.release().await.unwrap();
    let other = manager(h).await;
    let (third, _, _) = token(&other, id).await.unwrap();
    assert!(
        third > second + 1,
        "{third} after {second} and a hand-held lock"
    );
}

// ---------------------------------------------------------------------------------------
// Keys

#[distributed_lock(key = "buy_<goods_id>", manager = locks, ttl = "30s", guard = g)]
async fn buy(
    locks: &LockManager,
    goods_id: u64,
    qty: u32,
    gate: &Gate,
) -> Result<String, LockError> {
    let _ = qty;
    gate.pass().await;
    Ok(g.key().to_owned())
}

#[distributed_lock(key = "cart_<user>_<item>", manager = locks, guard = g)]
async fn cart(locks: &LockManager, user: u64, item: &str) -> Result<String, LockError> {
    Ok(g.key().to_owned())
}

#[distributed_lock(key = "order:{<region>}:<order.id>", manager = locks, guard = g)]
async fn order(locks: &LockManager, region: &str, order: &Order) -> Result<String, LockError> {
    Ok(g.key().to_owned())
}

#[distributed_lock(key = "nightly_report", manager = locks, guard = g)]
async fn nightly(locks: &LockManager) -> Result<String, LockError> {
    Ok(g.key().to_owned())
}

#[distributed_lock(key = "item_<item>", manager = locks, guard = g)]
async fn generic<T: fmt::Display + Sync>(
    locks: &LockManager,
    item: T,
) -> Result<String, LockError> {
    Ok(g.key().to_owned())
}

// Regression: a body that only panics tripped `clippy::diverging_sub_expression`.
#[distributed_lock(key = "user_<name>", manager = locks)]
async fn by_name(locks: &LockManager, name: &str) -> Result<(), LockError> {
    unreachable!("no lock for an empty name: {name}")
}

struct Order {
    id: u64,
}

/// The key template, `Display`-formatted and hash-tagged: the lock is held under that key
/// while the body runs, and freed when it returns.
async fn key_templates_become_hash_tagged_keys<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let goods_id = fresh_id();
    let full = format!("lock:buy_{{{goods_id}}}");
    let gate = Gate::new();
    let call = {
        let (locks, gate) = (locks.clone(), gate.clone());
        tokio::spawn(async move { buy(&locks, goods_id, 1, &gate).await })
    };
    gate.entered.notified().await;
    assert!(h.exists(&full).await, "{full} not held while the body runs");
    gate.go.notify_one();
    assert_eq!(call.await.unwrap().unwrap(), full);
    assert!(
        !h.exists(&full).await,
        "{full} held after the call returned"
    );

    let id = fresh_id();
    assert_eq!(
        cart(&locks, id, "hat").await.unwrap(),
        format!("lock:cart_{{{id}_hat}}")
    );
    assert_eq!(
        order(&locks, "eu", &Order { id }).await.unwrap(),
        format!("lock:order:{{eu}}:{id}")
    );
    assert_eq!(nightly(&locks).await.unwrap(), "lock:nightly_report");
    assert_eq!(
        generic(&locks, format!("{id}-x")).await.unwrap(),
        format!("lock:item_{{{id}-x}}")
    );
    // An empty value would make an empty hash tag: an error, and the body never runs.
    let err = by_name(&locks, "").await.unwrap_err();
    assert!(matches!(err, LockError::InvalidKey { .. }), "{err}");
}

#[distributed_lock(key = "weekly_report", manager = locks, wait = "0s")]
async fn weekly(locks: &LockManager, gate: Option<&Gate>) -> Result<(), LockError> {
    if let Some(gate) = gate {
        gate.pass().await;
    }
    Ok(())
}

#[distributed_lock(key = "restock_<goods_id>", manager = locks, wait = "0s")]
async fn restock(locks: &LockManager, goods_id: u64, gate: Option<&Gate>) -> Result<(), LockError> {
    if let Some(gate) = gate {
        gate.pass().await;
    }
    Ok(())
}

/// Issue 24, item 1: `#[distributed_lock(key = "nightly_report")]` locked
/// `lock:{nightly_report}` while `locks.lock("nightly_report")` locked
/// `lock:nightly_report`, and both ran at once. One rule names both: a template without
/// placeholders is used as written, and `key!` renders one with placeholders the way the
/// attribute does. Each spelling held by hand makes the macro wait (here: a zero wait
/// turned away), and the other way round.
async fn the_macro_and_the_guard_api_take_the_same_lock<H: Harness>(h: &H) {
    use redlock::key;

    let locks = manager(h).await;
    // By hand first: the macro is turned away until the hand lock is released.
    let by_hand = locks.lock("weekly_report").await.unwrap();
    let turned = weekly(&locks, None).await;
    assert!(
        matches!(turned, Err(LockError::Timeout { .. })),
        "{turned:?}"
    );
    by_hand.release().await.unwrap();
    weekly(&locks, None).await.unwrap();

    let goods_id = fresh_id();
    assert_eq!(
        key!("restock_<goods_id>"),
        format!("restock_{{{goods_id}}}")
    );
    let by_hand = locks.lock(&key!("restock_<goods_id>")).await.unwrap();
    let turned = restock(&locks, goods_id, None).await;
    assert!(
        matches!(turned, Err(LockError::Timeout { .. })),
        "{turned:?}"
    );
    by_hand.release().await.unwrap();

    // The macro first: the hand lock finds the key held while the body runs.
    for spelling in ["weekly_report".to_owned(), key!("restock_<goods_id>")] {
        let gate = Gate::new();
        let call = {
            let (locks, gate, spelling) = (locks.clone(), gate.clone(), spelling.clone());
            tokio::spawn(async move {
                if spelling == "weekly_report" {
                    weekly(&locks, Some(&gate)).await
                } else {
                    restock(&locks, goods_id, Some(&gate)).await
                }
            })
        };
        gate.entered.notified().await;
        assert!(
            locks.try_lock(&spelling).await.unwrap().is_none(),
            "{spelling} free by hand while the macro's body runs"
        );
        gate.go.notify_one();
        call.await.unwrap().unwrap();
        let after = locks.try_lock(&spelling).await.unwrap();
        assert!(after.is_some(), "{spelling} still held after the call");
    }
}

/// The seed example: `buy_<goods_id>` with 42 is stored in Redis as `lock:buy_{42}`,
/// next to its slot's fencing counter `lock:fence:{<tag>}`, and nothing else.
#[tokio::test]
async fn redis_stores_buy_42_as_lock_buy_42() {
    let h = Single::new();
    let locks = manager(&h).await;
    let gate = Gate::new();
    let call = {
        let (locks, gate) = (locks.clone(), gate.clone());
        tokio::spawn(async move { buy(&locks, 42, 3, &gate).await })
    };
    gate.entered.notified().await;
    let counter = redlock_testkit::fence_key("lock:", "lock:buy_{42}");
    let mut expected = vec!["lock:buy_{42}".to_owned(), counter.clone()];
    expected.sort();
    assert_eq!(h.keys().await, expected);
    let pttl: i64 = h.raw().await.pttl("lock:buy_{42}").await.unwrap();
    assert!(
        pttl > 20_000 && pttl <= 30_000,
        "ttl = \"30s\", pttl {pttl} ms"
    );
    gate.go.notify_one();
    assert_eq!(call.await.unwrap().unwrap(), "lock:buy_{42}");
    assert_eq!(h.keys().await, std::slice::from_ref(&counter));
    let fence: u64 = h.raw().await.get(&counter).await.unwrap();
    assert_eq!(fence, 1);
}

// ---------------------------------------------------------------------------------------
// Reentrancy

#[distributed_lock(key = "account_<id>", manager = locks, guard = g)]
async fn transfer<H: Harness>(locks: &LockManager, id: u64, h: &H) -> Result<[u64; 3], LockError> {
    let outer = g.fencing_token();
    let direct = audit(locks, id).await?;
    let indirect = via_helper(locks, id).await?;
    // The inner calls returned: the lock is still ours, and still in the store.
    assert!(g.is_held());
    assert!(
        h.exists(g.key()).await,
        "an inner call released the outer lock"
    );
    Ok([outer, direct, indirect])
}

#[distributed_lock(key = "account_<id>", manager = locks, wait = "1s", guard = g)]
async fn audit(locks: &LockManager, id: u64) -> Result<u64, LockError> {
    Ok(g.fencing_token())
}

/// Not annotated: reentrancy follows the call chain through plain functions, and a
/// clone of the manager is the same manager.
async fn via_helper(locks: &LockManager, id: u64) -> Result<u64, LockError> {
    tokio::task::yield_now().await;
    audit(&locks.clone(), id).await
}

/// A calls B on the same key: B runs inside A's lock (same fencing token, so one
/// acquisition) without waiting, and only A, the outermost, releases.
async fn reentrant_call_runs_inside_the_outer_lock<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let id = fresh_id();
    let full = format!("lock:account_{{{id}}}");
    // An inner call that waited for the outer lock would time out after 1 s.
    let [outer, direct, indirect] = transfer(&locks, id, h).await.expect("no self-deadlock");
    assert_eq!((direct, indirect), (outer, outer), "one acquisition");
    assert!(!h.exists(&full).await, "the outermost call did not release");
    // The next acquisition is the second one ever on this key.
    let next = locks.lock(&format!("account_{{{id}}}")).await.unwrap();
    assert_eq!(next.fencing_token(), outer + 1);
    next.release().await.unwrap();
}

#[distributed_lock(key = "ledger_<id>", manager = locks, guard = g)]
async fn ledger(
    locks: LockManager,
    id: u64,
) -> Result<(u64, Result<u64, LockError>, u64), LockError> {
    // Another task is another call chain: it does not share this lock.
    let spawned = {
        let locks = locks.clone();
        tokio::spawn(async move { ledger_entry(&locks, id).await })
            .await
            .unwrap()
    };
    // Another key in the same chain is a lock of its own.
    let other_key = journal(&locks, id).await?;
    Ok((g.fencing_token(), spawned, other_key))
}

#[distributed_lock(key = "ledger_<id>", manager = locks, wait = "0s", guard = g)]
async fn ledger_entry(locks: &LockManager, id: u64) -> Result<u64, LockError> {
    Ok(g.fencing_token())
}

#[distributed_lock(key = "journal_<id>", manager = locks, guard = g)]
async fn journal(locks: &LockManager, id: u64) -> Result<u64, LockError> {
    assert!(g.is_held());
    Ok(g.fencing_token())
}

/// Reentrancy is for one task's call chain and one key: a task spawned from the body
/// contends like anyone else, and another key is acquired (and released) on its own.
async fn reentrancy_is_per_call_chain<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let id = fresh_id();
    let (token, spawned, journal_token) = ledger(locks.clone(), id).await.unwrap();
    assert!(token >= 1);
    assert!(
        matches!(spawned, Err(LockError::Timeout { .. })),
        "a spawned task re-entered its parent's lock: {spawned:?}"
    );
    // Its own acquisition: a token of its own, after the ledger's (both keys have the
    // tag `{id}`, so they share their slot's fencing counter).
    assert!(journal_token > token, "{journal_token} after {token}");
    assert!(!h.exists(&format!("lock:journal_{{{id}}}")).await);
    assert!(!h.exists(&format!("lock:ledger_{{{id}}}")).await);
}

#[distributed_lock(key = "stock_<id>", manager = a, guard = g)]
async fn move_stock(
    a: &LockManager,
    b: &LockManager,
    id: u64,
    gate: &Gate,
) -> Result<(u64, u64), LockError> {
    let inner = mirror_stock(b, id, gate).await?;
    Ok((g.fencing_token(), inner))
}

#[distributed_lock(key = "stock_<id>", manager = b, wait = "1s", guard = g)]
async fn mirror_stock(b: &LockManager, id: u64, gate: &Gate) -> Result<u64, LockError> {
    gate.pass().await;
    Ok(g.fencing_token())
}

/// Regression (issue 11, finding 5): reentrancy matched the key only, so an annotated
/// call on manager B nested in one on manager A with the same key took no lock on B,
/// and another client of B could acquire it meanwhile. Reentrancy is per (manager,
/// key): the inner call locks B's key, and B's other clients see it locked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrancy_on_another_manager_takes_its_lock() {
    let (server_a, server_b) = (Single::new(), Single::new());
    let (a, b) = (manager(&server_a).await, manager(&server_b).await);
    let other_client_of_b = manager(&server_b).await;
    let id = fresh_id();
    let user_key = format!("stock_{{{id}}}");
    let gate = Gate::new();
    let call = {
        let (a, b, gate) = (a.clone(), b.clone(), gate.clone());
        tokio::spawn(async move { move_stock(&a, &b, id, &gate).await })
    };
    tokio::time::timeout(PROMPTLY, gate.entered.notified())
        .await
        .expect("the inner body runs");
    assert!(
        other_client_of_b.is_locked(&user_key).await.unwrap(),
        "the inner call on manager B holds no lock on B"
    );
    let stolen = other_client_of_b.try_lock(&user_key).await.unwrap();
    assert!(
        stolen.is_none(),
        "another client of B acquired the key while the inner call ran"
    );
    gate.go.notify_one();
    let (outer, inner) = call.await.unwrap().expect("both calls succeed");
    assert_eq!((outer, inner), (1, 1), "one acquisition on each manager");
    // Each call released its own lock.
    assert!(!server_a.exists(&format!("lock:{user_key}")).await);
    assert!(!server_b.exists(&format!("lock:{user_key}")).await);
}

// ---------------------------------------------------------------------------------------
// Release on every way out

// The fields are read through `Debug` in failure messages.
#[allow(dead_code)]
#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Parse(ParseIntError),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

impl From<ParseIntError> for AppError {
    fn from(e: ParseIntError) -> Self {
        AppError::Parse(e)
    }
}

#[distributed_lock(key = "parse_<id>", manager = locks, ttl = "30s")]
async fn parse_quantity(locks: &LockManager, id: u64, input: &str) -> Result<u32, AppError> {
    tokio::task::yield_now().await;
    let qty: u32 = input.parse()?;
    Ok(qty)
}

/// `?` leaves the body with the body's own error; the lock is released at once.
async fn error_via_question_mark_releases<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let id = fresh_id();
    assert_eq!(parse_quantity(&locks, id, "7").await.unwrap(), 7);
    let err = parse_quantity(&locks, id, "seven").await.unwrap_err();
    assert!(matches!(err, AppError::Parse(_)), "{err:?}");
    assert_released(
        h,
        &format!("lock:parse_{{{id}}}"),
        &format!("parse_{{{id}}}"),
    )
    .await;
}

#[distributed_lock(key = "early_<id>", manager = locks, ttl = "30s")]
async fn early_return(locks: &LockManager, id: u64, stock: u32) -> Result<&'static str, LockError> {
    if stock == 0 {
        return Ok("sold out");
    }
    tokio::task::yield_now().await;
    Ok("sold")
}

/// An early `return` leaves the body; the lock is released at once.
async fn early_return_releases<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let id = fresh_id();
    assert_eq!(early_return(&locks, id, 0).await.unwrap(), "sold out");
    assert_released(
        h,
        &format!("lock:early_{{{id}}}"),
        &format!("early_{{{id}}}"),
    )
    .await;
    assert_eq!(early_return(&locks, id, 1).await.unwrap(), "sold");
}

#[distributed_lock(key = "panic_<id>", manager = locks, ttl = "30s")]
async fn panics(locks: LockManager, id: u64, gate: Arc<Gate>) -> Result<(), LockError> {
    gate.pass().await;
    panic!("the body panicked while holding lock {id}");
}

/// A panicking body (in a spawned task, seen as a `JoinError`) releases its lock.
async fn panic_releases<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let id = fresh_id();
    let full = format!("lock:panic_{{{id}}}");
    let gate = Gate::new();
    let task = tokio::spawn(panics(locks.clone(), id, gate.clone()));
    gate.entered.notified().await;
    assert!(h.exists(&full).await);
    gate.go.notify_one();
    let err = task.await.unwrap_err();
    assert!(err.is_panic());
    assert_released(h, &full, &format!("panic_{{{id}}}")).await;
}

#[distributed_lock(key = "slow_<id>", manager = locks, ttl = "30s")]
async fn slow(
    locks: &LockManager,
    id: u64,
    entered: &Notify,
    done: &AtomicBool,
) -> Result<(), LockError> {
    entered.notify_one();
    tokio::time::sleep(Duration::from_secs(60)).await;
    done.store(true, Ordering::SeqCst);
    Ok(())
}

/// A call whose future is dropped mid-body (here by a timeout) releases its lock.
async fn cancelled_body_releases<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let id = fresh_id();
    let full = format!("lock:slow_{{{id}}}");
    let (entered, done) = (Notify::new(), AtomicBool::new(false));
    // Boxed, so that dropping it drops the call itself.
    let mut call = Box::pin(slow(&locks, id, &entered, &done));
    tokio::select! {
        _ = &mut call => panic!("the body cannot finish"),
        () = entered.notified() => {}
    }
    assert!(h.exists(&full).await);
    let timed_out = tokio::time::timeout(Duration::from_millis(50), &mut call).await;
    assert!(timed_out.is_err());
    drop(call);
    assert!(!done.load(Ordering::SeqCst));
    assert_released(h, &full, &format!("slow_{{{id}}}")).await;
}

/// A call dropped while it waits for the lock leaves nothing behind: once the holder
/// releases, the key is free (not taken by the abandoned waiter).
async fn cancelled_wait_leaves_nothing<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let id = fresh_id();
    let user_key = format!("slow_{{{id}}}");
    let holder = a
        .lock_with(&user_key, LockOptions::new().ttl(LONG_TTL))
        .await
        .unwrap();
    let (entered, done) = (Notify::new(), AtomicBool::new(false));
    let waiting =
        tokio::time::timeout(Duration::from_millis(200), slow(&b, id, &entered, &done)).await;
    assert!(waiting.is_err(), "the call got a held lock");
    holder.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_released(h, &format!("lock:{user_key}"), &user_key).await;
}

#[distributed_lock(key = "once_<id>", manager = locks, wait = "0s")]
async fn one_attempt(locks: &LockManager, id: u64) -> Result<(), LockError> {
    Ok(())
}

/// `wait = "0s"` on a held key is `Timeout` at once, and the body does not run.
async fn wait_zero_is_one_attempt<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let id = fresh_id();
    let holder = a.lock(&format!("once_{{{id}}}")).await.unwrap();
    let start = Instant::now();
    let err = one_attempt(&b, id).await.unwrap_err();
    assert!(start.elapsed() < PROMPTLY);
    assert!(
        matches!(&err, LockError::Timeout { key } if *key == format!("lock:once_{{{id}}}")),
        "{err}"
    );
    holder.release().await.unwrap();
    one_attempt(&b, id).await.unwrap();
}

// ---------------------------------------------------------------------------------------
// on_lost

#[distributed_lock(key = "job_<id>", manager = locks, ttl = "600ms")]
async fn long_job(
    locks: &LockManager,
    id: u64,
    entered: &Notify,
    done: &AtomicBool,
) -> Result<u32, LockError> {
    entered.notify_one();
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done.store(true, Ordering::SeqCst);
    Ok(1)
}

/// `on_lost = "abort"` (the default): the key deleted behind the holder's back, the
/// watchdog's next renewal finds out, the body (20 s of work) is dropped at its next
/// await, and the call returns `Err(Lost)` within a few ttls.
async fn on_lost_abort_drops_the_body<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let id = fresh_id();
    let full = format!("lock:job_{{{id}}}");
    let (entered, done) = (Notify::new(), AtomicBool::new(false));
    let call = long_job(&locks, id, &entered, &done);
    tokio::pin!(call);
    tokio::select! {
        _ = &mut call => panic!("the body cannot finish"),
        () = entered.notified() => {}
    }
    h.delete(&full).await;
    let deleted = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the body was not aborted");
    assert!(
        matches!(&result, Err(LockError::Lost { key }) if *key == full),
        "{result:?}"
    );
    assert!(
        deleted.elapsed() < Duration::from_secs(5),
        "{:?}",
        deleted.elapsed()
    );
    assert!(!done.load(Ordering::SeqCst), "the body ran to the end");
}

#[distributed_lock(key = "lease_<id>", manager = locks, ttl = "500ms", watchdog = false)]
async fn unrenewed_job(locks: &LockManager, id: u64, done: &AtomicBool) -> Result<u32, LockError> {
    tokio::time::sleep(Duration::from_secs(20)).await;
    done.store(true, Ordering::SeqCst);
    Ok(1)
}

/// `watchdog = false` with the default `on_lost = "abort"`: the lease ends at `ttl`, and
/// so does the body; meanwhile the key expired for everyone else.
async fn on_lost_abort_without_watchdog_ends_at_ttl<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let id = fresh_id();
    let done = AtomicBool::new(false);
    let start = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(10), unrenewed_job(&locks, id, &done))
        .await
        .expect("the body outlived its lease");
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(5),
        "{took:?} for a 500 ms lease"
    );
    assert!(!done.load(Ordering::SeqCst));
    let other = manager(h).await;
    let g = other
        .lock_with(
            &format!("lease_{{{id}}}"),
            LockOptions::new().wait(PROMPTLY),
        )
        .await
        .unwrap();
    g.release().await.unwrap();
}

#[distributed_lock(key = "report_<id>", manager = locks, ttl = "600ms", on_lost = "continue", guard = g)]
async fn report(locks: &LockManager, id: u64, gate: &Gate) -> Result<&'static str, LockError> {
    g.lost().await;
    assert!(!g.is_held());
    gate.pass().await;
    Ok("report written")
}

/// `on_lost = "continue"`: the body outlives the loss and its result comes back
/// unchanged; its late release does not touch the lock someone else took meanwhile.
async fn on_lost_continue_returns_the_body_result<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let id = fresh_id();
    let full = format!("lock:report_{{{id}}}");
    let gate = Gate::new();
    let call = {
        let (a, gate) = (a.clone(), gate.clone());
        tokio::spawn(async move { report(&a, id, &gate).await })
    };
    // Wait until the body holds the lock, then take it away.
    assert!(eventually(PROMPTLY, || h.exists(&full)).await);
    h.delete(&full).await;
    tokio::time::timeout(Duration::from_secs(10), gate.entered.notified())
        .await
        .expect("the loss was never seen");
    let thief = b
        .lock_with(
            &format!("report_{{{id}}}"),
            LockOptions::new().wait(PROMPTLY),
        )
        .await
        .unwrap();
    gate.go.notify_one();
    assert_eq!(call.await.unwrap().unwrap(), "report written");
    assert!(thief.is_held());
    assert!(
        h.exists(&full).await,
        "the lost call deleted the new holder's lock"
    );
    thief.release().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// Methods

/// One tenant's view of a shared service.
struct TenantService {
    locks: LockManager,
    tenant: String,
    reserved: u32,
}

impl TenantService {
    #[distributed_lock(key = "stock_<self.tenant>_<sku>", manager = self.locks, wait = "0s", guard = g)]
    async fn reserve(&self, sku: u64, gate: Option<&Gate>) -> Result<String, LockError> {
        if let Some(gate) = gate {
            gate.pass().await;
        }
        Ok(g.key().to_owned())
    }

    #[distributed_lock(key = "stock_<self.tenant>_<sku>", manager = self.locks)]
    async fn add(&mut self, sku: u64, qty: u32) -> Result<u32, LockError> {
        let _ = sku;
        self.reserved += qty;
        Ok(self.reserved)
    }
}

/// `manager = self.locks` with `<self.tenant>`: the tenant is part of the key, so the
/// same tenant contends across managers and different tenants do not.
async fn self_manager_and_tenant_placeholder<H: Harness>(h: &H) {
    let sku = fresh_id();
    let service = |locks: LockManager, tenant: &str| TenantService {
        locks,
        tenant: tenant.to_owned(),
        reserved: 0,
    };
    let acme = Arc::new(service(manager(h).await, "acme"));
    let acme_elsewhere = service(manager(h).await, "acme");
    let mut globex = service(manager(h).await, "globex");
    let gate = Gate::new();
    let call = {
        let (acme, gate) = (acme.clone(), gate.clone());
        tokio::spawn(async move { acme.reserve(sku, Some(&gate)).await })
    };
    gate.entered.notified().await;
    let err = acme_elsewhere.reserve(sku, None).await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    assert_eq!(
        globex.reserve(sku, None).await.unwrap(),
        format!("lock:stock_{{globex_{sku}}}")
    );
    assert_eq!(globex.add(sku, 2).await.unwrap(), 2);
    gate.go.notify_one();
    assert_eq!(
        call.await.unwrap().unwrap(),
        format!("lock:stock_{{acme_{sku}}}")
    );
    assert_eq!(
        acme_elsewhere.reserve(sku, None).await.unwrap(),
        format!("lock:stock_{{acme_{sku}}}")
    );
}

#[async_trait::async_trait]
trait Inventory {
    async fn restock(&self, sku: u64, gate: &Gate) -> Result<u32, LockError>;
}

// Regression: under `#[async_trait]` a parameter read only by the key (`sku`) was
// reported unused.
#[deny(unused_variables)]
#[async_trait::async_trait]
impl Inventory for TenantService {
    #[distributed_lock(key = "restock_<self.tenant>_<sku>", manager = self.locks, ttl = "30s")]
    async fn restock(&self, sku: u64, gate: &Gate) -> Result<u32, LockError> {
        gate.pass().await;
        Ok(self.reserved)
    }
}

/// An `#[async_trait]` method holds its lock while it runs and releases after.
async fn async_trait_method_holds_the_lock<H: Harness>(h: &H) {
    let sku = fresh_id();
    let service = Arc::new(TenantService {
        locks: manager(h).await,
        tenant: "initech".into(),
        reserved: 5,
    });
    let full = format!("lock:restock_{{initech_{sku}}}");
    let gate = Gate::new();
    let call: Arc<dyn Inventory + Send + Sync> = service;
    let task = {
        let gate = gate.clone();
        tokio::spawn(async move { call.restock(sku, &gate).await })
    };
    gate.entered.notified().await;
    assert!(h.exists(&full).await);
    gate.go.notify_one();
    assert_eq!(task.await.unwrap().unwrap(), 5);
    assert_released(h, &full, &format!("restock_{{initech_{sku}}}")).await;
}

// ---------------------------------------------------------------------------------------
// axum

mod web {
    use std::sync::Arc;

    use axum::extract::{Path, State};
    use axum::http::StatusCode;
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    use axum::Router;
    use redlock::{distributed_lock, LockError, LockManager};
    use tokio::sync::Mutex;

    #[derive(Clone)]
    pub(super) struct Shop {
        pub(super) locks: LockManager,
        /// The stock, read and written without atomicity, as a database row would be.
        pub(super) stock: Arc<std::sync::Mutex<u32>>,
        /// When set, `hold` waits for it while holding the lock.
        pub(super) gate: Arc<Mutex<Option<Arc<super::Gate>>>>,
    }

    pub(super) enum ShopError {
        SoldOut,
        Lock(LockError),
    }

    impl From<LockError> for ShopError {
        fn from(e: LockError) -> Self {
            ShopError::Lock(e)
        }
    }

    impl IntoResponse for ShopError {
        fn into_response(self) -> Response {
            match self {
                ShopError::SoldOut => (StatusCode::CONFLICT, "sold out".to_owned()),
                ShopError::Lock(e @ LockError::Timeout { .. }) => {
                    (StatusCode::LOCKED, e.to_string())
                }
                ShopError::Lock(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
            }
            .into_response()
        }
    }

    #[distributed_lock(key = "goods_<id>", manager = shop.locks, wait = "20s", guard = g)]
    async fn buy(State(shop): State<Shop>, Path(id): Path<u64>) -> Result<String, ShopError> {
        let stock = *shop.stock.lock().unwrap();
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        if stock == 0 {
            return Err(ShopError::SoldOut);
        }
        *shop.stock.lock().unwrap() = stock - 1;
        let gate = shop.gate.lock().await.take();
        if let Some(gate) = gate {
            gate.pass().await;
        }
        Ok(format!(
            "bought {id} with token {} under {}",
            g.fencing_token(),
            g.key()
        ))
    }

    #[distributed_lock(key = "goods_<id>", manager = shop.locks, wait = "0s")]
    async fn peek(State(shop): State<Shop>, Path(id): Path<u64>) -> Result<String, ShopError> {
        Ok(format!("{id}: {} left", *shop.stock.lock().unwrap()))
    }

    pub(super) fn app(shop: Shop) -> Router {
        Router::new()
            .route("/goods/{id}/buy", post(buy))
            .route("/goods/{id}/peek", post(peek))
            .with_state(shop)
    }
}

/// POSTs to `url` over a real TCP connection; the status and the body text.
async fn post(url: &str) -> (u16, String) {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<axum::body::Bytes>>();
    let request = http::Request::post(url)
        .body(Empty::new())
        .expect("request");
    let response = client.request(request).await.expect("HTTP request");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// An annotated axum 0.8 handler served on 127.0.0.1: concurrent buyers never oversell
/// (stock 5, 12 buyers: exactly 5 sold), the response carries the hash-tagged key, and a
/// request that cannot get the lock maps the `LockError` to its own status.
async fn axum_handler_over_loopback_http<H: Harness>(h: &H) {
    let id = fresh_id();
    let shop = web::Shop {
        locks: manager(h).await,
        stock: Arc::new(Mutex::new(5)),
        gate: Arc::default(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(axum::serve(listener, web::app(shop.clone())).into_future());
    let base = format!("http://{addr}/goods/{id}");

    let mut buyers = Vec::new();
    for _ in 0..12 {
        let url = format!("{base}/buy");
        buyers.push(tokio::spawn(async move { post(&url).await }));
    }
    let mut sold = 0;
    for buyer in buyers {
        let (status, body) = buyer.await.unwrap();
        match status {
            200 => {
                sold += 1;
                assert!(
                    body.ends_with(&format!("under lock:goods_{{{id}}}")),
                    "{body}"
                );
            }
            409 => assert_eq!(body, "sold out"),
            _ => panic!("{status}: {body}"),
        }
    }
    assert_eq!(sold, 5, "oversold or undersold");
    assert_eq!(*shop.stock.lock().unwrap(), 0);

    // While a request holds the lock, another (wait = "0s") gets the mapped error.
    *shop.stock.lock().unwrap() = 1;
    let gate = arm_gate(&shop).await;
    let holding = tokio::spawn({
        let url = format!("{base}/buy");
        async move { post(&url).await }
    });
    gate.entered.notified().await;
    let (status, body) = post(&format!("{base}/peek")).await;
    assert_eq!(status, 423, "{body}");
    assert!(body.contains(&format!("lock:goods_{{{id}}}")), "{body}");
    gate.go.notify_one();
    assert_eq!(holding.await.unwrap().0, 200);
    assert_eq!(
        post(&format!("{base}/peek")).await,
        (200, format!("{id}: 0 left"))
    );
    server.abort();
}

/// Arms the shop's gate for the next `buy`.
async fn arm_gate(shop: &web::Shop) -> Arc<Gate> {
    let gate = Gate::new();
    *shop.gate.lock().await = Some(gate.clone());
    gate
}

// ---------------------------------------------------------------------------------------
// Regressions: `Call::run` used to poll the body before the loss, so with
// `on_lost = "abort"` a body could start (and finish) although the lock it was promised
// was already lost.

#[distributed_lock(key = "lost_outer_<id>", manager = locks, ttl = "300ms", on_lost = "continue", guard = g)]
async fn lost_outer(
    locks: &LockManager,
    id: u64,
    ran: &AtomicBool,
) -> Result<Result<(), LockError>, LockError> {
    g.lost().await;
    Ok(lost_inner(locks, id, ran).await)
}

#[distributed_lock(key = "lost_outer_<id>", manager = locks)]
async fn lost_inner(locks: &LockManager, id: u64, ran: &AtomicBool) -> Result<(), LockError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

/// A call re-entering a lock its caller already lost must not run its body.
#[tokio::test]
async fn reentered_call_into_a_lost_lock_does_not_run_its_body() {
    let h = Single::new();
    let locks = manager(&h).await;
    let id = fresh_id();
    let full = format!("lock:lost_outer_{{{id}}}");
    let ran = Arc::new(AtomicBool::new(false));
    let call = {
        let (locks, ran) = (locks.clone(), ran.clone());
        tokio::spawn(async move { lost_outer(&locks, id, &ran).await })
    };
    assert!(eventually(PROMPTLY, || h.exists(&full)).await);
    h.delete(&full).await;
    let inner = call.await.unwrap().unwrap();
    assert!(matches!(inner, Err(LockError::Lost { .. })), "{inner:?}");
    assert!(!ran.load(Ordering::SeqCst), "the body ran without the lock");
}

#[distributed_lock(key = "born_lost_<id>", manager = locks, ttl = "1ms", watchdog = false)]
async fn born_lost(locks: &LockManager, id: u64, ran: &AtomicBool) -> Result<(), LockError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

/// A lease whose validity (ttl minus the drift allowance) is already over when the lock
/// is granted must not run the body.
#[tokio::test]
async fn lease_lost_at_grant_does_not_run_the_body() {
    let locks = manager(&Memory).await;
    let ran = AtomicBool::new(false);
    let result = born_lost(&locks, fresh_id(), &ran).await;
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    assert!(!ran.load(Ordering::SeqCst), "the body ran without the lock");
}

// ---------------------------------------------------------------------------------------
// Other kinds of lock: mode, permits, keys, hold_at_least

#[distributed_lock(key = "doc_<id>", manager = locks, mode = "read", wait = "10s", guard = g)]
async fn read_doc(locks: &LockManager, id: u64, gate: &Gate) -> Result<LockKind, LockError> {
    gate.pass().await;
    Ok(g.kind())
}

#[distributed_lock(key = "doc_<id>", manager = locks, mode = "read", wait = "0s")]
async fn try_read_doc(locks: &LockManager, id: u64) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "doc_<id>", manager = locks, mode = "write", wait = "10s", guard = g)]
async fn write_doc(locks: &LockManager, id: u64, gate: &Gate) -> Result<LockKind, LockError> {
    gate.pass().await;
    Ok(g.kind())
}

#[distributed_lock(key = "doc_<id>", manager = locks, wait = "0s")]
async fn try_write_doc(locks: &LockManager, id: u64) -> Result<(), LockError> {
    Ok(())
}

/// Runs `call` in a task and returns once its body holds the lock (within [`PROMPTLY`]).
async fn enter_gated<T, F>(gate: &Arc<Gate>, call: F) -> tokio::task::JoinHandle<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let task = tokio::spawn(call);
    tokio::time::timeout(PROMPTLY, gate.entered.notified())
        .await
        .expect("the body entered");
    task
}

/// `mode = "read"`: two readers of one key hold it at once (from two managers), a
/// writer (`mode = "write"` or the default exclusive mode) cannot get it meanwhile; and
/// while a writer holds it a reader cannot.
async fn read_mode_shares_with_readers_not_writers<H: Harness>(h: &H) {
    let (a, b) = (manager(h).await, manager(h).await);
    let id = fresh_id();
    let (first, second) = (Gate::new(), Gate::new());
    let r1 = enter_gated(&first, {
        let (a, gate) = (a.clone(), first.clone());
        async move { read_doc(&a, id, &gate).await }
    })
    .await;
    let r2 = enter_gated(&second, {
        let (b, gate) = (b.clone(), second.clone());
        async move { read_doc(&b, id, &gate).await }
    })
    .await;
    let err = try_write_doc(&a, id).await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    first.go.notify_one();
    second.go.notify_one();
    assert_eq!(r1.await.unwrap().unwrap(), LockKind::Read);
    assert_eq!(r2.await.unwrap().unwrap(), LockKind::Read);

    let writing = Gate::new();
    let w = enter_gated(&writing, {
        let (b, gate) = (b.clone(), writing.clone());
        async move { write_doc(&b, id, &gate).await }
    })
    .await;
    let err = try_read_doc(&a, id).await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    writing.go.notify_one();
    assert_eq!(w.await.unwrap().unwrap(), LockKind::Exclusive);
    try_read_doc(&a, id).await.expect("free again");
}

/// The bodies of one permit-limited function: how many run now, the most that ever ran
/// at once, and how many ran.
#[derive(Default)]
struct Slots {
    active: AtomicUsize,
    high_water: AtomicUsize,
    runs: AtomicUsize,
}

#[distributed_lock(key = "export_<id>", manager = locks, permits = 2, wait = "30s", guard = g)]
async fn export(
    locks: &LockManager,
    id: u64,
    slots: &Slots,
    gate: Option<&Gate>,
) -> Result<LockKind, LockError> {
    let now = slots.active.fetch_add(1, Ordering::SeqCst) + 1;
    slots.high_water.fetch_max(now, Ordering::SeqCst);
    match gate {
        Some(gate) => gate.pass().await,
        None => tokio::time::sleep(Duration::from_millis(5)).await,
    }
    slots.runs.fetch_add(1, Ordering::SeqCst);
    slots.active.fetch_sub(1, Ordering::SeqCst);
    Ok(g.kind())
}

#[distributed_lock(key = "export_<id>", manager = locks, permits = 2, wait = "0s")]
async fn try_export(locks: &LockManager, id: u64) -> Result<(), LockError> {
    Ok(())
}

/// `permits = 2`: two calls hold a permit at once and a third cannot; then twelve
/// tasks over three managers never run more than two bodies at once, and every call
/// runs.
async fn permits_admit_exactly_n<H: Harness>(h: &H) {
    const MANAGERS: usize = 3;
    const TASKS: usize = 4;
    const ROUNDS: usize = 5;
    let id = fresh_id();
    let slots = Arc::new(Slots::default());
    let locks = manager(h).await;
    let (first, second) = (Gate::new(), Gate::new());
    let mut held = Vec::new();
    for gate in [&first, &second] {
        let (locks, slots, gate) = (locks.clone(), slots.clone(), gate.clone());
        held.push(
            enter_gated(&gate.clone(), async move {
                export(&locks, id, &slots, Some(&gate)).await
            })
            .await,
        );
    }
    let err = try_export(&manager(h).await, id).await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    first.go.notify_one();
    second.go.notify_one();
    for call in held {
        assert_eq!(call.await.unwrap().unwrap(), LockKind::Permit);
    }

    let mut tasks = Vec::new();
    for _ in 0..MANAGERS {
        let locks = manager(h).await;
        for _ in 0..TASKS {
            let (locks, slots) = (locks.clone(), slots.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    export(&locks, id, &slots, None).await.expect("export");
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(slots.high_water.load(Ordering::SeqCst), 2, "permits = 2");
    assert_eq!(
        slots.runs.load(Ordering::SeqCst),
        2 + MANAGERS * TASKS * ROUNDS
    );
}

/// The accounts of the transfers: bodies holding each account now, and transfers done.
struct Accounts {
    holders: Vec<AtomicUsize>,
    ids: Vec<u64>,
    done: AtomicUsize,
}

impl Accounts {
    fn holders(&self, id: u64) -> &AtomicUsize {
        let i = self.ids.iter().position(|&x| x == id).expect("an account");
        &self.holders[i]
    }
}

#[distributed_lock(keys = ["account_<from>", "account_<to>"], manager = locks, wait = "30s", guard = g)]
async fn move_funds(
    locks: &LockManager,
    from: u64,
    to: u64,
    accounts: &Accounts,
) -> Result<usize, LockError> {
    let mut touched = vec![from, to];
    touched.dedup();
    for &id in &touched {
        assert_eq!(
            accounts.holders(id).fetch_add(1, Ordering::SeqCst),
            0,
            "two holders of account {id}"
        );
    }
    assert_eq!(g.fencing_tokens().len(), g.keys().len());
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_micros(200)).await;
    for &id in &touched {
        accounts.holders(id).fetch_sub(1, Ordering::SeqCst);
    }
    accounts.done.fetch_add(1, Ordering::SeqCst);
    Ok(g.keys().len())
}

/// `keys = [...]`: tasks naming three accounts in opposite orders, over two managers,
/// all finish (no deadlock) and never hold one account twice at once; the guard has
/// each distinct key once, sorted.
async fn keys_lock_all_in_any_order<H: Harness>(h: &H) {
    const TASKS: usize = 6;
    const ROUNDS: usize = 8;
    let ids = vec![fresh_id(), fresh_id(), fresh_id()];
    let accounts = Arc::new(Accounts {
        holders: ids.iter().map(|_| AtomicUsize::new(0)).collect(),
        ids: ids.clone(),
        done: AtomicUsize::new(0),
    });
    let (a, b) = (manager(h).await, manager(h).await);
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let locks = if task % 2 == 0 { a.clone() } else { b.clone() };
        let accounts = accounts.clone();
        let (from, to) = (ids[task % 3], ids[(task + 1) % 3]);
        let (from, to) = if task % 2 == 0 {
            (from, to)
        } else {
            (to, from)
        };
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let held = move_funds(&locks, from, to, &accounts).await;
                assert_eq!(held.expect("transfer"), 2);
            }
        }));
    }
    let all = async {
        for t in tasks {
            t.await.expect("task");
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("every transfer finished");
    assert_eq!(accounts.done.load(Ordering::SeqCst), TASKS * ROUNDS);
    // Both templates naming one account lock it once.
    let same = move_funds(&a, ids[0], ids[0], &accounts).await.unwrap();
    assert_eq!(same, 1);
    for id in ids {
        assert!(!a.is_locked(&format!("account_{{{id}}}")).await.unwrap());
    }
}

#[distributed_lock(key = "nightly_job_<id>", manager = locks, hold_at_least = "2s", wait = "0s")]
async fn nightly_job(locks: &LockManager, id: u64) -> Result<(), LockError> {
    Ok(())
}

/// `hold_at_least = "2s"`: the key stays locked after the body returned, another run
/// is refused meanwhile (skip-if-locked with `wait = "0s"`), and the key is free once
/// the hold is over (well before the 30 s default ttl).
async fn hold_at_least_keeps_the_key_after_return<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let id = fresh_id();
    let key = format!("nightly_job_{{{id}}}");
    let start = Instant::now();
    nightly_job(&locks, id).await.expect("first run");
    assert!(locks.is_locked(&key).await.unwrap(), "released at once");
    let err = nightly_job(&manager(h).await, id).await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "checks took the whole hold"
    );
    let hold_over = eventually(Duration::from_secs(2) + PROMPTLY, || async {
        !locks.is_locked(&key).await.unwrap()
    });
    assert!(hold_over.await, "still locked long after the hold");
    assert!(
        start.elapsed() >= Duration::from_secs(2),
        "freed before the hold"
    );
    nightly_job(&locks, id)
        .await
        .expect("runs again after the hold");
}

#[distributed_lock(key = "doc_<id>", manager = locks, wait = "0s")]
async fn write_inside_read(locks: &LockManager, id: u64) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "doc_<id>", manager = locks, mode = "read")]
async fn read_then_write(locks: &LockManager, id: u64) -> Result<(), LockError> {
    write_inside_read(locks, id).await
}

/// Only an exclusive call re-enters: an exclusive call nested in a read call of the same
/// key is a writer like any other, so it is refused while its caller reads.
async fn read_call_is_not_reentered<H: Harness>(h: &H) {
    let locks = manager(h).await;
    let err = read_then_write(&locks, fresh_id()).await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
}
