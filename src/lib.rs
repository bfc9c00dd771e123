//! # redlock
//!
//! Distributed locks on Redis for async Rust: an attribute macro, RAII guards kept alive
//! by a watchdog, fencing tokens, and wake-up on release instead of polling.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), redlock::LockError> {
//! use redlock::LockManager;
//!
//! // `LockManager::connect("redis://127.0.0.1:6379")` for Redis; in memory here.
//! let locks = LockManager::builder().in_memory().build().await?;
//! let guard = locks.lock("buy_{42}").await?;
//! println!("holding {} with fencing token {}", guard.key(), guard.fencing_token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! The guarantees each backend gives, and their limits: `docs/guarantees.md` in the
//! repository, summed up in the README.
#![warn(missing_docs, unreachable_pub)]
// docs.rs builds with `--cfg docsrs`: items behind a feature say which one.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use redlock_runtime::{
    IntoNode, LeaderInfo, LeaderWatch, Leadership, LockError, LockGuard, LockInfo, LockKind,
    LockManager, LockManagerBuilder, LockOptions, MultiGuard, SharedHolder,
    DEFAULT_MAX_WAITERS_PER_KEY, DEFAULT_PREFIX, DEFAULT_SLOW_ACQUISITION, DEFAULT_TTL,
    DEFAULT_WAIT, MAX_KEY_LEN, MAX_TTL, MIN_TTL,
};

/// The redis-rs crate redlock is built on, re-exported so an application names the same
/// version: [`redis::Client`] for
/// [`single_client`](LockManagerBuilder::single_client),
/// [`redis::cluster::ClusterClient`] for
/// [`cluster_client`](LockManagerBuilder::cluster_client), [`redis::ConnectionInfo`] (see
/// [`IntoNode`]), and the [`redis::RedisError`] inside [`LockError::Backend`].
#[doc(no_inline)]
pub use redlock_runtime::redis;

// Its documentation (with the doctested examples) is written once, in
// redlock-macros/src/distributed_lock.md; rustdoc inlines it here.
#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use redlock_macros::{distributed_lock, key};

// Web integration (feature `tower`): `LockLayer`, key extractors, the HTTP error
// mapping; inlined so the module's documentation (status codes) shows here.
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
#[doc(inline)]
pub use redlock_runtime::layer as tower;

// The README's code, compiled and run as doctests (`cargo test --doc --all-features`).
#[cfg(all(doctest, feature = "macros", feature = "axum"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

// The same for the Rust code of docs/usage.md and docs/backends.md (not shipped: the
// repository's doctests only).
#[cfg(all(doctest, feature = "macros", feature = "axum"))]
#[doc = include_str!("../docs/usage.md")]
struct UsageDoctests;

#[cfg(all(doctest, feature = "macros", feature = "axum"))]
#[doc = include_str!("../docs/backends.md")]
struct BackendsDoctests;

/// What `#[distributed_lock]` expansions use. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use redlock_runtime::macro_support::*;
    pub use std::time::Duration;
}
