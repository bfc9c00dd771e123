//! N independent servers (the Redlock topology).

use std::thread;

use crate::server::RedisServer;

/// N independent standalone [`RedisServer`]s, as used by the Redlock algorithm.
///
/// Dropping the set drops (kills and reaps) every server.
#[derive(Debug)]
pub struct RedisSet {
    nodes: Vec<RedisServer>,
}

impl RedisSet {
    /// Starts `n` servers concurrently (one thread each) and waits until all answer `PING`
    /// (about 60-90 ms for 5 on two cores).
    ///
    /// # Panics
    ///
    /// When any server fails to start (the others are stopped first).
    pub fn start(n: usize) -> RedisSet {
        RedisSet {
            nodes: start_all(n, RedisServer::start),
        }
    }

    /// The number of servers.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the set has no server.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// `redis://127.0.0.1:<port>` of every server, in index order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// All servers, in index order.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Server `i`.
    ///
    /// # Panics
    ///
    /// When `i >= len()`.
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// Server `i`, mutably (to [`kill9`](RedisServer::kill9), [`pause`](RedisServer::pause), ...).
    ///
    /// # Panics
    ///
    /// When `i >= len()`.
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }
}

/// Runs `start` on `n` threads at once and collects the servers.
///
/// If any call panics, the servers that did start are dropped (killed and reaped) and the first
/// panic is resumed.
pub(crate) fn start_all(n: usize, start: impl Fn() -> RedisServer + Sync) -> Vec<RedisServer> {
    let results: Vec<thread::Result<RedisServer>> = thread::scope(|s| {
        let handles: Vec<_> = (0..n).map(|_| s.spawn(&start)).collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    let mut nodes = Vec::with_capacity(n);
    let mut failure = None;
    for r in results {
        match r {
            Ok(server) => nodes.push(server),
            Err(panic) => failure = failure.or(Some(panic)),
        }
    }
    if let Some(panic) = failure {
        drop(nodes);
        std::panic::resume_unwind(panic);
    }
    nodes
}
