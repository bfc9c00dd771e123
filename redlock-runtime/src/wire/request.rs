//! What an acquisition asks the stores for ([`Claim`], with a writer's [`Intent`] or a
//! fair waiter's [`Arrival`]), and
//! the grant an operator's force-unlock names ([`Seen`]).

use std::time::Duration;

use super::ReplicaWait;
use crate::info::LockInfo;
use crate::key::LockKey;
use crate::kind::Mode;
use crate::token::Token;

/// One acquisition attempt's request: what the backend writes for a new lock.
///
/// A struct, not an argument list, so that new lock kinds add a field here instead of
/// a parameter to every backend.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim<'a> {
    pub(crate) key: &'a LockKey,
    /// The attempt's owner token (fresh per attempt).
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
    /// What to `WAIT` for after acquiring, if anything.
    pub(crate) replicas: Option<ReplicaWait>,
    /// The key alone, a reader's place, or one of `n` permits.
    pub(crate) mode: Mode,
    /// A writer's intent, kept by the server while readers hold the key (exclusive
    /// claims only): readers arriving meanwhile queue behind the writer.
    pub(crate) intent: Option<Intent>,
    /// A fair waiter's place in the key's queue (fair claims only; `None`: one attempt
    /// that does not queue, granted only when nobody is queued).
    pub(crate) arrival: Option<Arrival>,
}

/// A fair waiter's place in a key's queue, kept by the server while the waiter asks
/// again within its heartbeat (`acquire_fair.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Arrival {
    /// The waiter (one per `fair` call, the same for all its attempts).
    pub(crate) waiter: u64,
    /// Its place in the order of arrival: 0 before the server gave it one, then the
    /// ticket the last attempt was told (a place dropped meanwhile comes back there).
    pub(crate) ticket: u64,
    /// How long the place lasts without another attempt.
    pub(crate) heartbeat: Duration,
    /// The most places the queue may hold (the manager's `max_waiters_per_key`).
    pub(crate) bound: usize,
    /// What the attempt is for.
    pub(crate) purpose: Purpose,
}

/// What a fair waiter's attempt is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// The lock, at its turn (and the place kept meanwhile).
    Acquire,
    /// The place alone, at the ticket carried, never a grant: a Redlock waiter settling
    /// one ticket on every node (see `backend/redlock/fair.rs`).
    Settle,
}

/// A waiting writer's intent: while it is registered, new readers are refused.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Intent {
    /// The writer's wait (one per `lock` call, the same for all its attempts).
    pub(crate) waiter: u64,
    /// How long the intent holds: the writer's remaining wait. A grant to the writer
    /// withdraws it, whatever earlier attempts were told: one may have registered it
    /// with its reply lost.
    pub(crate) until: Duration,
}

/// The grant an operator was shown (by `inspect` or `list`): a force-unlock given one
/// deletes the lock only while no later grant holds it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen<'a> {
    /// The holder's digest as [`LockInfo::holder`] names it; `None`: any (a Redlock
    /// permit's places, each held by a token of its own).
    pub(crate) holder: Option<&'a str>,
    /// The latest grant's fencing token; a lock whose grant has a greater one was
    /// granted after it. `None`: any (a value written before metadata existed).
    pub(crate) fence: Option<u64>,
}

impl<'a> Seen<'a> {
    /// The grant `info` shows.
    pub(crate) fn of(info: &'a LockInfo) -> Self {
        Self {
            holder: Some(&info.holder),
            fence: info.fencing_token,
        }
    }

    /// Whether a lock held by `holder` with the latest grant `fence` is still the one
    /// shown.
    pub(crate) fn admits(&self, holder: &str, fence: Option<u64>) -> bool {
        self.holder.is_none_or(|h| h == holder)
            && match (self.fence, fence) {
                (Some(shown), Some(now)) => now <= shown,
                _ => true,
            }
    }
}
