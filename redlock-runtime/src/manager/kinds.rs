//! The read/write, permit and several-keys API of [`LockManager`].

use std::time::Duration;

use super::LockManager;
use crate::key::LockKey;
use crate::kind::Mode;
use crate::{LockError, LockGuard, LockOptions, MultiGuard};

/// `Ok(None)` for a [`LockError::Timeout`]: what the `try_` calls return when the key is
/// held.
pub(super) fn optional<G>(result: Result<G, LockError>) -> Result<Option<G>, LockError> {
    match result {
        Ok(guard) => Ok(Some(guard)),
        Err(LockError::Timeout { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `options` with a zero wait: one attempt.
pub(super) fn once(options: LockOptions) -> LockOptions {
    options.wait(Duration::ZERO)
}

impl LockManager {
    /// Takes `key` for reading: any number of readers at once, none while a writer
    /// ([`write`](Self::write) or [`lock`](Self::lock)) holds the key or waits for it
    /// (writer-preferring, across managers: the server keeps the waiting writers).
    /// Waits up to the default wait, like [`lock`](Self::lock).
    ///
    /// Each reader is a lease of its own with its own fencing token, renewed by the
    /// watchdog, freed by its ttl (the server's clock) if the process dies.
    ///
    /// # Errors
    /// As [`lock`](Self::lock).
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let a = locks.read("report_{7}").await?;
    /// let b = locks.read("report_{7}").await?; // readers share
    /// assert!(locks.try_write("report_{7}").await?.is_none()); // no writer meanwhile
    /// drop((a, b));
    /// # Ok(()) }
    /// ```
    pub async fn read(&self, key: &str) -> Result<LockGuard, LockError> {
        self.read_with(key, LockOptions::new()).await
    }

    /// One attempt at [`read`](Self::read): `Ok(None)` when a writer holds or waits.
    ///
    /// # Errors
    /// As [`try_lock`](Self::try_lock).
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let writer = locks.write("report_{7}").await?;
    /// assert!(locks.try_read("report_{7}").await?.is_none());
    /// writer.release().await?;
    /// assert!(locks.try_read("report_{7}").await?.is_some());
    /// # Ok(()) }
    /// ```
    pub async fn try_read(&self, key: &str) -> Result<Option<LockGuard>, LockError> {
        optional(self.read_with(key, once(LockOptions::new())).await)
    }

    /// One attempt at [`read_with`](Self::read_with) (the options' `wait` is ignored):
    /// `Ok(None)` when a writer holds the key or waits for it, counted as the metrics
    /// outcome `busy`.
    ///
    /// # Errors
    /// As [`read_with`](Self::read_with), without `Timeout` and `QueueFull`.
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let short = LockOptions::new().ttl(Duration::from_secs(5));
    /// let reader = locks.try_read_with("report_{7}", short.clone()).await?;
    /// assert!(reader.is_some());
    /// assert!(locks.try_write_with("report_{7}", short).await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn try_read_with(
        &self,
        key: &str,
        options: LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        optional(self.read_with(key, once(options)).await)
    }

    /// [`read`](Self::read) with per-call options.
    ///
    /// # Errors
    /// As [`lock_with`](Self::lock_with); `min_replicas` is an
    /// [`LockError::InvalidOption`] for a reader.
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockError, LockKind, LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let reader = locks
    ///     .read_with("report_{7}", LockOptions::new().wait(Duration::from_secs(1)))
    ///     .await?;
    /// assert_eq!(reader.kind(), LockKind::Read);
    /// let replicated = locks
    ///     .read_with("report_{7}", LockOptions::new().min_replicas(1))
    ///     .await;
    /// assert!(matches!(replicated, Err(LockError::InvalidOption { .. })));
    /// # Ok(()) }
    /// ```
    pub async fn read_with(&self, key: &str, options: LockOptions) -> Result<LockGuard, LockError> {
        self.acquire_mode(key, Mode::Read, options).await
    }

    /// Takes `key` for writing: the same exclusive lock as [`lock`](Self::lock), which
    /// excludes readers too.
    ///
    /// # Errors
    /// As [`lock`](Self::lock).
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock); a writer that stops waiting without the lock (its future
    /// dropped too) withdraws its intent in the background.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::{LockKind, LockManager};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let reader = locks.read("report_{7}").await?;
    /// // The writer waits until the readers are gone.
    /// let writer = tokio::spawn({
    ///     let locks = locks.clone();
    ///     async move { locks.write("report_{7}").await.map(|g| g.kind()) }
    /// });
    /// reader.release().await?;
    /// assert_eq!(writer.await.unwrap()?, LockKind::Exclusive);
    /// # Ok(()) }
    /// ```
    pub async fn write(&self, key: &str) -> Result<LockGuard, LockError> {
        self.lock(key).await
    }

    /// One attempt at [`write`](Self::write).
    ///
    /// # Errors
    /// As [`try_lock`](Self::try_lock).
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let reader = locks.read("report_{7}").await?;
    /// assert!(locks.try_write("report_{7}").await?.is_none()); // a reader holds it
    /// reader.release().await?;
    /// assert!(locks.try_write("report_{7}").await?.is_some());
    /// # Ok(()) }
    /// ```
    pub async fn try_write(&self, key: &str) -> Result<Option<LockGuard>, LockError> {
        self.try_lock(key).await
    }

    /// One attempt at [`write_with`](Self::write_with) (the options' `wait` is
    /// ignored): `Ok(None)` when a writer or readers hold the key, counted as the
    /// metrics outcome `busy`.
    ///
    /// # Errors
    /// As [`write_with`](Self::write_with), without `Timeout` and `QueueFull`.
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let refresh = LockOptions::new().ttl(Duration::from_secs(10));
    /// let writer = locks.try_write_with("cache_{1}", refresh.clone()).await?;
    /// assert!(writer.is_some());
    /// assert!(locks.try_write_with("cache_{1}", refresh).await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn try_write_with(
        &self,
        key: &str,
        options: LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.try_lock_with(key, options).await
    }

    /// [`write`](Self::write) with per-call options.
    ///
    /// # Errors
    /// As [`lock_with`](Self::lock_with).
    ///
    /// # Cancel safety
    /// As [`write`](Self::write).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockError, LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let reader = locks.read("report_{7}").await?;
    /// let writer = locks
    ///     .write_with("report_{7}", LockOptions::new().wait(Duration::from_millis(50)))
    ///     .await;
    /// assert!(matches!(writer, Err(LockError::Timeout { .. })));
    /// reader.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn write_with(
        &self,
        key: &str,
        options: LockOptions,
    ) -> Result<LockGuard, LockError> {
        self.lock_with(key, options).await
    }

    /// Takes one of `n` permits of `key`: at most `n` holders at once. Each permit is a
    /// lease of its own (its own fencing token, renewed by the watchdog, freed by its
    /// ttl on the server's clock if the holder dies, released on drop). Callers should
    /// agree on `n` for a key: each call is checked against its own `n`.
    ///
    /// # Errors
    /// As [`lock`](Self::lock); `n == 0` is [`LockError::InvalidOption`].
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let one = locks.permit("export", 2).await?;
    /// let two = locks.permit("export", 2).await?;
    /// assert!(locks.try_permit("export", 2).await?.is_none()); // both taken
    /// assert_ne!(one.fencing_token(), two.fencing_token());
    /// # Ok(()) }
    /// ```
    pub async fn permit(&self, key: &str, n: u32) -> Result<LockGuard, LockError> {
        self.permit_with(key, n, LockOptions::new()).await
    }

    /// One attempt at [`permit`](Self::permit): `Ok(None)` when all `n` are taken.
    ///
    /// # Errors
    /// As [`try_lock`](Self::try_lock); `n == 0` is [`LockError::InvalidOption`].
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let only = locks.try_permit("export", 1).await?.expect("free");
    /// assert!(locks.try_permit("export", 1).await?.is_none());
    /// only.release().await?;
    /// assert!(locks.try_permit("export", 1).await?.is_some());
    /// # Ok(()) }
    /// ```
    pub async fn try_permit(&self, key: &str, n: u32) -> Result<Option<LockGuard>, LockError> {
        optional(self.permit_with(key, n, once(LockOptions::new())).await)
    }

    /// One attempt at [`permit_with`](Self::permit_with) (the options' `wait` is
    /// ignored): `Ok(None)` when all `n` places are taken, counted as the metrics
    /// outcome `busy`.
    ///
    /// # Errors
    /// As [`permit_with`](Self::permit_with), without `Timeout` and `QueueFull`.
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let export = LockOptions::new().ttl(Duration::from_secs(60));
    /// let first = locks.try_permit_with("exports", 2, export.clone()).await?;
    /// let second = locks.try_permit_with("exports", 2, export.clone()).await?;
    /// assert!(first.is_some() && second.is_some());
    /// assert!(locks.try_permit_with("exports", 2, export).await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn try_permit_with(
        &self,
        key: &str,
        n: u32,
        options: LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        optional(self.permit_with(key, n, once(options)).await)
    }

    /// [`permit`](Self::permit) with per-call options.
    ///
    /// # Errors
    /// As [`permit`](Self::permit); `min_replicas` is an [`LockError::InvalidOption`]
    /// for a permit.
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockError, LockKind, LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let permit = locks
    ///     .permit_with("export", 4, LockOptions::new().ttl(Duration::from_secs(300)))
    ///     .await?;
    /// assert_eq!(permit.kind(), LockKind::Permit);
    /// let nobody = locks.permit_with("export", 0, LockOptions::new()).await;
    /// assert!(matches!(nobody, Err(LockError::InvalidOption { .. })));
    /// # Ok(()) }
    /// ```
    pub async fn permit_with(
        &self,
        key: &str,
        n: u32,
        options: LockOptions,
    ) -> Result<LockGuard, LockError> {
        if n == 0 {
            return Err(LockError::invalid_option(
                "a permit count of 0 admits nobody",
            ));
        }
        self.acquire_mode(key, Mode::Permit(n), options).await
    }

    /// Takes every key of `keys` exclusively, all or nothing, under one
    /// [`MultiGuard`]. Callers naming the same keys in any order never deadlock: the
    /// keys are taken in sorted order. Waits up to the default wait for all of them.
    ///
    /// # Errors
    /// As [`lock`](Self::lock); no key at all is [`LockError::InvalidKey`]. On an
    /// error, no key is left held.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future at any point leaves no key held; keys a round had
    /// taken are released in the background.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let both = locks.lock_all(["account_{42}", "account_{17}"]).await?;
    /// assert_eq!(both.keys(), ["lock:account_{17}", "lock:account_{42}"]); // sorted
    /// assert_eq!(both.fencing_tokens().len(), 2);
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn lock_all<I, K>(&self, keys: I) -> Result<MultiGuard, LockError>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
    {
        self.lock_all_with(keys, LockOptions::new()).await
    }

    /// One attempt at [`lock_all`](Self::lock_all): `Ok(None)` when a key is held.
    ///
    /// # Errors
    /// As [`try_lock`](Self::try_lock).
    ///
    /// # Cancel safety
    /// As [`lock_all`](Self::lock_all).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let one = locks.lock("account_{17}").await?;
    /// assert!(locks.try_lock_all(["account_{42}", "account_{17}"]).await?.is_none());
    /// one.release().await?;
    /// assert!(locks.try_lock_all(["account_{42}", "account_{17}"]).await?.is_some());
    /// # Ok(()) }
    /// ```
    pub async fn try_lock_all<I, K>(&self, keys: I) -> Result<Option<MultiGuard>, LockError>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
    {
        optional(self.lock_all_with(keys, once(LockOptions::new())).await)
    }

    /// One attempt at [`lock_all_with`](Self::lock_all_with) (the options' `wait` is
    /// ignored): `Ok(None)` when a key is held, counted as the metrics outcome `busy`;
    /// no key is held then.
    ///
    /// # Errors
    /// As [`lock_all_with`](Self::lock_all_with), without `Timeout` and `QueueFull`.
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let transfer = LockOptions::new().ttl(Duration::from_secs(5));
    /// let one = locks.lock("account_{17}").await?;
    /// let both = locks
    ///     .try_lock_all_with(["account_{42}", "account_{17}"], transfer)
    ///     .await?;
    /// assert!(both.is_none());
    /// assert!(!locks.is_locked("account_{42}").await?); // nothing held meanwhile
    /// # drop(one);
    /// # Ok(()) }
    /// ```
    pub async fn try_lock_all_with<I, K>(
        &self,
        keys: I,
        options: LockOptions,
    ) -> Result<Option<MultiGuard>, LockError>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
    {
        optional(self.lock_all_with(keys, once(options)).await)
    }

    /// [`lock_all`](Self::lock_all) with per-call options, which apply to every key;
    /// the wait bounds the whole call.
    ///
    /// # Errors
    /// As [`lock_all`](Self::lock_all).
    ///
    /// # Cancel safety
    /// As [`lock_all`](Self::lock_all).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let options = LockOptions::new()
    ///     .ttl(Duration::from_secs(60))
    ///     .wait(Duration::from_secs(2)); // for the whole call
    /// let both = locks.lock_all_with(["stock_{1}", "stock_{2}"], options).await?;
    /// assert!(both.is_held());
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn lock_all_with<I, K>(
        &self,
        keys: I,
        options: LockOptions,
    ) -> Result<MultiGuard, LockError>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
    {
        let mut full = keys
            .into_iter()
            .map(|k| LockKey::prefixed(self.prefix(), k.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        if full.is_empty() {
            return Err(LockError::InvalidKey {
                reason: "lock_all was given no key".into(),
            });
        }
        full.sort_unstable_by(|a, b| a.full().cmp(b.full()));
        full.dedup_by(|a, b| a.full() == b.full());
        let resolved = self.resolve(&options)?;
        self.acquire_all(full, resolved).await
    }

    /// Prefixes, validates and acquires `key` in `mode`.
    pub(super) async fn acquire_mode(
        &self,
        key: &str,
        mode: Mode,
        options: LockOptions,
    ) -> Result<LockGuard, LockError> {
        let key = LockKey::prefixed(self.prefix(), key)?;
        let resolved = self.resolve(&options)?;
        if mode.is_shared() && resolved.min_replicas > 0 {
            return Err(LockError::invalid_option(format!(
                "min_replicas is for exclusive locks, not a {} lock",
                mode.kind()
            )));
        }
        self.acquire(key, mode, resolved).await
    }
}
