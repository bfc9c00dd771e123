//! The library's metrics, through the [`metrics`](https://docs.rs/metrics/0.24) crate
//! facade (feature `metrics`); the application installs the recorder or exporter.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `redlock_acquire_total` | counter | `outcome` (`acquired`, `busy`, `timeout`, `queue_full`, `error`), `kind`, `backend`, `name` |
//! | `redlock_release_total` | counter | `outcome` (`released`, `lost`, `error`) |
//! | `redlock_renewals_total` | counter | `outcome` (`renewed`, `lost`, `error`) |
//! | `redlock_lost_total` | counter | `reason` (`expired`, `taken`) |
//! | `redlock_wait_seconds` | histogram | `kind`, `name` |
//! | `redlock_hold_seconds` | histogram | `kind`, `name` |
//! | `redlock_held` | gauge | `kind` |
//! | `redlock_waiters` | gauge | |
//!
//! `kind` is `exclusive`, `read` or `permit`; `backend` is `memory`, `single`,
//! `cluster` or `redlock`; `name` is [`LockOptions::name`](crate::LockOptions::name)
//! (`""` when unset), never the key. `busy` is a single attempt (`try_*`, or a zero
//! `wait`) that found the key held; `timeout` a wait that ran out. An acquisition that
//! was granted or timed out records a wait sample; each lock records one hold sample when it is released or lost.
//!
//! Without the feature every function here is empty and every type zero-sized, so the
//! lock path pays nothing for them.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use crate::{LockError, LockKind};

/// Why a lock was lost, for logs and `redlock_lost_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loss {
    /// Its deadline passed without a successful renewal.
    Expired,
    /// The server no longer held its token (renewal, extend or release said so).
    Taken,
}

impl Loss {
    /// What a log says about it.
    pub(crate) fn message(self) -> &'static str {
        match self {
            Self::Expired => "the lease deadline passed without a successful renewal",
            Self::Taken => "the server no longer holds this lock's token",
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn label(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::Taken => "taken",
        }
    }
}

/// How a release request ended, for `redlock_release_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// The lock was ours and is gone.
    Released,
    /// The server no longer held our token.
    Lost,
    /// The request failed.
    Error,
}

impl Release {
    /// The outcome's name, as in metrics and logs.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::Lost => "lost",
            Self::Error => "error",
        }
    }
}

/// How one lock's renewal ended, for `redlock_renewals_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewing {
    /// Renewed.
    Renewed,
    /// The server no longer held our token.
    Lost,
    /// The request failed (retried soon).
    Error,
}

/// The `acquire_total` outcome of the result of an acquisition that could wait `wait`
/// (a zero wait: a single attempt, which finds the lock busy rather than timing out),
/// as in metrics and logs.
pub(crate) fn outcome<T>(result: &Result<T, LockError>, wait: Duration) -> &'static str {
    match result {
        Ok(_) => "acquired",
        Err(LockError::Timeout { .. }) if wait.is_zero() => "busy",
        Err(LockError::Timeout { .. }) => "timeout",
        Err(LockError::QueueFull { .. }) => "queue_full",
        Err(_) => "error",
    }
}

#[cfg(feature = "metrics")]
mod on {
    use metrics::{counter, gauge, histogram, SharedString};

    use super::*;

    /// [`LockOptions::name`](crate::LockOptions::name), as a label value.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct Name(SharedString);

    impl Name {
        pub(crate) fn new(name: Option<&Cow<'static, str>>) -> Self {
            Self(name.cloned().map(SharedString::from).unwrap_or_default())
        }
    }

    /// Counts an acquisition (of a lock named `name`, that could wait `wait`, started
    /// at `started`) and, when it was granted or timed out, records how long it waited.
    pub(crate) fn acquisition<T>(
        result: &Result<T, LockError>,
        kind: LockKind,
        backend: &'static str,
        (name, wait): (&Name, Duration),
        started: Instant,
    ) {
        let outcome = outcome(result, wait);
        let kind = kind.name();
        counter!(
            "redlock_acquire_total",
            "outcome" => outcome,
            "kind" => kind,
            "backend" => backend,
            "name" => name.0.clone()
        )
        .increment(1);
        if matches!(outcome, "acquired" | "timeout") {
            histogram!("redlock_wait_seconds", "kind" => kind, "name" => name.0.clone())
                .record(started.elapsed());
        }
    }

    /// Counts a release request's outcome.
    pub(crate) fn release(outcome: Release) {
        counter!("redlock_release_total", "outcome" => outcome.name()).increment(1);
    }

    /// Counts one lock's renewal outcome.
    pub(crate) fn renewal(outcome: Renewing) {
        let outcome = match outcome {
            Renewing::Renewed => "renewed",
            Renewing::Lost => "lost",
            Renewing::Error => "error",
        };
        counter!("redlock_renewals_total", "outcome" => outcome).increment(1);
    }

    /// Counts a lock found lost.
    pub(crate) fn lost(reason: Loss) {
        counter!("redlock_lost_total", "reason" => reason.label()).increment(1);
    }

    /// Moves `redlock_waiters` (tasks in this process's local queues) by `delta`.
    pub(crate) fn waiters(delta: f64) {
        gauge!("redlock_waiters").increment(delta);
    }

    /// One held lock, from its grant: `redlock_held` while it lasts, and a
    /// `redlock_hold_seconds` sample at its [`end`](Self::end).
    #[derive(Debug)]
    pub(crate) struct Hold(Option<Held>);

    #[derive(Debug)]
    struct Held {
        kind: &'static str,
        name: SharedString,
        since: Instant,
    }

    impl Hold {
        /// Nothing to record (a lease made outside an acquisition, in tests).
        pub(crate) fn none() -> Self {
            Self(None)
        }

        /// A lock of `kind` granted now.
        pub(crate) fn start(kind: LockKind, name: &Name) -> Self {
            let kind = kind.name();
            gauge!("redlock_held", "kind" => kind).increment(1.0);
            Self(Some(Held {
                kind,
                name: name.0.clone(),
                since: Instant::now(),
            }))
        }

        /// The lock was released or lost: called once per lock.
        pub(crate) fn end(&self) {
            if let Some(h) = &self.0 {
                histogram!("redlock_hold_seconds", "kind" => h.kind, "name" => h.name.clone())
                    .record(h.since.elapsed());
                gauge!("redlock_held", "kind" => h.kind).decrement(1.0);
            }
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod on {
    use super::*;

    /// [`LockOptions::name`](crate::LockOptions::name): not kept without the feature.
    #[derive(Debug, Clone, Copy, Default)]
    pub(crate) struct Name;

    impl Name {
        #[inline(always)]
        pub(crate) fn new(_: Option<&Cow<'static, str>>) -> Self {
            Self
        }
    }

    #[inline(always)]
    pub(crate) fn acquisition<T>(
        _: &Result<T, LockError>,
        _: LockKind,
        _: &'static str,
        _: (&Name, Duration),
        _: Instant,
    ) {
    }

    #[inline(always)]
    pub(crate) fn release(_: Release) {}

    #[inline(always)]
    pub(crate) fn renewal(_: Renewing) {}

    #[inline(always)]
    pub(crate) fn lost(_: Loss) {}

    #[inline(always)]
    pub(crate) fn waiters(_: f64) {}

    /// Nothing to keep without the feature.
    #[derive(Debug)]
    pub(crate) struct Hold;

    impl Hold {
        #[inline(always)]
        pub(crate) fn none() -> Self {
            Self
        }

        #[inline(always)]
        pub(crate) fn start(_: LockKind, _: &Name) -> Self {
            Self
        }

        #[inline(always)]
        pub(crate) fn end(&self) {}
    }
}

pub(crate) use on::*;
