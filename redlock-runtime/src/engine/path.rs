//! The one path of a held lease's requests: every request that sets or ends a lease's
//! expiry after its grant — an extend, a renewal, a release and its keep — is sent and
//! booked here, whichever kind (exclusive, read, permit, a `lock_all` key) and backend,
//! so a rule of the lease written here holds for all of them.
//!
//! | rule | requests | where |
//! |---|---|---|
//! | a request carries the lease's policy (its kind, its `min_replicas`) | extend, renewal, release, keep | built only by [`Lease::lease_ref`] and [`Lease::renewal`] |
//! | one extend or renewal in flight per lease, booked before the next is sent | extend, renewal | the lease's `op` lock: [`extend`] runs with it held; the watchdog takes it for a renewal |
//! | book what was sent: a confirmation moves the deadline by the ttl the request carried | extend, renewal | [`booked`] |
//! | lower before sending, raise only on success | extend | [`extend`] (`Lease::extending`) |
//! | a release that freed the key tells this process's waiters at once (a fair lock's: none, the server names the one waiter whose turn it is) | release, keep, the undo of an abandoned attempt (`Job::Abandon`) | [`tell`], after [`release`] and its booking |
//! | a release that finds the lock gone, unnoticed, counts it lost | release, keep (foreground and background) | [`book_release`] |
//!
//! What the server must do with these requests (the compare-token checks, the wake-ups
//! it publishes) is the backends' part: see the rules table in `backend`.

use std::time::Duration;

use tracing::Instrument;

use super::Shared;
use crate::backend::RELEASE_RETRIES;
use crate::error::chain;
use crate::key::LockKey;
use crate::kind::Mode;
use crate::lease::{self, Lease};
use crate::stats::{self, Loss, Release};
use crate::wire::LeaseRef;
use crate::wire::Renewed;
use crate::LockError;

/// Extends `lease` to `ttl`, called with its `op` lock held (the caller drops it once
/// this returns): true when the lock was ours and now lives `ttl` longer.
pub(crate) async fn extend(
    shared: &Shared,
    lease: &Lease,
    ttl: Duration,
) -> Result<bool, LockError> {
    let sent = lease::now();
    lease.extending(sent, ttl);
    // The watchdog declares the lock lost at the lowered deadline if no reply raised it
    // by then.
    shared.reschedule(lease);
    let outcome = shared.backend.extend(lease.lease_ref(), ttl).await;
    if let Ok(ours) = outcome {
        booked(lease, sent, ttl, Renewed::from(ours));
    }
    outcome
}

/// Books the answer to a request that set `lease`'s expiry, sent at `sent` carrying
/// `ttl` (an extend or a renewal, `op` lock held): confirmed moves the deadline, denied
/// marks the lease lost; an unknown outcome changes nothing.
pub(crate) fn booked(lease: &Lease, sent: u64, ttl: Duration, outcome: Renewed) {
    match outcome {
        Renewed::Yes => lease.confirmed(sent, ttl),
        Renewed::Lost => lease.mark_lost(Loss::Taken),
        Renewed::Unknown => {}
    }
}

/// Sends one release of `lease`, keeping the key `keep` longer when that is not zero
/// (`hold_at_least`): true when it was ours. The caller then [`tell`]s this process's
/// waiters.
pub(crate) async fn release(
    shared: &Shared,
    lease: LeaseRef<'_>,
    keep: Duration,
) -> Result<bool, LockError> {
    let span = tracing::debug_span!(target: "redlock", "redlock.release");
    // Boxed: inline, the backend's request made `release`'s future 4 KB (see
    // `the_futures_callers_hold_stay_small`).
    Box::pin(shared.backend.release(lease, keep).instrument(span)).await
}

/// Wakes this process's waiters for `key` after a release of a lock of `mode` freed it
/// (or shortened its hold), at once: the server's message follows. Not for a fair lock:
/// its release's message names the one waiter whose turn it is, in whichever process,
/// and waking every fair waiter here would send each of them to ask.
pub(crate) fn tell(shared: &Shared, key: &LockKey, mode: Mode) {
    if mode != Mode::Fair {
        shared.waiters.wake(key.full());
    }
}

/// [`release`], tried again after each of `RELEASE_RETRIES`' pauses while it fails;
/// `keep()` is measured again before each try.
pub(crate) async fn release_retrying(
    shared: &Shared,
    lease: LeaseRef<'_>,
    keep: impl Fn() -> Duration,
) -> Release {
    let key = lease.key;
    let backend = shared.backend.name();
    for pause in std::iter::once(None).chain(RELEASE_RETRIES.map(Some)) {
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        match release(shared, lease, keep()).await {
            Ok(true) => {
                tell(shared, key, lease.mode);
                return Release::Released;
            }
            Ok(false) => return Release::Lost,
            Err(e) => tracing::debug!(
                target: "redlock",
                key = key.full(),
                backend,
                error = %chain(&e),
                "background release failed"
            ),
        }
    }
    tracing::warn!(
        target: "redlock",
        key = key.full(),
        backend,
        "background release failed; the ttl will free the lock"
    );
    Release::Error
}

/// Books how a release of `lease` ended (the metrics and a debug line); a lock the
/// server no longer had, that nobody had declared lost, was lost unnoticed.
pub(crate) fn book_release(shared: &Shared, lease: &Lease, outcome: Release) {
    if outcome == Release::Lost && !lease.was_lost() {
        stats::lost(Loss::Taken);
    }
    lease.book_release(shared.backend.name(), outcome);
}
