//! Coalescing: the plain requests that one connection's callers make while other calls
//! are in flight ride one script call.
//!
//! Each `EVALSHA` costs the server a fixed set-up (the script's `KEYS`/`ARGV` tables, the
//! call, the reply) on top of its work; 64 tasks locking 64 keys need not pay it 64
//! times. A request goes alone, at once, while fewer than [`ALONE_BELOW`] calls are in
//! flight on the connection, so a lone caller pays nothing. Past that it is queued, and
//! a flush task sends the queue as one call after one scheduler round (`yield_now`), so
//! the requests made by the tasks that run meanwhile join it. Flushes do not wait for
//! one another: at a distance, calls stay pipelined.
//!
//! A queued caller that gives up (its future dropped) before the flush takes its request
//! is skipped: nothing is sent for it. One that gives up after is answered to nobody;
//! the flush hands that outcome to [`Batched::orphaned`] (a grant is released), and does
//! so after the call's reply, so the release cannot overtake the grant on the wire, as
//! the manager's own undo of a dropped attempt could (it does not know the request is
//! still queued behind the flush).

use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use redis::aio::ConnectionManager;
use redis::{RedisResult, Value};
use tokio::sync::oneshot;

/// Calls in flight on a connection below which a request goes alone.
const ALONE_BELOW: usize = 1;

/// Most requests in one call (a larger queue goes as several calls).
const MOST_PER_CALL: usize = 256;

/// A queued request's state: waiting in the queue, taken by a flush, or given up.
const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const GIVEN_UP: u8 = 2;

/// A request that can ride a shared call.
pub(crate) trait Batched: Send + Sync + Sized + 'static {
    /// Sends `batch` as one call on `con`: one outcome per request, in order.
    fn send(
        con: ConnectionManager,
        batch: &[Self],
    ) -> impl Future<Output = RedisResult<Vec<RedisResult<Value>>>> + Send;

    /// The outcome of a request whose caller gave up after it was sent.
    fn orphaned(
        self,
        con: ConnectionManager,
        outcome: RedisResult<Value>,
    ) -> impl Future<Output = ()> + Send;
}

/// One connection's queue of requests of one kind.
pub(crate) struct Coalescer<R> {
    state: Mutex<State<R>>,
}

struct State<R> {
    /// Calls in flight: callers alone and flushes.
    in_flight: usize,
    queue: Vec<Queued<R>>,
    /// A flush task is spawned and has not taken the queue yet.
    flush_pending: bool,
}

struct Queued<R> {
    request: R,
    reply: oneshot::Sender<RedisResult<Value>>,
    state: Arc<AtomicU8>,
}

/// A call going alone: counted in flight until dropped.
pub(crate) struct Alone<'a, R> {
    coalescer: &'a Coalescer<R>,
}

impl<R> Drop for Alone<'_, R> {
    fn drop(&mut self) {
        self.coalescer.lock().in_flight -= 1;
    }
}

/// Gives up a queued request when its caller's future is dropped before the flush took it.
struct GiveUp(Arc<AtomicU8>);

impl Drop for GiveUp {
    fn drop(&mut self) {
        let _ = self
            .0
            .compare_exchange(QUEUED, GIVEN_UP, Ordering::AcqRel, Ordering::Acquire);
    }
}

impl<R> Coalescer<R> {
    fn lock(&self) -> MutexGuard<'_, State<R>> {
        // Nothing panics while holding it; a poisoned queue is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<R: Batched> Coalescer<R> {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(State {
                in_flight: 0,
                queue: Vec::new(),
                flush_pending: false,
            }),
        }
    }

    /// Leave to go alone when fewer than [`ALONE_BELOW`] calls are in flight (keep the
    /// guard until the reply is in), else `None`: [`queue`](Self::queue) the request.
    pub(crate) fn alone(&self) -> Option<Alone<'_, R>> {
        let mut state = self.lock();
        (state.in_flight < ALONE_BELOW).then(|| {
            state.in_flight += 1;
            Alone { coalescer: self }
        })
    }

    /// Queues `request` for the next flush on `con` and waits for its outcome.
    pub(crate) async fn queue(
        self: &Arc<Self>,
        con: &ConnectionManager,
        request: R,
    ) -> RedisResult<Value> {
        let (reply, outcome) = oneshot::channel();
        let state = Arc::new(AtomicU8::new(QUEUED));
        let _give_up = GiveUp(state.clone());
        let spawn = {
            let mut queue = self.lock();
            queue.queue.push(Queued {
                request,
                reply,
                state,
            });
            !std::mem::replace(&mut queue.flush_pending, true)
        };
        if spawn {
            tokio::spawn(self.clone().flush(con.clone()));
        }
        outcome.await.unwrap_or_else(|_| {
            Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "the coalesced call was dropped before it answered",
            )))
        })
    }

    /// After one scheduler round, sends what is queued (as calls of at most
    /// [`MOST_PER_CALL`]) and answers each caller.
    async fn flush(self: Arc<Self>, con: ConnectionManager) {
        tokio::task::yield_now().await;
        let taken: Vec<Queued<R>> = {
            let mut state = self.lock();
            state.flush_pending = false;
            let taken: Vec<_> = std::mem::take(&mut state.queue)
                .into_iter()
                .filter(|q| {
                    q.state
                        .compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                })
                .collect();
            state.in_flight += taken.len().div_ceil(MOST_PER_CALL);
            taken
        };
        let mut rest = taken.into_iter().peekable();
        let mut calls = Vec::new();
        while rest.peek().is_some() {
            let part: Vec<Queued<R>> = rest.by_ref().take(MOST_PER_CALL).collect();
            calls.push(self.call(con.clone(), part));
        }
        futures_util::future::join_all(calls).await;
    }

    /// One call for `part`; every caller answered, the outcomes of those gone handed on.
    async fn call(&self, con: ConnectionManager, part: Vec<Queued<R>>) {
        let (requests, replies): (Vec<R>, Vec<_>) =
            part.into_iter().map(|q| (q.request, q.reply)).unzip();
        let outcomes = R::send(con.clone(), &requests).await;
        self.lock().in_flight -= 1;
        let outcomes = match outcomes {
            Ok(outcomes) if outcomes.len() == requests.len() => outcomes,
            Ok(other) => {
                let e = redis::RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "a coalesced call answered a reply count other than its requests'",
                    format!("{} replies for {} requests", other.len(), requests.len()),
                ));
                vec![Err(e); requests.len()]
            }
            Err(e) => vec![Err(e); requests.len()],
        };
        let mut orphans = Vec::new();
        for ((request, reply), outcome) in requests.into_iter().zip(replies).zip(outcomes) {
            if let Err(outcome) = reply.send(outcome) {
                orphans.push(request.orphaned(con.clone(), outcome));
            }
        }
        futures_util::future::join_all(orphans).await;
    }
}
