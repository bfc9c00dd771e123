//! [`LockManager`]: the handle every lock goes through.

use std::fmt;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tracing::{field, Instrument};

use crate::backend::{
    jitter, Attempt, Backend, ClusterBackend, MemoryBackend, RedlockBackend, ReplicaWait,
    SingleBackend, Timeouts, DEFAULT_NODE_TIMEOUT,
};
use crate::key::{check_prefix, LockKey};
use crate::lease::{self, Lease};
use crate::options::{check_ttl, Resolved};
use crate::token::Token;
use crate::waiters::{Subscription, Waiters};
use crate::watchdog::{self, Job, Shared};
use crate::{LockError, LockGuard, LockOptions};

/// Hands out distributed locks over one backend. Cheap to clone (an `Arc` inside); make
/// one per process and share it.
///
/// # Behavior
/// - `lock` tries once at once; if the key is held it joins this process's FIFO queue
///   for the key. Only the queue's head contends on the backend; it is woken by the
///   release's notification, or by the holder's remaining ttl as a fallback timer.
/// - A single background task renews every held lock at ttl/3 in batches, performs the
///   releases of dropped guards, and ends with the manager.
/// - Redis connections reconnect by themselves; a failed request is a
///   [`LockError::Backend`] (or is retried within the `wait` budget while waiting).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), redlock_runtime::LockError> {
/// use std::time::Duration;
/// use redlock_runtime::{LockManager, LockOptions};
///
/// let locks = LockManager::builder()
///     .in_memory()                       // or .single("redis://127.0.0.1:6379")
///     .prefix("lock:")
///     .default_ttl(Duration::from_secs(30))
///     .build()
///     .await?;
/// let guard = locks.lock("buy_{42}").await?;
/// assert!(locks.try_lock("buy_{42}").await?.is_none());
/// drop(guard);
/// let guard = locks
///     .lock_with("buy_{42}", LockOptions::new().wait(Duration::from_secs(1)))
///     .await?;
/// # drop(guard);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockManager(Arc<Inner>);

struct Inner {
    shared: Arc<Shared>,
    jobs: mpsc::UnboundedSender<Job>,
    prefix: String,
    default_ttl: Duration,
    default_wait: Duration,
    next_id: AtomicU64,
    /// Backend attempts made (for tests of how many a `lock` makes).
    #[cfg(test)]
    attempts: std::sync::atomic::AtomicUsize,
}

/// Which backend a builder connects to.
#[derive(Debug, Clone)]
enum Target {
    Memory,
    Single(String),
    Cluster(Vec<String>),
    Redlock(Vec<String>),
}

impl Target {
    /// `rediss://` needs the `tls` feature; without it the URL is refused up front.
    fn check_tls_support(&self) -> Result<(), LockError> {
        let urls: &[String] = match self {
            Self::Memory => &[],
            Self::Single(url) => std::slice::from_ref(url),
            Self::Cluster(urls) | Self::Redlock(urls) => urls,
        };
        match urls
            .iter()
            .find(|u| u.trim_start().to_ascii_lowercase().starts_with("rediss:"))
        {
            Some(url) if !cfg!(feature = "tls") => Err(LockError::invalid_option(format!(
                "{} uses TLS: enable the `tls` feature of redlock",
                url.split('@').next_back().unwrap_or_default()
            ))),
            _ => Ok(()),
        }
    }
}

/// Configures and connects a [`LockManager`]; from [`LockManager::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until .build().await"]
pub struct LockManagerBuilder {
    target: Option<Target>,
    prefix: String,
    default_ttl: Duration,
    default_wait: Duration,
    max_waiters_per_key: usize,
    timeouts: Timeouts,
    redlock_node_timeout: Duration,
    require_noeviction: bool,
}

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "lock:";
/// The default ttl.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// The default wait budget.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);
/// The default bound of the local queue per key.
pub const DEFAULT_MAX_WAITERS_PER_KEY: usize = 1024;

impl Default for LockManagerBuilder {
    fn default() -> Self {
        Self {
            target: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            default_ttl: DEFAULT_TTL,
            default_wait: DEFAULT_WAIT,
            max_waiters_per_key: DEFAULT_MAX_WAITERS_PER_KEY,
            timeouts: Timeouts {
                connect: Duration::from_secs(3),
                response: Duration::from_secs(1),
            },
            redlock_node_timeout: DEFAULT_NODE_TIMEOUT,
            require_noeviction: false,
        }
    }
}

impl LockManagerBuilder {
    /// One Redis server, e.g. `redis://user:pass@127.0.0.1:6379/0`
    /// (`rediss://` with the `tls` feature).
    pub fn single(mut self, url: &str) -> Self {
        self.target = Some(Target::Single(url.to_owned()));
        self
    }

    /// A Redis Cluster, given one or more seed nodes (`redis://host:port`); the others are
    /// discovered. Every key a lock uses shares its hash tag, wake-ups use sharded
    /// pub/sub (Redis 7+), and `MOVED`/`ASK` and failovers are followed.
    pub fn cluster<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let urls = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        self.target = Some(Target::Cluster(urls));
        self
    }

    /// Redlock over N independent Redis masters (use an odd N, usually 3 or 5): a lock
    /// is held when a majority granted it in time. See the README's "Redlock mode" for
    /// what its fencing tokens guarantee, and the delayed-restart rule. Every node must
    /// answer at `build`; later, up to N − (N/2+1) nodes may be down.
    pub fn redlock<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let urls = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        self.target = Some(Target::Redlock(urls));
        self
    }

    /// Redlock only: the bound on each node's reply (default 200 ms; for each lock at
    /// most its ttl/10), so a frozen node slows a request by at most this much.
    pub fn redlock_node_timeout(mut self, timeout: Duration) -> Self {
        self.redlock_node_timeout = timeout;
        self
    }

    /// Process memory: no Redis, same semantics; all in-memory managers of a process
    /// share one store.
    pub fn in_memory(mut self) -> Self {
        self.target = Some(Target::Memory);
        self
    }

    /// The namespace put in front of every key (default `"lock:"`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The ttl of locks whose options set none (default 30 s).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// How long `lock` waits when the options set nothing (default 10 s).
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.default_wait = wait;
        self
    }

    /// How many tasks of this process may wait for one key, the one contending on the
    /// backend included (default 1024); beyond it `lock` fails with
    /// [`LockError::QueueFull`] at once. 0 is rejected by `build`.
    pub fn max_waiters_per_key(mut self, n: usize) -> Self {
        self.max_waiters_per_key = n;
        self
    }

    /// The bound on connecting, for each connection and for `build` as a whole
    /// (default 3 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.connect = timeout;
        self
    }

    /// The bound on each Redis reply (default 1 s).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.response = timeout;
        self
    }

    /// Whether a Redis node whose `maxmemory-policy` is not `noeviction` fails `build`
    /// (default `false`: it is logged as a warning).
    ///
    /// Under memory pressure any other policy may evict keys, lock keys included: the
    /// next client is then granted a lock that is still held, two holders at once.
    /// `build` reads the policy from `INFO memory` on every node locks are written to
    /// (the server, every Redlock node, every cluster master).
    pub fn require_noeviction(mut self, require: bool) -> Self {
        self.require_noeviction = require;
        self
    }

    /// Checks the settings, connects to and PINGs every node, reads every node's
    /// `maxmemory-policy`, and starts the manager's background task. Writes no key.
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] for a bad URL or setting (or no backend chosen, or a
    /// prefix with an unclosed `{`), or for a node whose `maxmemory-policy` is not
    /// `noeviction` under [`require_noeviction(true)`](Self::require_noeviction);
    /// [`LockError::Backend`] when a node cannot be reached within the connect timeout
    /// (or, under `require_noeviction(true)`, its policy cannot be read).
    pub async fn build(self) -> Result<LockManager, LockError> {
        check_ttl(self.default_ttl)?;
        check_prefix(&self.prefix)?;
        if Instant::now().checked_add(self.default_wait).is_none() {
            return Err(LockError::invalid_option("default_wait overflows"));
        }
        if self.max_waiters_per_key == 0 {
            return Err(LockError::invalid_option(
                "max_waiters_per_key must be at least 1",
            ));
        }
        if self.timeouts.connect.is_zero() || self.timeouts.response.is_zero() {
            return Err(LockError::invalid_option("timeouts must be positive"));
        }
        let target = self.target.ok_or_else(|| {
            LockError::invalid_option("no backend chosen: call .single(url), .cluster(urls), .redlock(urls) or .in_memory()")
        })?;
        target.check_tls_support()?;
        let (jobs, rx) = mpsc::unbounded_channel();
        let unsubscribe = jobs.downgrade();
        let waiters = Arc::new(Waiters::new(
            self.max_waiters_per_key,
            Box::new(move |key| {
                if let Some(jobs) = unsubscribe.upgrade() {
                    let _ = jobs.send(Job::Unsubscribe(key.to_owned()));
                }
            }),
        ));
        #[cfg(feature = "tls")]
        crate::tls::install_crypto_provider();
        let backend = match target {
            Target::Memory => Backend::Memory(MemoryBackend::new(Arc::downgrade(&waiters))),
            Target::Cluster(urls) => Backend::Cluster(
                ClusterBackend::connect(&urls, self.timeouts, Arc::downgrade(&waiters)).await?,
            ),
            Target::Redlock(urls) => Backend::Redlock(
                RedlockBackend::connect(
                    &urls,
                    self.timeouts,
                    self.redlock_node_timeout,
                    Arc::downgrade(&waiters),
                )
                .await?,
            ),
            Target::Single(url) => Backend::Single(
                SingleBackend::connect(&url, self.timeouts, Arc::downgrade(&waiters)).await?,
            ),
        };
        check_eviction(&backend, self.require_noeviction).await?;
        let shared = Arc::new(Shared::new(backend, waiters, self.default_ttl));
        tokio::spawn(watchdog::run(shared.clone(), rx));
        Ok(LockManager(Arc::new(Inner {
            shared,
            jobs,
            prefix: self.prefix,
            default_ttl: self.default_ttl,
            default_wait: self.default_wait,
            next_id: AtomicU64::new(1),
            #[cfg(test)]
            attempts: std::sync::atomic::AtomicUsize::new(0),
        })))
    }
}

/// Warns about, or with `require` refuses, nodes that may evict lock keys.
async fn check_eviction(backend: &Backend, require: bool) -> Result<(), LockError> {
    const RISK: &str = "Redis may evict lock keys under memory pressure, and an evicted \
                        lock is granted to a second client while its holder still holds it";
    for (node, policy) in backend.eviction_policies().await? {
        match policy {
            Ok(policy) if policy == "noeviction" => {}
            Ok(policy) if require => {
                return Err(LockError::invalid_option(format!(
                    "{node} has maxmemory-policy {policy}, and require_noeviction(true) \
                     needs noeviction: {RISK}"
                )));
            }
            Ok(policy) => tracing::warn!(
                node,
                policy,
                "maxmemory-policy is not noeviction: {RISK}; set it to noeviction"
            ),
            Err(e) if require => return Err(e),
            Err(e) => tracing::warn!(
                node,
                error = %e,
                "cannot read maxmemory-policy (INFO memory): if it is not noeviction, {RISK}"
            ),
        }
    }
    Ok(())
}

/// The manager `#[distributed_lock]` uses when no `manager =` is given.
static GLOBAL: RwLock<Option<LockManager>> = RwLock::new(None);

/// How often a head polls while it cannot hear releases.
const POLL_UNSUBSCRIBED: Duration = Duration::from_millis(100);
/// How long a head lets a key's channel go unheard before subscribing again.
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(1);
/// The longest pause between attempts that failed.
const MAX_RETRY_BACKOFF: Duration = Duration::from_millis(500);

/// Whether `lock` tries again after this error while it has wait budget left: a failed
/// request, or too few Redlock nodes answering in time (with a short ttl their timeout
/// is a few milliseconds, which one slow moment can miss). Anything else is the
/// answer.
fn retried_while_waiting(e: &LockError) -> bool {
    matches!(
        e,
        LockError::Backend { .. } | LockError::QuorumUnavailable { .. }
    )
}

/// How an attempt ended when it did not fail.
enum Outcome {
    Acquired(LockGuard),
    Held(Option<Duration>),
}

/// Releases in the background what an attempt may have taken, unless disarmed: the
/// request may have been applied even when its future was dropped or its reply lost.
struct PendingAttempt<'a> {
    manager: &'a LockManager,
    key: &'a LockKey,
    token: Token,
    armed: bool,
}

impl Drop for PendingAttempt<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self
                .manager
                .0
                .jobs
                .send(Job::Abandon(self.key.clone(), self.token));
        }
    }
}

impl LockManager {
    /// A builder with the defaults: prefix `"lock:"`, ttl 30 s, wait 10 s, 1024 waiters
    /// per key, connect timeout 3 s.
    pub fn builder() -> LockManagerBuilder {
        LockManagerBuilder::default()
    }

    /// Connects to one Redis server with the defaults.
    ///
    /// # Errors
    /// As [`LockManagerBuilder::build`].
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::builder().single(url).build().await
    }

    /// Makes this the manager `#[distributed_lock]` uses when no `manager =` is given.
    /// A later call replaces it (calls already running keep the one they resolved); the
    /// replaced manager is dropped once nothing else holds it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock_runtime::LockError> {
    /// use redlock_runtime::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// locks.clone().install_global();
    /// assert_eq!(LockManager::global().unwrap().backend_name(), "memory");
    /// # Ok(()) }
    /// ```
    pub fn install_global(self) {
        // Replaced under the lock, dropped after it.
        let _replaced = GLOBAL
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(self);
    }

    /// The manager installed by [`install_global`](Self::install_global), if any: a
    /// clone (an `Arc` inside) of the latest one.
    pub fn global() -> Option<LockManager> {
        GLOBAL
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The prefix put in front of every key.
    pub fn prefix(&self) -> &str {
        &self.0.prefix
    }

    /// The backend's name: `"memory"`, `"single"`, `"cluster"` or `"redlock"`.
    pub fn backend_name(&self) -> &'static str {
        self.0.shared.backend.name()
    }

    /// Acquires `key` (prefixed), waiting up to the default wait.
    ///
    /// The wait bounds the whole call: it returns within the wait plus at most one
    /// request timeout (the response timeout, or Redlock's per-node timeout, plus the
    /// `WAIT` of `min_replicas`), even when Redis hangs. A failed attempt
    /// ([`LockError::Backend`], [`LockError::QuorumUnavailable`]) is retried, after a
    /// short jittered pause, while wait budget is left.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when the wait ran out with the key still held,
    /// [`LockError::QueueFull`] when this process already has `max_waiters_per_key`
    /// tasks waiting for the key, [`LockError::InvalidKey`] for an empty or too long
    /// key; [`LockError::Backend`] when Redis failed, or
    /// [`LockError::QuorumUnavailable`] when too few Redlock nodes answered, on the last
    /// attempt before the wait ran out (with a zero wait: on the one attempt).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future at any point leaves no lock behind. A lock the
    /// server granted after the future was dropped is released in the background, and
    /// the queue slot is freed.
    pub async fn lock(&self, key: &str) -> Result<LockGuard, LockError> {
        self.lock_with(key, LockOptions::new()).await
    }

    /// One attempt: `Ok(None)` when someone else holds the lock.
    ///
    /// # Errors
    /// As [`lock`](Self::lock), without `Timeout` and `QueueFull`.
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    pub async fn try_lock(&self, key: &str) -> Result<Option<LockGuard>, LockError> {
        match self
            .lock_with(key, LockOptions::new().wait(Duration::ZERO))
            .await
        {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Acquires `key` with explicit options.
    ///
    /// # Errors
    /// As [`lock`](Self::lock); also [`LockError::InvalidOption`] for a ttl outside
    /// 1 ms ..= 30 days or a wait that overflows, and
    /// [`LockError::ReplicasUnavailable`] when `min_replicas` was not met (the lock is
    /// released again).
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    pub async fn lock_with(&self, key: &str, options: LockOptions) -> Result<LockGuard, LockError> {
        let key = LockKey::prefixed(&self.0.prefix, key)?;
        let resolved = options.resolve(self.0.default_ttl, self.0.default_wait)?;
        self.acquire(key, resolved).await
    }

    /// Whether anyone holds `key` now.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`], [`LockError::Backend`].
    pub async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        let key = LockKey::prefixed(&self.0.prefix, key)?;
        self.0.shared.backend.is_locked(&key).await
    }

    /// Deletes `key`'s lock whoever holds it, and wakes its waiters: an operator's tool
    /// for a stuck lock. The holder finds out at its next renewal. Returns whether a lock
    /// was there.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`], [`LockError::Backend`].
    pub async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        let key = LockKey::prefixed(&self.0.prefix, key)?;
        self.0.shared.backend.force_unlock(&key).await
    }

    /// The number of locks the watchdog is renewing.
    pub fn watched_locks(&self) -> usize {
        self.0.shared.watched()
    }

    /// The number of wake-up channels this manager keeps an interest in (summed over
    /// Redlock's nodes; 0 for the in-memory backend). For tests: it drops
    /// back to 0 once no task waits.
    #[doc(hidden)]
    pub fn subscription_interests(&self) -> usize {
        self.0.shared.backend.interests()
    }

    /// Acquires an already prefixed and validated key.
    pub(crate) async fn acquire(
        &self,
        key: LockKey,
        opts: Resolved,
    ) -> Result<LockGuard, LockError> {
        let span = tracing::debug_span!(
            "redlock.acquire",
            key = key.full(),
            backend = self.backend_name(),
            fencing_token = field::Empty,
        );
        let started = Instant::now();
        let result = async {
            let replicas = (opts.min_replicas > 0).then(|| ReplicaWait {
                replicas: opts.min_replicas,
                timeout: opts.replica_wait(),
            });
            let mut first_error = None;
            if opts.wait.is_zero() || !self.0.shared.waiters.is_queued(key.full()) {
                match self.bounded_attempt(&key, &opts, replicas).await {
                    Ok(Outcome::Acquired(guard)) => return Ok(guard),
                    Ok(Outcome::Held(_)) if opts.wait.is_zero() => {
                        return Err(LockError::Timeout {
                            key: key.into_full(),
                        })
                    }
                    // With time to wait, the wait loop tries again.
                    Ok(Outcome::Held(_)) => {}
                    Err(e) if retried_while_waiting(&e) && !opts.wait.is_zero() => {
                        first_error = Some(e);
                    }
                    Err(e) => return Err(e),
                }
            }
            let wait = tracing::debug_span!("redlock.wait", key = key.full());
            self.wait_for(&key, &opts, replicas, first_error)
                .instrument(wait)
                .await
        }
        .instrument(span.clone())
        .await;
        if let Ok(guard) = &result {
            span.record("fencing_token", guard.fencing_token());
            let waited = started.elapsed();
            if waited > Duration::from_secs(1) {
                tracing::info!(parent: &span, ?waited, "slow lock acquisition");
            }
        }
        result
    }

    /// One round trip: acquired, or held (with the holder's remaining ttl).
    ///
    /// Every attempt draws a fresh token. What an earlier attempt may have left on the
    /// server (a request applied after its reply was lost, a Redlock undo that did not
    /// arrive) carries an older token, so it can never be counted as part of this
    /// attempt's grant, and its background release can never delete this attempt's lock.
    async fn attempt(
        &self,
        key: &LockKey,
        opts: &Resolved,
        replicas: Option<ReplicaWait>,
    ) -> Result<Outcome, LockError> {
        #[cfg(test)]
        self.0.attempts.fetch_add(1, Ordering::Relaxed);
        let shared = &self.0.shared;
        let token = Token::random();
        let sent = lease::now();
        let mut pending = PendingAttempt {
            manager: self,
            key,
            token,
            armed: true,
        };
        let attempt = shared.backend.acquire(key, token, opts.ttl, replicas).await;
        // A backend that undoes its own failed attempts does so without waking anyone
        // (the waiters include this caller); a release from here would do it again,
        // with a wake-up.
        if attempt.is_ok() || shared.backend.undoes_failed_attempts() {
            pending.armed = false;
        }
        let attempt = attempt?;
        let fence = match attempt {
            Attempt::Held { remaining, .. } => return Ok(Outcome::Held(remaining)),
            Attempt::Acquired {
                fence,
                replicas: acked,
            } => {
                if let (Some(want), Some(acked)) = (replicas, acked) {
                    if acked < want.replicas {
                        pending.armed = true;
                        shared.backend.release(key, token).await?;
                        pending.armed = false;
                        return Err(LockError::ReplicasUnavailable {
                            key: key.full().to_owned(),
                            acked,
                            wanted: want.replicas,
                        });
                    }
                }
                fence
            }
        };
        let id = self.0.next_id.fetch_add(1, Ordering::Relaxed);
        let lease = Arc::new(Lease::new(id, key.clone(), token, fence, opts.ttl, sent));
        if opts.watchdog {
            shared.watch(&lease);
        }
        Ok(Outcome::Acquired(LockGuard::new(lease, self.clone())))
    }

    /// [`attempt`](Self::attempt), cut short once both the wait's deadline and one
    /// request timeout (its `WAIT` included) from now have passed: whatever hangs (a
    /// frozen server, a connection being opened or re-established), `lock` returns
    /// within its wait plus one request timeout. What a cut-short attempt may have
    /// taken is released in the background, as for any dropped attempt.
    async fn bounded_attempt(
        &self,
        key: &LockKey,
        opts: &Resolved,
        replicas: Option<ReplicaWait>,
    ) -> Result<Outcome, LockError> {
        let request = self.0.shared.backend.request_timeout(opts.ttl)
            + replicas.map_or(Duration::ZERO, |r| r.timeout);
        let now = tokio::time::Instant::now();
        let bound = (now + request).max(tokio::time::Instant::from_std(opts.deadline));
        tokio::time::timeout_at(bound, self.attempt(key, opts, replicas))
            .await
            .unwrap_or_else(|_| Err(LockError::timed_out("acquire", bound - now)))
    }

    /// Queues locally, then contends as the head until acquired or out of time. When
    /// the wait runs out, the last attempt's error is returned if it failed, else
    /// [`LockError::Timeout`].
    async fn wait_for(
        &self,
        key: &LockKey,
        opts: &Resolved,
        replicas: Option<ReplicaWait>,
        mut last_error: Option<LockError>,
    ) -> Result<LockGuard, LockError> {
        let shared = &self.0.shared;
        let timeout = || LockError::Timeout {
            key: key.full().to_owned(),
        };
        let place = shared
            .waiters
            .join(key.full())
            .ok_or_else(|| LockError::QueueFull {
                key: key.full().to_owned(),
            })?;
        let deadline = tokio::time::Instant::from_std(opts.deadline);
        let Ok(Ok(_turn)) = tokio::time::timeout_at(deadline, place.queue.turn.acquire()).await
        else {
            return Err(last_error.unwrap_or_else(timeout));
        };
        let mut backoff = Duration::from_millis(10);
        // When this head first saw the key's channel not listened to (or last asked).
        let mut unheard_since: Option<Instant> = None;
        let mut asked = false;
        // Each round ends in a wake-up, a timer or the deadline; the deadline ends the loop.
        loop {
            // No attempt starts once the wait is over: the initial attempt (or the turn)
            // may have run past the deadline already, and another one would take `lock`
            // beyond its wait plus one request timeout.
            if tokio::time::Instant::now() >= deadline {
                return Err(last_error.unwrap_or_else(timeout));
            }
            // Subscribed before the next attempt, so no release after it goes unnoticed.
            // The queue owns its interest from before the request is sent: if this
            // future is dropped or cut short mid-way, the channel is still unsubscribed
            // when the queue empties. The wait bounds the subscription too. A channel
            // unheard for a while (a subscription that failed, or one lost with its
            // connection and not restored by the connection's own resubscription) is
            // asked for again; meanwhile the head polls.
            //
            // A queue without an interest of its own registers one even when the
            // channel is listened to: that may be an earlier queue's interest, about to
            // be dropped (and the channel unsubscribed). On a confirmed channel this
            // only counts the interest, without a round trip.
            let unregistered =
                place.queue.subscription() == Subscription::None && shared.backend.has_channels();
            if shared.backend.listening(key.full()) && !unregistered {
                unheard_since = None;
            } else {
                let now = Instant::now();
                let since = *unheard_since.get_or_insert(now);
                if unregistered || !asked || now.duration_since(since) >= RESUBSCRIBE_AFTER {
                    let again = std::mem::replace(&mut asked, true);
                    unheard_since = Some(now);
                    let register = unregistered;
                    place.queue.set_subscription(Subscription::Asked);
                    let subscribe = shared.backend.subscribe(key.full(), register);
                    match tokio::time::timeout_at(deadline, subscribe).await {
                        Err(_) => return Err(last_error.unwrap_or_else(timeout)),
                        Ok(Ok(())) => {
                            place.queue.set_subscription(Subscription::Confirmed);
                            // Heard from now on: a later loss (a reconnect) starts its own
                            // grace period, in which the connection's resubscription can
                            // restore the channel before this head asks again.
                            unheard_since = None;
                        }
                        Ok(Err(e)) if again => {
                            tracing::debug!(error = %e, "subscribing again failed; polling");
                        }
                        Ok(Err(e)) => {
                            tracing::warn!(error = %e, "no release notifications; polling");
                        }
                    }
                }
            }
            let mut notified = pin!(place.queue.wake.notified());
            notified.as_mut().enable();
            let pause = match self.bounded_attempt(key, opts, replicas).await {
                Ok(Outcome::Acquired(guard)) => return Ok(guard),
                Ok(Outcome::Held(remaining)) => {
                    last_error = None;
                    let fallback =
                        remaining.unwrap_or(Duration::from_secs(1)) + Duration::from_millis(1);
                    // Not listening (no subscription, or its connection dropped and it
                    // is not restored yet): a release would go unheard, so poll.
                    if shared.backend.listening(key.full()) {
                        fallback
                    } else {
                        fallback.min(POLL_UNSUBSCRIBED)
                    }
                }
                Err(e) if retried_while_waiting(&e) => {
                    tracing::debug!(error = %e, "acquire attempt failed; retrying");
                    last_error = Some(e);
                    backoff = (backoff * 2).min(MAX_RETRY_BACKOFF);
                    // Jittered, so managers that failed together do not retry together.
                    backoff / 2 + jitter(backoff / 2)
                }
                Err(e) => return Err(e),
            };
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(last_error.unwrap_or_else(timeout));
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until((now + pause).min(deadline)) => {}
            }
        }
    }

    /// Releases a lease now (the guard's `release`).
    pub(crate) async fn release_lease(&self, lease: &Arc<Lease>) -> Result<(), LockError> {
        let shared = &self.0.shared;
        let key = lease.key.full();
        let Some(was) = lease.mark_released() else {
            return Err(LockError::NotHeld {
                key: key.to_owned(),
            });
        };
        shared.unwatch(lease.id);
        let mut pending = PendingAttempt {
            manager: self,
            key: &lease.key,
            token: lease.token,
            armed: true,
        };
        let span = tracing::debug_span!(
            "redlock.release",
            key,
            backend = self.backend_name(),
            fencing_token = lease.fence
        );
        let released = shared
            .backend
            .release(&lease.key, lease.token)
            .instrument(span)
            .await;
        // A failed request is retried in the background (compare-token, so harmless).
        pending.armed = released.is_err();
        match (released?, was) {
            (true, Ok(())) => {
                shared.waiters.wake(key);
                Ok(())
            }
            (true, Err(())) => {
                shared.waiters.wake(key);
                Err(LockError::Lost {
                    key: key.to_owned(),
                })
            }
            (false, _) => Err(LockError::Lost {
                key: key.to_owned(),
            }),
        }
    }

    /// Hands a dropped guard's release to the background task.
    pub(crate) fn release_in_background(&self, lease: &Arc<Lease>) {
        if lease.mark_released().is_some() {
            self.0.shared.unwatch(lease.id);
            let _ = self.0.jobs.send(Job::Release(lease.clone()));
        }
    }

    /// Sets a lease's remaining ttl.
    ///
    /// The request runs in a task of its own, holding the lease's operation lock until
    /// its outcome is booked: dropping this future neither cancels the request nor lets
    /// a renewal overtake it (see the `lease` module for the rules).
    pub(crate) async fn extend_lease(
        &self,
        lease: &Arc<Lease>,
        ttl: Duration,
    ) -> Result<(), LockError> {
        check_ttl(ttl)?;
        let lost = |lease: &Lease| LockError::Lost {
            key: lease.key.full().to_owned(),
        };
        if !lease.is_held() {
            return Err(lost(lease));
        }
        let op = lease.op.clone().lock_owned().await;
        if !lease.is_held() {
            return Err(lost(lease));
        }
        let manager = self.clone();
        let task_lease = lease.clone();
        let request = tokio::spawn(async move {
            let (lease, shared) = (task_lease, &manager.0.shared);
            let sent = lease::now();
            lease.extending(sent, ttl);
            // The watchdog declares the lock lost at the lowered deadline if no reply
            // raised it by then.
            shared.reschedule(&lease);
            let outcome = match shared.backend.extend(&lease.key, lease.token, ttl).await {
                Ok(true) => {
                    lease.confirmed(sent, ttl);
                    Ok(())
                }
                Ok(false) => {
                    lease.mark_lost("the server no longer holds this lock's token");
                    Err(lost(&lease))
                }
                Err(e) => Err(e),
            };
            drop(op);
            // The renewal schedule moved (and renewals were skipped while this ran).
            shared.reschedule(&lease);
            outcome
        });
        match request.await {
            Ok(outcome) => outcome,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Only when the runtime shuts down.
            Err(_) => Err(lost(lease)),
        }
    }

    /// A string that starts with the prefix, for building a key in place.
    pub(crate) fn key_buffer(&self, capacity: usize) -> String {
        let mut s = String::with_capacity(self.0.prefix.len() + capacity);
        s.push_str(&self.0.prefix);
        s
    }

    /// Whether `other` is this manager or a clone of it: two managers built separately
    /// are different, even over the same Redis.
    pub(crate) fn same_as(&self, other: &LockManager) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    pub(crate) fn resolve(&self, options: &LockOptions) -> Result<Resolved, LockError> {
        options.resolve(self.0.default_ttl, self.0.default_wait)
    }
}

impl fmt::Debug for LockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockManager")
            .field("backend", &self.backend_name())
            .field("prefix", &self.0.prefix)
            .field("default_ttl", &self.0.default_ttl)
            .field("default_wait", &self.0.default_wait)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (review of `liveness`, finding 5): when the initial attempt ended past
    /// the wait's deadline and the key's channel was listened to, the wait loop made a
    /// second full attempt (on a hung server, `lock` returned after its wait plus two
    /// request timeouts). The in-memory backend always listens; a 1 ns wait has passed
    /// by the time the initial attempt returns.
    #[tokio::test]
    async fn no_attempt_starts_after_the_deadline() {
        let locks = LockManager::builder().in_memory().build().await.unwrap();
        let held = locks.lock("k").await.unwrap();
        let before = locks.0.attempts.load(Ordering::Relaxed);
        let err = locks
            .lock_with("k", LockOptions::new().wait(Duration::from_nanos(1)))
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }), "{err}");
        let made = locks.0.attempts.load(Ordering::Relaxed) - before;
        assert_eq!(made, 1, "{made} attempts for a wait already over");
        held.release().await.unwrap();
    }

    /// Regression (issue 13, the seam): `install_global` leaked every manager it
    /// replaced (a `Box` never freed, behind an `AtomicPtr` read with `unsafe`).
    /// The only test of this crate that touches the global.
    #[tokio::test]
    async fn install_global_twice_drops_the_replaced_manager() {
        let first = LockManager::builder().in_memory().build().await.unwrap();
        let second = LockManager::builder().in_memory().build().await.unwrap();
        first.clone().install_global();
        assert!(LockManager::global().unwrap().same_as(&first));
        assert_eq!(
            Arc::strong_count(&first.0),
            2,
            "installed: ours and the global's"
        );
        second.clone().install_global();
        assert!(LockManager::global().unwrap().same_as(&second));
        assert_eq!(
            Arc::strong_count(&first.0),
            1,
            "the replaced manager leaked"
        );
        assert_eq!(Arc::strong_count(&second.0), 2);
        // Installing the installed one again keeps one reference, not two.
        second.clone().install_global();
        assert_eq!(Arc::strong_count(&second.0), 2);
        let guard = LockManager::global().unwrap().lock("k").await.unwrap();
        assert!(second.is_locked("k").await.unwrap());
        guard.release().await.unwrap();
    }
}
