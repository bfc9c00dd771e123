//! Support for redlock's fault-injection suite (`tests/faults/`): what the tests and the
//! `fault-holder` process share.
//!
//! * [`clock`]: one monotonic clock readable from every process of the machine, so the
//!   critical sections of a killed or paused holder process and of in-process clients
//!   can be put on one time line.
//! * [`resource`]: a *fenced* resource kept in Redis: it remembers the highest fencing
//!   token it has seen and rejects anyone older (Kleppmann's storage-side check).
//! * [`history`]: a recorder of critical sections (client, fencing token, enter, exit) and
//!   the checker of the suite's invariants: no overlap unless a holder lost its lease and
//!   the resource rejected it; tokens strictly increasing in grant order; the protected
//!   counter exact.
//! * [`belief`]: the randomized nemesis's checker: every grant and the last instant its
//!   holder's `is_held()` answered true; reports overlaps of belief and fencing-order
//!   violations, conservatively.
//! * [`liveness`]: the nemesis's wake-up checker: from polls of each key's state on the
//!   server, the waiters and the calm spells, the worst gap between a key becoming
//!   grantable and a waiter being granted; reports gaps over a bound, conservatively.
//! * [`protocol`]: the line protocol between the tests and the `fault-holder` process.
//!
//! Not published; not an API.
#![warn(missing_docs, unreachable_pub)]

pub mod belief;
pub mod clock;
pub mod history;
pub mod liveness;
pub mod protocol;
pub mod resource;
