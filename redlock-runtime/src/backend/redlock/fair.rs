//! A fair lock on Redlock: one queue per node, and how the nodes agree on who is first.
//!
//! Each node keeps the key's queue as on one server (`acquire_fair.lua`), ordered by
//! (ticket, waiter id), and grants only to its first waiter while the key is free. A
//! new place takes the next ticket of its node's queue, so the nodes may give one waiter
//! different tickets; the waiter then takes the greatest of them, settles its place on
//! every node at once at that ticket (a round that moves places only, never granting),
//! and carries it on every later attempt (a node moves a place back to a greater ticket
//! it is sent, and puts a place it lacks at the ticket sent).
//!
//! Why that orders arrivals and cannot deadlock:
//! - **Order.** Once a waiter's place holds one ticket `t` on a quorum, any later
//!   arrival asks a quorum too, which shares a node with the first; that node gives the
//!   newcomer more than `t` (its queue's last ticket is at least `t`), and the newcomer
//!   takes the greatest ticket it was given. So a waiter that arrived after another's
//!   arrival completed is behind it on every node (Lamport's bakery, over quorums).
//!   Waiters whose arrivals overlapped are ordered by the tickets they settled on, the
//!   same way on every node: ties go by id, as a sorted set orders equal scores.
//! - **No deadlock.** Every node orders the waiters by the same (ticket, id), so the
//!   first live waiter by that order is first on every node that holds its place, which
//!   is a quorum once its next attempt (its heartbeat, at most a second later) has put
//!   it back where a node lacked it. Places ahead of it on some node belong to waiters
//!   that are gone: granted (their places are withdrawn on every node), stopped waiting
//!   (withdrawn) or dead (dropped by the node's clock once their heartbeat runs out).
//!   So within the heartbeat bound it is first on a quorum, and gets the key once the
//!   key is free on a quorum.
//!
//! What it does not promise: arrivals that overlap are not ordered by when they began;
//! and a grant still needs a quorum, so a waiter first on fewer nodes than a quorum
//! (some nodes down) waits as any Redlock acquisition does.

use std::sync::{Arc, Mutex};

use super::{lock, RedlockBackend};
use crate::backend::Store;
use crate::wire::{Arrival, Attempt, Claim, Purpose};
use crate::LockError;

/// What the nodes said of a fair waiter's place in one attempt.
#[derive(Debug, Default)]
pub(super) struct Tickets {
    seen: Mutex<Seen>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    /// The least and greatest ticket a node gave the place.
    least: Option<u64>,
    greatest: u64,
    /// How many nodes answered that it is not the waiter's turn.
    queued: usize,
    /// Whether any node found the key held (not only someone else's turn).
    held: bool,
    /// How many nodes refused a new place: their queue is full.
    full: usize,
}

impl Tickets {
    /// Records one node's answer.
    pub(super) fn add(&self, attempt: &Result<Attempt, LockError>) {
        let mut seen = lock(&self.seen);
        match attempt {
            Ok(Attempt::Queued {
                ticket, remaining, ..
            }) => {
                seen.least = Some(seen.least.map_or(*ticket, |l| l.min(*ticket)));
                seen.greatest = seen.greatest.max(*ticket);
                seen.queued += 1;
                seen.held |= remaining.is_some();
            }
            Ok(Attempt::Held { .. }) => seen.held = true,
            Err(e) if e.is_full_queue_reply() => seen.full += 1,
            _ => {}
        }
    }

    fn seen(&self) -> Seen {
        *lock(&self.seen)
    }
}

impl RedlockBackend {
    /// A fair waiter's attempt (see the module's docs): the quorum's vote with its
    /// place on every node. When the nodes that answered gave its place tickets other
    /// than the greatest, or some did not answer, its place is settled on every node at
    /// the greatest at once: a second round that moves places only and never grants
    /// (this attempt's undos may still be on their way, and must find nothing of it).
    pub(super) async fn acquire_fair(&self, claim: &Claim<'_>) -> Result<Attempt, LockError> {
        let tickets = Arc::new(Tickets::default());
        let attempt = self.acquire_quorum(claim, Some(&tickets)).await;
        let seen = tickets.seen();
        // Too few nodes had room for a place: a quorum cannot grant it.
        let attempt = match attempt {
            Err(_) if seen.full > self.nodes.len() - self.quorum => {
                return Err(LockError::QueueFull {
                    key: claim.key.full().to_owned(),
                })
            }
            attempt => attempt?,
        };
        let (Attempt::Held { .. }, Some(arrival)) = (attempt, claim.arrival) else {
            return Ok(attempt);
        };
        let ticket = seen.greatest.max(arrival.ticket);
        let settled = seen.queued == self.nodes.len() && seen.least == Some(ticket);
        if !settled && ticket > 0 {
            let settle = Claim {
                arrival: Some(Arrival {
                    ticket,
                    purpose: Purpose::Settle,
                    ..arrival
                }),
                ..*claim
            };
            let timeout = self.node_timeout(claim.ttl);
            self.on_all("settle", timeout, |node| node.acquire(&settle))
                .await;
        }
        Ok(queued(attempt, seen, ticket))
    }
}

/// A lost fair attempt as the waiter sees it: its ticket, and how long the key is held
/// for when a node found it held (else `None`: someone else's turn, and the waiter
/// sleeps until it is called or its heartbeat is due, never polling at the jitter's
/// pace a split vote would).
fn queued(attempt: Attempt, seen: Seen, ticket: u64) -> Attempt {
    match attempt {
        Attempt::Held { remaining, holder }
        | Attempt::Queued {
            remaining, holder, ..
        } => Attempt::Queued {
            remaining: remaining.filter(|_| seen.held),
            holder,
            ticket: ticket.max(seen.greatest),
        },
        acquired => acquired,
    }
}
