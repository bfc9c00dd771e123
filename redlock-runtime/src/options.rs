//! Per-call options ([`LockOptions`]) and their validation.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use crate::{stats, LockError};

/// The shortest ttl accepted. A backend may need more: Redlock refuses a ttl under 5 ms
/// (its drift allowance, 1 % of the ttl + 2 ms, and an attempt's round trips would leave
/// no validity to any grant) with [`LockError::InvalidOption`].
pub const MIN_TTL: Duration = Duration::from_millis(1);
/// The longest ttl accepted (30 days).
pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// Options for one acquisition; unset fields take the manager's defaults.
///
/// ```
/// use std::time::Duration;
/// use redlock::LockOptions;
///
/// let opts = LockOptions::new()
///     .ttl(Duration::from_secs(5))
///     .wait(Duration::from_millis(200))
///     .watchdog(false);
/// # let _ = opts;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockOptions {
    pub(crate) ttl: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) watchdog: Option<bool>,
    pub(crate) min_replicas: Option<u32>,
    pub(crate) hold_at_least: Option<Duration>,
    pub(crate) name: Option<Cow<'static, str>>,
}

impl LockOptions {
    /// Options that take every value from the manager.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::{LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// // The manager's ttl (30 s) and wait (10 s), renewed by the watchdog.
    /// let guard = locks.lock_with("buy_{42}", LockOptions::new()).await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// How long the lock lives without renewal (1 ms ..= 30 days; on Redlock at least
    /// 5 ms, see [`MIN_TTL`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let opts = LockOptions::new().ttl(Duration::from_secs(5));
    /// let guard = locks.lock_with("report_{7}", opts).await?;
    /// assert!(guard.valid_until() <= std::time::Instant::now() + Duration::from_secs(5));
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long to wait for a held lock; `Duration::ZERO` makes one attempt.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockError, LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let _held = locks.lock("buy_{42}").await?;
    /// let opts = LockOptions::new().wait(Duration::from_millis(20));
    /// let late = locks.lock_with("buy_{42}", opts).await;
    /// assert!(matches!(late, Err(LockError::Timeout { .. })));
    /// # Ok(()) }
    /// ```
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Whether the watchdog renews the lock while the guard lives (default `true`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use std::time::Duration;
    ///
    /// use redlock::{LockManager, LockOptions};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// // Not renewed: it simply expires after 50 ms.
    /// let opts = LockOptions::new().ttl(Duration::from_millis(50)).watchdog(false);
    /// let guard = locks.lock_with("cache_{1}", opts).await?;
    /// tokio::time::sleep(Duration::from_millis(100)).await;
    /// assert!(!locks.is_locked("cache_{1}").await?);
    /// # drop(guard);
    /// # Ok(()) }
    /// ```
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = Some(on);
        self
    }

    /// After acquiring, `WAIT` until `n` replicas acknowledged the write, bounded by
    /// min(ttl/10, 1 s); fewer acknowledgements release the lock and fail with
    /// [`LockError::ReplicasUnavailable`]. Single and cluster backends only.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// use redlock::LockOptions;
    ///
    /// // Granted only once a replica has the lock too (and so for every extend and renewal).
    /// let opts = LockOptions::new().min_replicas(1).ttl(Duration::from_secs(10));
    /// # let _ = opts;
    /// ```
    pub fn min_replicas(mut self, n: u32) -> Self {
        self.min_replicas = Some(n);
        self
    }

    /// On release, keep the key until `d` after the grant: at most one holder per
    /// period, as ShedLock's `lockAtLeastFor` (a scheduled job that ends early is not
    /// run again by another instance within `d`). Released later than `d` after the
    /// grant, the key goes at once as usual. At most [`MAX_TTL`]; default none.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use redlock::LockOptions;
    /// let opts = LockOptions::new().hold_at_least(Duration::from_secs(30));
    /// ```
    pub fn hold_at_least(mut self, d: Duration) -> Self {
        self.hold_at_least = Some(d);
        self
    }

    /// What the lock is for, as the `name` label of the metrics (feature `metrics`): a
    /// bounded set of values such as `"buy_<goods_id>"` (what `#[distributed_lock]`
    /// sets: its key template), never the concrete key, whose values are unbounded.
    /// Default `""`. Accepted, and ignored, without the feature.
    ///
    /// The metrics, through the [`metrics`](https://docs.rs/metrics/0.24) facade:
    /// counters `redlock_acquire_total{outcome,kind,backend,name}` (`outcome`:
    /// `acquired`, `timeout`, `queue_full`, `error`), `redlock_release_total{outcome}`
    /// (`released`, `lost`, `error`), `redlock_renewals_total{outcome}` (`renewed`,
    /// `lost`, `error`), `redlock_lost_total{reason}` (`expired`, `taken`); histograms
    /// `redlock_wait_seconds{kind,name}` (grants and timeouts) and
    /// `redlock_hold_seconds{kind,name}` (one sample per lock, at its release or loss);
    /// gauges `redlock_held{kind}` and `redlock_waiters` (tasks in this process's local
    /// queues).
    ///
    /// ```
    /// # use redlock::LockOptions;
    /// let opts = LockOptions::new().name("buy_<goods_id>");
    /// ```
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.name = Some(name.into());
        self
    }
}

/// Options with every default applied and every bound checked.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub(crate) ttl: Duration,
    pub(crate) deadline: Instant,
    pub(crate) wait: Duration,
    pub(crate) watchdog: bool,
    pub(crate) min_replicas: u32,
    pub(crate) hold_at_least: Duration,
    /// The metrics' `name` label (zero-sized without the feature).
    pub(crate) name: stats::Name,
}

impl Resolved {
    /// The `WAIT` timeout for `min_replicas`: min(ttl/10, 1 s), at least 1 ms.
    pub(crate) fn replica_wait(&self) -> Duration {
        (self.ttl / 10).clamp(Duration::from_millis(1), Duration::from_secs(1))
    }
}

/// Checks a ttl against the accepted range: `shortest` (the backend's shortest
/// grantable ttl, at least [`MIN_TTL`]) ..= [`MAX_TTL`]. Every ttl a request carries
/// passes here (the options of every acquisition, `extend`, the default ttl), before
/// any I/O.
pub(crate) fn check_ttl(ttl: Duration, shortest: Duration) -> Result<Duration, LockError> {
    let shortest = shortest.max(MIN_TTL);
    if (shortest..=MAX_TTL).contains(&ttl) {
        Ok(ttl)
    } else {
        Err(LockError::invalid_option(format!(
            "ttl {ttl:?} is outside {shortest:?}..=30 days"
        )))
    }
}

impl LockOptions {
    /// The options with the defaults applied, checked; `shortest` is the backend's
    /// shortest grantable ttl (see [`check_ttl`]).
    pub(crate) fn resolve(
        &self,
        default_ttl: Duration,
        default_wait: Duration,
        shortest: Duration,
    ) -> Result<Resolved, LockError> {
        let ttl = check_ttl(self.ttl.unwrap_or(default_ttl), shortest)?;
        let wait = self.wait.unwrap_or(default_wait);
        let hold_at_least = self.hold_at_least.unwrap_or(Duration::ZERO);
        if hold_at_least > MAX_TTL {
            return Err(LockError::invalid_option(format!(
                "hold_at_least {hold_at_least:?} is over 30 days"
            )));
        }
        let deadline = Instant::now()
            .checked_add(wait)
            .ok_or_else(|| LockError::invalid_option(format!("wait {wait:?} overflows")))?;
        Ok(Resolved {
            ttl,
            deadline,
            wait,
            watchdog: self.watchdog.unwrap_or(true),
            min_replicas: self.min_replicas.unwrap_or(0),
            hold_at_least,
            name: stats::Name::new(self.name.as_ref()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_values_are_errors_not_clamps() {
        let d = Duration::from_secs(1);
        for ttl in [Duration::ZERO, MAX_TTL + Duration::from_millis(1)] {
            let err = LockOptions::new()
                .ttl(ttl)
                .resolve(d, d, MIN_TTL)
                .unwrap_err();
            assert!(matches!(err, LockError::InvalidOption { .. }), "{err}");
        }
        let err = LockOptions::new()
            .wait(Duration::MAX)
            .resolve(d, d, MIN_TTL)
            .unwrap_err();
        assert!(matches!(err, LockError::InvalidOption { .. }));
        let ok = LockOptions::new()
            .ttl(MAX_TTL)
            .resolve(d, d, MIN_TTL)
            .unwrap();
        assert_eq!(ok.ttl, MAX_TTL);
        assert_eq!(ok.replica_wait(), Duration::from_secs(1));
    }

    #[test]
    fn a_backend_minimum_is_named() {
        let (d, four) = (Duration::from_secs(1), Duration::from_millis(4));
        let short = LockOptions::new().ttl(Duration::from_millis(3));
        let err = short.resolve(d, d, four).unwrap_err();
        assert!(err.to_string().contains("4ms"), "{err}");
        assert_eq!(check_ttl(four, four).unwrap(), four);
        assert!(check_ttl(Duration::ZERO, Duration::ZERO).is_err());
    }
}
