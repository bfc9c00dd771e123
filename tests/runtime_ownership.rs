//! Regression (issue 14, item 8): a manager built on one tokio runtime and used on
//! another went on silently: its watchdog and background releases had died with the
//! first runtime, so a lock taken on the second was never renewed (lost at its ttl)
//! and dropped guards were never released. Used outside any runtime it panicked deep
//! in tokio. A manager belongs to the runtime that built it: elsewhere its operations
//! fail with `LockError::WrongRuntime`.

use std::time::Duration;

use redlock::{LockError, LockManager};
use redlock_testkit::RedisServer;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn assert_wrong_runtime<T: std::fmt::Debug>(r: Result<T, LockError>, place: &str) {
    match r {
        Err(e @ LockError::WrongRuntime { .. }) => {
            assert!(e.to_string().contains(place), "{e}");
            assert!(e.to_string().contains("one manager per runtime"), "{e}");
            assert_eq!(e.kind(), "wrong_runtime");
        }
        other => panic!("expected WrongRuntime ({place}), got {other:?}"),
    }
}

/// Built on a runtime that has since shut down, used on a new one: in memory and on
/// Redis, every operation is refused, and nothing is left locked.
#[test]
fn a_manager_used_on_another_runtime_fails_clearly() {
    let server = RedisServer::start();
    let url = server.url();
    for redis in [false, true] {
        let first = runtime();
        let locks = first.block_on(async {
            if redis {
                LockManager::connect(&url).await.unwrap()
            } else {
                LockManager::builder().in_memory().build().await.unwrap()
            }
        });
        drop(first);
        let second = runtime();
        second.block_on(async {
            assert_wrong_runtime(locks.lock("rt_{1}").await, "from another runtime");
            assert_wrong_runtime(locks.try_lock("rt_{1}").await, "from another runtime");
            assert_wrong_runtime(locks.read("rt_{1}").await, "from another runtime");
            assert_wrong_runtime(locks.permit("rt_{2}", 2).await, "from another runtime");
            assert_wrong_runtime(
                locks.lock_all(["rt_{1}", "rt_{3}"]).await,
                "from another runtime",
            );
            assert_wrong_runtime(locks.is_locked("rt_{1}").await, "from another runtime");
        });
        // A manager built on this runtime works.
        second.block_on(async {
            let here = if redis {
                LockManager::connect(&url).await.unwrap()
            } else {
                LockManager::builder().in_memory().build().await.unwrap()
            };
            let guard = here.lock("rt_{1}").await.expect("nothing was left locked");
            guard.release().await.unwrap();
        });
    }
}

/// A guard of a manager whose runtime still runs (on another thread): extending it
/// from another runtime is refused too; on its own runtime (and from `spawn_blocking`
/// through the handle) all works.
#[test]
fn a_guard_extended_from_another_runtime_fails_clearly() {
    let home = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let locks = home
        .block_on(LockManager::builder().in_memory().build())
        .unwrap();
    let guard = home.block_on(locks.lock("rt_{guard}")).unwrap();
    runtime().block_on(async {
        assert_wrong_runtime(
            guard.extend(Duration::from_secs(5)).await,
            "from another runtime",
        );
    });
    let handle = home.handle().clone();
    home.block_on(async {
        guard.extend(Duration::from_secs(5)).await.unwrap();
        let again = locks.clone();
        tokio::task::spawn_blocking(move || {
            handle.block_on(async { again.try_lock("rt_{other}").await.map(|g| g.is_some()) })
        })
        .await
        .unwrap()
        .unwrap();
        guard.release().await.unwrap();
    });
}

/// Outside any runtime: an error, not a panic in tokio.
#[test]
fn a_manager_used_outside_any_runtime_fails_clearly() {
    let locks = runtime()
        .block_on(LockManager::builder().in_memory().build())
        .unwrap();
    assert_wrong_runtime(
        futures::executor::block_on(locks.lock("rt_{outside}")),
        "outside any runtime",
    );
    assert_wrong_runtime(
        futures::executor::block_on(LockManager::builder().in_memory().build()),
        "outside any runtime",
    );
}
