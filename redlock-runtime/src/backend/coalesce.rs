//! Coalescing: the plain requests that one connection's callers make while other calls
//! are in flight ride one script call.
//!
//! Each `EVALSHA` costs the server a fixed set-up (the script's `KEYS`/`ARGV` tables, the
//! call, the reply) on top of its work; 64 tasks locking 64 keys need not pay it 64
//! times. A request goes alone, at once, while fewer than [`ALONE_BELOW`] calls are in
//! flight on the connection, so a lone caller pays one uncontended mutex. Past that it
//! is queued, and a flush task sends the queue as one call after one scheduler round
//! (`yield_now`), so the requests made by the tasks that run meanwhile join it. Flushes
//! do not wait for one another: at a distance, calls stay pipelined.
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
use tokio::sync::{oneshot, Notify};

/// Calls in flight on a connection below which a request goes alone: two callers keep
/// two calls in flight without waiting for a flush (at a distance, one caller queued
/// behind the other's round trip would halve their throughput).
const ALONE_BELOW: usize = 2;

/// Most requests in one call; a larger queue goes as several calls, sent together. Each
/// call then holds the server for tens of microseconds, not hundreds (other clients wait
/// behind a script), and the server works on one call while the client takes the
/// replies of the one before.
const MOST_PER_CALL: usize = 16;

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
    /// Told when the last flush task ends (see [`settled`](Coalescer::settled)).
    flushes_done: Notify,
}

struct State<R> {
    /// Calls in flight: callers alone and flushes.
    in_flight: usize,
    queue: Vec<Queued<R>>,
    /// A flush task is spawned and has not taken the queue yet.
    flush_pending: bool,
    /// Flush tasks spawned and not ended: their calls, and the releases of grants whose
    /// callers gave up, still to come.
    flushes: usize,
}

struct Queued<R> {
    request: R,
    reply: oneshot::Sender<RedisResult<Value>>,
    state: Arc<AtomicU8>,
}

/// A call in flight (a caller's alone, or a flush's): counted until dropped.
pub(crate) struct InFlight<'a, R> {
    coalescer: &'a Coalescer<R>,
}

impl<R> Drop for InFlight<'_, R> {
    fn drop(&mut self) {
        self.coalescer.lock().in_flight -= 1;
    }
}

/// A flush task spawned: counted until dropped, however the task ends (run, panicked,
/// or dropped unpolled with its runtime).
struct Flushing<R>(Arc<Coalescer<R>>);

impl<R> Drop for Flushing<R> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.flushes -= 1;
        if state.flushes == 0 {
            self.0.flushes_done.notify_waiters();
        }
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
                flushes: 0,
            }),
            flushes_done: Notify::new(),
        }
    }

    /// Returns once no flush task is running: every queued request answered, and every
    /// grant whose caller gave up released (what `LockManager::shutdown` waits for).
    pub(crate) async fn settled(&self) {
        loop {
            let told = self.flushes_done.notified();
            if self.lock().flushes == 0 {
                return;
            }
            told.await;
        }
    }

    /// Leave to go alone when fewer than [`ALONE_BELOW`] calls are in flight (keep the
    /// guard until the reply is in), else `None`: [`queue`](Self::queue) the request.
    pub(crate) fn alone(&self) -> Option<InFlight<'_, R>> {
        let mut state = self.lock();
        (state.in_flight < ALONE_BELOW).then(|| {
            state.in_flight += 1;
            InFlight { coalescer: self }
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
            let spawn = !std::mem::replace(&mut queue.flush_pending, true);
            queue.flushes += usize::from(spawn);
            spawn
        };
        if spawn {
            tokio::spawn(Flushing(self.clone()).flush(con.clone()));
        }
        outcome.await.unwrap_or_else(|_| {
            Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "the coalesced call was dropped before it answered",
            )))
        })
    }

    /// One call for `part`; every caller answered, the outcomes of those gone handed on.
    async fn call(&self, con: ConnectionManager, part: Vec<Queued<R>>, flight: InFlight<'_, R>) {
        let (requests, replies): (Vec<R>, Vec<_>) =
            part.into_iter().map(|q| (q.request, q.reply)).unzip();
        let outcomes = R::send(con.clone(), &requests).await;
        drop(flight);
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

impl<R: Batched> Flushing<R> {
    /// After one scheduler round, sends what is queued (as calls of at most
    /// [`MOST_PER_CALL`]) and answers each caller.
    async fn flush(self, con: ConnectionManager) {
        let coalescer = &self.0;
        tokio::task::yield_now().await;
        let mut calls = Vec::new();
        {
            let mut state = coalescer.lock();
            state.flush_pending = false;
            let mut taken = std::mem::take(&mut state.queue)
                .into_iter()
                .filter(|q| {
                    q.state
                        .compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                })
                .peekable();
            while taken.peek().is_some() {
                let part: Vec<Queued<R>> = taken.by_ref().take(MOST_PER_CALL).collect();
                // Counted in flight under the lock; the guard gives it back however the
                // call ends (answered, panicked, or the task aborted).
                state.in_flight += 1;
                calls.push(coalescer.call(con.clone(), part, InFlight { coalescer }));
            }
        }
        futures_util::future::join_all(calls).await;
    }
}

#[cfg(test)]
mod tests {
    use crate::wire::LeaseRef;
    use std::sync::Arc;
    use std::time::Duration;

    use futures_util::FutureExt;
    use redis::Client;
    use redlock_testkit::{ChaosProxy, Direction, Fault, RedisServer};

    use crate::backend::server::Timeouts;
    use crate::backend::{SingleBackend, Store};
    use crate::key::LockKey;
    use crate::kind::Mode;
    use crate::scripts::{ACQUIRE, ACQUIRE_BATCH, RELEASE, RELEASE_BATCH};
    use crate::token::Token;
    use crate::waiters::Wake;
    use crate::wire::{Attempt, Claim};

    const TTL: Duration = Duration::from_secs(30);

    async fn backend(url: &str) -> SingleBackend {
        let timeouts = Timeouts {
            connect: Duration::from_secs(3),
            response: Duration::from_secs(2),
        };
        let info = Client::open(url).unwrap().get_connection_info().clone();
        SingleBackend::connect(info, timeouts, Wake::default(), "single")
            .await
            .unwrap()
    }

    /// The scripts cached on `server`: a first `EVALSHA` answered `NOSCRIPT` would be
    /// sent again as `EVAL` only once that answer is in, which these tests hold back.
    fn cached(server: &RedisServer) {
        let mut con = server.client().get_connection().unwrap();
        for script in [&ACQUIRE, &ACQUIRE_BATCH, &RELEASE, &RELEASE_BATCH] {
            let _: String = script.load().query(&mut con).unwrap();
        }
    }

    fn key(name: &str) -> LockKey {
        LockKey::prefixed("lock:", name).unwrap()
    }

    fn claim(key: &LockKey, token: Token) -> Claim<'_> {
        Claim {
            key,
            token,
            ttl: TTL,
            replicas: None,
            mode: Mode::Exclusive,
            intent: None,
            arrival: None,
        }
    }

    async fn acquire(
        backend: &SingleBackend,
        key: &LockKey,
        token: Token,
    ) -> Result<Attempt, crate::LockError> {
        backend.acquire(&claim(key, token)).await
    }

    fn get(server: &RedisServer, key: &str) -> redis::Value {
        server.cmd_sync(&["GET", key]).unwrap()
    }

    /// A backend behind a proxy that holds replies back as `replies` says, its calls
    /// allowed alone taken by claims whose replies are held: every claim made meanwhile
    /// is queued.
    async fn occupied(replies: Fault) -> (RedisServer, ChaosProxy, Arc<SingleBackend>) {
        let server = RedisServer::start();
        cached(&server);
        let proxy = ChaosProxy::start(server.addr()).await.unwrap();
        let backend = Arc::new(backend(&proxy.url()).await);
        proxy.set_direction(Direction::ToClient, replies);
        for i in 0..super::ALONE_BELOW {
            let backend = backend.clone();
            tokio::spawn(async move {
                let k = key(&format!("occupying_{i}_{{1}}"));
                backend.acquire(&claim(&k, Token::random())).await
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        (server, proxy, backend)
    }

    /// A caller that gives up after the flush sent its claim is answered to nobody: the
    /// flush releases the grant once the reply is in. Nothing else would: the manager's
    /// undo of a dropped attempt may reach the server before the grant (here there is no
    /// manager at all), and the key would stay held by nobody for its ttl. And `settled`
    /// (what `LockManager::shutdown` waits for) returns only after that release, so a
    /// process that exits right after its shutdown leaves no such lock either.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_given_up_after_it_was_sent_is_released_by_the_flush_before_settled() {
        let (server, _proxy, backend) = occupied(Fault::Delay(Duration::from_millis(300))).await;
        let k = key("orphan_{2}");
        let gave_up = tokio::time::timeout(
            Duration::from_millis(100),
            backend.acquire(&claim(&k, Token::random())),
        )
        .await;
        assert!(
            gave_up.is_err(),
            "the claim was answered before its caller gave up"
        );
        tokio::time::timeout(Duration::from_secs(5), backend.settled())
            .await
            .expect("settled within 5 s");
        assert_eq!(
            get(&server, k.fence()),
            redis::Value::BulkString(b"1".to_vec()),
            "granted"
        );
        assert_eq!(
            get(&server, k.full()),
            redis::Value::Nil,
            "the grant of a caller that gave up is left held by nobody once settled"
        );
    }

    /// A caller that gives up before the flush took its claim sends nothing: the claim
    /// never reaches the server (no increment of its counter, no key).
    #[tokio::test(flavor = "current_thread")]
    async fn a_claim_given_up_while_queued_is_never_sent() {
        let (server, _proxy, backend) = occupied(Fault::Delay(Duration::from_millis(300))).await;
        let k = key("queued_{2}");
        // Polled once (queued, the flush spawned but not run: one thread), then dropped.
        assert!(backend
            .acquire(&claim(&k, Token::random()))
            .now_or_never()
            .is_none());
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            get(&server, k.fence()),
            redis::Value::Nil,
            "the claim was sent"
        );
        assert_eq!(get(&server, k.full()), redis::Value::Nil);
    }

    /// Claims queued together are decided one by one: on one slot's counter, 64 claims get
    /// 64 distinct fences, each key holds its own token, and each release releases its
    /// own key; and the server saw fewer calls than requests.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn coalesced_claims_get_distinct_fences_and_release_their_own_keys() {
        let server = RedisServer::start();
        let backend = Arc::new(backend(&server.url()).await);
        server.cmd_sync(&["CONFIG", "RESETSTAT"]).unwrap();
        let keys: Vec<LockKey> = (0..64).map(|i| key(&format!("many_{i}_{{7}}"))).collect();
        let tokens: Vec<Token> = (0..64).map(|_| Token::random()).collect();
        let fences = futures_util::future::join_all(
            keys.iter()
                .zip(&tokens)
                .map(|(k, t)| acquire(&backend, k, *t)),
        )
        .await;
        let mut fences: Vec<u64> = fences
            .into_iter()
            .map(|a| match a {
                Ok(Attempt::Acquired { fence, .. }) => fence,
                other => panic!("not granted: {other:?}"),
            })
            .collect();
        fences.sort_unstable();
        assert_eq!(fences, (1..=64).collect::<Vec<_>>());
        for (k, t) in keys.iter().zip(&tokens) {
            let redis::Value::BulkString(v) = get(&server, k.full()) else {
                panic!("{} not held", k.full())
            };
            assert_eq!(&v[..16], t.as_bytes(), "{} holds its own token", k.full());
        }
        let released =
            futures_util::future::join_all(keys.iter().zip(&tokens).map(|(k, t)| {
                backend.release(LeaseRef::new(k, *t, Mode::Exclusive), Duration::ZERO)
            }))
            .await;
        assert!(
            released.iter().all(|r| matches!(r, Ok(true))),
            "{released:?}"
        );
        assert!(keys
            .iter()
            .all(|k| get(&server, k.full()) == redis::Value::Nil));
        let calls = server.command_calls(&["evalsha", "eval"]);
        assert!(
            calls < 128,
            "{calls} script calls for 64 claims and 64 releases"
        );
    }

    /// A release batch whose connection drops after the server applied it is sent again:
    /// the keys are gone by then, and each release still answers "released" (the first
    /// send's), not "the lock was gone" (a lock lost to its ttl). Of the four releases,
    /// two go alone (the releases' own calls in flight) and two as a batch: both paths.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_batch_cut_after_it_was_applied_reports_released() {
        let (server, proxy, proxied) = occupied(Fault::Blackhole).await;
        let direct = backend(&server.url()).await;
        let keys: Vec<LockKey> = (0..4).map(|i| key(&format!("unheld_{i}_{{4}}"))).collect();
        let tokens: Vec<Token> = (0..4).map(|_| Token::random()).collect();
        for (k, t) in keys.iter().zip(&tokens) {
            let granted = acquire(&direct, k, *t).await;
            assert!(
                matches!(granted, Ok(Attempt::Acquired { .. })),
                "{granted:?}"
            );
        }
        let releases =
            futures_util::future::join_all(keys.iter().zip(&tokens).map(|(k, t)| {
                proxied.release(LeaseRef::new(k, *t, Mode::Exclusive), Duration::ZERO)
            }));
        let cut = async {
            let applied = redlock_testkit::wait_until(
                Duration::from_secs(5),
                Duration::from_millis(10),
                || {
                    keys.iter()
                        .all(|k| get(&server, k.full()) == redis::Value::Nil)
                },
            );
            assert!(applied, "the batch was applied");
            proxy.reset_all();
            proxy.heal();
        };
        let (released, ()) = tokio::join!(releases, cut);
        assert!(
            released.iter().all(|r| matches!(r, Ok(true))),
            "{released:?}"
        );
    }

    /// A batch whose connection drops under it is sent again: each claim finds its own
    /// token and is granted once, with the fence it drew the first time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_cut_by_a_dropped_connection_is_granted_once_when_sent_again() {
        let (server, proxy, backend) = occupied(Fault::Blackhole).await;
        let keys: Vec<LockKey> = (0..4).map(|i| key(&format!("resent_{i}_{{3}}"))).collect();
        let tokens: Vec<Token> = (0..4).map(|_| Token::random()).collect();
        let claims = futures_util::future::join_all(
            keys.iter()
                .zip(&tokens)
                .map(|(k, t)| acquire(&backend, k, *t)),
        );
        let cut = async {
            let applied = redlock_testkit::wait_until(
                Duration::from_secs(5),
                Duration::from_millis(10),
                || get(&server, "lock:fence:{3}") == redis::Value::BulkString(b"4".to_vec()),
            );
            assert!(applied, "the batch was applied");
            proxy.reset_all();
            proxy.heal();
        };
        let (claims, ()) = tokio::join!(claims, cut);
        let mut fences: Vec<u64> = claims
            .into_iter()
            .map(|a| match a {
                Ok(Attempt::Acquired { fence, .. }) => fence,
                other => panic!("not granted after the resend: {other:?}"),
            })
            .collect();
        fences.sort_unstable();
        assert_eq!(fences, vec![1, 2, 3, 4], "each claim's first fence");
        for (k, t) in keys.iter().zip(&tokens) {
            let redis::Value::BulkString(v) = get(&server, k.full()) else {
                panic!("{} not held", k.full())
            };
            assert_eq!(&v[..16], t.as_bytes());
        }
    }
}
