//! The other kinds of lock (read/write, permits, `lock_all`, `hold_at_least`) on Redlock
//! over 5 independent redis-server processes: a binary of their own, so that their load
//! does not share a process with the Redlock latency and straggler tests.

mod conformance;

use conformance::backends::Redlock;

kinds_tests!(Redlock::new());
rules_tests!(Redlock::new());

#[tokio::test(flavor = "current_thread")]
async fn writer_waiting_behind_a_writer_keeps_new_readers_out() {
    conformance::kinds::writer_waiting_behind_a_writer_keeps_new_readers_out(&Redlock::new()).await;
}
