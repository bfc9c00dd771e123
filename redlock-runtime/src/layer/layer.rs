use std::fmt;
use std::time::Duration;

use tower::Layer;

use super::LockService;
use crate::{LockManager, LockOptions};

/// A [`tower::Layer`] that holds a distributed lock, keyed by the request, while the
/// inner service produces the response. See [the module docs](super) for the behaviour
/// and the status codes of rejected requests.
///
/// `K` is the [`KeyFn`](super::KeyFn): a closure `Fn(&http::Request<B>) ->
/// Option<String>` (annotate the request type) or a typed extractor from
/// [`key`](super::key), which builds the key from the value the handler parses.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), redlock::LockError> {
/// use std::time::Duration;
/// use redlock::tower::{key, LockLayer};
/// use redlock::{LockManager, LockOptions};
///
/// let locks = LockManager::builder().in_memory().build().await?;
/// let by_goods = LockLayer::new(locks.clone(), key::path_segment::<u64>(1, "goods_{}"))
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_millis(500));
/// let by_tenant = LockLayer::new(locks, key::header::<String>("x-tenant", "tenant_{}"))
///     .options(LockOptions::new().wait(Duration::ZERO).watchdog(false));
/// # let _ = (by_goods, by_tenant);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockLayer<K> {
    manager: LockManager,
    key: K,
    options: LockOptions,
}

impl<K> LockLayer<K> {
    /// A layer locking the key `key` derives from each request, on `manager`, with the
    /// manager's default ttl and wait.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::tower::{key, LockLayer};
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let layer = LockLayer::new(locks, key::path_segment::<u64>(1, "goods_{}"));
    /// assert_eq!(layer.manager().backend_name(), "memory");
    /// # Ok(()) }
    /// ```
    pub fn new(manager: LockManager, key: K) -> Self {
        Self {
            manager,
            key,
            options: LockOptions::new(),
        }
    }

    /// The lock's ttl (renewed by the watchdog while the request runs). An out-of-range
    /// ttl makes every keyed request fail with `InvalidOption` (500).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::tower::{key, LockLayer};
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let layer = LockLayer::new(locks, key::path_segment::<u64>(1, "goods_{}"))
    ///     .ttl(Duration::from_secs(10));
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.options.ttl = Some(ttl);
        self
    }

    /// How long a request waits for the lock before `423 Locked`; `Duration::ZERO` makes
    /// one attempt.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::tower::{key, LockLayer};
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// // Busy for more than 3 s: 423 Locked.
    /// let layer = LockLayer::new(locks, key::path_segment::<u64>(1, "goods_{}"))
    ///     .wait(Duration::from_secs(3));
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn wait(mut self, wait: Duration) -> Self {
        self.options.wait = Some(wait);
        self
    }

    /// Replaces all lock options (ttl, wait, watchdog, `min_replicas`) at once.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::tower::{key, LockLayer};
    /// use redlock::{LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let layer = LockLayer::new(locks, key::header::<u64>("x-account", "account_{}")).options(
    ///     LockOptions::new().ttl(Duration::from_secs(5)).wait(Duration::ZERO),
    /// );
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// The manager the layer locks with.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::tower::{key, LockLayer};
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let layer = LockLayer::new(locks.clone(), key::path_segment::<u64>(1, "goods_{}"));
    /// assert_eq!(layer.manager().prefix(), locks.prefix());
    /// # Ok(()) }
    /// ```
    pub fn manager(&self) -> &LockManager {
        &self.manager
    }
}

impl<S, K: Clone> Layer<S> for LockLayer<K> {
    type Service = LockService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        LockService::new(
            inner,
            self.manager.clone(),
            self.key.clone(),
            self.options.clone(),
        )
    }
}

impl<K> fmt::Debug for LockLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLayer")
            .field("manager", &self.manager)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}
