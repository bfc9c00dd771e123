//! The `WAIT` connections of leases with `min_replicas`: `WAIT` blocks the connection it
//! runs on, so each such pipeline takes one of its own from a small pool ([`WaitPool`]),
//! and an acquire cut short is undone on that same connection ([`WaitAttempt`]).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::Cmd;

use super::{release_call, RELEASE_RETRIES};
use crate::error::chain;
use crate::wire::Claim;
use crate::wire::{LeaseRef, Publish};

/// The longest `WAIT` a lock asks for (min(ttl/10, 1 s)).
pub(crate) const MAX_REPLICA_WAIT: Duration = Duration::from_secs(1);

/// Idle `WAIT` connections kept for reuse, per backend.
const IDLE_WAIT_CONNECTIONS: usize = 8;

/// Connections for `WAIT`, which blocks the connection it is sent on.
///
/// Each acquisition with `min_replicas` takes a connection of its own for its
/// `acquire` + `WAIT` pipeline (an idle one, or a new one), so concurrent acquisitions
/// never queue behind each other's `WAIT`; up to [`IDLE_WAIT_CONNECTIONS`] are kept for
/// reuse. Only a connection whose pipeline completed is given back: one whose request
/// was cancelled or failed may still have a reply (or a blocked `WAIT`) in flight, so it
/// is dropped.
pub(crate) struct WaitPool<C> {
    idle: Mutex<Vec<C>>,
}

impl<C> WaitPool<C> {
    pub(crate) fn new() -> Self {
        Self {
            idle: Mutex::new(Vec::new()),
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<C>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An idle connection, if any.
    pub(crate) fn take(&self) -> Option<C> {
        self.idle().pop()
    }

    /// Gives back a connection whose pipeline completed.
    pub(crate) fn put(&self, con: C) {
        let mut idle = self.idle();
        if idle.len() < IDLE_WAIT_CONNECTIONS {
            idle.push(con);
        }
    }

    /// Drops every idle connection (the server went away: they are all broken).
    pub(crate) fn clear(&self) {
        self.idle().clear();
    }
}

/// The `WAIT` connection of an acquire pipeline in flight, which undoes the attempt on
/// that same connection when it is dropped before the pipeline's reply was read.
///
/// The manager releases the token of an attempt that was cut short, cancelled or
/// failed ([`Job::Abandon`](crate::engine::Job::Abandon)), on the command connection. Requests
/// on two connections are not ordered: after a server freeze (or a retransmission on
/// one connection) that release may be applied before the acquire, find nothing, and
/// leave the key to nobody for its whole ttl. So an attempt whose reply was not read
/// sends its release on the pipeline's own connection, where the server applies it
/// after the acquire whatever happened to the acquire, and the connection is not given
/// back to the pool. If that release fails (the connection broke, which settles the
/// acquire's fate), it is retried on `fallback` after a pause, a few times.
pub(crate) struct WaitAttempt<C, F>
where
    C: ConnectionLike + Clone + Send + 'static,
    F: ConnectionLike + Clone + Send + 'static,
{
    con: Option<C>,
    fallback: F,
    /// The claim's release, as a self-contained `EVAL` (never answered `NOSCRIPT`,
    /// applied whenever it is delivered).
    undo: Cmd,
    /// The claim's key, for logs.
    key: String,
    backend: &'static str,
}

impl<C, F> WaitAttempt<C, F>
where
    C: ConnectionLike + Clone + Send + 'static,
    F: ConnectionLike + Clone + Send + 'static,
{
    /// Arms the undo of `claim`'s acquire about to be sent on `con` (its release, of
    /// whichever kind), which wakes by `publish`; `backend` names the backend in logs.
    pub(crate) fn new(
        con: C,
        fallback: F,
        claim: &Claim<'_>,
        (publish, backend): (Publish, &'static str),
    ) -> Self {
        let lease = LeaseRef::new(claim.key, claim.token, claim.mode);
        Self {
            con: Some(con),
            fallback,
            undo: release_call(lease, Duration::ZERO, publish).eval(),
            key: claim.key.full().to_owned(),
            backend,
        }
    }

    /// The connection to send the pipeline on.
    pub(crate) fn con(&mut self) -> &mut C {
        self.con.as_mut().expect("armed until finished")
    }

    /// Moves the pipeline to another connection (the first one broke: the acquire sent
    /// on it was settled when it closed).
    pub(crate) fn replace(&mut self, con: C) {
        self.con = Some(con);
    }

    /// The pipeline's reply was read: disarms, and gives the connection back.
    pub(crate) fn finish(mut self) -> C {
        self.con.take().expect("armed until finished")
    }
}

impl<C, F> Drop for WaitAttempt<C, F>
where
    C: ConnectionLike + Clone + Send + 'static,
    F: ConnectionLike + Clone + Send + 'static,
{
    fn drop(&mut self) {
        let Some(mut con) = self.con.take() else {
            return;
        };
        // No runtime: it is shutting down, and the ttl frees the lock.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (mut fallback, key, release, backend) = (
            self.fallback.clone(),
            std::mem::take(&mut self.key),
            self.undo.clone(),
            self.backend,
        );
        runtime.spawn(async move {
            let mut outcome = release.query_async::<i64>(&mut con).await;
            drop(con);
            for pause in RELEASE_RETRIES {
                let Err(e) = &outcome else {
                    return;
                };
                tracing::debug!(
                    target: "redlock",
                    key,
                    backend,
                    error = %chain(e),
                    "undo of a WAIT acquire failed"
                );
                tokio::time::sleep(pause).await;
                outcome = release.query_async::<i64>(&mut fallback).await;
            }
            if outcome.is_err() {
                tracing::debug!(
                    target: "redlock",
                    key,
                    backend,
                    "undo of a WAIT acquire failed; the ttl will free the lock"
                );
            }
        });
    }
}
