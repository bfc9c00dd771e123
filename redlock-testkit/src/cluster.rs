//! A Redis Cluster of local processes.

use std::fs::File;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::conn::{self, info_field, slot_ranges, SlotRange};
use crate::env::redis_cli_bin;
use crate::server::RedisServer;
use crate::slot::{key_slot, SLOT_COUNT};
use crate::wait::wait_until;

/// How long the cluster may take to be ready after `redis-cli --cluster create` returns.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long `redis-cli --cluster create` may run.
const CREATE_TIMEOUT: Duration = Duration::from_secs(20);
/// Poll interval of the readiness and failover loops.
const POLL: Duration = Duration::from_millis(20);
/// Timeout of each probe connection.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// Whole-cluster attempts (a failed `--cluster create` starts over on new ports).
const ATTEMPTS: u32 = 2;

/// A Redis Cluster of `masters * (1 + replicas_per_master)` local [`RedisServer`]s.
///
/// Nodes run with `--cluster-enabled yes`, `--cluster-port <free port>`,
/// `--cluster-config-file <dir>/nodes.conf`, `--cluster-node-timeout 1000` and
/// `--cluster-replica-validity-factor 0`, and are joined with `redis-cli --cluster create ... --cluster-replicas R --cluster-yes`. Startup
/// takes about 2.1-2.2 s (a master declares the cluster ok only 2 s after its own start); a
/// failover after [`kill_master_for_key`](Self::kill_master_for_key) about 2-2.7 s. Share
/// one cluster between tests that do not kill nodes.
///
/// Dropping the cluster drops (kills and reaps) every node.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts 3 masters with 1 replica each (6 nodes); see [`start`](Self::start).
    pub fn start_default() -> RedisCluster {
        RedisCluster::start(3, 1)
    }

    /// Starts `masters * (1 + replicas_per_master)` nodes concurrently, creates the cluster and
    /// waits (20 s cap) until every node reports `cluster_state:ok`, every replica
    /// `master_link_status:up`, and all nodes agree on a full slot map.
    ///
    /// # Panics
    ///
    /// When `masters < 3` (`redis-cli --cluster create` needs 3), or when the cluster cannot be
    /// created or does not become ready in time (with the node logs' tails).
    pub fn start(masters: usize, replicas_per_master: usize) -> RedisCluster {
        assert!(masters >= 3, "a Redis Cluster needs at least 3 masters");
        let n = masters * (1 + replicas_per_master);
        let mut last_error = String::new();
        for _ in 0..ATTEMPTS {
            let nodes = start_nodes(n);
            if let Err(e) = create(&nodes, replicas_per_master) {
                last_error = e;
                continue;
            }
            let cluster = RedisCluster { nodes };
            let started = Instant::now();
            let ready = wait_until(READY_TIMEOUT, POLL, || cluster.check_ready(masters).is_ok());
            if !ready {
                let why = cluster.check_ready(masters).err().unwrap_or_default();
                cluster.fail(&format!(
                    "cluster not ready after {:?}: {why}",
                    started.elapsed()
                ));
            }
            return cluster;
        }
        panic!("redlock-testkit: could not create the cluster: {last_error}");
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the cluster has no node (never true for a started cluster).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// `redis://127.0.0.1:<port>` of every node, in index order (masters and replicas).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// A `redis::cluster::ClusterClient` seeded with every node.
    ///
    /// # Panics
    ///
    /// Never in practice: the URLs are always valid.
    pub fn client(&self) -> redis::cluster::ClusterClient {
        redis::cluster::ClusterClient::new(self.urls())
            .unwrap_or_else(|e| panic!("redlock-testkit: cluster client: {e}"))
    }

    /// All nodes, in index order.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Node `i`.
    ///
    /// # Panics
    ///
    /// When `i >= len()`.
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// Node `i`, mutably (to [`kill9`](RedisServer::kill9), [`pause`](RedisServer::pause), ...).
    ///
    /// # Panics
    ///
    /// When `i >= len()`.
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// The hash slot of `key` (pure Rust, see [`key_slot`]).
    pub fn keyslot(&self, key: &str) -> u16 {
        key_slot(key.as_bytes())
    }

    /// Index of the node serving `key`'s slot as master, according to the first live node
    /// that answers `CLUSTER SLOTS`.
    ///
    /// # Panics
    ///
    /// When no live node answers, or the slot has no known master.
    pub fn master_for_key(&self, key: &str) -> usize {
        self.master_for_slot(key_slot(key.as_bytes()))
    }

    /// Index of the node serving `slot` as master; see [`master_for_key`](Self::master_for_key).
    ///
    /// # Panics
    ///
    /// When no live node answers, or the slot has no known master.
    pub fn master_for_slot(&self, slot: u16) -> usize {
        for node in self.live_nodes() {
            let Some(ranges) = self.slot_map(node.port()) else {
                continue;
            };
            if let Some(i) = ranges
                .iter()
                .find(|r| (r.start..=r.end).contains(&slot))
                .and_then(|r| self.index_of_port(r.master_port))
            {
                return i;
            }
        }
        panic!("redlock-testkit: no live cluster node knows the master of slot {slot}");
    }

    /// Indices of the nodes that currently serve slots as masters, ascending.
    ///
    /// # Panics
    ///
    /// When no live node answers `CLUSTER SLOTS`.
    pub fn master_indices(&self) -> Vec<usize> {
        for node in self.live_nodes() {
            if let Some(ranges) = self.slot_map(node.port()) {
                let mut out: Vec<usize> = ranges
                    .iter()
                    .filter_map(|r| self.index_of_port(r.master_port))
                    .collect();
                out.sort_unstable();
                out.dedup();
                return out;
            }
        }
        panic!("redlock-testkit: no live cluster node answers CLUSTER SLOTS");
    }

    /// Kills (SIGKILL + reap) the master serving `key` and returns its index. Follow with
    /// [`wait_failover`](Self::wait_failover).
    pub fn kill_master_for_key(&mut self, key: &str) -> usize {
        let i = self.master_for_key(key);
        self.nodes[i].kill9();
        i
    }

    /// Waits until a live node serves `key`'s slot as master and every live node reports
    /// `cluster_state:ok` and the same slot map; returns the time this call waited. Call it
    /// right after the fault to measure the failover.
    ///
    /// Nodes that were killed or are paused (through this crate) are not asked.
    ///
    /// # Panics
    ///
    /// When that does not happen within `timeout` (about 2-2.7 s is normal at
    /// node-timeout 1000 ms; allow 5-10 s), with every live node's view.
    pub fn wait_failover(&self, key: &str, timeout: Duration) -> Duration {
        self.wait_failover_slot(key_slot(key.as_bytes()), timeout)
    }

    /// Like [`wait_failover`](Self::wait_failover), for a slot number.
    ///
    /// # Panics
    ///
    /// When the failover does not complete within `timeout`.
    pub fn wait_failover_slot(&self, slot: u16, timeout: Duration) -> Duration {
        let started = Instant::now();
        if wait_until(timeout, POLL, || self.check_owner(slot).is_ok()) {
            return started.elapsed();
        }
        let why = self.check_owner(slot).err().unwrap_or_default();
        self.fail(&format!(
            "no failover of slot {slot} within {timeout:?}: {why}"
        ))
    }

    /// Nodes with a process that is not paused.
    fn live_nodes(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes
            .iter()
            .filter(|n| n.has_process() && !n.is_paused())
    }

    fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|n| n.port() == port)
    }

    fn slot_map(&self, port: u16) -> Option<Vec<SlotRange>> {
        let v = conn::query(port, &["CLUSTER", "SLOTS"], PROBE_TIMEOUT).ok()?;
        slot_ranges(&v)
    }

    /// Ok when every node is ok, every replica linked, and all agree on a full slot map.
    fn check_ready(&self, masters: usize) -> Result<(), String> {
        self.check_consistent()?;
        let mut master_count = 0;
        for node in &self.nodes {
            let port = node.port();
            let info = conn::query_text(port, &["INFO", "replication"], PROBE_TIMEOUT)
                .ok_or_else(|| format!("{port}: no INFO replication"))?;
            match info_field(&info, "role") {
                Some("master") => master_count += 1,
                Some("slave") => {
                    let link = info_field(&info, "master_link_status");
                    if link != Some("up") {
                        return Err(format!("{port}: master_link_status {link:?}"));
                    }
                }
                other => return Err(format!("{port}: role {other:?}")),
            }
        }
        if master_count != masters {
            return Err(format!("{master_count} masters, expected {masters}"));
        }
        Ok(())
    }

    /// Ok when every live node reports `cluster_state:ok` and the same full slot map.
    fn check_consistent(&self) -> Result<Vec<SlotRange>, String> {
        let mut first: Option<(u16, Vec<SlotRange>)> = None;
        for node in self.live_nodes() {
            let port = node.port();
            let info = conn::query_text(port, &["CLUSTER", "INFO"], PROBE_TIMEOUT)
                .ok_or_else(|| format!("{port}: no CLUSTER INFO"))?;
            let state = info_field(&info, "cluster_state");
            if state != Some("ok") {
                return Err(format!("{port}: cluster_state {state:?}"));
            }
            let ranges = self
                .slot_map(port)
                .ok_or_else(|| format!("{port}: no CLUSTER SLOTS"))?;
            let covered: u32 = ranges
                .iter()
                .map(|r| u32::from(r.end.saturating_sub(r.start)) + 1)
                .sum();
            if covered != u32::from(SLOT_COUNT) {
                return Err(format!("{port}: {covered} slots covered"));
            }
            match &first {
                None => first = Some((port, ranges)),
                Some((p0, r0)) if *r0 != ranges => {
                    return Err(format!("{port} and {p0} disagree on the slot map"));
                }
                Some(_) => {}
            }
        }
        first
            .map(|(_, r)| r)
            .ok_or_else(|| "no live node".to_owned())
    }

    /// Ok when the cluster is consistent and `slot` is served by a live node.
    fn check_owner(&self, slot: u16) -> Result<(), String> {
        let ranges = self.check_consistent()?;
        let owner = ranges
            .iter()
            .find(|r| (r.start..=r.end).contains(&slot))
            .map(|r| r.master_port)
            .ok_or_else(|| format!("slot {slot} not in the map"))?;
        let live = self.live_nodes().any(|n| n.port() == owner);
        if live {
            Ok(())
        } else {
            Err(format!("slot {slot} still mapped to dead node {owner}"))
        }
    }

    /// Panics with `what` and the log tail of every node.
    fn fail(&self, what: &str) -> ! {
        let mut msg = format!("redlock-testkit: {what}");
        for (i, n) in self.nodes.iter().enumerate() {
            msg.push_str(&format!(
                "\n--- node {i} (port {}) {} ---\n{}",
                n.port(),
                n.log_path().display(),
                n.log_tail(8)
            ));
        }
        panic!("{msg}");
    }
}

/// Starts `n` cluster-enabled nodes concurrently.
fn start_nodes(n: usize) -> Vec<RedisServer> {
    crate::set::start_all(n, || RedisServer::builder().cluster().start())
}

/// Runs `redis-cli --cluster create` over `nodes` (bounded by [`CREATE_TIMEOUT`]).
fn create(nodes: &[RedisServer], replicas: usize) -> Result<(), String> {
    let Some(first) = nodes.first() else {
        return Err("no nodes".to_owned());
    };
    let out_path = first.dir().join("cluster-create.log");
    let out = File::create(&out_path).map_err(|e| format!("create log: {e}"))?;
    let err = out.try_clone().map_err(|e| format!("create log: {e}"))?;
    let mut cmd = Command::new(redis_cli_bin());
    cmd.arg("--cluster").arg("create");
    for n in nodes {
        cmd.arg(format!("127.0.0.1:{}", n.port()));
    }
    cmd.arg("--cluster-replicas")
        .arg(replicas.to_string())
        .arg("--cluster-yes")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", redis_cli_bin()))?;
    let mut status = None;
    wait_until(CREATE_TIMEOUT, Duration::from_millis(10), || {
        status = child.try_wait().ok().flatten();
        status.is_some()
    });
    let output = || std::fs::read_to_string(&out_path).unwrap_or_default();
    match status {
        Some(s) if s.success() => Ok(()),
        Some(s) => Err(format!(
            "redis-cli --cluster create failed ({s}):\n{}",
            output()
        )),
        None => {
            // Our own child: kill by pid handle and reap.
            let _ = child.kill();
            let _ = child.wait();
            Err(format!(
                "redis-cli --cluster create timed out after {CREATE_TIMEOUT:?}:\n{}",
                output()
            ))
        }
    }
}
