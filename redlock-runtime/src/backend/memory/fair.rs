//! Fair locks' queues in the in-memory store, as `acquire_fair.lua` keeps them on Redis:
//! per key, the waiters in the order of arrival, each place lasting until its heartbeat
//! runs out.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use crate::wire::Arrival;
use crate::LockError;

/// Every key's queue.
#[derive(Default)]
pub(super) struct Queues(HashMap<String, Queue>);

/// One key's queue: places by (ticket, waiter), and each waiter's ticket and deadline.
#[derive(Default)]
struct Queue {
    order: BTreeMap<(u64, u64), ()>,
    places: HashMap<u64, Place>,
}

#[derive(Clone, Copy)]
struct Place {
    ticket: u64,
    until: Instant,
}

impl Queue {
    fn first(&self) -> Option<u64> {
        self.order.keys().next().map(|&(_, waiter)| waiter)
    }

    fn remove(&mut self, waiter: u64) {
        if let Some(place) = self.places.remove(&waiter) {
            self.order.remove(&(place.ticket, waiter));
        }
    }
}

impl Queues {
    /// The first waiter of `key`'s queue.
    pub(super) fn first(&self, key: &str) -> Option<u64> {
        self.0.get(key).and_then(Queue::first)
    }

    /// How many places of `key`'s queue are live at `now`.
    pub(super) fn len(&self, key: &str, now: Instant) -> usize {
        self.0
            .get(key)
            .map_or(0, |q| q.places.values().filter(|p| p.until > now).count())
    }

    /// Drops the places of `key` whose heartbeat ran out by `now`.
    pub(super) fn reclaim(&mut self, key: &str, now: Instant) {
        let Some(queue) = self.0.get_mut(key) else {
            return;
        };
        let gone: Vec<u64> = (queue.places.iter())
            .filter(|(_, p)| p.until <= now)
            .map(|(&w, _)| w)
            .collect();
        for waiter in gone {
            queue.remove(waiter);
        }
        if queue.places.is_empty() {
            self.0.remove(key);
        }
    }

    /// Joins `key`'s queue, or renews the place `arrival` has (moved back to its ticket
    /// when that is later): the place's ticket. A full queue takes no new place.
    pub(super) fn join(
        &mut self,
        key: &str,
        arrival: Arrival,
        now: Instant,
    ) -> Result<u64, LockError> {
        let queue = self.0.entry(key.to_owned()).or_default();
        let until = now + arrival.heartbeat;
        let ticket = match queue.places.get(&arrival.waiter) {
            Some(place) => place.ticket.max(arrival.ticket),
            None if queue.places.len() >= arrival.bound => {
                if queue.places.is_empty() {
                    self.0.remove(key);
                }
                return Err(LockError::QueueFull {
                    key: key.to_owned(),
                });
            }
            None if arrival.ticket > 0 => arrival.ticket,
            None => queue.order.keys().next_back().map_or(1, |&(t, _)| t + 1),
        };
        queue.remove(arrival.waiter);
        queue.order.insert((ticket, arrival.waiter), ());
        queue.places.insert(arrival.waiter, Place { ticket, until });
        Ok(ticket)
    }

    /// Leaves `key`'s queue (a grant, or a waiter that stopped waiting): whether the
    /// waiter had a place.
    pub(super) fn leave(&mut self, key: &str, waiter: u64) -> bool {
        let Some(queue) = self.0.get_mut(key) else {
            return false;
        };
        let had = queue.places.contains_key(&waiter);
        queue.remove(waiter);
        if queue.places.is_empty() {
            self.0.remove(key);
        }
        had
    }

    /// Drops every expired place of every key (the store's sweep).
    pub(super) fn sweep(&mut self, now: Instant) {
        let keys: Vec<String> = self.0.keys().cloned().collect();
        for key in keys {
            self.reclaim(&key, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn arrival(waiter: u64, ticket: u64) -> Arrival {
        Arrival {
            waiter,
            ticket,
            heartbeat: Duration::from_secs(1),
            bound: 3,
            purpose: crate::wire::Purpose::Acquire,
        }
    }

    #[test]
    fn places_keep_their_order_run_out_and_are_bounded() {
        let mut q = Queues::default();
        let now = Instant::now();
        assert_eq!(q.join("k", arrival(7, 0), now).unwrap(), 1);
        assert_eq!(q.join("k", arrival(3, 0), now).unwrap(), 2);
        assert_eq!(
            q.join("k", arrival(7, 0), now).unwrap(),
            1,
            "a renewal keeps it"
        );
        assert_eq!(q.first("k"), Some(7));
        assert_eq!(q.join("k", arrival(9, 0), now).unwrap(), 3);
        assert!(matches!(
            q.join("k", arrival(10, 0), now),
            Err(LockError::QueueFull { .. })
        ));
        // 7 renews later than 3 and 9: they run out first.
        let later = now + Duration::from_millis(600);
        q.join("k", arrival(7, 1), later).unwrap();
        q.reclaim("k", now + Duration::from_secs(1));
        assert_eq!(q.len("k", now + Duration::from_secs(1)), 1);
        assert_eq!(q.first("k"), Some(7));
        q.leave("k", 7);
        assert_eq!(q.first("k"), None);
        assert!(q.0.is_empty(), "an empty queue is dropped");
    }

    #[test]
    fn a_place_dropped_or_missed_comes_back_at_its_ticket() {
        let mut q = Queues::default();
        let now = Instant::now();
        q.join("k", arrival(1, 5), now).unwrap();
        q.join("k", arrival(2, 0), now).unwrap();
        assert_eq!(q.join("k", arrival(3, 4), now).unwrap(), 4);
        assert_eq!(q.first("k"), Some(3));
        // A later ticket moves a place back (a Redlock agreement on a later one).
        assert_eq!(q.join("k", arrival(3, 9), now).unwrap(), 9);
        assert_eq!(q.first("k"), Some(1));
    }
}
