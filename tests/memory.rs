//! The conformance suite on the in-memory backend.

mod conformance;

use conformance::Harness;
use redlock::{LockManager, LockManagerBuilder, LockOptions};
use std::time::Duration;

/// In-memory managers of one process share one store.
struct Memory;

impl Harness for Memory {
    fn builder(&self) -> LockManagerBuilder {
        LockManager::builder().in_memory()
    }

    async fn delete(&self, full_key: &str) {
        let admin = LockManager::builder()
            .in_memory()
            .prefix("")
            .build()
            .await
            .unwrap();
        assert!(admin.force_unlock(full_key).await.unwrap());
    }

    async fn steal(&self, full_key: &str) {
        let thief = LockManager::builder()
            .in_memory()
            .prefix("")
            .build()
            .await
            .unwrap();
        assert!(thief.force_unlock(full_key).await.unwrap());
        let guard = thief
            .lock_with(
                full_key,
                LockOptions::new()
                    .ttl(Duration::from_secs(60))
                    .watchdog(false),
            )
            .await
            .unwrap();
        std::mem::forget(guard);
    }

    async fn exists(&self, full_key: &str) -> bool {
        let admin = LockManager::builder()
            .in_memory()
            .prefix("")
            .build()
            .await
            .unwrap();
        admin.is_locked(full_key).await.unwrap()
    }
}

conformance_tests!(Memory);

#[tokio::test]
async fn futures_and_types_are_send_sync() {
    let locks = LockManager::builder().in_memory().build().await.unwrap();
    conformance::static_send_sync_checks(&locks);
}
