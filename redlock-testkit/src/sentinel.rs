//! Master + replica + 3 sentinels.

use std::time::{Duration, Instant};

use redis::{RedisResult, Value};

use crate::conn::{self, flat_map};
use crate::server::{RedisServer, SentinelConf};
use crate::wait::wait_until;

/// The name the sentinels monitor.
const MASTER_NAME: &str = "mymaster";
/// Startup budget: replica attached and sentinels discovered each other.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// Poll interval of the readiness and failover loops.
const POLL: Duration = Duration::from_millis(20);
/// Timeout of each probe connection.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// Number of sentinels.
const SENTINELS: usize = 3;

/// A master, one replica and three sentinels monitoring them as `mymaster` (quorum 2,
/// `down-after-milliseconds 1000`, `failover-timeout 2000`, `parallel-syncs 1`).
///
/// Startup takes about 2.1-3 s; a failover after [`kill_master`](Self::kill_master) about
/// 2.2-2.4 s.
///
/// [`master`](Self::master) and [`replica`](Self::replica) are the servers *started* as master
/// and replica; after a failover ask [`current_master_addr`](Self::current_master_addr).
/// Dropping the value kills and reaps all five processes.
#[derive(Debug)]
pub struct Sentinels {
    /// `[started as master, started as replica]`.
    data: [RedisServer; 2],
    sentinels: Vec<RedisServer>,
    failed_master: Option<u16>,
    /// Index in `data` of the replica frozen by `partition_replica`.
    partitioned: Option<usize>,
}

impl Sentinels {
    /// Starts the master, the replica, and (once the replica is attached) three sentinels,
    /// then waits (15 s cap overall) until `WAIT 1` on the master acknowledges a write and
    /// every sentinel sees 2 other sentinels and 1 replica.
    ///
    /// # Panics
    ///
    /// When a process cannot be started or the setup is not ready in time (with log tails).
    pub fn start() -> Sentinels {
        let started = Instant::now();
        let master = RedisServer::start();
        let replica = RedisServer::builder().replica_of(master.port()).start();
        let attached = wait_until(READY_TIMEOUT, POLL, || replica_acks(master.port()));
        let conf = SentinelConf {
            master_name: MASTER_NAME.to_owned(),
            master_port: master.port(),
            quorum: 2,
            down_after_ms: 1000,
            failover_timeout_ms: 2000,
            parallel_syncs: 1,
        };
        let sentinels = start_sentinels(&conf);
        let set = Sentinels {
            data: [master, replica],
            sentinels,
            failed_master: None,
            partitioned: None,
        };
        if !attached {
            set.fail("the replica never acknowledged a write (WAIT 1)");
        }
        let left = READY_TIMEOUT.saturating_sub(started.elapsed());
        if !wait_until(left, POLL, || set.check_ready().is_ok()) {
            let why = set.check_ready().err().unwrap_or_default();
            set.fail(&format!(
                "sentinels not ready after {:?}: {why}",
                started.elapsed()
            ));
        }
        set
    }

    /// The monitored master's name, `mymaster`.
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// URL of the server started as master.
    pub fn master_url(&self) -> String {
        self.data[0].url()
    }

    /// URL of the server started as replica.
    pub fn replica_url(&self) -> String {
        self.data[1].url()
    }

    /// `redis://127.0.0.1:<port>` of the three sentinels.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The server started as master.
    pub fn master(&self) -> &RedisServer {
        &self.data[0]
    }

    /// The server started as master, mutably (e.g. to [`pause`](RedisServer::pause) it for a
    /// "zombie master" test).
    pub fn master_mut(&mut self) -> &mut RedisServer {
        &mut self.data[0]
    }

    /// The server started as replica.
    pub fn replica(&self) -> &RedisServer {
        &self.data[1]
    }

    /// The server started as replica, mutably.
    pub fn replica_mut(&mut self) -> &mut RedisServer {
        &mut self.data[1]
    }

    /// The sentinel processes.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// The master address according to the first sentinel that answers
    /// `SENTINEL GET-MASTER-ADDR-BY-NAME`.
    ///
    /// # Panics
    ///
    /// When no sentinel answers.
    pub fn current_master_addr(&self) -> (String, u16) {
        self.sentinels
            .iter()
            .filter(|s| s.has_process() && !s.is_paused())
            .find_map(|s| master_addr(s.port()))
            .unwrap_or_else(|| panic!("redlock-testkit: no sentinel knows the master address"))
    }

    /// `redis://<host>:<port>` of [`current_master_addr`](Self::current_master_addr).
    pub fn current_master_url(&self) -> String {
        let (host, port) = self.current_master_addr();
        format!("redis://{host}:{port}")
    }

    /// The data server the Sentinels name as master now (to pause it, say).
    pub fn current_master_mut(&mut self) -> &mut RedisServer {
        let i = self.current_master_index();
        &mut self.data[i]
    }

    /// Kills (SIGKILL + reap) sentinel `i` (0, 1 or 2); the others go on.
    ///
    /// # Panics
    ///
    /// When `i` is out of range.
    pub fn kill_sentinel(&mut self, i: usize) {
        self.sentinels[i].kill9();
    }

    /// Restarts sentinel `i` (after [`kill_sentinel`](Self::kill_sentinel)) on its port,
    /// with the configuration it last wrote.
    ///
    /// # Panics
    ///
    /// When `i` is out of range or the process cannot be started.
    pub fn restart_sentinel(&mut self, i: usize) {
        self.sentinels[i].restart();
    }

    /// Restarts the data server [`kill_master`](Self::kill_master) killed as a replica of
    /// the current master and waits (up to `timeout`) until the whole set is settled
    /// again ([`wait_healthy`](Self::wait_healthy)); returns how long that took.
    ///
    /// # Panics
    ///
    /// When no master was killed, `REPLICAOF` fails, or the set does not settle in time.
    pub fn restore_killed(&mut self, timeout: Duration) -> Duration {
        let started = Instant::now();
        let killed = self
            .failed_master
            .take()
            .expect("redlock-testkit: restore_killed without kill_master");
        let (_, master) = self.current_master_addr();
        let i = self
            .data
            .iter()
            .position(|s| s.port() == killed)
            .expect("the killed server is one of the data servers");
        self.data[i].restart();
        if let Err(e) = self.data[i].cmd_sync(&["REPLICAOF", "127.0.0.1", &master.to_string()]) {
            panic!("redlock-testkit: REPLICAOF failed: {e}");
        }
        self.wait_healthy(timeout);
        started.elapsed()
    }

    /// Kills (SIGKILL + reap) the current master. Follow with
    /// [`wait_failover`](Self::wait_failover).
    pub fn kill_master(&mut self) {
        let i = self.current_master_index();
        self.failed_master = Some(self.data[i].port());
        self.data[i].kill9();
    }

    /// Waits until every live sentinel names the same master, that master is a live server
    /// other than the one [`kill_master`](Self::kill_master) killed, and its `ROLE` is
    /// `master`. Returns the time this call waited; call it right after the fault.
    ///
    /// # Panics
    ///
    /// When that does not happen within `timeout` (allow 5 s; ~2.2-2.4 s is normal), with the
    /// logs' tails.
    pub fn wait_failover(&self, timeout: Duration) -> Duration {
        let started = Instant::now();
        if wait_until(timeout, POLL, || self.check_failover().is_ok()) {
            return started.elapsed();
        }
        let why = self.check_failover().err().unwrap_or_default();
        self.fail(&format!("no failover within {timeout:?}: {why}"))
    }

    /// Waits until the set is settled again after a failover and a restart: every live
    /// sentinel names the same master, flags it plain `master` (no `s_down`, `o_down` or
    /// `failover_in_progress`), and lists the other data server as a plain `slave`; that
    /// master's `ROLE` is `master` and a replica acknowledges a write (`WAIT 1`). Returns
    /// the time this call waited.
    ///
    /// Sentinels can fail over a second time (one that missed the first failover's new
    /// configuration may judge the freshly promoted master down and promote the other
    /// server back), so "settled" is checked as a whole, not per server.
    ///
    /// # Panics
    ///
    /// When that does not happen within `timeout`, with what each sentinel says and the
    /// logs' tails.
    pub fn wait_healthy(&self, timeout: Duration) -> Duration {
        let started = Instant::now();
        if wait_until(timeout, Duration::from_millis(50), || {
            self.check_healthy().is_ok()
        }) {
            return started.elapsed();
        }
        let why = self.check_healthy().err().unwrap_or_default();
        panic!(
            "redlock-testkit: the sentinel set did not settle within {timeout:?}: {why}\n{}",
            self.describe()
        )
    }

    /// The deterministic lost-write recipe: freezes the current replica (SIGSTOP) and makes the
    /// current master drop it (`CLIENT KILL TYPE replica`). Writes to the master are then
    /// acknowledged by no replica (`WAIT 1 100` returns 0), and are lost if the master is
    /// killed and the replica promoted. Undo with [`heal_replica`](Self::heal_replica).
    ///
    /// # Panics
    ///
    /// When the master rejects `CLIENT KILL`.
    pub fn partition_replica(&mut self) {
        let m = self.current_master_index();
        let r = 1 - m;
        self.data[r].pause();
        self.partitioned = Some(r);
        if let Err(e) = self.data[m].cmd_sync(&["CLIENT", "KILL", "TYPE", "replica"]) {
            panic!("redlock-testkit: CLIENT KILL TYPE replica failed: {e}");
        }
    }

    /// Resumes (SIGCONT) a replica frozen by [`partition_replica`](Self::partition_replica);
    /// it reconnects to its master within about a second.
    pub fn heal_replica(&mut self) {
        if let Some(r) = self.partitioned.take() {
            self.data[r].resume();
        }
    }

    /// Index in `data` of the server the sentinels name as master (0 if none matches).
    fn current_master_index(&self) -> usize {
        let (_, port) = self.current_master_addr();
        self.data.iter().position(|s| s.port() == port).unwrap_or(0)
    }

    fn check_ready(&self) -> Result<(), String> {
        for s in &self.sentinels {
            let port = s.port();
            let v = conn::query(port, &["SENTINEL", "MASTER", MASTER_NAME], PROBE_TIMEOUT)
                .map_err(|e| format!("sentinel {port}: {e}"))?;
            let m = flat_map(&v);
            let others = m.get("num-other-sentinels").map(String::as_str);
            let replicas = m.get("num-slaves").map(String::as_str);
            if others != Some("2") || replicas != Some("1") {
                return Err(format!(
                    "sentinel {port}: num-other-sentinels {others:?}, num-slaves {replicas:?}"
                ));
            }
        }
        Ok(())
    }

    fn check_healthy(&self) -> Result<(), String> {
        let master = self.agreed_master()?;
        let replica = self
            .data
            .iter()
            .map(RedisServer::port)
            .find(|&p| p != master)
            .ok_or("no second data server")?;
        for s in self.live_sentinels() {
            let port = s.port();
            let m = conn::query(port, &["SENTINEL", "MASTER", MASTER_NAME], PROBE_TIMEOUT)
                .map_err(|e| format!("sentinel {port}: {e}"))?;
            let flags = flat_map(&m).get("flags").cloned().unwrap_or_default();
            if flags != "master" {
                return Err(format!("sentinel {port}: master flags {flags:?}"));
            }
            let v = conn::query(port, &["SENTINEL", "REPLICAS", MASTER_NAME], PROBE_TIMEOUT)
                .map_err(|e| format!("sentinel {port}: {e}"))?;
            let Value::Array(items) = v else {
                return Err(format!("sentinel {port}: REPLICAS reply {v:?}"));
            };
            let listed = items.iter().map(flat_map).any(|r| {
                r.get("port") == Some(&replica.to_string())
                    && r.get("flags").map(String::as_str) == Some("slave")
            });
            if !listed {
                return Err(format!(
                    "sentinel {port}: {replica} is not a healthy replica"
                ));
            }
        }
        if replica_acks(master) {
            Ok(())
        } else {
            Err(format!("no replica acknowledges writes on {master}"))
        }
    }

    /// The master every live sentinel names, if they agree and it is a live server whose
    /// `ROLE` is `master`.
    fn agreed_master(&self) -> Result<u16, String> {
        let mut agreed: Option<u16> = None;
        for s in self.live_sentinels() {
            let (_, port) =
                master_addr(s.port()).ok_or_else(|| format!("sentinel {}: no answer", s.port()))?;
            match agreed {
                None => agreed = Some(port),
                Some(p) if p != port => return Err(format!("sentinels name {p} and {port}")),
                Some(_) => {}
            }
        }
        let port = agreed.ok_or_else(|| "no live sentinel".to_owned())?;
        let server = self
            .data
            .iter()
            .find(|s| s.port() == port && s.has_process() && !s.is_paused())
            .ok_or_else(|| format!("named master {port} is not a live server"))?;
        let role = server
            .cmd_sync(&["ROLE"])
            .ok()
            .and_then(|v| match v {
                Value::Array(items) => items.first().and_then(conn::text),
                _ => None,
            })
            .ok_or_else(|| format!("{port}: no ROLE"))?;
        if role == "master" {
            Ok(port)
        } else {
            Err(format!("{port}: role {role}"))
        }
    }

    fn live_sentinels(&self) -> impl Iterator<Item = &RedisServer> {
        self.sentinels
            .iter()
            .filter(|s| s.has_process() && !s.is_paused())
    }

    fn check_failover(&self) -> Result<(), String> {
        let port = self.agreed_master()?;
        if Some(port) == self.failed_master {
            return Err(format!("the sentinels still name {port}"));
        }
        Ok(())
    }

    /// What each sentinel says of `mymaster` (its address and replicas with their flags),
    /// then the tail of every process's log: for a test's failure message.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for s in &self.sentinels {
            let port = s.port();
            let replicas = conn::query(port, &["SENTINEL", "REPLICAS", MASTER_NAME], PROBE_TIMEOUT)
                .map(|v| match v {
                    Value::Array(items) => items
                        .iter()
                        .map(|r| {
                            let m = flat_map(r);
                            format!(
                                "{}:{}",
                                m.get("port").map_or("?", String::as_str),
                                m.get("flags").map_or("?", String::as_str)
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(" "),
                    other => format!("{other:?}"),
                });
            out.push_str(&format!(
                "sentinel {port}: master {:?}, replicas {replicas:?}\n",
                master_addr(port)
            ));
        }
        out.push_str(&self.log_tails(20));
        out
    }

    fn log_tails(&self, lines: usize) -> String {
        let mut msg = String::new();
        let all = self.data.iter().chain(self.sentinels.iter());
        for (name, s) in [
            "master",
            "replica",
            "sentinel 0",
            "sentinel 1",
            "sentinel 2",
        ]
        .iter()
        .zip(all)
        {
            msg.push_str(&format!(
                "\n--- {name} (port {}) {} ---\n{}",
                s.port(),
                s.log_path().display(),
                s.log_tail(lines)
            ));
        }
        msg
    }

    fn fail(&self, what: &str) -> ! {
        panic!("redlock-testkit: {what}{}", self.log_tails(8));
    }
}

/// `SET` then `WAIT 1 200` on one connection to the master returns 1.
fn replica_acks(master_port: u16) -> bool {
    let probe = || -> RedisResult<i64> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{master_port}"))?;
        let mut c = client.get_connection_with_timeout(PROBE_TIMEOUT)?;
        c.set_read_timeout(Some(PROBE_TIMEOUT))?;
        c.set_write_timeout(Some(PROBE_TIMEOUT))?;
        redis::cmd("SET")
            .arg("redlock-testkit:attach")
            .arg("1")
            .query::<()>(&mut c)?;
        redis::cmd("WAIT").arg(1).arg(200).query(&mut c)
    };
    probe().is_ok_and(|n| n >= 1)
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME` on the sentinel at `port`.
fn master_addr(port: u16) -> Option<(String, u16)> {
    let v = conn::query(
        port,
        &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
        PROBE_TIMEOUT,
    )
    .ok()?;
    let Value::Array(items) = v else {
        return None;
    };
    let [host, p] = items.as_slice() else {
        return None;
    };
    Some((conn::text(host)?, u16::try_from(conn::int(p)?).ok()?))
}

/// Starts [`SENTINELS`] sentinels concurrently.
fn start_sentinels(conf: &SentinelConf) -> Vec<RedisServer> {
    crate::set::start_all(SENTINELS, || {
        RedisServer::builder().sentinel(conf.clone()).start()
    })
}
