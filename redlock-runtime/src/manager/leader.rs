//! Leader election on the exclusive lock: [`leader`](LockManager::leader) campaigns until
//! elected and returns a [`Leadership`]; [`lead`](LockManager::lead) runs a body while
//! leader and campaigns again when leadership is lost. Who leads now is
//! `leader_watch`'s.
//!
//! A leadership is an exclusive lock on the key `leader:{<name>}` (under the manager's
//! prefix), renewed by the watchdog: its term is the lock's fencing token, its loss the
//! lock's loss, its resignation the lock's release (whose notification wakes the
//! followers). No new script, no new kind.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use super::LockManager;
use crate::error::chain;
use crate::key::LockKey;
use crate::kind::Mode;
use crate::{LockError, LockGuard, LockOptions};

/// What a leader's name is prefixed with to make its lock key: a leadership never
/// shares a key with a lock taken with `lock(name)`.
const NAMESPACE: &str = "leader:";

/// The shortest round of a campaign: its wait, and the least time between the starts
/// of two rounds (a campaign with a zero `wait`, or whose attempts fail at once, would
/// otherwise try again at once, over and over).
const MIN_ATTEMPT: Duration = Duration::from_secs(1);

/// The lock key of the leader `name`: `<prefix>leader:{<name>}`, one hash tag, so that on
/// a cluster the lock and its fencing counter share the name's slot.
pub(super) fn leader_key(prefix: &str, name: &str) -> Result<LockKey, LockError> {
    if name.is_empty() {
        return Err(LockError::InvalidKey {
            reason: "the leader's name is empty".into(),
        });
    }
    LockKey::prefixed(prefix, &format!("{NAMESPACE}{{{name}}}"))
}

/// Whether a campaign goes on after an attempt ended in `e`: the attempt's wait ran out,
/// or the backend failed (a campaign outlives an outage). Anything else ends it.
fn campaign_goes_on(e: &LockError) -> bool {
    matches!(
        e,
        LockError::Timeout { .. }
            | LockError::Backend { .. }
            | LockError::QuorumUnavailable { .. }
            | LockError::ReplicasUnavailable { .. }
    )
}

impl LockManager {
    /// Campaigns until elected leader of `name`: the one holder, among every process
    /// asking for it, of the lock `leader:{<name>}` (under this manager's prefix), with
    /// the manager's default ttl, renewed by the watchdog while the [`Leadership`] lives.
    ///
    /// The campaign has no deadline: it waits (woken by the leader's resignation, or at
    /// the leader's ttl when it died) in attempts bounded by the manager's default wait,
    /// each one as [`lock`](Self::lock) waits, and starts another when one runs out or
    /// the backend failed (logged at debug level). Bound it with
    /// [`tokio::time::timeout`] if needed.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] for an empty or too long name, [`LockError::ShutDown`]
    /// once the manager shut down, [`LockError::QueueFull`] when this process already
    /// has `max_waiters_per_key` tasks waiting for the name, [`LockError::WrongRuntime`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves no lock behind (a leadership granted after
    /// it was dropped is resigned in the background), as for [`lock`](Self::lock).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let leadership = locks.leader("scheduler").await?;
    /// assert!(leadership.is_held());
    /// let term = leadership.fencing_token(); // hand it to what the leader writes to
    ///
    /// // Another instance campaigns; it is elected once the leader resigns.
    /// let follower = tokio::spawn({
    ///     let locks = locks.clone();
    ///     async move { locks.leader("scheduler").await.map(|l| l.fencing_token()) }
    /// });
    /// leadership.resign().await?;
    /// assert!(follower.await.unwrap()? > term);
    /// # Ok(()) }
    /// ```
    pub async fn leader(&self, name: &str) -> Result<Leadership, LockError> {
        self.leader_with(name, LockOptions::new()).await
    }

    /// [`leader`](Self::leader) with explicit options: their ttl is the lease's (the
    /// failover time after a crash of the leader is about one ttl), their `wait` bounds
    /// each attempt of the campaign (at least 1 s), `min_replicas` is waited for at each
    /// election, and the watchdog must stay on.
    ///
    /// # Errors
    /// As [`leader`](Self::leader); also [`LockError::InvalidOption`] for
    /// `watchdog(false)` (a leadership is kept by renewals) and for a ttl or wait
    /// [`lock_with`](Self::lock_with) rejects.
    ///
    /// # Cancel safety
    /// As [`leader`](Self::leader).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockError, LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// // A 5 s lease: a crashed leader is replaced about 5 s later.
    /// let opts = LockOptions::new().ttl(Duration::from_secs(5));
    /// let leadership = locks.leader_with("compactor", opts).await?;
    /// assert!(leadership.is_held());
    ///
    /// let unrenewed = LockOptions::new().watchdog(false);
    /// let refused = locks.leader_with("compactor", unrenewed).await;
    /// assert!(matches!(refused, Err(LockError::InvalidOption { .. })));
    /// # Ok(()) }
    /// ```
    pub async fn leader_with(
        &self,
        name: &str,
        options: LockOptions,
    ) -> Result<Leadership, LockError> {
        let key = leader_key(&self.0.prefix, name)?;
        if options.watchdog == Some(false) {
            return Err(LockError::invalid_option(
                "a leadership is kept by the watchdog: watchdog(false) would lose it at its ttl",
            ));
        }
        let wait = self.resolve(&options)?.wait.max(MIN_ATTEMPT);
        let attempt = options.wait(wait);
        loop {
            let resolved = self.resolve(&attempt)?;
            // A round lasts at least `MIN_ATTEMPT`: one that ends early in an error
            // (`ReplicasUnavailable` is not waited out) pauses until then.
            let round = tokio::time::Instant::now() + MIN_ATTEMPT;
            match self.acquire(key.clone(), Mode::Exclusive, resolved).await {
                Ok(guard) => {
                    return Ok(Leadership {
                        name: name.to_owned(),
                        guard,
                    })
                }
                Err(e) if campaign_goes_on(&e) => tracing::debug!(
                    target: "redlock",
                    leader = name,
                    key = key.full(),
                    backend = self.backend_name(),
                    error = %chain(&e),
                    "not elected yet; campaigning on"
                ),
                Err(e) => return Err(e),
            }
            tokio::time::sleep_until(round).await;
        }
    }

    /// Runs `body` while leader of `name`: campaigns as [`leader`](Self::leader) does,
    /// calls `body(term)` once elected, and when leadership is lost before the body
    /// returns, drops the body's future (at its next `.await`, as the macro's
    /// `on_lost = "abort"` does) and campaigns again, calling `body` anew with the next
    /// term. When the body returns, resigns (a failure to resign is logged: the ttl frees
    /// the name) and returns its output.
    ///
    /// The term is the leadership's fencing token: pass it with every write the body
    /// makes, so that a resource can refuse the writes of a former leader that has not
    /// noticed its loss yet (a paused process).
    ///
    /// # Errors
    /// As [`leader`](Self::leader), from any of the campaigns.
    ///
    /// # Cancel safety
    /// Dropping the future drops the body's and resigns in the background.
    ///
    /// # Examples
    ///
    /// A worker that must run on exactly one instance:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let done = locks
    ///     .lead("nightly-export", |term| async move {
    ///         // ... the job, writing with `term` as its fencing token ...
    ///         format!("exported under term {term}")
    ///     })
    ///     .await?;
    /// assert!(done.starts_with("exported"));
    /// assert!(locks.leader_info("nightly-export").await?.is_none()); // resigned
    /// # Ok(()) }
    /// ```
    pub async fn lead<F, Fut, T>(&self, name: &str, body: F) -> Result<T, LockError>
    where
        F: FnMut(u64) -> Fut,
        Fut: Future<Output = T>,
    {
        self.lead_with(name, LockOptions::new(), body).await
    }

    /// [`lead`](Self::lead) with explicit options, as [`leader_with`](Self::leader_with)
    /// takes them (for every campaign).
    ///
    /// # Errors
    /// As [`leader_with`](Self::leader_with).
    ///
    /// # Cancel safety
    /// As [`lead`](Self::lead).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let opts = LockOptions::new().ttl(Duration::from_secs(3));
    /// let mut terms = Vec::new();
    /// let runs = locks
    ///     .lead_with("rebalancer", opts, |term| {
    ///         terms.push(term);
    ///         async { 1 }
    ///     })
    ///     .await?;
    /// assert_eq!((runs, terms.len()), (1, 1));
    /// # Ok(()) }
    /// ```
    pub async fn lead_with<F, Fut, T>(
        &self,
        name: &str,
        options: LockOptions,
        mut body: F,
    ) -> Result<T, LockError>
    where
        F: FnMut(u64) -> Fut,
        Fut: Future<Output = T>,
    {
        loop {
            let leadership = self.leader_with(name, options.clone()).await?;
            let term = leadership.fencing_token();
            tokio::select! {
                biased;
                () = leadership.lost() => tracing::info!(
                    target: "redlock",
                    leader = name,
                    term,
                    backend = self.backend_name(),
                    "leadership lost: the leader's work is stopped; campaigning again"
                ),
                output = body(term) => {
                    if let Err(e) = leadership.resign().await {
                        tracing::warn!(
                            target: "redlock",
                            leader = name,
                            term,
                            backend = self.backend_name(),
                            error = %chain(&e),
                            "resigning after the leader's work failed"
                        );
                    }
                    return Ok(output);
                }
            }
        }
    }
}

/// Being the leader of a name: an exclusive lock on the name's leader key, renewed by
/// the manager's watchdog while this lives. Dropping it resigns in the background (as a
/// dropped [`LockGuard`] releases); [`resign`](Self::resign) does it now.
///
/// Leadership can be lost without a resignation: the process paused or was cut off
/// past its ttl, or an operator removed the lock. [`is_held`](Self::is_held) turns false
/// at once then (it also counts the local lease deadline), and [`lost`](Self::lost)
/// resolves. The term ([`fencing_token`](Self::fencing_token)) strictly increases from
/// one leadership of a name to the next, so a resource that keeps the highest term it
/// saw refuses a former leader's late writes.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), redlock::LockError> {
/// use redlock::LockManager;
///
/// let locks = LockManager::builder().in_memory().build().await?;
/// let leadership = locks.leader("scheduler").await?;
/// assert_eq!(leadership.name(), "scheduler");
/// println!("{leadership:?}"); // Leadership { name: "scheduler", term: 1, held: true }
/// leadership.resign().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the leadership resigns at once"]
pub struct Leadership {
    name: String,
    guard: LockGuard,
}

impl Leadership {
    /// The name it was elected for (as given to [`leader`](LockManager::leader)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// let locks = redlock::LockManager::builder().in_memory().build().await?;
    /// let leadership = locks.leader("scheduler").await?;
    /// assert_eq!(leadership.name(), "scheduler");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The term: the fencing token of the leader's lock, strictly increasing from one
    /// leadership of the name to the next (including after a leader's lease expired),
    /// never 0. Hand it to every resource the leader writes to.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// let locks = redlock::LockManager::builder().in_memory().build().await?;
    /// let first = locks.leader("scheduler").await?;
    /// let term = first.fencing_token();
    /// first.resign().await?;
    /// let second = locks.leader("scheduler").await?;
    /// assert!(second.fencing_token() > term);
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> u64 {
        self.guard.fencing_token()
    }

    /// Whether this is still the leader: not resigned, not known lost, and the lease's
    /// local deadline has not passed (a process resumed after a long pause sees `false`
    /// at once, before any reply from the server).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// let locks = redlock::LockManager::builder().in_memory().build().await?;
    /// let leadership = locks.leader("scheduler").await?;
    /// assert!(leadership.is_held());
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        self.guard.is_held()
    }

    /// Resolves when leadership is lost: a renewal found the lock gone or taken, or the
    /// lease's deadline passed without a renewal. Never while renewals succeed. Loss is
    /// terminal: campaign again (or use [`lead`](LockManager::lead), which does).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future changes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let opts = LockOptions::new().ttl(Duration::from_millis(300));
    /// let leadership = locks.leader_with("scheduler", opts).await?;
    /// locks.force_unlock("leader:{scheduler}").await?; // an operator removes the lock
    /// tokio::select! {
    ///     () = tokio::time::sleep(Duration::from_secs(10)) => unreachable!(),
    ///     () = leadership.lost() => {} // stop leading
    /// }
    /// assert!(!leadership.is_held());
    /// # Ok(()) }
    /// ```
    pub async fn lost(&self) {
        self.guard.lost().await;
    }

    /// Resigns now: releases the leader's lock, whose release notification wakes the
    /// followers, one of which is elected within a few round trips.
    ///
    /// # Errors
    /// As [`LockGuard::release`]: [`LockError::Lost`] when leadership had been lost
    /// already, [`LockError::Backend`] when Redis failed (the release is retried in the
    /// background; the ttl is the last resort).
    ///
    /// # Cancel safety
    /// If the future is dropped before it completes, the resignation still happens in
    /// the background.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// let locks = redlock::LockManager::builder().in_memory().build().await?;
    /// let leadership = locks.leader("scheduler").await?;
    /// leadership.resign().await?;
    /// assert!(locks.leader_info("scheduler").await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn resign(self) -> Result<(), LockError> {
        self.guard.release().await
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("name", &self.name)
            .field("term", &self.guard.fencing_token())
            .field("held", &self.guard.is_held())
            .finish()
    }
}
