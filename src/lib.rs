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
//! See the README for the guarantees each backend gives, and their limits.
#![warn(missing_docs, unreachable_pub)]

pub use redlock_runtime::{
    LockError, LockGuard, LockKind, LockManager, LockManagerBuilder, LockOptions, MultiGuard,
    DEFAULT_MAX_WAITERS_PER_KEY, DEFAULT_PREFIX, DEFAULT_SLOW_ACQUISITION, DEFAULT_TTL,
    DEFAULT_WAIT, MAX_KEY_LEN, MAX_TTL, MIN_TTL,
};

#[cfg(feature = "macros")]
#[doc = include_str!("distributed_lock.md")]
pub use redlock_macros::distributed_lock;

// Web integration (feature `tower`): `LockLayer`, key extractors, the HTTP error
// mapping; inlined so the module's documentation (status codes) shows here.
#[cfg(feature = "tower")]
#[doc(inline)]
pub use redlock_runtime::layer as tower;

/// What `#[distributed_lock]` expansions use. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use redlock_runtime::macro_support::*;
    pub use std::time::Duration;
}
