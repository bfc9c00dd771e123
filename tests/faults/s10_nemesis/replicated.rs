//! The nemesis's primary + replica backend, for `min_replicas`: its servers, the
//! replication link through a proxy, and a promotion the clients follow.
//!
//! The replica replicates through a [`ChaosProxy`] (its `replicaof` address), so the link
//! can be blackholed or cut for a while; the replica can be frozen (SIGSTOP). Every
//! acquisition uses `min_replicas(1)`, so a grant, an extend, a watchdog renewal or a
//! `hold_at_least` keep is booked only once the replica acknowledged it.
//!
//! A **failover** kills (-9) or freezes (SIGSTOP) the primary, promotes the replica
//! (`REPLICAOF NO ONE`), and moves the clients' address to it: every client's proxy is
//! retargeted ([`ChaosProxy::retarget`], resetting its connections), as a virtual IP or
//! a DNS name moved by an operator would be. A plain single-server manager cannot follow
//! a promotion by itself (it knows one address; Sentinel is what tells a client where
//! the primary went); moving the address is the other way deployments do it, and keeps
//! the failover in the default run's time (a Sentinel failover takes 2.2-2.4 s plus
//! several seconds for the set to settle again, see `redlock-testkit/src/sentinel.rs`,
//! `tests/faults/s4_sentinel.rs`, which cover the Sentinel backend's failovers). The old
//! primary then comes back (restarted empty, or continued) as a replica of the new one
//! through the link proxy, and the failover ends when it acknowledges a write.
//!
//! What was acknowledged by the replica survives the promotion, so no holder's belief
//! outlives its lock: what the safety checker verifies across failovers. Unacknowledged
//! writes may be lost: a grant or extend that failed with `ReplicasUnavailable` (never
//! believed), or a release (the key comes back until its ttl: a liveness matter, and
//! only seen by the poller, which asks the new primary).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlock_testkit::{ChaosProxy, RedisServer};

/// Bound of each administrative command.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on the new replica's first acknowledgement after a failover.
const SYNC_TIMEOUT: Duration = Duration::from_secs(10);

/// A primary and its replica, linked through a proxy.
pub(super) struct Replicated {
    /// `[primary, replica]` now.
    data: [RedisServer; 2],
    /// The replica's `replicaof` address.
    link: ChaosProxy,
    /// The primary's address, where the poller asks.
    primary: Arc<Mutex<Vec<SocketAddr>>>,
}

impl Replicated {
    /// Starts both servers and waits (10 s cap) until the replica acknowledges a write.
    pub(super) async fn start() -> Replicated {
        let primary = RedisServer::start();
        let link = ChaosProxy::start(primary.addr()).await.expect("link proxy");
        let replica = RedisServer::builder()
            .replica_of(link.addr().port())
            .start();
        let addr = primary.addr();
        let set = Replicated {
            data: [primary, replica],
            link,
            primary: Arc::new(Mutex::new(vec![addr])),
        };
        assert!(
            set.wait_synced().await,
            "the replica never acknowledged a write"
        );
        set
    }

    /// The primary now.
    pub(super) fn primary(&self) -> &RedisServer {
        &self.data[0]
    }

    /// The primary now, mutably (to pause it).
    pub(super) fn primary_mut(&mut self) -> &mut RedisServer {
        &mut self.data[0]
    }

    /// The replica now, mutably (to freeze it).
    pub(super) fn replica_mut(&mut self) -> &mut RedisServer {
        &mut self.data[1]
    }

    /// The replication link's proxy.
    pub(super) fn link(&self) -> &ChaosProxy {
        &self.link
    }

    /// The primary's address as the poller reads it (updated by failovers).
    pub(super) fn poll_targets(&self) -> Arc<Mutex<Vec<SocketAddr>>> {
        Arc::clone(&self.primary)
    }

    /// Whether a write on the primary is acknowledged by the replica (`WAIT 1 200`),
    /// asked every 50 ms until [`SYNC_TIMEOUT`].
    async fn wait_synced(&self) -> bool {
        let port = self.primary().port();
        for _ in 0..(SYNC_TIMEOUT.as_millis() / 50) {
            let acked = async {
                admin(port, &["SET", "nemesis:sync", "1"]).await?;
                admin(port, &["WAIT", "1", "200"]).await
            };
            if matches!(acked.await, Ok(redis::Value::Int(n)) if n >= 1) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Fails over: kills or (`freeze`) freezes the primary, waits `settle`, promotes the
    /// replica, points `clients` and the link at it, brings the old primary back as its
    /// replica and waits until it acknowledges. Returns what it did, for the trace.
    pub(super) async fn failover(
        &mut self,
        clients: &[Vec<Arc<ChaosProxy>>],
        freeze: bool,
        settle: Duration,
    ) -> String {
        if freeze {
            self.data[0].pause();
        } else {
            self.data[0].kill9();
        }
        tokio::time::sleep(settle).await;
        let promoted = admin(self.data[1].port(), &["REPLICAOF", "NO", "ONE"]).await;
        let new_primary = self.data[1].addr();
        for proxy in clients.iter().flatten() {
            proxy.retarget(new_primary);
        }
        self.link.retarget(new_primary);
        if let Ok(mut p) = self.primary.lock() {
            *p = vec![new_primary];
        }
        let old = &mut self.data[0];
        if freeze {
            old.resume();
        } else {
            tokio::task::block_in_place(|| old.restart());
        }
        let link = self.link.addr().port().to_string();
        let demoted = admin(old.port(), &["REPLICAOF", "127.0.0.1", &link]).await;
        self.data.swap(0, 1);
        let synced = self.wait_synced().await;
        format!(
            "{} the primary, promoted the replica ({}), old primary as replica ({}), {}",
            if freeze { "froze" } else { "killed" },
            if promoted.is_ok() { "ok" } else { "failed" },
            if demoted.is_ok() { "ok" } else { "failed" },
            if synced {
                "synced"
            } else {
                "NOT synced in time"
            },
        )
    }
}

/// One command on a direct connection to `port`, bounded by [`ADMIN_TIMEOUT`].
async fn admin(port: u16, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let run = async {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
        let mut c = client.get_multiplexed_async_connection().await?;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query_async(&mut c).await
    };
    tokio::time::timeout(ADMIN_TIMEOUT, run)
        .await
        .unwrap_or_else(|_| Err((redis::ErrorKind::Io, "timed out").into()))
}
