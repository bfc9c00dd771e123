//! What crosses the network, typed: an acquisition's request and the stores' replies
//! (`request`, `reply`), the lease a held lock's requests name and the replicas every
//! request that sets its expiry waits for, and how a script tells the waiters
//! ([`Publish`]). The scripts themselves are `scripts`' (one `.lua` per operation).

mod reply;
mod request;

pub(crate) use reply::{Attempt, Renewed, Together};
pub(crate) use request::{Arrival, Claim, Intent, Purpose, Seen};

use std::time::Duration;

use redis::{RedisWrite, ToRedisArgs};

use crate::key::LockKey;
use crate::kind::Mode;
use crate::token::Token;

/// A held lock, as its release and extends name it.
///
/// Every request on a lease carries this (renewals its fields): what a lease's requests
/// must all obey travels with it. A backend that has replicas applies `replicas` to
/// every request that sets the expiry (extend, renewal, a release that keeps the key):
/// such a request counts only once that many replicas acknowledged it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseRef<'a> {
    pub(crate) key: &'a LockKey,
    pub(crate) token: Token,
    /// The key alone, or a shared holder's place in it.
    pub(crate) mode: Mode,
    /// The lease's `min_replicas`, if any.
    pub(crate) replicas: Option<ReplicaWait>,
}

impl<'a> LeaseRef<'a> {
    /// A lease without replicas to wait for (an attempt's undo, a Redlock node's part).
    pub(crate) fn new(key: &'a LockKey, token: Token, mode: Mode) -> Self {
        Self {
            key,
            token,
            mode,
            replicas: None,
        }
    }
}

/// What to `WAIT` for after every request that sets a lease's expiry (`min_replicas`):
/// the acquire, and every extend, renewal and keep of the lease it grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaWait {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

/// One lock the watchdog renews.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewal<'a> {
    pub(crate) key: &'a LockKey,
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
    /// The key alone, or a shared holder's place in it.
    pub(crate) mode: Mode,
    /// The lease's `min_replicas`: the renewal counts only once acknowledged by them.
    pub(crate) replicas: Option<ReplicaWait>,
}

/// How a script tells the waiters of a key that it was freed or that its hold got
/// shorter: the command it runs on the key's channel (a script's publish argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Publish {
    /// `PUBLISH`: a single server, a Sentinel deployment's master, a Redlock node.
    Channel,
    /// `SPUBLISH`: a Cluster, where the owner of the key's slot delivers it.
    Shard,
    /// Nothing: a Redlock undo, which would wake the undoing caller itself.
    Nobody,
}

impl Publish {
    /// The command, as the scripts take it (`""` for [`Publish::Nobody`]).
    pub(crate) fn command(self) -> &'static str {
        match self {
            Publish::Channel => "PUBLISH",
            Publish::Shard => "SPUBLISH",
            Publish::Nobody => "",
        }
    }
}

impl ToRedisArgs for Publish {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        out.write_arg(self.command().as_bytes());
    }
}

/// A script's yes-or-no argument, as the scripts read it: `1` or `0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flag(pub(crate) bool);

impl Flag {
    /// The argument's bytes.
    pub(crate) fn arg(self) -> &'static [u8] {
        if self.0 {
            b"1"
        } else {
            b"0"
        }
    }
}
