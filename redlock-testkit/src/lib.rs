//! Test support for `redlock`: real `redis-server` processes on free loopback ports.
//!
//! Everything here listens on and connects to `127.0.0.1` only. Every wait loop is bounded in
//! both iterations and time. Processes are stopped by pid only (never by name) and are always
//! reaped in `Drop`; nothing in `Drop` panics.
//!
//! * [`RedisServer`] / [`ServerBuilder`]: one standalone server in its own temp dir, with
//!   [`kill9`](RedisServer::kill9), [`restart`](RedisServer::restart) and
//!   [`pause`](RedisServer::pause) / [`resume`](RedisServer::resume).
//! * [`RedisSet`]: N independent servers (the Redlock topology), started concurrently;
//!   [`ProxiedSet`]: the same with a [`ChaosProxy`] in front of every node.
//! * [`RedisCluster`]: a Redis Cluster (3 masters + 3 replicas by default) with failover helpers
//!   and a pure-Rust [`key_slot`]; [`fence_key`] names a lock's fencing counter.
//! * [`Sentinels`]: master + replica + 3 sentinels, with failover and the deterministic
//!   "lost write" partition recipe.
//! * [`ChaosProxy`]: an in-process tokio TCP proxy that delays, blackholes, refuses or resets,
//!   in both directions or in one ([`Direction`]: requests, or replies).
//! * [`unique`]: key names no other test uses.
//!
//! The API is blocking (std) except [`ChaosProxy`], [`ProxiedSet::start`] and
//! [`RedisServer::connection`]. Blocking calls are short (a server starts in
//! ~30 ms); the cluster and sentinel constructors take ~2-3 s, so call them from
//! `tokio::task::spawn_blocking` or before entering the runtime when that matters.
//!
//! # Environment
//!
//! * `REDLOCK_REDIS_SERVER`: the `redis-server` binary (default: `redis-server` on `PATH`).
//! * `REDLOCK_REDIS_CLI`: the `redis-cli` binary (default: next to `REDLOCK_REDIS_SERVER`
//!   when that is a path, else `redis-cli` on `PATH`).
//! * `REDLOCK_TEST_PORTS`: the port range to allocate from, `LOW-HIGH` (default `20000-29999`).
#![warn(missing_docs, unreachable_pub)]

mod cluster;
mod conn;
mod env;
mod lua;
mod proxied;
mod proxy;
mod sentinel;
mod server;
mod set;
mod slot;
mod unique;
mod wait;

pub use cluster::RedisCluster;
pub use env::{free_port, redis_available, redis_cli_bin, redis_server_bin};
pub use lua::lua_as_sent;
pub use proxied::ProxiedSet;
pub use proxy::{ChaosProxy, Direction, Fault};
pub use sentinel::Sentinels;
pub use server::{RedisServer, ServerBuilder};
pub use set::RedisSet;
pub use slot::{fence_key, key_slot, SLOT_COUNT};
pub use unique::unique;
pub use wait::wait_until;
