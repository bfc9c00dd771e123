//! The runtime of [`redlock-guard`](https://docs.rs/redlock-guard) (library `redlock`): the
//! lock manager, its backends (one Redis server, Redis Cluster, Redlock over independent
//! masters, process memory), guards, the watchdog and wake-up notifications.
//!
//! Use it through the facade, `redlock-guard` in `Cargo.toml` and `redlock::` in code, which
//! re-exports everything here (the `layer` module as `redlock::tower`) and adds the
//! `#[distributed_lock]` attribute; the examples here are written that way.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]
// docs.rs builds with `--cfg docsrs`: items behind a feature say which one.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod engine;
mod error;
mod info;
mod key;
mod kind;
mod lease;
mod manager;
mod node;
mod notify;
mod options;
mod scripts;
mod stats;
#[cfg(feature = "tls")]
mod tls;
mod token;
mod waiters;
mod wire;

#[doc(hidden)]
pub mod macro_support;

#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod layer;

pub use error::LockError;
pub use info::{LockInfo, SharedHolder};

/// The redis-rs crate this library is built on, so applications name the same version
/// (`redis::Client`, `redis::ConnectionInfo`, the source of [`LockError::Backend`]).
#[doc(no_inline)]
pub use redis;

pub use key::MAX_KEY_LEN;
pub use kind::LockKind;
pub use manager::{
    LeaderInfo, LeaderWatch, Leadership, LockGuard, LockManager, LockManagerBuilder, MultiGuard,
    DEFAULT_MAX_WAITERS_PER_KEY, DEFAULT_PREFIX, DEFAULT_SLOW_ACQUISITION, DEFAULT_TTL,
    DEFAULT_WAIT,
};
pub use node::IntoNode;
pub use options::{LockOptions, MAX_TTL, MIN_TTL};
