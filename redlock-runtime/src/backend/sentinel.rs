//! A primary with replicas under Redis Sentinel, followed through failovers.
//!
//! The backend is a [`SingleBackend`] on the current master, replaced when the master
//! moves. The Sentinels are asked where the master is at `build`, after a failed request
//! (a dropped connection, a timeout, `READONLY` from a demoted master), when one of them
//! announces `+switch-master`, and once a second in case an announcement was missed.
//! Every Sentinel is asked at once, and the answer with the highest configuration epoch
//! wins (a Sentinel that has not heard of a failover yet still names the old master,
//! with the old epoch); its master must say `ROLE master` before it is used.
//!
//! When the master moves:
//! - the subscriptions move with it: every channel with an interest is subscribed on the
//!   new master and every head is woken to retry at once (a release on the old master
//!   went unheard);
//! - an answer the old master gave while the move happened does not count: the request
//!   is repeated on the new master (each one is idempotent per token), whose answer is
//!   the answer. A lock whose write never reached the new master is therefore reported
//!   lost at its next renewal, never held silently; `min_replicas` makes the write
//!   reach a replica before the lock is granted, so that a failover keeps it.
//!
//! redis-rs has Sentinel support (`redis::sentinel`), which finds the master once: its
//! clients keep that address for good, a connection manager built on one reconnects to
//! the old master after a failover, and it never listens for `+switch-master`. Hence this
//! module.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, ErrorKind};
use tokio::sync::{oneshot, watch, Mutex};

use super::{Policies, SingleBackend, Store, Timeouts};

use crate::error::chain;
use crate::info::LockInfo;
use crate::key::LockKey;
use crate::kind::Mode;
use crate::notify::{Channels, Register};
use crate::token::Token;
use crate::waiters::Wake;
use crate::wire::{Attempt, Claim, Renewed, Seen, Together};
use crate::wire::{LeaseRef, Renewal};
use crate::LockError;

/// How often the Sentinels are asked when nothing went wrong (an announcement of
/// `+switch-master` may have been missed).
const POLL: Duration = Duration::from_secs(1);

/// The least time between two re-discoveries set off by failed requests.
const MIN_GAP: Duration = Duration::from_millis(100);

/// How long a discovery waits for the remaining Sentinels once a majority answered.
const STRAGGLERS: Duration = Duration::from_millis(200);

/// The backend's name in logs and metrics.
const NAME: &str = "sentinel";

/// The master named `master` by the Sentinels at `sentinels`.
pub(crate) struct SentinelBackend {
    inner: Arc<Inner>,
}

/// Where the master is asked for, and the master in use.
struct Inner {
    master: String,
    sentinels: Vec<Sentinel>,
    /// The settings of the data nodes (credentials, database, TLS): the first Sentinel
    /// URL's; only the address changes.
    node: ConnectionInfo,
    timeouts: Timeouts,
    wake: Wake,
    /// The interests in wake-up channels, kept across masters.
    channels: Arc<Channels>,
    current: RwLock<Arc<Master>>,
    /// The generation of `current`, announced when the master moves (requests in flight
    /// on the old one are given up).
    moved: watch::Sender<u64>,
    /// Serialises re-discoveries.
    rediscovering: Mutex<()>,
    /// A re-discovery set off by a failed request is under way (or just ended).
    suspecting: AtomicBool,
    /// Dropped with the backend: ends the watcher.
    _stop: oneshot::Sender<()>,
}

/// One master, and which one it is (successive masters count up from 0).
struct Master {
    backend: SingleBackend,
    generation: u64,
}

/// One Sentinel, with a connection kept between questions.
struct Sentinel {
    info: ConnectionInfo,
    con: StdMutex<Option<MultiplexedConnection>>,
}

/// What one Sentinel says of the master.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    host: String,
    port: u16,
    epoch: u64,
}

impl SentinelBackend {
    /// Asks the Sentinels for the master named `master`, connects to it (it must say
    /// `ROLE master`) and starts following it, all within the connect timeout.
    pub(crate) async fn connect(
        master: String,
        sentinels: Vec<ConnectionInfo>,
        timeouts: Timeouts,
        wake: Wake,
    ) -> Result<Self, LockError> {
        if master.is_empty() {
            return Err(LockError::invalid_option(
                "the Sentinel master name is empty",
            ));
        }
        let Some(node) = sentinels.first().cloned() else {
            return Err(LockError::invalid_option("no Sentinel given"));
        };
        let sentinels: Vec<Sentinel> = sentinels
            .into_iter()
            .map(|info| {
                // A Sentinel has no databases: the URL's database is the data nodes'.
                let settings = info.redis_settings().clone().set_db(0);
                Sentinel {
                    info: info.set_redis_settings(settings),
                    con: StdMutex::new(None),
                }
            })
            .collect();
        let channels = Arc::new(Channels::default());
        let candidates = ask_sentinels(&master, &sentinels, &node, timeouts).await?;
        let backend = connect_master(candidates, timeouts, &wake, &channels, 0).await?;
        tracing::info!(target: "redlock", master, addr = backend.addr(), "sentinel: master found");
        let (stop, stopped) = oneshot::channel();
        let inner = Arc::new(Inner {
            master,
            sentinels,
            node,
            timeouts,
            wake,
            channels,
            current: RwLock::new(Arc::new(Master {
                backend: *backend,
                generation: 0,
            })),
            moved: watch::Sender::new(0),
            rediscovering: Mutex::new(()),
            suspecting: AtomicBool::new(false),
            _stop: stop,
        });
        tokio::spawn(watch(Arc::downgrade(&inner), stopped));
        Ok(Self { inner })
    }

    fn current(&self) -> Arc<Master> {
        self.inner.current()
    }
}

impl Inner {
    fn current(&self) -> Arc<Master> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Asks the Sentinels where the master is and moves to it if it moved.
    async fn rediscover(&self, why: &'static str) {
        let _one = self.rediscovering.lock().await;
        let current = self.current();
        let in_use = current.backend.addr();
        let found = async {
            let mut candidates =
                ask_sentinels(&self.master, &self.sentinels, &self.node, self.timeouts).await?;
            // Only a candidate of a higher epoch than the master in use can replace it:
            // when none of those is a master, the one in use still is.
            let in_use_at = candidates
                .iter()
                .position(|c| c.addr().to_string() == in_use);
            if let Some(at) = in_use_at {
                candidates.truncate(at);
            }
            let generation = current.generation + 1;
            match connect_master(
                candidates,
                self.timeouts,
                &self.wake,
                &self.channels,
                generation,
            )
            .await
            {
                Ok(backend) => Ok(Some(backend)),
                Err(_) if in_use_at.is_some() => Ok(None),
                Err(e) => Err(e),
            }
        };
        match found.await {
            Ok(Some(backend)) => self.move_to(*backend, &current, why),
            Ok(None) => {}
            Err(e) => tracing::debug!(
                target: "redlock",
                master = self.master,
                why,
                error = %chain(&e),
                "sentinel: cannot tell where the master is"
            ),
        }
    }

    /// Makes `backend` the master, after `old`.
    fn move_to(&self, backend: SingleBackend, old: &Master, why: &'static str) {
        let generation = old.generation + 1;
        tracing::warn!(
            target: "redlock",
            master = self.master,
            from = old.backend.addr(),
            to = backend.addr(),
            why,
            "sentinel: the master moved; following it"
        );
        let master = Arc::new(Master {
            backend,
            generation,
        });
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = master.clone();
        self.moved.send_replace(generation);
        let channels = self.channels.move_to(generation);
        self.wake.wake_all();
        for key in channels {
            let master = master.clone();
            // Bounded by the connection's response timeout.
            tokio::spawn(async move {
                if let Err(e) = master.backend.subscriber().send_subscribe(&key).await {
                    tracing::debug!(target: "redlock", key, backend = NAME, error = %chain(&e), "resubscribe failed");
                }
            });
        }
    }

    /// After a failed request on master `generation`: asks the Sentinels again (in a
    /// task of its own, at most once per [`MIN_GAP`]).
    fn suspect<T>(self: &Arc<Self>, answer: &Result<T, LockError>, generation: u64) {
        if !matches!(answer, Err(LockError::Backend { .. }))
            || self.suspecting.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let inner = self.clone();
        tokio::spawn(async move {
            if inner.current().generation == generation {
                inner.rediscover("a request failed").await;
            }
            tokio::time::sleep(MIN_GAP).await;
            inner.suspecting.store(false, Ordering::Release);
        });
    }
}

/// Asks every Sentinel where `name`'s master is (those that did not answer within the
/// connect timeout, or [`STRAGGLERS`] after a majority, count as failed): the masters
/// they name, as nodes to connect to (the Sentinels' credentials and TLS), the highest
/// epoch first; never empty.
///
/// Not the first majority's answer: right after a failover only the Sentinel that led
/// it may know (the others learn within a couple of seconds), while the old master,
/// not yet demoted, still says `ROLE master` and takes writes.
async fn ask_sentinels(
    name: &str,
    sentinels: &[Sentinel],
    node: &ConnectionInfo,
    timeouts: Timeouts,
) -> Result<Vec<ConnectionInfo>, LockError> {
    let majority = sentinels.len() / 2 + 1;
    let mut deadline = tokio::time::Instant::now() + timeouts.connect;
    let mut silent: Vec<String> = sentinels
        .iter()
        .map(|s| s.info.addr().to_string())
        .collect();
    let mut asks: futures_util::stream::FuturesUnordered<_> = sentinels
        .iter()
        .map(|s| async move { (s.info.addr().to_string(), s.ask(name, timeouts).await) })
        .collect();
    let mut answers: Vec<Answer> = Vec::new();
    let mut problems: Vec<String> = Vec::new();
    let mut unknown = 0;
    loop {
        let Ok(Some((sentinel, asked))) = tokio::time::timeout_at(deadline, asks.next()).await
        else {
            let late = timeouts.connect;
            problems.extend(
                silent
                    .drain(..)
                    .map(|s| format!("{s}: no answer within {late:?}")),
            );
            break;
        };
        silent.retain(|s| *s != sentinel);
        match asked {
            Ok(Some(answer)) => answers.push(answer),
            Ok(None) => {
                unknown += 1;
                problems.push(format!("{sentinel}: no master named {name:?}"));
            }
            // The error names its Sentinel.
            Err(e) => problems.push(chain(&e).to_string()),
        }
        // A majority has answered: the others get a moment more (one that just
        // failed over may be among them, the rest not yet told).
        if answers.len() == majority {
            deadline = deadline.min(tokio::time::Instant::now() + STRAGGLERS);
        }
    }
    if answers.is_empty() {
        let detail = problems.join("; ");
        if unknown > 0 && unknown + answers.len() == sentinels.len() {
            return Err(LockError::invalid_option(format!(
                "no Sentinel knows a master named {name:?} ({detail})"
            )));
        }
        return Err(LockError::Backend {
            operation: "sentinel discovery",
            node: None,
            source: (ErrorKind::Io, "no Sentinel answered", detail).into(),
        });
    }
    answers.sort_by_key(|a| std::cmp::Reverse(a.epoch));
    answers.dedup_by(|a, b| a.host == b.host && a.port == b.port);
    Ok(answers
        .into_iter()
        .map(|a| {
            node.clone()
                .set_addr(node_addr(node.addr(), &a.host, a.port))
        })
        .collect())
}

/// Connects to the first of `candidates` that says `ROLE master` (as connection
/// `generation` of the channels); the last failure when none does.
async fn connect_master(
    candidates: Vec<ConnectionInfo>,
    timeouts: Timeouts,
    wake: &Wake,
    channels: &Arc<Channels>,
    generation: u64,
) -> Result<Box<SingleBackend>, LockError> {
    let mut last_error = None;
    for info in candidates {
        let connected = SingleBackend::connect_listening(
            info,
            timeouts,
            wake.clone(),
            NAME,
            (channels.clone(), generation),
        )
        .await;
        let backend = match connected {
            Ok(backend) => backend,
            Err(e) => {
                last_error = Some(e);
                continue;
            }
        };
        match backend.role().await {
            Ok(role) if role == "master" => return Ok(Box::new(backend)),
            Ok(role) => {
                last_error = Some(LockError::Backend {
                    operation: "sentinel discovery",
                    node: None,
                    source: (
                        ErrorKind::Client,
                        "the Sentinels' master is not a master",
                        format!("{} says ROLE {role}", backend.addr()),
                    )
                        .into(),
                });
            }
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.unwrap_or_else(|| LockError::Backend {
        operation: "sentinel discovery",
        node: None,
        source: (ErrorKind::Client, "no master to connect to").into(),
    }))
}

/// The address of a data node at `host:port`, over TLS when the Sentinels are.
fn node_addr(sentinel: &ConnectionAddr, host: &str, port: u16) -> ConnectionAddr {
    match sentinel {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host.to_owned(), port),
    }
}

impl Sentinel {
    /// `SENTINEL MASTER name` on this Sentinel: `None` when it knows no such master.
    async fn ask(&self, name: &str, timeouts: Timeouts) -> Result<Option<Answer>, LockError> {
        let cached = self
            .con
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut con = match cached {
            Some(con) => con,
            None => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(timeouts.connect))
                    .set_response_timeout(Some(timeouts.response));
                let at = |e| LockError::backend("sentinel")(e).on_node(self.info.addr());
                let client = Client::open(self.info.clone()).map_err(at)?;
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map_err(at)?
            }
        };
        let reply: redis::RedisResult<HashMap<String, String>> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(name)
            .query_async(&mut con)
            .await;
        let fields = match reply {
            Ok(fields) => fields,
            Err(e) if e.code() == Some("ERR") && e.to_string().contains("No such master") => {
                return Ok(None)
            }
            Err(e) => {
                *self.con.lock().unwrap_or_else(PoisonError::into_inner) = None;
                return Err(LockError::Backend {
                    operation: "sentinel",
                    node: Some(self.info.addr().to_string()),
                    source: e,
                });
            }
        };
        *self.con.lock().unwrap_or_else(PoisonError::into_inner) = Some(con);
        let field = |name: &str| fields.get(name).map(String::as_str);
        let parsed = (|| {
            Some(Answer {
                host: field("ip")?.to_owned(),
                port: field("port")?.parse().ok()?,
                epoch: field("config-epoch")
                    .and_then(|e| e.parse().ok())
                    .unwrap_or(0),
            })
        })();
        parsed.map(Some).ok_or_else(|| LockError::Backend {
            operation: "sentinel",
            node: Some(self.info.addr().to_string()),
            source: (
                ErrorKind::Parse,
                "SENTINEL MASTER reply without ip and port",
            )
                .into(),
        })
    }
}

/// Follows the master while the backend lives: listens for `+switch-master` on one
/// Sentinel at a time (the next one when its connection drops) and asks again every
/// [`POLL`].
async fn watch(inner: Weak<Inner>, mut stop: oneshot::Receiver<()>) {
    let Some((sentinels, master, timeouts)) = inner.upgrade().map(|i| {
        let infos: Vec<ConnectionInfo> = i.sentinels.iter().map(|s| s.info.clone()).collect();
        (infos, i.master.clone(), i.timeouts)
    }) else {
        return;
    };
    let check = |why: &'static str| {
        let inner = inner.clone();
        async move {
            if let Some(inner) = inner.upgrade() {
                inner.rediscover(why).await;
            }
        }
    };
    let mut poll = tokio::time::interval(POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for sentinel in sentinels.iter().cycle() {
        let listening = tokio::select! {
            _ = &mut stop => return,
            listening = announcements(sentinel, timeouts) => listening,
        };
        // An announcement may have been missed while nobody listened.
        check("a Sentinel connection was (re)opened").await;
        let Ok(mut announced) = listening else {
            // This Sentinel cannot be listened to: poll once, then try the next.
            tokio::select! {
                _ = &mut stop => return,
                _ = poll.tick() => check("poll").await,
            }
            continue;
        };
        loop {
            tokio::select! {
                _ = &mut stop => return,
                message = announced.next() => match message {
                    Some(message) => {
                        let payload: String = message.get_payload().unwrap_or_default();
                        if payload.split(' ').next() == Some(master.as_str()) {
                            check("+switch-master").await;
                        }
                    }
                    None => break,
                },
                _ = poll.tick() => check("poll").await,
            }
        }
    }
}

/// A subscription to `+switch-master` on one Sentinel.
async fn announcements(
    sentinel: &ConnectionInfo,
    timeouts: Timeouts,
) -> Result<redis::aio::PubSubStream, LockError> {
    let subscribe = async {
        let mut pubsub = Client::open(sentinel.clone())?.get_async_pubsub().await?;
        pubsub.subscribe("+switch-master").await?;
        Ok::<_, redis::RedisError>(pubsub.into_on_message())
    };
    tokio::time::timeout(timeouts.connect, subscribe)
        .await
        .map_err(|_| LockError::timed_out("sentinel subscribe", timeouts.connect))?
        .map_err(LockError::backend("sentinel subscribe"))
}

/// Runs `$call` with `$b` bound to the current master's backend; when the master moved
/// while it ran, runs it again on the new one, whose answer is the answer. The call on
/// the old master is given up as soon as the master moves (its answer would not count,
/// and on a frozen or dead master it lasts until its timeout or its reconnects fail). A
/// failed request sets off a re-discovery.
macro_rules! on_master {
    ($self:ident, $b:ident => $call:expr) => {{
        let master = $self.current();
        let mut moved = $self.inner.moved.subscribe();
        let first = async {
            let $b = &master.backend;
            $call
        };
        let answer = tokio::select! {
            biased;
            answer = first => Some(answer),
            _ = moved.wait_for(|g| *g != master.generation) => None,
        };
        let now = $self.current();
        match answer {
            Some(answer) if now.generation == master.generation => {
                $self.inner.suspect(&answer, master.generation);
                answer
            }
            _ => {
                let $b = &now.backend;
                let answer = $call;
                $self.inner.suspect(&answer, now.generation);
                answer
            }
        }
    }};
}

impl Store for SentinelBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    /// A request, and its repetition on a new master.
    fn request_timeout(&self, ttl: Duration, mode: Mode) -> Duration {
        self.current().backend.request_timeout(ttl, mode) * 2
    }

    async fn acquire(&self, claim: &Claim<'_>) -> Result<Attempt, LockError> {
        on_master!(self, b => b.acquire(claim).await)
    }

    async fn acquire_together(
        &self,
        keys: &[&LockKey],
        token: Token,
        ttl: Duration,
    ) -> Result<Option<Together>, LockError> {
        on_master!(self, b => b.acquire_together(keys, token, ttl).await)
    }

    async fn release(&self, lease: LeaseRef<'_>, keep: Duration) -> Result<bool, LockError> {
        on_master!(self, b => b.release(lease, keep).await)
    }

    async fn extend(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<bool, LockError> {
        on_master!(self, b => b.extend(lease, ttl).await)
    }

    async fn renew(&self, batch: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        on_master!(self, b => b.renew(batch).await)
    }

    async fn is_locked(&self, key: &LockKey) -> Result<bool, LockError> {
        on_master!(self, b => b.is_locked(key).await)
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        on_master!(self, b => b.inspect(key).await)
    }

    /// The current master's locks (a listing the master moved under is not repeated:
    /// it may be partial, like any listing under change).
    async fn list(&self, prefix: &str, pattern: &str) -> Result<Vec<LockInfo>, LockError> {
        let master = self.current();
        let answer = master.backend.list(prefix, pattern).await;
        self.inner.suspect(&answer, master.generation);
        answer
    }

    async fn eviction_policies(&self) -> Result<Policies, LockError> {
        self.current().backend.eviction_policies().await
    }

    async fn force_unlock(&self, key: &LockKey, seen: Option<Seen<'_>>) -> Result<bool, LockError> {
        on_master!(self, b => b.force_unlock(key, seen).await)
    }

    async fn withdraw(&self, key: &LockKey, waiter: u64) -> Result<(), LockError> {
        on_master!(self, b => b.withdraw(key, waiter).await)
    }

    /// Subscribes on the current master; when the master moved meanwhile, on the new one
    /// too (the interest counted once).
    async fn subscribe(&self, key: &str, register: Register) -> Result<(), LockError> {
        let mut register = register;
        let mut answer = Ok(());
        // Each round ends on a master that was current when it began; a few are plenty
        // (masters do not move every round trip).
        for _ in 0..3 {
            let master = self.current();
            answer = master.backend.subscribe(key, register).await;
            if self.current().generation == master.generation {
                self.inner.suspect(&answer, master.generation);
                return answer;
            }
            register = Register::Again;
        }
        answer
    }

    async fn unsubscribe(&self, key: &str) -> Result<(), LockError> {
        self.current().backend.unsubscribe(key).await
    }

    fn listening(&self, key: &str) -> bool {
        self.inner.channels.listening(key)
    }

    fn interests(&self) -> usize {
        self.current().backend.interests()
    }

    /// The current master's (a master left behind by a failover answers its callers'
    /// requests, or fails them, on its own).
    async fn settled(&self) {
        self.current().backend.settled().await
    }
}

#[cfg(test)]
mod tests {
    use redlock_testkit::{ChaosProxy, Direction, Fault, RedisServer};

    use super::*;

    const TIMEOUTS: Timeouts = Timeouts {
        connect: Duration::from_secs(3),
        response: Duration::from_secs(2),
    };

    async fn node(url: &str, channels: &Arc<Channels>, generation: u64) -> SingleBackend {
        let info = redis::IntoConnectionInfo::into_connection_info(url).unwrap();
        let listening = (channels.clone(), generation);
        SingleBackend::connect_listening(info, TIMEOUTS, Wake::default(), NAME, listening)
            .await
            .unwrap()
    }

    /// A backend on the server at `url`, asking no Sentinel: the tests move it by hand
    /// ([`Inner::move_to`]), as a discovery would.
    async fn on(url: &str) -> SentinelBackend {
        let channels = Arc::new(Channels::default());
        let backend = node(url, &channels, 0).await;
        let (stop, _) = oneshot::channel();
        SentinelBackend {
            inner: Arc::new(Inner {
                master: "test".to_owned(),
                sentinels: Vec::new(),
                node: redis::IntoConnectionInfo::into_connection_info(url).unwrap(),
                timeouts: TIMEOUTS,
                wake: Wake::default(),
                channels,
                current: RwLock::new(Arc::new(Master {
                    backend,
                    generation: 0,
                })),
                moved: watch::Sender::new(0),
                rediscovering: Mutex::new(()),
                suspecting: AtomicBool::new(false),
                _stop: stop,
            }),
        }
    }

    /// Moves `sentinel` to the server at `url`.
    async fn move_to(sentinel: &SentinelBackend, url: &str) {
        let old = sentinel.current();
        let new = node(url, &sentinel.inner.channels, old.generation + 1).await;
        sentinel.inner.move_to(new, &old, "test");
    }

    /// `proxy` holds the old master's replies while the master moves.
    async fn moved_while_answering<T>(
        sentinel: &SentinelBackend,
        proxy: &ChaosProxy,
        new_url: &str,
        request: impl std::future::Future<Output = T>,
    ) -> T {
        proxy.set_direction(Direction::ToClient, Fault::Blackhole);
        let (answer, ()) = tokio::join!(request, async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            move_to(sentinel, new_url).await;
            proxy.heal();
        });
        answer
    }

    /// An extend the old master granted (its copy had our token) while the master moved
    /// to one without the lock: before, the old master's "extended" was the answer,
    /// and a lock that no longer existed anywhere that counts was believed held.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_extend_answered_by_the_old_master_after_a_move_does_not_count() {
        let (old, new) = (RedisServer::start(), RedisServer::start());
        let proxy = ChaosProxy::start(old.addr()).await.unwrap();
        let sentinel = on(&proxy.url()).await;
        let key = LockKey::prefixed("lock:", "moved_{extend}").unwrap();
        let token = Token::random();
        let mut con = old.connection().await;
        let _: () = redis::cmd("SET")
            .arg(key.full())
            .arg(token.as_bytes())
            .query_async(&mut con)
            .await
            .unwrap();
        // Cached, so that the old master runs the extend on its first request (the call
        // on it is given up when the master moves: a NOSCRIPT reply held by the proxy
        // would leave its EVAL unsent).
        let _: String = crate::scripts::EXTEND
            .load()
            .query_async(&mut con)
            .await
            .unwrap();
        let lease = LeaseRef::new(&key, token, Mode::Exclusive);
        let extended = moved_while_answering(
            &sentinel,
            &proxy,
            &new.url(),
            sentinel.extend(lease, Duration::from_secs(30)),
        )
        .await
        .unwrap();
        assert!(old.pttl(key.full()) > 0, "the old master never extended");
        assert!(!extended, "the old master's answer counted after the move");
    }

    /// An acquire the old master granted while the master moved to one where another
    /// holder has the key: the answer is the new master's (held), not the old one's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_acquire_granted_by_the_old_master_after_a_move_does_not_count() {
        let (old, new) = (RedisServer::start(), RedisServer::start());
        let proxy = ChaosProxy::start(old.addr()).await.unwrap();
        let sentinel = on(&proxy.url()).await;
        let key = LockKey::prefixed("lock:", "moved_{acquire}").unwrap();
        let mut con = new.connection().await;
        let _: () = redis::cmd("SET")
            .arg(key.full())
            .arg(Token::random().as_bytes())
            .arg("PX")
            .arg(30_000)
            .query_async(&mut con)
            .await
            .unwrap();
        // Cached on the old master, as in the extend test above.
        let _: String = crate::scripts::ACQUIRE
            .load()
            .query_async(&mut old.connection().await)
            .await
            .unwrap();
        let claim = Claim {
            key: &key,
            token: Token::random(),
            ttl: Duration::from_secs(30),
            replicas: None,
            mode: Mode::Exclusive,
            intent: None,
            arrival: None,
        };
        let attempt =
            moved_while_answering(&sentinel, &proxy, &new.url(), sentinel.acquire(&claim))
                .await
                .unwrap();
        assert!(old.exists(key.full()), "the old master never granted");
        assert!(
            matches!(attempt, Attempt::Held { .. }),
            "the old master's grant counted after the move: {attempt:?}"
        );
    }

    /// Interests move with the master: a channel subscribed on the old master is
    /// subscribed on the new one, and a confirmation from the old connection after the
    /// move does not make it count as heard.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn subscriptions_move_with_the_master() {
        let (old, new) = (RedisServer::start(), RedisServer::start());
        let sentinel = on(&old.url()).await;
        let retired = sentinel.current();
        sentinel.subscribe("lock:a", Register::New).await.unwrap();
        assert!(sentinel.listening("lock:a"));
        move_to(&sentinel, &new.url()).await;
        // A late subscription on the old connection confirms nothing.
        retired
            .backend
            .subscribe("lock:b", Register::New)
            .await
            .unwrap();
        assert!(!sentinel.listening("lock:b"));
        sentinel.subscribe("lock:b", Register::Again).await.unwrap();
        let numsub = |channel: &str| {
            new.cmd_sync(&["PUBSUB", "NUMSUB", channel])
                .ok()
                .and_then(|v| match v {
                    redis::Value::Array(items) => items.get(1).cloned(),
                    _ => None,
                })
        };
        let moved =
            redlock_testkit::wait_until(Duration::from_secs(5), Duration::from_millis(20), || {
                numsub("lock:a") == Some(redis::Value::Int(1)) && sentinel.listening("lock:a")
            });
        assert!(moved, "lock:a was not subscribed on the new master");
        assert!(sentinel.listening("lock:b"));
        assert_eq!(numsub("lock:b"), Some(redis::Value::Int(1)));
        assert_eq!(sentinel.interests(), 2);
    }
}
