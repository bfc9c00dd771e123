//! Getting a [`LockManager`]: its builder, a one-line connect, the process-wide global
//! the macro uses, and what it is connected to.

use std::sync::{PoisonError, RwLock};

use super::{LockManager, LockManagerBuilder};
use crate::LockError;

/// The manager `#[distributed_lock]` uses when no `manager =` is given.
static GLOBAL: RwLock<Option<LockManager>> = RwLock::new(None);

impl LockManager {
    /// A builder with the defaults: prefix `"lock:"`, ttl 30 s, wait 10 s, 1024 waiters
    /// per key, connect timeout 3 s.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// assert_eq!(locks.backend_name(), "memory");
    /// # Ok(()) }
    /// ```
    pub fn builder() -> LockManagerBuilder {
        LockManagerBuilder::default()
    }

    /// Connects to one Redis server with the defaults.
    ///
    /// # Errors
    /// As [`LockManagerBuilder::build`].
    ///
    /// # Cancel safety
    /// As [`build`](LockManagerBuilder::build).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::connect("redis://127.0.0.1:6379").await?;
    /// let guard = locks.lock("buy_{42}").await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::builder().single(url).build().await
    }

    /// Makes this the manager `#[distributed_lock]` uses when no `manager =` is given.
    /// A later call replaces it (calls already running keep the one they resolved); the
    /// replaced manager is dropped once nothing else holds it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
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
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// LockManager::builder().in_memory().build().await?.install_global();
    /// let locks = LockManager::global().expect("installed above");
    /// assert_eq!(locks.backend_name(), "memory");
    /// # Ok(()) }
    /// ```
    pub fn global() -> Option<LockManager> {
        GLOBAL
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The prefix put in front of every key.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// assert_eq!(locks.prefix(), "lock:");
    /// # Ok(()) }
    /// ```
    pub fn prefix(&self) -> &str {
        &self.0.prefix
    }

    /// The backend's name: `"memory"`, `"single"`, `"cluster"` or `"redlock"`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// assert_eq!(locks.backend_name(), "memory");
    /// # Ok(()) }
    /// ```
    pub fn backend_name(&self) -> &'static str {
        self.0.shared.backend.name()
    }
}
