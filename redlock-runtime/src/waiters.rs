//! The bounded local FIFO of tasks waiting for a key, and their wake-ups.
//!
//! Per key, this process keeps one [`KeyQueue`]: a one-permit fair semaphore decides
//! which local task is the *head* (the only one contending on the backend); the others
//! wait their turn in arrival order without touching the network. A release seen by
//! this process (its own, or a notification from the server) wakes the head through
//! [`Notify::notify_waiters`]; the head enables its `Notified` before each attempt, so a
//! release between a failed attempt and the wait is never missed.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio::sync::{Notify, Semaphore};

use crate::stats;

/// Called with a key whose queue emptied while it held an interest in the key's channel.
pub(crate) type OnUnsubscribe = Box<dyn Fn(&str) + Send + Sync>;

/// All keys this process is waiting for.
pub(crate) struct Waiters {
    max_per_key: usize,
    keys: Mutex<HashMap<String, Entry>>,
    on_unsubscribe: OnUnsubscribe,
}

impl std::fmt::Debug for Waiters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiters")
            .field("max_per_key", &self.max_per_key)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Entry {
    queue: Arc<KeyQueue>,
    waiting: usize,
}

/// The local queue of one key.
#[derive(Debug)]
pub(crate) struct KeyQueue {
    /// One permit: whoever holds it is the head.
    pub(crate) turn: Semaphore,
    /// Woken on every release of the key seen by this process.
    pub(crate) wake: Notify,
    /// Whom the wake-ups were for: a fair lock's release names the one waiter whose
    /// turn it is, and the others sleep on.
    calls: Mutex<Calls>,
    /// Whether the queue holds an interest in the key's wake-up channel
    /// ([`Subscription`]).
    subscription: AtomicU8,
}

/// Where a queue stands with the key's wake-up channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Subscription {
    /// No interest: nothing to undo when the queue empties.
    None,
    /// An interest was registered and `SUBSCRIBE` sent (or about to be), unconfirmed:
    /// the request may have been cancelled or failed after reaching the server, so the
    /// interest is dropped (and the channel unsubscribed) when the queue empties.
    Asked,
    /// The server confirmed the subscription.
    Confirmed,
}

/// Whom a wake-up is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    /// Every waiter of the key (the key was freed, or its hold got shorter).
    Anyone,
    /// The fair waiter with this id: its turn has come (a fair lock's release, or a
    /// first place left behind by a dropped one).
    Waiter(u64),
}

impl Call {
    /// Whom a release's published payload calls: a fair waiter by `w:<id>`, or anyone
    /// ('' for free, 'kept', a permit release's count, anything else).
    pub(crate) fn of_payload(payload: &[u8]) -> Self {
        std::str::from_utf8(payload)
            .ok()
            .and_then(|p| p.strip_prefix("w:"))
            .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|id| id.parse().ok())
            .map_or(Self::Anyone, Self::Waiter)
    }
}

/// The recent wake-ups of a key: how many called anyone, and the waiters named.
#[derive(Debug, Default)]
struct Calls {
    anyone: u64,
    named: VecDeque<u64>,
}

/// The most named calls a key remembers: a call nobody takes (its waiter is gone)
/// is forgotten after this many more.
const NAMED_CALLS: usize = 64;

impl KeyQueue {
    fn calls(&self) -> MutexGuard<'_, Calls> {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many wake-ups for anyone there were so far: [`called`](Self::called) compares
    /// with it.
    pub(crate) fn calls_for_anyone(&self) -> u64 {
        self.calls().anyone
    }

    /// Whether a wake-up since `anyone` (what [`calls_for_anyone`](Self::calls_for_anyone)
    /// said) was for fair waiter `waiter`: one for anyone, or one naming it (taken).
    pub(crate) fn called(&self, waiter: u64, anyone: u64) -> bool {
        let mut calls = self.calls();
        if let Some(i) = calls.named.iter().position(|&w| w == waiter) {
            calls.named.remove(i);
            return true;
        }
        calls.anyone != anyone
    }

    /// Records a wake-up, then wakes the queue's waiters.
    fn call(&self, call: Call) {
        {
            let mut calls = self.calls();
            match call {
                Call::Anyone => calls.anyone += 1,
                Call::Waiter(w) => {
                    if calls.named.len() == NAMED_CALLS {
                        calls.named.pop_front();
                    }
                    calls.named.push_back(w);
                }
            }
        }
        self.wake.notify_waiters();
    }

    /// Where the queue stands with the key's channel.
    pub(crate) fn subscription(&self) -> Subscription {
        match self.subscription.load(Ordering::Acquire) {
            0 => Subscription::None,
            1 => Subscription::Asked,
            _ => Subscription::Confirmed,
        }
    }

    /// Takes the queue's interest in the key's channel for the caller, if nobody took
    /// it yet: true when the caller registers it. (A key's fair waiters in one process
    /// are all heads, and may ask at once.)
    pub(crate) fn claim_subscription(&self) -> bool {
        self.subscription
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Records where the queue stands (only its heads call this).
    pub(crate) fn set_subscription(&self, state: Subscription) {
        let n = match state {
            Subscription::None => 0,
            Subscription::Asked => 1,
            Subscription::Confirmed => 2,
        };
        self.subscription.store(n, Ordering::Release);
    }
}

/// A task's place in a key's queue; leaving it (drop) frees the slot.
#[derive(Debug)]
pub(crate) struct Place<'a> {
    waiters: &'a Waiters,
    key: &'a str,
    pub(crate) queue: Arc<KeyQueue>,
}

impl Waiters {
    pub(crate) fn new(max_per_key: usize, on_unsubscribe: OnUnsubscribe) -> Self {
        Self {
            max_per_key,
            keys: Mutex::new(HashMap::new()),
            on_unsubscribe,
        }
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The most tasks that may wait for one key here (and the most places a fair
    /// lock's queue on the server may hold).
    pub(crate) fn max_per_key(&self) -> usize {
        self.max_per_key
    }

    /// Whether any local task is queued for `key` (then newcomers queue behind it).
    pub(crate) fn is_queued(&self, key: &str) -> bool {
        self.keys().contains_key(key)
    }

    /// Joins the queue of `key`, or `None` when it already has `max_per_key` tasks.
    pub(crate) fn join<'a>(&'a self, key: &'a str) -> Option<Place<'a>> {
        let mut keys = self.keys();
        let entry = keys.entry(key.to_owned()).or_insert_with(|| Entry {
            queue: Arc::new(KeyQueue {
                turn: Semaphore::new(1),
                wake: Notify::new(),
                calls: Mutex::default(),
                subscription: AtomicU8::new(0),
            }),
            waiting: 0,
        });
        if entry.waiting >= self.max_per_key {
            return None;
        }
        entry.waiting += 1;
        stats::waiters(1.0);
        Some(Place {
            waiters: self,
            key,
            queue: entry.queue.clone(),
        })
    }

    /// Wakes the head waiting for `key`, if any.
    pub(crate) fn wake(&self, key: &str) {
        self.wake_for(key, Call::Anyone);
    }

    /// Wakes the waiters of `key` that `call` is for.
    pub(crate) fn wake_for(&self, key: &str, call: Call) {
        let queue = self.keys().get(key).map(|entry| entry.queue.clone());
        if let Some(queue) = queue {
            queue.call(call);
        }
    }

    /// Wakes every head (after a reconnect: notifications may have been lost).
    pub(crate) fn wake_all(&self) {
        let queues: Vec<_> = self.keys().values().map(|e| e.queue.clone()).collect();
        for queue in queues {
            queue.call(Call::Anyone);
        }
    }

    /// Leaves a queue; the last one out releases the key's channel.
    fn leave(&self, key: &str) {
        stats::waiters(-1.0);
        let emptied = {
            let mut keys = self.keys();
            let Some(entry) = keys.get_mut(key) else {
                return;
            };
            entry.waiting -= 1;
            if entry.waiting > 0 {
                return;
            }
            keys.remove(key)
        };
        if emptied.is_some_and(|e| e.queue.subscription() != Subscription::None) {
            (self.on_unsubscribe)(key);
        }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.waiters.leave(self.key);
    }
}

/// A backend's handle on the manager's waiters: all it may do is wake them. Weak, so
/// that a backend's tasks (and the process-wide in-memory store) never keep a dropped
/// manager's waiters alive; once the manager is gone, waking does nothing.
#[derive(Clone, Default)]
pub(crate) struct Wake(Weak<Waiters>);

impl Wake {
    pub(crate) fn new(waiters: &Arc<Waiters>) -> Self {
        Self(Arc::downgrade(waiters))
    }

    /// Wakes the head waiting for `key`, if any (a release was heard).
    pub(crate) fn wake(&self, key: &str) {
        self.wake_for(key, Call::Anyone);
    }

    /// Wakes the waiters of `key` that `call` is for (a release was heard).
    pub(crate) fn wake_for(&self, key: &str, call: Call) {
        if let Some(waiters) = self.0.upgrade() {
            waiters.wake_for(key, call);
        }
    }

    /// Wakes every head (after a reconnect: notifications may have been lost).
    pub(crate) fn wake_all(&self) {
        if let Some(waiters) = self.0.upgrade() {
            waiters.wake_all();
        }
    }

    /// Whether the manager is gone (nobody is left to wake).
    pub(crate) fn is_gone(&self) -> bool {
        self.0.strong_count() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_call_a_fair_waiter_by_its_prefixed_id_and_anyone_else() {
        assert_eq!(Call::of_payload(b"w:42"), Call::Waiter(42));
        for anyone in [
            &b""[..],
            b"kept",
            b"3",
            b"w:",
            b"w:4x",
            b"w:99999999999999999999",
        ] {
            assert_eq!(Call::of_payload(anyone), Call::Anyone, "{anyone:?}");
        }
    }

    #[test]
    fn a_named_call_is_taken_once_and_a_call_for_anyone_reaches_all() {
        let w = Waiters::new(8, Box::new(|_| {}));
        let place = w.join("k").unwrap();
        let anyone = place.queue.calls_for_anyone();
        w.wake_for("k", Call::Waiter(7));
        assert!(!place.queue.called(8, anyone), "someone else's call");
        assert!(place.queue.called(7, anyone));
        assert!(!place.queue.called(7, anyone), "taken once");
        w.wake("k");
        assert!(place.queue.called(8, anyone) && place.queue.called(7, anyone));
    }

    #[test]
    fn the_queue_is_bounded_and_removed_when_empty() {
        let released = Arc::new(Mutex::new(Vec::new()));
        let seen = released.clone();
        let w = Waiters::new(
            2,
            Box::new(move |k| seen.lock().unwrap().push(k.to_owned())),
        );
        let a = w.join("k").unwrap();
        let b = w.join("k").unwrap();
        assert!(w.join("k").is_none());
        assert!(w.is_queued("k"));
        drop(a);
        b.queue.set_subscription(Subscription::Asked);
        assert!(released.lock().unwrap().is_empty());
        drop(b);
        assert!(!w.is_queued("k"));
        assert_eq!(*released.lock().unwrap(), ["k"]);
    }
}
