//! The read/write, permit and several-keys API of [`LockManager`].

use std::time::Duration;

use super::LockManager;
use crate::key::LockKey;
use crate::kind::Mode;
use crate::{LockError, LockGuard, LockOptions, MultiGuard};

/// `Ok(None)` for a [`LockError::Timeout`]: what the `try_` calls return when the key is
/// held.
fn optional<G>(result: Result<G, LockError>) -> Result<Option<G>, LockError> {
    match result {
        Ok(guard) => Ok(Some(guard)),
        Err(LockError::Timeout { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `options` with a zero wait: one attempt.
fn once(options: LockOptions) -> LockOptions {
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
    /// ```
    /// # async fn demo() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let a = locks.read("report_{7}").await?;
    /// let b = locks.read("report_{7}").await?; // readers share
    /// assert!(locks.try_write("report_{7}").await?.is_none());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`lock`](Self::lock).
    pub async fn read(&self, key: &str) -> Result<LockGuard, LockError> {
        self.read_with(key, LockOptions::new()).await
    }

    /// One attempt at [`read`](Self::read): `Ok(None)` when a writer holds or waits.
    ///
    /// # Errors
    /// As [`try_lock`](Self::try_lock).
    pub async fn try_read(&self, key: &str) -> Result<Option<LockGuard>, LockError> {
        optional(self.read_with(key, once(LockOptions::new())).await)
    }

    /// [`read`](Self::read) with per-call options.
    ///
    /// # Errors
    /// As [`lock_with`](Self::lock_with); `min_replicas` is an
    /// [`LockError::InvalidOption`] for a reader.
    pub async fn read_with(&self, key: &str, options: LockOptions) -> Result<LockGuard, LockError> {
        self.acquire_mode(key, Mode::Read, options).await
    }

    /// Takes `key` for writing: the same exclusive lock as [`lock`](Self::lock), which
    /// excludes readers too.
    ///
    /// # Errors
    /// As [`lock`](Self::lock).
    pub async fn write(&self, key: &str) -> Result<LockGuard, LockError> {
        self.lock(key).await
    }

    /// One attempt at [`write`](Self::write).
    ///
    /// # Errors
    /// As [`try_lock`](Self::try_lock).
    pub async fn try_write(&self, key: &str) -> Result<Option<LockGuard>, LockError> {
        self.try_lock(key).await
    }

    /// [`write`](Self::write) with per-call options.
    ///
    /// # Errors
    /// As [`lock_with`](Self::lock_with).
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
    /// ```
    /// # async fn demo() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let one = locks.permit("export", 2).await?;
    /// let two = locks.permit("export", 2).await?;
    /// assert!(locks.try_permit("export", 2).await?.is_none());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`lock`](Self::lock); `n == 0` is [`LockError::InvalidOption`].
    pub async fn permit(&self, key: &str, n: u32) -> Result<LockGuard, LockError> {
        self.permit_with(key, n, LockOptions::new()).await
    }

    /// One attempt at [`permit`](Self::permit): `Ok(None)` when all `n` are taken.
    ///
    /// # Errors
    /// As [`try_lock`](Self::try_lock); `n == 0` is [`LockError::InvalidOption`].
    pub async fn try_permit(&self, key: &str, n: u32) -> Result<Option<LockGuard>, LockError> {
        optional(self.permit_with(key, n, once(LockOptions::new())).await)
    }

    /// [`permit`](Self::permit) with per-call options.
    ///
    /// # Errors
    /// As [`permit`](Self::permit); `min_replicas` is an [`LockError::InvalidOption`]
    /// for a permit.
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
    /// ```
    /// # async fn demo() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let both = locks.lock_all(["account_{42}", "account_{17}"]).await?;
    /// assert_eq!(both.fencing_tokens().len(), 2);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`lock`](Self::lock); no key at all is [`LockError::InvalidKey`]. On an
    /// error, no key is left held.
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
    pub async fn try_lock_all<I, K>(&self, keys: I) -> Result<Option<MultiGuard>, LockError>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
    {
        optional(self.lock_all_with(keys, once(LockOptions::new())).await)
    }

    /// [`lock_all`](Self::lock_all) with per-call options, which apply to every key;
    /// the wait bounds the whole call.
    ///
    /// # Errors
    /// As [`lock_all`](Self::lock_all).
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
    async fn acquire_mode(
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
