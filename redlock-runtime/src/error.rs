//! The one error type of the library, and how logs show an error.

use std::error::Error;
use std::fmt;
use std::time::Duration;

/// Why a lock operation failed.
///
/// Every variant says what this layer failed at; a Redis error is kept as the
/// [`source`](std::error::Error::source) of [`LockError::Backend`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock was still held by someone else when the `wait` budget ran out.
    #[error("timed out waiting for lock {key:?}")]
    Timeout {
        /// The full key (prefix included).
        key: String,
    },
    /// This process already has `max_waiters_per_key` tasks waiting for the key, or a
    /// fair lock's queue on the server holds that many waiters.
    #[error("too many waiters for lock {key:?}")]
    QueueFull {
        /// The full key (prefix included).
        key: String,
    },
    /// The lock expired or was taken over while it was believed held.
    #[error("lock {key:?} was lost")]
    Lost {
        /// The full key (prefix included).
        key: String,
    },
    /// The guard was already released.
    #[error("lock {key:?} is not held")]
    NotHeld {
        /// The full key (prefix included).
        key: String,
    },
    /// Fewer than a quorum of Redlock nodes answered in time.
    #[error("lock {key:?}: only {reached} Redlock nodes answered, {needed} needed")]
    QuorumUnavailable {
        /// The full key (prefix included).
        key: String,
        /// Nodes that answered in time.
        reached: usize,
        /// Nodes needed for a quorum.
        needed: usize,
    },
    /// `WAIT` got fewer replica acknowledgements than `min_replicas`. From an acquire: the
    /// lock was released. From an `extend`: the lock is still held, with the deadline it
    /// had before (the one a replica's copy backs). From a `release` with
    /// `hold_at_least`: the key is kept on the primary, but a failover may end the hold
    /// early (the release is retried in the background).
    #[error("lock {key:?}: {acked} of {wanted} replicas acknowledged in time")]
    ReplicasUnavailable {
        /// The full key (prefix included).
        key: String,
        /// Replicas that acknowledged.
        acked: u32,
        /// Replicas asked for.
        wanted: u32,
    },
    /// `#[distributed_lock]` without `manager =` ran before any manager was installed.
    #[error("no global LockManager installed (call LockManager::install_global first)")]
    NoManager,
    /// The key is empty, too long, or cannot be given a hash tag.
    #[error("invalid lock key: {reason}")]
    InvalidKey {
        /// What is wrong with it.
        reason: String,
    },
    /// The manager was used from another tokio runtime than the one that built it (or
    /// outside any): its background task and connections live on that runtime, so a
    /// manager belongs to it. Build one manager per runtime.
    #[error(
        "this LockManager belongs to the tokio runtime that built it and was used {place}: \
         build one manager per runtime"
    )]
    WrongRuntime {
        /// Where it was used: `"from another runtime"` or `"outside any runtime"`.
        place: &'static str,
    },
    /// The manager was shut down ([`LockManager::shutdown`](crate::LockManager::shutdown)):
    /// it takes no new work.
    #[error("the LockManager was shut down")]
    ShutDown,
    /// An option or URL is out of range or malformed.
    #[error("invalid option: {reason}")]
    InvalidOption {
        /// What is wrong with it.
        reason: String,
    },
    /// Redis failed or could not be reached. [`report`](LockError::report) shows the
    /// cause too.
    #[error("redis backend failed during {operation}{}", on(node.as_deref()))]
    Backend {
        /// What the library was doing.
        operation: &'static str,
        /// The server it was talking to (`host:port`, never credentials), when that says
        /// something: a failed connection names its node (a Cluster's seeds, the
        /// Sentinels asked).
        node: Option<String>,
        /// The Redis error.
        #[source]
        source: redis::RedisError,
    },
}

impl LockError {
    /// True when trying again later may succeed (a timeout, a full queue, a backend or
    /// quorum failure), false for errors in the caller's input or a lost lock.
    ///
    /// ```
    /// use redlock::LockError;
    ///
    /// assert!(LockError::Timeout { key: "lock:buy_{42}".into() }.is_retryable());
    /// assert!(!LockError::InvalidKey { reason: "empty".into() }.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Timeout { .. }
                | Self::QueueFull { .. }
                | Self::QuorumUnavailable { .. }
                | Self::ReplicasUnavailable { .. }
                | Self::Backend { .. }
        )
    }

    /// The variant's name in snake_case (`timeout`, `queue_full`, `lost`, ...), as used in
    /// logs and HTTP error bodies.
    ///
    /// ```
    /// use redlock::LockError;
    ///
    /// assert_eq!(LockError::Timeout { key: "lock:buy_{42}".into() }.kind(), "timeout");
    /// assert_eq!(LockError::ShutDown.kind(), "shut_down");
    /// ```
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Timeout { .. } => "timeout",
            Self::QueueFull { .. } => "queue_full",
            Self::Lost { .. } => "lost",
            Self::NotHeld { .. } => "not_held",
            Self::QuorumUnavailable { .. } => "quorum_unavailable",
            Self::ReplicasUnavailable { .. } => "replicas_unavailable",
            Self::NoManager => "no_manager",
            Self::InvalidKey { .. } => "invalid_key",
            Self::InvalidOption { .. } => "invalid_option",
            Self::WrongRuntime { .. } => "wrong_runtime",
            Self::ShutDown => "shut_down",
            Self::Backend { .. } => "backend",
        }
    }

    /// The full lock key the error is about, when there is one.
    ///
    /// ```
    /// use redlock::LockError;
    ///
    /// let err = LockError::Lost { key: "lock:buy_{42}".into() };
    /// assert_eq!(err.key(), Some("lock:buy_{42}"));
    /// assert_eq!(LockError::NoManager.key(), None);
    /// ```
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Timeout { key }
            | Self::QueueFull { key }
            | Self::Lost { key }
            | Self::NotHeld { key }
            | Self::QuorumUnavailable { key, .. }
            | Self::ReplicasUnavailable { key, .. } => Some(key),
            _ => None,
        }
    }

    /// A hint for clients on when to try again (used for HTTP `Retry-After`).
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// use redlock::LockError;
    ///
    /// let busy = LockError::QueueFull { key: "lock:buy_{42}".into() };
    /// assert_eq!(busy.retry_after(), Some(Duration::from_secs(1)));
    /// assert_eq!(LockError::NoManager.retry_after(), None);
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        self.is_retryable().then_some(Duration::from_secs(1))
    }

    /// The error with its whole cause chain, each cause once: `redis backend failed
    /// during connect on 127.0.0.1:6390: Connection refused (os error 111)`. Its
    /// `Display` alone says what failed, and [`source`](Error::source) gives the cause,
    /// as the Rust API guidelines ask; print this where a person reads it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use redlock::LockManager;
    ///
    /// let refused = LockManager::builder()
    ///     .single("redis://127.0.0.1:1")
    ///     .build()
    ///     .await
    ///     .unwrap_err();
    /// let report = refused.report().to_string();
    /// assert!(report.starts_with("redis backend failed during connect on 127.0.0.1:1: "));
    /// # }
    /// ```
    pub fn report(&self) -> impl fmt::Display + '_ {
        chain(self)
    }

    pub(crate) fn backend(operation: &'static str) -> impl FnOnce(redis::RedisError) -> Self {
        move |source| Self::Backend {
            operation,
            node: None,
            source,
        }
    }

    /// Whether this is a fair queue's refusal of a new place: `acquire_fair.lua`'s
    /// error reply `QUEUEFULL`.
    pub(crate) fn is_full_queue_reply(&self) -> bool {
        matches!(self, Self::Backend { source, .. } if source.code() == Some("QUEUEFULL"))
    }

    /// A fair queue's refusal of a new place as [`QueueFull`](Self::QueueFull) for
    /// `key`; other errors unchanged.
    pub(crate) fn or_queue_full(self, key: &str) -> Self {
        if self.is_full_queue_reply() {
            return Self::QueueFull {
                key: key.to_owned(),
            };
        }
        self
    }

    /// Names the server a [`Backend`](Self::Backend) error came from, unless it already
    /// does; other errors unchanged.
    pub(crate) fn on_node(self, node: impl fmt::Display) -> Self {
        match self {
            Self::Backend {
                operation,
                node: None,
                source,
            } => Self::Backend {
                operation,
                node: Some(node.to_string()),
                source,
            },
            other => other,
        }
    }

    /// A script's reply (to `operation`) of a shape it never sends: `detail` says what came.
    pub(crate) fn unexpected_reply(operation: &'static str, detail: String) -> Self {
        Self::Backend {
            operation,
            node: None,
            source: redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "unexpected reply from the script",
                detail,
            )),
        }
    }

    /// A request (`operation`) that got no answer within `after`.
    pub(crate) fn timed_out(operation: &'static str, after: Duration) -> Self {
        Self::Backend {
            operation,
            node: None,
            source: std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {after:?}"),
            )
            .into(),
        }
    }

    pub(crate) fn invalid_option(reason: impl Into<String>) -> Self {
        Self::InvalidOption {
            reason: reason.into(),
        }
    }
}

/// ` on <node>` when the node is known.
fn on(node: Option<&str>) -> String {
    node.map_or_else(String::new, |n| format!(" on {n}"))
}

/// An error with its [`source`](Error::source) chain, `: `-separated, for logs: `redis
/// backend failed during connect: Connection refused (os error 111)` where the error's
/// own `Display` says only what failed. A source whose text the previous level already
/// shows (redis-rs prints its inner error itself) is not repeated.
pub(crate) struct Chain<'a>(&'a (dyn Error + 'static));

/// The [`Chain`] of `error`, to log as `error = %chain(&e)`.
pub(crate) fn chain<'a>(error: &'a (dyn Error + 'static)) -> Chain<'a> {
    Chain(error)
}

/// Sources followed at most (a chain is finite; this only bounds the loop).
const MAX_SOURCES: usize = 16;

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        f.write_str(&shown)?;
        for source in std::iter::successors(self.0.source(), |&e| e.source()).take(MAX_SOURCES) {
            let text = source.to_string();
            if !shown.contains(&text) {
                write!(f, ": {text}")?;
            }
            shown = text;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 14, item 4: logs said "redis backend failed during connect", the cause only
    /// in `source()`.
    #[test]
    fn chain_shows_the_cause_once() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused by peer");
        let e = LockError::backend("connect")(refused.into());
        let shown = chain(&e).to_string();
        assert_eq!(
            shown,
            "redis backend failed during connect: refused by peer"
        );
        let timeout = chain(&LockError::timed_out("acquire", Duration::from_secs(1))).to_string();
        assert_eq!(
            timeout,
            "redis backend failed during acquire: no answer within 1s"
        );
        let plain = LockError::NoManager;
        assert_eq!(chain(&plain).to_string(), plain.to_string());
    }

    /// Issue 24, item 5: a failed connect named no node.
    #[test]
    fn a_backend_error_names_its_node_once() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused by peer");
        let e = LockError::backend("connect")(refused.into())
            .on_node("10.0.0.7:6379")
            .on_node("ignored:1");
        assert_eq!(
            e.to_string(),
            "redis backend failed during connect on 10.0.0.7:6379"
        );
        assert_eq!(
            e.report().to_string(),
            "redis backend failed during connect on 10.0.0.7:6379: refused by peer"
        );
        assert!(matches!(
            LockError::NoManager.on_node("10.0.0.7:6379"),
            LockError::NoManager
        ));
    }
}
