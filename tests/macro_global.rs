//! `#[distributed_lock]` without `manager =`: the process-wide global manager.
//!
//! The global is one per process, so this binary holds a single test that walks through
//! its life in order: none installed, an in-memory one, then a Redis one replacing it.

use std::sync::atomic::{AtomicUsize, Ordering};

use redis::AsyncCommands;
use redlock::{distributed_lock, LockError, LockManager};
use redlock_testkit::RedisServer;
use tokio::sync::Notify;

#[derive(Debug)]
enum ShopError {
    Lock(LockError),
}

impl From<LockError> for ShopError {
    fn from(e: LockError) -> Self {
        ShopError::Lock(e)
    }
}

/// How many times a body ran.
static RUNS: AtomicUsize = AtomicUsize::new(0);

#[distributed_lock(key = "buy_<goods_id>", ttl = "30s", guard = g)]
async fn buy(
    goods_id: u64,
    entered: Option<&Notify>,
    go: Option<&Notify>,
) -> Result<String, ShopError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    if let (Some(entered), Some(go)) = (entered, go) {
        entered.notify_one();
        go.notified().await;
    }
    // Re-entering through the global manager too.
    let inner = restock(goods_id).await?;
    assert_eq!(inner, g.fencing_token());
    Ok(g.key().to_owned())
}

#[distributed_lock(key = "buy_<goods_id>", wait = "0s", guard = g)]
async fn restock(goods_id: u64) -> Result<u64, ShopError> {
    Ok(g.fencing_token())
}

#[distributed_lock(key = "buy_<goods_id>", manager = locks, guard = g)]
async fn buy_with(locks: &LockManager, goods_id: u64) -> Result<String, LockError> {
    Ok(format!("{} {}", locks.backend_name(), g.key()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_manager_lifecycle() {
    // 1. None installed: NoManager at run time, converted by `From`, and no body ran.
    assert!(LockManager::global().is_none());
    let err = buy(42, None, None).await.unwrap_err();
    assert!(
        matches!(err, ShopError::Lock(LockError::NoManager)),
        "{err:?}"
    );
    assert_eq!(RUNS.load(Ordering::SeqCst), 0);
    // An explicit manager needs no global.
    let memory = LockManager::builder().in_memory().build().await.unwrap();
    assert_eq!(buy_with(&memory, 42).await.unwrap(), "memory lock:buy_{42}");

    // 2. An in-memory global.
    memory.clone().install_global();
    assert_eq!(buy(42, None, None).await.unwrap(), "lock:buy_{42}");
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
    assert!(!memory.is_locked("buy_{42}").await.unwrap());

    // 3. A Redis global replaces it: the lock is in Redis while the body runs.
    let server = RedisServer::start();
    LockManager::connect(&server.url())
        .await
        .unwrap()
        .install_global();
    assert_eq!(LockManager::global().unwrap().backend_name(), "single");
    let (entered, go) = (Notify::new(), Notify::new());
    let call = buy(42, Some(&entered), Some(&go));
    tokio::pin!(call);
    tokio::select! {
        _ = &mut call => panic!("the body waits for `go`"),
        () = entered.notified() => {}
    }
    let mut raw = server.connection().await;
    let exists: bool = raw.exists("lock:buy_{42}").await.unwrap();
    assert!(exists, "the global Redis manager does not hold the lock");
    assert!(!memory.is_locked("buy_{42}").await.unwrap());
    go.notify_one();
    assert_eq!(call.await.unwrap(), "lock:buy_{42}");
    let exists: bool = raw.exists("lock:buy_{42}").await.unwrap();
    assert!(!exists, "not released");
    // An explicit manager still wins over the global one.
    assert_eq!(buy_with(&memory, 42).await.unwrap(), "memory lock:buy_{42}");
}
