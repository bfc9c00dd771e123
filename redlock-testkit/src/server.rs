//! One `redis-server` process on a free loopback port.

use std::fs::{self, File};
use std::io::{self, Write as _};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis::{RedisResult, Value};
use tempfile::TempDir;

use crate::conn::{self, info_field};
use crate::env::{free_port, redis_server_bin};

/// How long a server may take to answer `PING` after spawn or restart.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Sleep between readiness probes.
const READY_POLL: Duration = Duration::from_millis(10);
/// Upper bound on readiness probes (the time cap normally ends the loop first).
const READY_MAX_ROUNDS: u32 = 2_000;
/// Ports tried before giving up when each one turns out to be taken.
const MAX_PORT_ATTEMPTS: u32 = 16;
/// Timeout of the connection behind [`RedisServer::cmd_sync`].
const CMD_TIMEOUT: Duration = Duration::from_secs(2);
/// Timeout of one readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// The message of a failed `bind`.
const ADDR_IN_USE: &str = "Address already in use";
/// Attempts of [`RedisServer::restart`] while its port is busy.
const RESTART_ATTEMPTS: u32 = 5;
/// Pause between those attempts.
const RESTART_BACKOFF: Duration = Duration::from_millis(50);
/// The log file every server writes into its directory.
const LOG_FILE: &str = "redis.log";
/// Where the process's stdout and stderr go (early configuration errors end up here).
const STDIO_FILE: &str = "stdio.log";

/// Settings of a sentinel process (used by [`crate::Sentinels`]).
#[derive(Clone, Debug)]
pub(crate) struct SentinelConf {
    pub(crate) master_name: String,
    pub(crate) master_port: u16,
    pub(crate) quorum: u32,
    pub(crate) down_after_ms: u64,
    pub(crate) failover_timeout_ms: u64,
    pub(crate) parallel_syncs: u32,
}

/// Builder for a [`RedisServer`] with extra arguments; see [`RedisServer::builder`].
///
/// Arguments are passed on the command line in this order: the defaults (see
/// [`RedisServer::start`]), then [`aof`](Self::aof), [`replica_of`](Self::replica_of), the
/// cluster options, and last the extra [`arg`](Self::arg)s, so an extra argument overrides a
/// default of the same name.
#[derive(Clone, Debug, Default)]
#[must_use = "call .start() to spawn the server"]
pub struct ServerBuilder {
    args: Vec<String>,
    aof: bool,
    replica_of: Option<u16>,
    cluster: bool,
    sentinel: Option<SentinelConf>,
    first_port: Option<u16>,
}

impl ServerBuilder {
    /// Appends one command-line argument, e.g. `.arg("--maxmemory").arg("10mb")`.
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_owned());
        self
    }

    /// Appends several command-line arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// With `true`, persists every write: `--appendonly yes --appendfsync always`, so data
    /// survives [`RedisServer::kill9`] + [`RedisServer::restart`].
    pub fn aof(mut self, on: bool) -> Self {
        self.aof = on;
        self
    }

    /// Starts the server as a replica of `127.0.0.1:<master_port>` (`--replicaof`).
    pub fn replica_of(mut self, master_port: u16) -> Self {
        self.replica_of = Some(master_port);
        self
    }

    /// Enables cluster mode: `--cluster-enabled yes`, a cluster bus port from [`free_port`],
    /// `nodes.conf` in the server's directory, `--cluster-node-timeout 1000` and
    /// `--cluster-replica-validity-factor 0`. Used by [`crate::RedisCluster`].
    pub(crate) fn cluster(mut self) -> Self {
        self.cluster = true;
        self
    }

    /// Runs a sentinel with this configuration instead of a data node.
    pub(crate) fn sentinel(mut self, conf: SentinelConf) -> Self {
        self.sentinel = Some(conf);
        self
    }

    /// Tries this port first (tests of the retry path).
    #[cfg(test)]
    pub(crate) fn first_port(mut self, port: u16) -> Self {
        self.first_port = Some(port);
        self
    }

    /// Spawns the server and waits until it answers `PING` (10 s cap).
    ///
    /// When the server exits at once with "Address already in use" (another process took the
    /// port since [`free_port`] checked it), it is started again on the next free port, up to
    /// 16 times.
    ///
    /// # Panics
    ///
    /// When `redis-server` cannot be run, exits for another reason, or is not ready in time; the
    /// message includes the tail of its log.
    pub fn start(mut self) -> RedisServer {
        let dir = tempfile::Builder::new()
            .prefix("redlock-testkit-")
            .tempdir()
            .unwrap_or_else(|e| panic!("redlock-testkit: cannot create a temp dir: {e}"));
        let bin = redis_server_bin();
        let mut last_error = String::new();
        for _ in 0..MAX_PORT_ATTEMPTS {
            let port = self.first_port.take().unwrap_or_else(free_port);
            let bus_port = self.cluster.then(free_port);
            let args = match self.command_line(dir.path(), port, bus_port) {
                Ok(args) => args,
                Err(e) => panic!("redlock-testkit: cannot write a config file: {e}"),
            };
            match spawn_ready(&bin, &args, dir.path(), port) {
                Ok(child) => {
                    return RedisServer {
                        port,
                        bus_port,
                        pid: child.id(),
                        child: Some(child),
                        dir: Some(dir),
                        bin,
                        args,
                        paused: false,
                    }
                }
                Err(StartError::Exited(status)) if log_text(dir.path()).contains(ADDR_IN_USE) => {
                    // Another process took the port (or the bus port) after free_port checked
                    // it. Start afresh on the next one, with fresh logs.
                    last_error = format!("port {port} in use ({status})");
                    let _ = fs::remove_file(dir.path().join(LOG_FILE));
                    let _ = fs::remove_file(dir.path().join(STDIO_FILE));
                    let _ = fs::remove_file(dir.path().join("nodes.conf"));
                }
                Err(e) => fail_with_log(dir, &format!("redis-server on port {port} {e}")),
            }
        }
        panic!(
            "redlock-testkit: redis-server: no usable port after {MAX_PORT_ATTEMPTS} attempts \
             (last: {last_error})"
        );
    }

    /// The full command line (after the binary) for `port`; writes the sentinel config file.
    fn command_line(
        &self,
        dir: &Path,
        port: u16,
        bus_port: Option<u16>,
    ) -> io::Result<Vec<String>> {
        let dir_s = dir.to_string_lossy().into_owned();
        let log = dir.join(LOG_FILE).to_string_lossy().into_owned();
        if let Some(s) = &self.sentinel {
            let conf = dir.join("sentinel.conf");
            let text = format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir_s}\nlogfile {log}\n\
                 sentinel monitor {name} 127.0.0.1 {mp} {q}\n\
                 sentinel down-after-milliseconds {name} {da}\n\
                 sentinel failover-timeout {name} {ft}\n\
                 sentinel parallel-syncs {name} {ps}\n",
                name = s.master_name,
                mp = s.master_port,
                q = s.quorum,
                da = s.down_after_ms,
                ft = s.failover_timeout_ms,
                ps = s.parallel_syncs,
            );
            fs::write(&conf, text)?;
            let mut args = vec![conf.to_string_lossy().into_owned(), "--sentinel".to_owned()];
            args.extend(self.args.iter().cloned());
            return Ok(args);
        }
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            &dir_s,
            "--save",
            "",
            "--appendonly",
            "no",
            "--logfile",
            &log,
            "--enable-debug-command",
            "local",
            "--repl-diskless-sync-delay",
            "0",
            "--daemonize",
            "no",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        if self.aof {
            args.extend(["--appendonly", "yes", "--appendfsync", "always"].map(String::from));
        }
        if let Some(m) = self.replica_of {
            args.extend([
                "--replicaof".to_owned(),
                "127.0.0.1".to_owned(),
                m.to_string(),
            ]);
        }
        if let Some(bus) = bus_port {
            let nodes = dir.join("nodes.conf").to_string_lossy().into_owned();
            args.extend([
                "--cluster-enabled".to_owned(),
                "yes".to_owned(),
                "--cluster-port".to_owned(),
                bus.to_string(),
                "--cluster-config-file".to_owned(),
                nodes,
                "--cluster-node-timeout".to_owned(),
                "1000".to_owned(),
                "--cluster-replica-validity-factor".to_owned(),
                "0".to_owned(),
            ]);
        }
        args.extend(self.args.iter().cloned());
        Ok(args)
    }
}

/// Why a spawned server did not become ready.
#[derive(Debug)]
enum StartError {
    /// `redis-server` could not be executed.
    Spawn(io::Error),
    /// The process exited before answering `PING`.
    Exited(ExitStatus),
    /// No `PONG` within [`READY_TIMEOUT`].
    Timeout,
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Spawn(e) => write!(f, "could not be run: {e}"),
            StartError::Exited(s) => write!(f, "exited during startup ({s})"),
            StartError::Timeout => write!(f, "did not answer PING within {READY_TIMEOUT:?}"),
        }
    }
}

/// Spawns `bin args` with stdio into `dir`, then waits until it is ready on `port`.
///
/// On failure the child (if any) is killed and reaped.
fn spawn_ready(bin: &str, args: &[String], dir: &Path, port: u16) -> Result<Child, StartError> {
    let stdio = File::create(dir.join(STDIO_FILE)).map_err(StartError::Spawn)?;
    let stderr = stdio.try_clone().map_err(StartError::Spawn)?;
    let mut child = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(stdio)
        .stderr(stderr)
        .spawn()
        .map_err(StartError::Spawn)?;
    match wait_ready(&mut child, port) {
        Ok(()) => Ok(child),
        Err(e) => {
            reap(&mut child);
            Err(e)
        }
    }
}

/// Polls until the process `child` answers `PING` with `PONG` on `port` (not `LOADING`) and
/// `INFO server` names its pid, so a foreign server that owns the port is never mistaken for it.
fn wait_ready(child: &mut Child, port: u16) -> Result<(), StartError> {
    let started = Instant::now();
    let pid = child.id();
    for _ in 0..READY_MAX_ROUNDS {
        match child.try_wait() {
            Ok(Some(status)) => return Err(StartError::Exited(status)),
            Ok(None) => {}
            Err(e) => return Err(StartError::Spawn(e)),
        }
        if answers_as(port, pid) {
            return Ok(());
        }
        if started.elapsed() >= READY_TIMEOUT {
            break;
        }
        thread::sleep(READY_POLL);
    }
    Err(StartError::Timeout)
}

/// `PING` answers `PONG` and `INFO server` reports `process_id:<pid>`, on one connection.
fn answers_as(port: u16, pid: u32) -> bool {
    let probe = || -> RedisResult<bool> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
        let mut c = client.get_connection_with_timeout(PROBE_TIMEOUT)?;
        c.set_read_timeout(Some(PROBE_TIMEOUT))?;
        c.set_write_timeout(Some(PROBE_TIMEOUT))?;
        let pong: Value = redis::cmd("PING").query(&mut c)?;
        if conn::text(&pong).as_deref() != Some("PONG") {
            return Ok(false);
        }
        let info: Value = redis::cmd("INFO").arg("server").query(&mut c)?;
        let info = conn::text(&info).unwrap_or_default();
        Ok(info_field(&info, "process_id") == Some(pid.to_string().as_str()))
    };
    probe().unwrap_or(false)
}

/// Kills (SIGCONT first, in case it is stopped, then SIGKILL) and reaps `child`, unless it
/// has already been reaped. Never panics.
fn reap(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        // Not reaped yet, so the pid still names our child (running or zombie).
        signal(child.id(), libc::SIGCONT);
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// Sends `sig` to `pid`. Callers guarantee `pid` is an unreaped child of this process.
fn signal(pid: u32, sig: libc::c_int) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// The server's log file followed by its captured stdout/stderr (empty if unreadable).
fn log_text(dir: &Path) -> String {
    let mut text = fs::read_to_string(dir.join(LOG_FILE)).unwrap_or_default();
    let stdio = fs::read_to_string(dir.join(STDIO_FILE)).unwrap_or_default();
    if !stdio.trim().is_empty() {
        text.push_str(&stdio);
    }
    text
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Panics with the log tail, keeping the directory so the whole log can be read.
fn fail_with_log(dir: TempDir, what: &str) -> ! {
    let log = tail(&log_text(dir.path()), 30);
    let kept = dir.keep();
    panic!(
        "redlock-testkit: {what}\n--- last lines of {} ---\n{log}",
        kept.join(LOG_FILE).display()
    );
}

/// A `redis-server` process (data node or sentinel) on a free loopback port, in its own temp
/// directory, owned by this value.
///
/// Started with `--port P --bind 127.0.0.1 --dir <tempdir> --save "" --appendonly no
/// --logfile <dir>/redis.log --enable-debug-command local --repl-diskless-sync-delay 0
/// --daemonize no` plus the [`ServerBuilder`] options.
///
/// # Drop
///
/// Sends SIGCONT (in case it is paused) and SIGKILL to the pid, and reaps it. The temp dir is
/// removed, except while the thread is panicking: then its path is printed to stderr so the log
/// of a failed test survives.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    bus_port: Option<u16>,
    pid: u32,
    child: Option<Child>,
    dir: Option<TempDir>,
    bin: String,
    args: Vec<String>,
    paused: bool,
}

impl RedisServer {
    /// Starts a standalone server with the default arguments and waits for `PING`.
    ///
    /// # Panics
    ///
    /// When the server cannot be started; see [`ServerBuilder::start`].
    pub fn start() -> RedisServer {
        ServerBuilder::default().start()
    }

    /// A builder for a server with extra arguments, AOF, replication or cluster mode.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }

    /// The TCP port the server listens on (stable across [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster bus port, when started in cluster mode.
    pub fn bus_port(&self) -> Option<u16> {
        self.bus_port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port))
    }

    /// The pid of the current process (the last one, if it has been killed).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The server's temp directory (data, `redis.log`, `nodes.conf`, `sentinel.conf`).
    pub fn dir(&self) -> &Path {
        self.dir.as_ref().map_or(Path::new(""), |d| d.path())
    }

    /// The path of the server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir().join(LOG_FILE)
    }

    /// A `redis::Client` for [`url`](Self::url) (no connection is made yet).
    ///
    /// # Panics
    ///
    /// Never in practice: the URL is always valid.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url())
            .unwrap_or_else(|e| panic!("redlock-testkit: bad url {}: {e}", self.url()))
    }

    /// Runs one command on a fresh synchronous connection with 2 s connect/read/write
    /// timeouts, e.g. `server.cmd_sync(&["SET", "k", "v"])`.
    ///
    /// # Errors
    ///
    /// Connection errors, timeouts (e.g. while [`pause`](Self::pause)d) and error replies.
    pub fn cmd_sync(&self, args: &[&str]) -> RedisResult<Value> {
        conn::query(self.port, args, CMD_TIMEOUT)
    }

    /// A fresh multiplexed async connection to this server (the test's own, beside the
    /// manager's).
    ///
    /// # Panics
    ///
    /// When the server cannot be reached.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("redlock-testkit: connecting to {}: {e}", self.url()))
    }

    /// Whether `key` exists (`EXISTS`, through [`cmd_sync`](Self::cmd_sync)).
    ///
    /// # Panics
    ///
    /// When the command fails.
    pub fn exists(&self, key: &str) -> bool {
        self.cmd_sync(&["EXISTS", key]).expect("EXISTS") == Value::Int(1)
    }

    /// The remaining ttl of `key` in milliseconds (`PTTL`: -1 without expiry, -2 when
    /// absent).
    ///
    /// # Panics
    ///
    /// When the command fails or replies something other than an integer.
    pub fn pttl(&self, key: &str) -> i64 {
        match self.cmd_sync(&["PTTL", key]).expect("PTTL") {
            Value::Int(n) => n,
            other => panic!("PTTL replied {other:?}"),
        }
    }

    /// The integer stored at `key` (`GET`; 0 when absent), e.g. a fencing counter.
    ///
    /// # Panics
    ///
    /// When the command fails or the value is not an integer.
    pub fn get_int(&self, key: &str) -> i64 {
        match self.cmd_sync(&["GET", key]).expect("GET") {
            Value::BulkString(b) => String::from_utf8_lossy(&b).parse().expect("integer"),
            _ => 0,
        }
    }

    /// The `calls` of the commands named `names` (lower case, e.g. `["eval", "evalsha"]`)
    /// in `INFO commandstats`, summed.
    ///
    /// # Panics
    ///
    /// When `INFO` fails or replies something other than text.
    pub fn command_calls(&self, names: &[&str]) -> u64 {
        let info = match self.cmd_sync(&["INFO", "commandstats"]).expect("INFO") {
            Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            Value::VerbatimString { text, .. } => text,
            other => panic!("redlock-testkit: INFO replied {other:?}"),
        };
        info.lines()
            .filter_map(|l| {
                let (name, stats) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                names.contains(&name).then_some(stats)
            })
            .filter_map(|stats| {
                stats
                    .split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    /// Kills the process with SIGKILL and reaps it. The directory and port are kept for
    /// [`restart`](Self::restart). Does nothing if it is not running.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            reap(&mut child);
        }
        self.paused = false;
    }

    /// Starts the server again on the same port, directory and arguments (killing the current
    /// process first if it is still running) and waits for `PING`.
    ///
    /// With [`ServerBuilder::aof`] the data survives; without it the server comes back empty.
    ///
    /// # Panics
    ///
    /// When the server does not come back, with the log tail. If the port is busy (another
    /// process took it meanwhile) the start is retried 5 times, 50 ms apart, first.
    pub fn restart(&mut self) {
        self.kill9();
        let dir = self.dir().to_path_buf();
        let in_use = |dir: &Path| log_text(dir).matches(ADDR_IN_USE).count();
        let mut last = None;
        for attempt in 0..RESTART_ATTEMPTS {
            if attempt > 0 {
                thread::sleep(RESTART_BACKOFF);
            }
            let before = in_use(&dir);
            match spawn_ready(&self.bin, &self.args, &dir, self.port) {
                Ok(child) => {
                    self.pid = child.id();
                    self.child = Some(child);
                    return;
                }
                // Possibly transient (another process probing the port with a bind): retry.
                Err(e @ StartError::Exited(_)) if in_use(&dir) > before => last = Some(e),
                Err(e) => {
                    last = Some(e);
                    break;
                }
            }
        }
        let why = last.map(|e| e.to_string()).unwrap_or_default();
        panic!(
            "redlock-testkit: restart of redis-server on port {} {why}\n--- log ---\n{}",
            self.port,
            self.log_tail(30)
        );
    }

    /// Freezes the process with SIGSTOP, like a long GC pause: connections are still accepted
    /// by the kernel, but nothing is answered until [`resume`](Self::resume). TTLs keep running.
    /// Does nothing if it is not running.
    pub fn pause(&mut self) {
        if self.unreaped() && signal(self.pid, libc::SIGSTOP) {
            self.paused = true;
            // SIGSTOP is asynchronous: wait (bounded) until the kernel reports it stopped.
            let pid = self.pid;
            crate::wait_until(Duration::from_secs(1), Duration::from_millis(1), || {
                proc_state(pid).is_none_or(|s| s == 'T' || s == 't')
            });
        }
    }

    /// Continues a process stopped by [`pause`](Self::pause) (SIGCONT).
    pub fn resume(&mut self) {
        if self.unreaped() {
            signal(self.pid, libc::SIGCONT);
        }
        self.paused = false;
    }

    /// Whether the process is [`pause`](Self::pause)d.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Whether the process is alive (it may be paused).
    pub fn is_running(&mut self) -> bool {
        self.unreaped()
    }

    /// The last `n_lines` lines of the server's log (plus anything it printed to stdout/stderr).
    pub fn log_tail(&self, n_lines: usize) -> String {
        tail(&log_text(self.dir()), n_lines)
    }

    /// Whether this value holds a process (not killed through [`kill9`](Self::kill9)); does not
    /// check whether it crashed.
    pub(crate) fn has_process(&self) -> bool {
        self.child.is_some()
    }

    /// Whether the child exists and has not exited (its pid can be signalled safely).
    fn unreaped(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                // Exited (now reaped) or unknowable: forget the child so its pid is never
                // signalled again.
                if let Some(mut c) = self.child.take() {
                    let _ = c.wait();
                }
                false
            }
            None => false,
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            reap(&mut child);
        }
        if let Some(dir) = self.dir.take() {
            if thread::panicking() {
                let path = dir.keep();
                // Not eprintln!: it panics if stderr is gone, and Drop must not panic.
                let _ = writeln!(
                    std::io::stderr(),
                    "redlock-testkit: kept the directory of redis-server on port {}: {}",
                    self.port,
                    path.display()
                );
            }
        }
    }
}

/// The state letter of `/proc/<pid>/stat` (`R`, `S`, `T`, `Z`, ...), if readable.
fn proc_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: the state follows the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.trim_start().chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_takes_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
        assert_eq!(tail("", 3), "");
    }

    #[test]
    fn retries_when_the_port_is_taken() {
        if !crate::redis_available() {
            eprintln!("redis-server not found: skipping");
            return;
        }
        let taken = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, free_port()))
            .expect("bind a port to block it");
        let blocked = taken.local_addr().expect("local addr").port();
        let server = RedisServer::builder().first_port(blocked).start();
        assert_ne!(server.port(), blocked);
        assert_eq!(
            conn::text(&server.cmd_sync(&["PING"]).expect("PING")).as_deref(),
            Some("PONG")
        );
    }
}
