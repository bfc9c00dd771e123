//! A Redlock set with a fault proxy in front of every node.

use std::io;

use crate::proxy::{ChaosProxy, Direction, Fault};
use crate::server::RedisServer;
use crate::set::RedisSet;

/// A [`RedisSet`] with one [`ChaosProxy`] per node: a manager built over
/// [`proxy_urls`](Self::proxy_urls) suffers the faults, one over [`urls`](Self::urls)
/// reaches the servers directly.
///
/// Dropping it stops the proxies and the servers.
#[derive(Debug)]
pub struct ProxiedSet {
    set: RedisSet,
    proxies: Vec<ChaosProxy>,
}

impl ProxiedSet {
    /// Starts `n` servers ([`RedisSet::start`]) and a proxy in front of each, passing
    /// everything ([`Fault::Pass`]). Must be called within a tokio runtime.
    ///
    /// # Errors
    ///
    /// When a proxy's listener cannot be bound.
    ///
    /// # Panics
    ///
    /// When a server fails to start.
    pub async fn start(n: usize) -> io::Result<ProxiedSet> {
        let set = RedisSet::start(n);
        let mut proxies = Vec::with_capacity(n);
        for node in set.nodes() {
            proxies.push(ChaosProxy::start(node.addr()).await?);
        }
        Ok(ProxiedSet { set, proxies })
    }

    /// The servers.
    pub fn servers(&self) -> &RedisSet {
        &self.set
    }

    /// Server `i`.
    ///
    /// # Panics
    ///
    /// When `i` is out of range.
    pub fn node(&self, i: usize) -> &RedisServer {
        self.set.node(i)
    }

    /// The proxy in front of server `i`.
    ///
    /// # Panics
    ///
    /// When `i` is out of range.
    pub fn proxy(&self, i: usize) -> &ChaosProxy {
        &self.proxies[i]
    }

    /// Every proxy, in node order.
    pub fn proxies(&self) -> &[ChaosProxy] {
        &self.proxies
    }

    /// `redis://` URLs of the proxies, in node order.
    pub fn proxy_urls(&self) -> Vec<String> {
        self.proxies.iter().map(ChaosProxy::url).collect()
    }

    /// `redis://` URLs of the servers themselves, in node order.
    pub fn urls(&self) -> Vec<String> {
        self.set.urls()
    }

    /// [`ChaosProxy::set`] on every proxy.
    pub fn set_all(&self, fault: Fault) {
        for proxy in &self.proxies {
            proxy.set(fault);
        }
    }

    /// [`ChaosProxy::set_direction`] on every proxy.
    pub fn set_direction_all(&self, direction: Direction, fault: Fault) {
        for proxy in &self.proxies {
            proxy.set_direction(direction, fault);
        }
    }
}
