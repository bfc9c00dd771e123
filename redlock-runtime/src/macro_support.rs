//! What `#[distributed_lock]` expansions call. Not a public API: reached only through
//! the facade's hidden `__private` module, and free to change in any release.

use std::future::Future;
use std::time::Duration;

use crate::key::LockKey;
use crate::{LockError, LockGuard, LockKind, LockManager, LockOptions, MultiGuard};

pub use crate::kind::Mode;
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
    /// `mode = "…"` or `permits = n`; [`enter_all`] takes every key exclusively.
    pub kind: Mode,
    /// `ttl = "…"`, else the manager's default.
    pub ttl: Option<Duration>,
    /// `wait = "…"`, else the manager's default.
    pub wait: Option<Duration>,
    /// `hold_at_least = "…"`, else none.
    pub hold_at_least: Option<Duration>,
    /// `watchdog = …` (default true).
    pub watchdog: bool,
    /// `on_lost = "abort"` (the default) rather than `"continue"`.
    pub abort_on_lost: bool,
    /// The key template (the templates of `keys`, `, `-separated): the metrics' `name`.
    pub name: &'static str,
}

impl CallOptions {
    fn lock_options(&self) -> LockOptions {
        let mut options = LockOptions::new().watchdog(self.watchdog);
        options.ttl = self.ttl;
        options.wait = self.wait;
        options.hold_at_least = self.hold_at_least;
        options.name(self.name)
    }
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

/// Validates a key built in a [`key_buffer`].
fn lock_key(manager: &LockManager, full_key: String) -> Result<LockKey, LockError> {
    if full_key.len() == manager.prefix().len() {
        return Err(LockError::InvalidKey {
            reason: "the key is empty".into(),
        });
    }
    LockKey::new(manager.prefix(), full_key)
}

/// Acquires `full_key` in the kind of `options`. An exclusive or fair call re-enters
/// the key when an exclusive or fair call further up this task's call chain holds it on
/// the same `manager` (or a clone of it); read and permit calls always acquire.
pub async fn enter(
    manager: LockManager,
    full_key: String,
    options: CallOptions,
) -> Result<Call, LockError> {
    let mode = options.kind;
    let outer = match mode {
        Mode::Exclusive | Mode::Fair => HELD
            .try_with(|held| {
                held.iter()
                    .find(|h| h.manager.same_as(&manager) && h.guard.key() == full_key)
                    .map(|h| h.guard.view())
            })
            .ok()
            .flatten(),
        Mode::Read | Mode::Permit(_) => None,
    };
    if let Some(guard) = outer {
        return Ok(Call {
            manager,
            guard,
            owner: false,
            abort_on_lost: options.abort_on_lost,
        });
    }
    let key = lock_key(&manager, full_key)?;
    let resolved = manager.resolve(&options.lock_options())?;
    let guard = manager.acquire(key, mode, resolved).await?;
    Ok(Call {
        manager,
        guard,
        owner: true,
        abort_on_lost: options.abort_on_lost,
    })
}

/// Acquires every key exclusively, all or nothing (`keys = [...]`); keys built equal
/// are taken once. Never re-enters: a key held further up the call chain is waited for
/// like any other.
pub async fn enter_all<I>(
    manager: LockManager,
    full_keys: I,
    options: CallOptions,
) -> Result<Call<MultiGuard>, LockError>
where
    I: IntoIterator<Item = String>,
{
    let mut keys = full_keys
        .into_iter()
        .map(|full_key| lock_key(&manager, full_key))
        .collect::<Result<Vec<_>, _>>()?;
    keys.sort_unstable_by(|a, b| a.full().cmp(b.full()));
    keys.dedup_by(|a, b| a.full() == b.full());
    let resolved = manager.resolve(&options.lock_options())?;
    let guard = manager.acquire_all(keys, resolved).await?;
    Ok(Call {
        manager,
        guard,
        owner: true,
        abort_on_lost: options.abort_on_lost,
    })
}

/// What a call holds: one lock ([`LockGuard`]) or several ([`MultiGuard`]).
pub trait CallGuard {
    /// Resolves when the lock (any of the locks) is lost.
    fn lost(&self) -> impl Future<Output = ()> + Send;
    /// The error a body aborted by the loss returns: `Lost` with the key, or with
    /// every key (comma-separated) of a [`MultiGuard`].
    fn lost_error(&self) -> LockError;
    /// Releases the lock(s), logging a failure.
    fn release_or_warn(self) -> impl Future<Output = ()> + Send;
    /// The lock nested calls may re-enter: an exclusive [`LockGuard`] only.
    fn reentrant(&self) -> Option<LockGuard>;
}

impl CallGuard for LockGuard {
    fn lost(&self) -> impl Future<Output = ()> + Send {
        LockGuard::lost(self)
    }

    fn lost_error(&self) -> LockError {
        LockError::Lost {
            key: self.key().to_owned(),
        }
    }

    fn release_or_warn(self) -> impl Future<Output = ()> + Send {
        LockGuard::release_or_warn(self)
    }

    fn reentrant(&self) -> Option<LockGuard> {
        matches!(self.kind(), LockKind::Exclusive | LockKind::Fair).then(|| self.view())
    }
}

impl CallGuard for MultiGuard {
    fn lost(&self) -> impl Future<Output = ()> + Send {
        MultiGuard::lost(self)
    }

    fn lost_error(&self) -> LockError {
        LockError::Lost {
            key: self.keys().join(", "),
        }
    }

    fn release_or_warn(self) -> impl Future<Output = ()> + Send {
        MultiGuard::release_or_warn(self)
    }

    fn reentrant(&self) -> Option<LockGuard> {
        None
    }
}

/// One annotated call holding (or re-entering) its lock(s).
#[derive(Debug)]
pub struct Call<G = LockGuard> {
    manager: LockManager,
    guard: G,
    owner: bool,
    abort_on_lost: bool,
}

impl<G: CallGuard> Call<G> {
    /// The lock(s), for `guard = name`.
    pub fn guard(&self) -> &G {
        &self.guard
    }

    /// Runs the body where re-entrant calls can see this call's exclusive lock; with
    /// `on_lost = "abort"` the body is dropped and `Err(Lost)` returned as soon as the
    /// lock is lost.
    pub async fn run<F, T, E>(&self, body: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<LockError>,
    {
        let mut held: Vec<Held> = HELD
            .try_with(|held| held.iter().map(Held::view).collect())
            .unwrap_or_default();
        if let (true, Some(guard)) = (self.owner, self.guard.reentrant()) {
            held.push(Held {
                manager: self.manager.clone(),
                guard,
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
            () = self.guard.lost() => Err(E::from(self.guard.lost_error())),
            result = body => result,
        }
    }

    /// Releases the lock(s) if this call acquired them.
    pub async fn finish(self) {
        if !self.owner {
            return;
        }
        self.guard.release_or_warn().await;
    }
}
