//! The in-memory backend: locks in this process's memory, same semantics as Redis.
//!
//! All in-memory managers of a process share one store, the way several managers
//! share one Redis server, so they exclude each other and wake each other's waiters.
//! Expiry is checked on access against the monotonic clock.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::Attempt;
use crate::key::LockKey;
use crate::token::Token;
use crate::waiters::Waiters;

#[derive(Default)]
struct Store {
    locks: HashMap<String, Held>,
    fences: HashMap<String, u64>,
    listeners: Vec<Weak<Waiters>>,
}

struct Held {
    token: Token,
    expires: Instant,
}

static STORE: LazyLock<Mutex<Store>> = LazyLock::new(Mutex::default);

fn store() -> MutexGuard<'static, Store> {
    STORE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A handle on the process-wide store.
pub(crate) struct MemoryBackend(());

impl MemoryBackend {
    /// Connects a manager's waiters to the store's wake-ups.
    pub(crate) fn new(waiters: Weak<Waiters>) -> Self {
        let mut s = store();
        s.listeners.retain(|w| w.strong_count() > 0);
        s.listeners.push(waiters);
        Self(())
    }

    pub(crate) fn acquire(&self, key: &LockKey, token: Token, ttl: Duration) -> Attempt {
        let now = Instant::now();
        let mut s = store();
        if let Some(held) = s.locks.get(key.full()) {
            if held.expires > now {
                if held.token == token {
                    let fence = s.fences.get(key.fence()).copied().unwrap_or(0);
                    return Attempt::Acquired {
                        fence,
                        replicas: None,
                    };
                }
                return Attempt::Held {
                    remaining: Some(held.expires - now),
                };
            }
        }
        let expires = now
            .checked_add(ttl)
            .unwrap_or(now + Duration::from_secs(1 << 32));
        s.locks
            .insert(key.full().to_owned(), Held { token, expires });
        let fence = s.fences.entry(key.fence().to_owned()).or_insert(0);
        *fence += 1;
        Attempt::Acquired {
            fence: *fence,
            replicas: None,
        }
    }

    pub(crate) fn release(&self, key: &LockKey, token: Token) -> bool {
        let listeners = {
            let mut s = store();
            let ours = s
                .locks
                .get(key.full())
                .is_some_and(|h| h.token == token && h.expires > Instant::now());
            // An expired entry of anyone is garbage either way.
            if ours
                || s.locks
                    .get(key.full())
                    .is_some_and(|h| h.expires <= Instant::now())
            {
                s.locks.remove(key.full());
            }
            if !ours {
                return false;
            }
            s.listeners.clone()
        };
        for w in listeners.iter().filter_map(Weak::upgrade) {
            w.wake(key.full());
        }
        true
    }

    pub(crate) fn extend(&self, key: &LockKey, token: Token, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut s = store();
        match s.locks.get_mut(key.full()) {
            Some(h) if h.token == token && h.expires > now => {
                h.expires = now.checked_add(ttl).unwrap_or(h.expires);
                true
            }
            _ => false,
        }
    }

    /// Deletes a lock whoever holds it; true when a live one was there.
    pub(crate) fn force_unlock(&self, key: &LockKey) -> bool {
        let (live, listeners) = {
            let mut s = store();
            let live = s
                .locks
                .remove(key.full())
                .is_some_and(|h| h.expires > Instant::now());
            (live, s.listeners.clone())
        };
        for w in listeners.iter().filter_map(Weak::upgrade) {
            w.wake(key.full());
        }
        live
    }

    /// Whether anyone holds the lock.
    pub(crate) fn is_locked(&self, key: &LockKey) -> bool {
        store()
            .locks
            .get(key.full())
            .is_some_and(|h| h.expires > Instant::now())
    }
}
