//! [`LockManagerBuilder`]: configures and connects a [`LockManager`].

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::cluster::ClusterClient;
use redis::ConnectionInfo;
use tokio::sync::mpsc;

use super::{Inner, LockManager};
use crate::backend::{
    only, Backend, ClusterBackend, ClusterNodes, MemoryBackend, RedlockBackend, SentinelBackend,
    Settings, SingleBackend, Target, Timeouts, DEFAULT_NODE_TIMEOUT,
};
use crate::engine::{self, Job, Shared};
use crate::error::chain;
use crate::key::check_prefix;
use crate::node::{is_tls, IntoNode};
use crate::options::{check_ttl, MIN_TTL};
use crate::waiters::{Waiters, Wake};
use crate::LockError;

/// Configures and connects a [`LockManager`]; from [`LockManager::builder`].
///
/// Its `Debug` shows the nodes with their passwords replaced by `<redacted>`.
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
    slow_acquisition: Duration,
}

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "lock:";
/// The default ttl.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// The default wait budget.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);
/// The default bound of the local queue per key.
pub const DEFAULT_MAX_WAITERS_PER_KEY: usize = 1024;
/// The default [`slow_acquisition_threshold`](LockManagerBuilder::slow_acquisition_threshold).
pub const DEFAULT_SLOW_ACQUISITION: Duration = Duration::from_secs(1);

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
            slow_acquisition: DEFAULT_SLOW_ACQUISITION,
        }
    }
}

impl LockManagerBuilder {
    /// One Redis server: a URL such as `redis://user:pass@127.0.0.1:6379/0`
    /// (`rediss://` with the `tls` feature, `redis+unix:///path`) or a
    /// [`redis::ConnectionInfo`]; see [`IntoNode`]. A URL that does not parse is
    /// reported by [`build`](Self::build).
    ///
    /// ```
    /// use redlock::LockManager;
    ///
    /// let builder = LockManager::builder().single("redis://127.0.0.1:6379/0");
    /// ```
    pub fn single(mut self, node: impl IntoNode) -> Self {
        let node = node
            .into_node()
            .map_err(|e| format!("invalid Redis node: {e}"));
        self.target = Some(single(node.map(|node| vec![node])));
        self
    }

    /// One Redis server through a configured [`redis::Client`] (custom TLS roots, client
    /// certificates, credentials from a secret store). The manager opens its own
    /// connections with the client's settings; [`connect_timeout`](Self::connect_timeout)
    /// and [`response_timeout`](Self::response_timeout) bound them.
    ///
    /// ```
    /// use redlock::{redis, LockManager};
    ///
    /// let client = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let builder = LockManager::builder().single_client(client);
    /// # Ok::<(), redis::RedisError>(())
    /// ```
    pub fn single_client(mut self, client: redis::Client) -> Self {
        self.target = Some(single(Ok(vec![client.get_connection_info().clone()])));
        self
    }

    /// A Redis Cluster, given one or more seed nodes (URLs such as `redis://host:port`,
    /// or [`redis::ConnectionInfo`]s; see [`IntoNode`]); the others are discovered.
    /// Every key a lock uses shares its hash tag, wake-ups use sharded pub/sub
    /// (Redis 7+), and `MOVED`/`ASK` and failovers are followed.
    ///
    /// ```
    /// use redlock::LockManager;
    ///
    /// let builder = LockManager::builder().cluster(["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]);
    /// ```
    pub fn cluster<I>(mut self, nodes: I) -> Self
    where
        I: IntoIterator,
        I::Item: IntoNode,
    {
        self.target = Some(Target::new("Cluster", Target::nodes(nodes), |nodes, s| {
            let nodes = ClusterNodes::Infos(nodes);
            async move {
                let cluster = ClusterBackend::connect(nodes, s.timeouts, s.wake).await?;
                Ok(Backend::Cluster(cluster))
            }
        }));
        self
    }

    /// A Redis Cluster through a configured
    /// [`ClusterClient`] (custom TLS roots, client
    /// certificates, credentials, retry settings). Wake-ups need sharded pub/sub, so the
    /// client must speak RESP3
    /// ([`use_protocol(ProtocolVersion::RESP3)`](redis::cluster::ClusterClientBuilder::use_protocol));
    /// [`build`](Self::build) refuses one that does not. The manager's
    /// [`connect_timeout`](Self::connect_timeout) and
    /// [`response_timeout`](Self::response_timeout) replace the client's timeouts.
    ///
    /// ```
    /// use redlock::{redis, LockManager};
    ///
    /// let client = redis::cluster::ClusterClientBuilder::new(["redis://127.0.0.1:7000"])
    ///     .use_protocol(redis::ProtocolVersion::RESP3)
    ///     .build()?;
    /// let builder = LockManager::builder().cluster_client(client);
    /// # Ok::<(), redis::RedisError>(())
    /// ```
    pub fn cluster_client(mut self, client: ClusterClient) -> Self {
        let client = Box::new(client);
        let target = Target::new("ClusterClient", Ok(Vec::new()), move |_, s| {
            let nodes = ClusterNodes::Client(client.clone());
            async move {
                let cluster = ClusterBackend::connect(nodes, s.timeouts, s.wake).await?;
                Ok(Backend::Cluster(cluster))
            }
        });
        self.target = Some(target.labelled("..".to_owned()));
        self
    }

    /// Redlock over N independent Redis masters (use an odd N, usually 3 or 5): a lock
    /// is held when a majority granted it in time. Nodes are URLs or
    /// [`redis::ConnectionInfo`]s (see [`IntoNode`]). See "Redlock mode" in the
    /// repository's `docs/backends.md` for what its fencing tokens guarantee, and the
    /// delayed-restart rule. Every node must answer at `build`; later, up to
    /// N − (N/2+1) nodes may be down.
    ///
    /// ```
    /// use redlock::LockManager;
    ///
    /// let builder = LockManager::builder().redlock([
    ///     "redis://10.0.0.1:6379",
    ///     "redis://10.0.0.2:6379",
    ///     "redis://10.0.0.3:6379",
    /// ]);
    /// ```
    pub fn redlock<I>(mut self, nodes: I) -> Self
    where
        I: IntoIterator,
        I::Item: IntoNode,
    {
        self.target = Some(Target::new("Redlock", Target::nodes(nodes), |nodes, s| {
            let (timeouts, node_timeout) = (s.timeouts, s.redlock_node_timeout);
            async move {
                let redlock =
                    RedlockBackend::connect(nodes, timeouts, node_timeout, s.wake).await?;
                Ok(Backend::Redlock(redlock))
            }
        }));
        self
    }

    /// A primary with replicas under Redis Sentinel: `master_name` as the Sentinels
    /// know it, and one or more Sentinels (URLs such as `redis://127.0.0.1:26379`, or
    /// [`redis::ConnectionInfo`]s; see [`IntoNode`]). `build` asks them for the master;
    /// the manager then follows it through failovers (re-asking after a failed request,
    /// on `+switch-master` and every second), re-subscribes its waiters on the new
    /// master and renews held locks there (a lock whose write was lost in the failover
    /// is reported lost). The first URL's credentials, database and TLS apply to the
    /// Sentinels and to the data nodes. See "Sentinel" in the repository's
    /// `docs/backends.md` for what a failover costs and what `min_replicas` keeps.
    ///
    /// ```
    /// use redlock::LockManager;
    ///
    /// let builder = LockManager::builder().sentinel(
    ///     "mymaster",
    ///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    /// );
    /// ```
    pub fn sentinel<I>(mut self, master_name: impl Into<String>, sentinels: I) -> Self
    where
        I: IntoIterator,
        I::Item: IntoNode,
    {
        let master: String = master_name.into();
        let sentinels = Target::nodes(sentinels).map_err(|e| e.replace("Redis node", "Sentinel"));
        let named = master.clone();
        let target = Target::new("Sentinel", sentinels, move |sentinels, s| {
            let master = named.clone();
            async move {
                let sentinel =
                    SentinelBackend::connect(master, sentinels, s.timeouts, s.wake).await?;
                Ok(Backend::Sentinel(sentinel))
            }
        });
        self.target = Some(target.labelled(master));
        self
    }

    /// Redlock only: the bound on each node's reply (default 200 ms; for each lock at
    /// most its ttl/10), so a frozen node slows a request by at most this much.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// use redlock::LockManager;
    ///
    /// let builder = LockManager::builder()
    ///     .redlock(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
    ///     .redlock_node_timeout(Duration::from_millis(100));
    /// ```
    pub fn redlock_node_timeout(mut self, timeout: Duration) -> Self {
        self.redlock_node_timeout = timeout;
        self
    }

    /// Process memory: no Redis, same semantics; all in-memory managers of a process
    /// share one store.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let a = LockManager::builder().in_memory().build().await?;
    /// let b = LockManager::builder().in_memory().build().await?;
    /// let held = a.lock("buy_{42}").await?;
    /// assert!(b.try_lock("buy_{42}").await?.is_none()); // one store per process
    /// held.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn in_memory(mut self) -> Self {
        self.target = Some(Target::new("Memory", Ok(Vec::new()), |_, s| async move {
            Ok(Backend::Memory(MemoryBackend::new(s.wake)))
        }));
        self
    }

    /// The namespace put in front of every key (default `"lock:"`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().prefix("shop:lock:").build().await?;
    /// let guard = locks.lock("buy_{42}").await?;
    /// assert_eq!(guard.key(), "shop:lock:buy_{42}");
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The ttl of locks whose options set none (default 30 s; 1 ms ..= 30 days, on
    /// Redlock 5 ms ..= 30 days, checked by [`build`](Self::build)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::{Duration, Instant};
    ///
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder()
    ///     .in_memory()
    ///     .default_ttl(Duration::from_secs(5))
    ///     .build()
    ///     .await?;
    /// let guard = locks.lock("buy_{42}").await?;
    /// assert!(guard.valid_until() <= Instant::now() + Duration::from_secs(5));
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// How long `lock` waits when the options set nothing (default 10 s).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockError, LockManager};
    ///
    /// let locks = LockManager::builder()
    ///     .in_memory()
    ///     .default_wait(Duration::from_millis(20))
    ///     .build()
    ///     .await?;
    /// let _held = locks.lock("buy_{42}").await?;
    /// assert!(matches!(locks.lock("buy_{42}").await, Err(LockError::Timeout { .. })));
    /// # Ok(()) }
    /// ```
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.default_wait = wait;
        self
    }

    /// How many tasks of this process may wait for one key, the one contending on the
    /// backend included (default 1024); beyond it `lock` fails with
    /// [`LockError::QueueFull`] at once. 0 is rejected by `build`.
    ///
    /// ```
    /// use redlock::LockManager;
    ///
    /// // A flood of callers of one key gets QueueFull beyond 64 waiting here.
    /// let builder = LockManager::builder().in_memory().max_waiters_per_key(64);
    /// ```
    pub fn max_waiters_per_key(mut self, n: usize) -> Self {
        self.max_waiters_per_key = n;
        self
    }

    /// The bound on connecting, for each connection and for `build` as a whole
    /// (default 3 s).
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// use redlock::LockManager;
    ///
    /// let builder = LockManager::builder()
    ///     .single("redis://127.0.0.1:6379")
    ///     .connect_timeout(Duration::from_secs(1));
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.connect = timeout;
        self
    }

    /// The bound on each Redis reply (default 1 s).
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// use redlock::LockManager;
    ///
    /// let builder = LockManager::builder()
    ///     .single("redis://127.0.0.1:6379")
    ///     .response_timeout(Duration::from_millis(500));
    /// ```
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
    ///
    /// ```
    /// use redlock::LockManager;
    ///
    /// // `build` fails unless the server is set `maxmemory-policy noeviction`.
    /// let builder = LockManager::builder()
    ///     .single("redis://127.0.0.1:6379")
    ///     .require_noeviction(true);
    /// ```
    pub fn require_noeviction(mut self, require: bool) -> Self {
        self.require_noeviction = require;
        self
    }

    /// Acquisitions that took longer than this are logged at `INFO` ("slow lock
    /// acquisition", with the key, kind, backend, fencing token and time waited);
    /// default 1 s. `Duration::MAX` turns the log off.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// use redlock::LockManager;
    ///
    /// // Log acquisitions that waited more than 250 ms (INFO, target `redlock`).
    /// let builder = LockManager::builder()
    ///     .in_memory()
    ///     .slow_acquisition_threshold(Duration::from_millis(250));
    /// ```
    pub fn slow_acquisition_threshold(mut self, threshold: Duration) -> Self {
        self.slow_acquisition = threshold;
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
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future closes what it had opened; nothing is left on the
    /// server.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockError, LockManager};
    ///
    /// let locks = LockManager::builder()
    ///     .in_memory() // or .single(url), .cluster(seeds), .redlock(urls)
    ///     .prefix("shop:")
    ///     .default_ttl(Duration::from_secs(10))
    ///     .build()
    ///     .await?;
    /// assert_eq!(locks.lock("buy_{42}").await?.key(), "shop:buy_{42}");
    ///
    /// let nowhere = LockManager::builder().build().await; // no backend chosen
    /// assert!(matches!(nowhere, Err(LockError::InvalidOption { .. })));
    /// # Ok(()) }
    /// ```
    pub async fn build(self) -> Result<LockManager, LockError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| LockError::WrongRuntime {
                place: "outside any runtime",
            })?
            .id();
        self.check_settings()?;
        let target = self.target.ok_or_else(|| {
            LockError::invalid_option("no backend chosen: call .single(url), .cluster(urls), .redlock(urls), .sentinel(name, urls) or .in_memory()")
        })?;
        let nodes = target.checked()?;
        if nodes.iter().any(is_tls) {
            check_tls_support()?;
        }
        let (jobs, rx) = mpsc::unbounded_channel();
        let waiters = unsubscribing_waiters(self.max_waiters_per_key, &jobs);
        let settings = Settings {
            timeouts: self.timeouts,
            redlock_node_timeout: self.redlock_node_timeout,
            wake: Wake::new(&waiters),
        };
        let backend = target.connect(settings).await?;
        // Again with the backend's shortest grantable ttl, known now.
        check_ttl(self.default_ttl, backend.min_ttl())?;
        let eviction = if self.require_noeviction {
            Eviction::Required
        } else {
            Eviction::Warned
        };
        check_eviction(&backend, eviction).await?;
        let shared = Arc::new(Shared::new(backend, waiters, self.default_ttl));
        tokio::spawn(engine::run(shared.clone(), rx));
        Ok(LockManager(Arc::new(Inner {
            runtime,
            shared,
            jobs,
            prefix: self.prefix,
            default_ttl: self.default_ttl,
            default_wait: self.default_wait,
            next_id: AtomicU64::new(1),
            slow_acquisition: self.slow_acquisition,
            #[cfg(test)]
            attempts: std::sync::atomic::AtomicUsize::new(0),
        })))
    }

    /// The settings that need no backend: the default ttl (against the shortest any
    /// backend grants), the prefix, the default wait, the waiter bound and the timeouts.
    fn check_settings(&self) -> Result<(), LockError> {
        check_ttl(self.default_ttl, MIN_TTL)?;
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
        Ok(())
    }
}

/// The manager's waiters, at most `max_per_key` per key; a key nobody waits for any
/// more is handed to the background task (`jobs`) to unsubscribe from.
fn unsubscribing_waiters(max_per_key: usize, jobs: &mpsc::UnboundedSender<Job>) -> Arc<Waiters> {
    let unsubscribe = jobs.downgrade();
    Arc::new(Waiters::new(
        max_per_key,
        Box::new(move |key| {
            if let Some(jobs) = unsubscribe.upgrade() {
                let _ = jobs.send(Job::Unsubscribe(key.to_owned()));
            }
        }),
    ))
}

/// TLS needs the `tls` feature, and a rustls crypto provider the application installed.
///
/// The library never installs a process-wide provider itself: one installed behind the
/// application's back would make the application's own `install_default` fail later.
fn check_tls_support() -> Result<(), LockError> {
    #[cfg(feature = "tls")]
    return crate::tls::check_provider();
    #[cfg(not(feature = "tls"))]
    Err(LockError::invalid_option(
        "a TLS node (rediss://) needs the `tls` feature of redlock",
    ))
}

/// What [`check_eviction`] does about a node that may evict lock keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Eviction {
    /// Refuses it (`require_noeviction(true)`).
    Required,
    /// Warns about it.
    Warned,
}

/// Warns about, or as `eviction` says refuses, nodes that may evict lock keys.
async fn check_eviction(backend: &Backend, eviction: Eviction) -> Result<(), LockError> {
    let require = eviction == Eviction::Required;
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
                target: "redlock",
                node,
                backend = backend.name(),
                policy,
                "maxmemory-policy is not noeviction: {RISK}; set it to noeviction"
            ),
            Err(e) if require => return Err(e),
            Err(e) => tracing::warn!(
                target: "redlock",
                node,
                backend = backend.name(),
                error = %chain(&e),
                "cannot read maxmemory-policy (INFO memory): if it is not noeviction, {RISK}"
            ),
        }
    }
    Ok(())
}

/// One Redis server (`single`, `single_client`): `node`, its one node.
fn single(node: Result<Vec<ConnectionInfo>, String>) -> Target {
    Target::new("Single", node, |node, s| async move {
        let single = SingleBackend::connect(only(node)?, s.timeouts, s.wake, "single").await?;
        Ok(Backend::Single(single))
    })
}
