//! The conformance suite on the in-memory backend.

mod conformance;

use conformance::backends::Memory;
use redlock::LockManager;

conformance_tests!(Memory);

#[tokio::test]
async fn futures_and_types_are_send_sync() {
    let locks = LockManager::builder().in_memory().build().await.unwrap();
    conformance::static_send_sync_checks(&locks);
}

kinds_tests!(Memory);
fair_tests!(Memory);
rules_tests!(Memory);
leader_tests!(Memory);

#[tokio::test(flavor = "current_thread")]
async fn writer_waiting_behind_a_writer_keeps_new_readers_out() {
    conformance::kinds::writer_waiting_behind_a_writer_keeps_new_readers_out(&Memory).await;
}
