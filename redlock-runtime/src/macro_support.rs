//! What `#[distributed_lock]` expansions call. Not a public API: reached only through
//! the facade's hidden `__private` module, and free to change in any release.

use std::future::Future;
use std::time::Duration;

use crate::key::LockKey;
use crate::kind::Mode;
use crate::{LockError, LockGuard, LockManager, LockOptions};

pub use ::core;
pub use ::std;
pub use std::time::Duration as StdDuration;

tokio::task_local! {
    /// The locks held by the annotated calls of this task's call chain.
    static HELD: Vec<Held>;
}

/// A lock held further up the call chain, with the manager it was taken on: reentrancy
/// is per (manager, key), since the same key on another manager is another lock.
struct Held {
    manager: LockManager,
    guard: LockGuard,
}

impl Held {
    /// A non-owning copy, for the scope of a nested call.
    fn view(&self) -> Self {
        Self {
            manager: self.manager.clone(),
            guard: self.guard.view(),
        }
    }
}

/// The options written in the attribute.
#[derive(Debug, Clone, Copy)]
pub struct CallOptions {
    /// `ttl = "…"`, else the manager's default.
    pub ttl: Option<Duration>,
    /// `wait = "…"`, else the manager's default.
    pub wait: Option<Duration>,
    /// `watchdog = …` (default true).
    pub watchdog: bool,
    /// `on_lost = "abort"` (the default) rather than `"continue"`.
    pub abort_on_lost: bool,
}

/// The explicit manager, else the global one: a clone (an `Arc` inside), which
/// [`enter`] keeps for the call.
pub fn resolve_manager(explicit: Option<&LockManager>) -> Result<LockManager, LockError> {
    explicit
        .cloned()
        .or_else(LockManager::global)
        .ok_or(LockError::NoManager)
}

/// A string starting with the manager's prefix, with room for `capacity` more bytes.
pub fn key_buffer(manager: &LockManager, capacity: usize) -> String {
    manager.key_buffer(capacity)
}

/// Acquires `full_key`, or re-enters it when an annotated call further up this task's
/// call chain holds it on the same `manager` (or a clone of it).
pub async fn enter(
    manager: LockManager,
    full_key: String,
    options: CallOptions,
) -> Result<Call, LockError> {
    let outer = HELD
        .try_with(|held| {
            held.iter()
                .find(|h| h.manager.same_as(&manager) && h.guard.key() == full_key)
                .map(|h| h.guard.view())
        })
        .ok()
        .flatten();
    if let Some(guard) = outer {
        return Ok(Call {
            manager,
            guard,
            owner: false,
            abort_on_lost: options.abort_on_lost,
        });
    }
    if full_key.len() == manager.prefix().len() {
        return Err(LockError::InvalidKey {
            reason: "the key is empty".into(),
        });
    }
    let mut lock_options = LockOptions::new().watchdog(options.watchdog);
    lock_options.ttl = options.ttl;
    lock_options.wait = options.wait;
    let resolved = manager.resolve(&lock_options)?;
    let guard = manager
        .acquire(
            LockKey::new(manager.prefix(), full_key)?,
            Mode::Exclusive,
            resolved,
        )
        .await?;
    Ok(Call {
        manager,
        guard,
        owner: true,
        abort_on_lost: options.abort_on_lost,
    })
}

/// One annotated call holding (or re-entering) its lock.
#[derive(Debug)]
pub struct Call {
    manager: LockManager,
    guard: LockGuard,
    owner: bool,
    abort_on_lost: bool,
}

impl Call {
    /// The lock, for `guard = name`.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Runs the body where re-entrant calls can see this lock; with `on_lost = "abort"`
    /// the body is dropped and `Err(Lost)` returned as soon as the lock is lost.
    pub async fn run<F, T, E>(&self, body: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<LockError>,
    {
        let mut held: Vec<Held> = HELD
            .try_with(|held| held.iter().map(Held::view).collect())
            .unwrap_or_default();
        if self.owner {
            held.push(Held {
                manager: self.manager.clone(),
                guard: self.guard.view(),
            });
        }
        let body = HELD.scope(held, body);
        if !self.abort_on_lost {
            return body.await;
        }
        // Loss first: once the lease is lost the body is never polled again. Polled
        // second, a body whose awaits complete without yielding (a fast reply, a
        // descheduled thread) would run on for several steps after the loss was known.
        tokio::select! {
            biased;
            () = self.guard.lost() => Err(E::from(LockError::Lost {
                key: self.guard.key().to_owned(),
            })),
            result = body => result,
        }
    }

    /// Releases the lock if this call acquired it.
    pub async fn finish(self) {
        if !self.owner {
            return;
        }
        let key = self.guard.key().to_owned();
        if let Err(e) = self.guard.release().await {
            tracing::warn!(key, error = %e, "release after the call failed");
        }
    }
}
