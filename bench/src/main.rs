//! The redlock benchmark harness.
//!
//! ```text
//! cargo run --release -p redlock-bench -- [--quick] [--scenario NAME]...
//! ```
//!
//! Starts its own `redis-server` processes on free loopback ports (through
//! `redlock-testkit`), warms up, runs each scenario several times with the implementations
//! interleaved, and prints one table per scenario: absolute figures, the baseline measured
//! in the same run, and the ratio. The last line sums the ratios up:
//!
//! ```text
//! ratios: uncontended=<x> uncontended_rslock=<x> distinct64=<x> distinct64_rslock=<x> distance=<x> distance_rslock=<x> acquire_vs_set=<x> release_vs_cad=<x> handoff_vs_poll=<x> handoff_vs_rslock=<x> handoff_vs_rtt=<x> fifo=<x> fair_rtts=<x> fair_attempts=<x> fair_violations=<n> redlock5_vs_single=<x> redlock5_vs_floor=<x> frozen_node=<x> macro_vs_guard=<x> held_100k=<x> list_100k_ping=<x>
//! ```
//!
//! Throughput ratios are redlock ÷ baseline (`*_rslock`: rslock's ops/s ÷ the same raw
//! baseline, beside ours; `distance*`: 1 task through a proxy adding 100 µs each way); `handoff_vs_*` is the baseline's hand-off p50
//! ÷ redlock's; `handoff_vs_rtt` is redlock's hand-off p50 ÷ one raw `SET` round trip;
//! `acquire_vs_set` is the lock's acquire script's server time per call ÷ a native
//! `SET NX PX`'s, `release_vs_cad` the release script's ÷ the raw compare-and-delete
//! script's (the `costs` table has every script, each against its budget);
//! `fifo` is the fraction of contended acquisitions that changed holder;
//! `fair_rtts` is the fair lock's hand-off p50 in raw `SET` round trips (32 waiters over 4
//! managers), `fair_attempts` its acquisition attempts per release across all managers
//! (the target is 1), `fair_violations` its grants out of arrival order (the target is 0);
//! `redlock5_vs_single`, `redlock5_vs_floor` (÷ raw lock+release on all five servers at
//! once, the machine's floor for Redlock) and `macro_vs_guard` are time-per-operation
//! ratios (cost ÷ cost); `frozen_node` is Redlock's lock+release p50 with one master
//! SIGSTOPped ÷ the same managers' healthy p50 (the larger over 3 and 5 masters);
//! for `macro_vs_guard` the macro's extra work is measured on the in-memory backend (where
//! it is well above the noise) and set against a Redis lock+release of the same run;
//! `held_100k` is the time of a lock + drop with 100 000 other locks held ÷ with none;
//! `list_100k_ping` is another client's `PING` p99 while `LockManager::list` walks 100 000
//! held locks ÷ its p99 on the idle server (listing must not block Redis).
//! Figures are printed, never asserted: timings do not fail the run (a scenario that
//! cannot run at all, e.g. no redis-server, exits non-zero).

mod costs;
mod cpu;
mod distance;
mod fair;
mod frozen;
mod handoff;
mod held;
mod list;
mod lockers;
mod macro_guard;
mod raw;
mod redlock5;
mod stats;
mod uncontended;
mod watchdog;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use redlock_testkit::{RedisServer, RedisSet};

/// How long and how often everything runs.
pub struct Config {
    pub quick: bool,
    /// Measured runs per implementation (interleaved).
    pub runs: usize,
    /// Length of one throughput run.
    pub dur: Duration,
    /// Warm-up per implementation before its first run.
    pub warmup: Duration,
    /// Sequential SETs per run for the raw round trip.
    pub rtt_samples: usize,
    /// Hand-off runs per implementation, and acquisitions per task in each.
    pub handoff_runs: usize,
    pub handoff_per_task: usize,
    /// Lock counts of the watchdog scenario.
    pub watchdog_locks: Vec<usize>,
    /// Renewal ticks per watchdog window.
    pub watchdog_ticks: u32,
    /// Interleaved slices per side in macro vs guard, and their length.
    pub macro_slices: usize,
    pub macro_slice: Duration,
}

impl Config {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                quick,
                runs: 7,
                dur: Duration::from_millis(200),
                warmup: Duration::from_millis(200),
                rtt_samples: 1000,
                handoff_runs: 5,
                handoff_per_task: 40,
                watchdog_locks: vec![1_000, 10_000],
                watchdog_ticks: 2,
                macro_slices: 8,
                macro_slice: Duration::from_millis(250),
            }
        } else {
            Self {
                quick,
                runs: 15,
                dur: Duration::from_millis(500),
                warmup: Duration::from_secs(1),
                rtt_samples: 5000,
                handoff_runs: 5,
                handoff_per_task: 100,
                watchdog_locks: vec![1_000, 10_000],
                watchdog_ticks: 5,
                macro_slices: 20,
                macro_slice: Duration::from_millis(500),
            }
        }
    }
}

const SCENARIOS: [&str; 12] = [
    "uncontended",
    "distinct64",
    "distance",
    "costs",
    "handoff",
    "fair",
    "watchdog",
    "held",
    "list",
    "redlock5",
    "frozen",
    "macro",
];

const USAGE: &str = "usage: redlock-bench [--quick] [--scenario NAME]...
  --quick            short runs (under 90 s on 2 cores), as CI runs it
  --scenario NAME    only this scenario (repeatable, or comma-separated):
                     uncontended, distinct64, distance, costs, handoff, fair, watchdog, held, list,
                     redlock5, frozen, macro";

fn parse_args() -> Result<(bool, Vec<String>), String> {
    let mut quick = false;
    let mut only = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--scenario" => {
                let v = args.next().ok_or("--scenario needs a name")?;
                only.extend(v.split(',').map(str::to_owned));
            }
            s if s.starts_with("--scenario=") => {
                only.extend(s["--scenario=".len()..].split(',').map(str::to_owned));
            }
            "-h" | "--help" => return Err(String::new()),
            // `cargo bench` passes --bench; accept and ignore it.
            "--bench" => {}
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    for s in &only {
        if !SCENARIOS.contains(&s.as_str()) {
            return Err(format!("unknown scenario {s:?}"));
        }
    }
    Ok((quick, only))
}

fn main() -> ExitCode {
    let (quick, only) = match parse_args() {
        Ok(x) => x,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("redlock-bench: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let wanted = |s: &str| only.is_empty() || only.iter().any(|o| o == s);
    let cfg = Config::new(quick);
    let started = Instant::now();

    if !redlock_testkit::redis_available() {
        eprintln!(
            "redlock-bench: redis-server not found (set REDLOCK_REDIS_SERVER or put it on PATH)"
        );
        return ExitCode::FAILURE;
    }
    let server = RedisServer::start();
    let set =
        (wanted("redlock5") || wanted("frozen") || wanted("costs")).then(|| RedisSet::start(5));
    let version = server
        .cmd_sync(&["INFO", "server"])
        .ok()
        .and_then(|v| match v {
            redis::Value::BulkString(b) => Some(String::from_utf8_lossy(&b).into_owned()),
            redis::Value::VerbatimString { text, .. } => Some(text),
            _ => None,
        })
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("redis_version:")
                    .map(|v| v.trim().to_owned())
            })
        })
        .unwrap_or_else(|| "?".into());
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    println!(
        "redlock-bench ({} mode): redis-server {version} on 127.0.0.1 (ports {}{}), {cpus} CPUs, tokio multi-thread runtime",
        if quick { "quick" } else { "full" },
        server.port(),
        set.as_ref()
            .map(|s| format!(", Redlock set {:?}", s.nodes().iter().map(RedisServer::port).collect::<Vec<_>>()))
            .unwrap_or_default(),
    );

    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("redlock-bench: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let url = server.url();
    let pid = server.pid();
    let set_urls = set.as_ref().map(RedisSet::urls);
    let set_pids: Vec<u32> = set
        .as_ref()
        .map(|s| s.nodes().iter().map(RedisServer::pid).collect())
        .unwrap_or_default();
    let failed = rt.block_on(async {
        let mut r = Ratios::default();
        let mut failed = false;
        let mut report = |name: &str, e: String| {
            eprintln!("redlock-bench: scenario {name} failed: {e}");
            failed = true;
        };
        if wanted("uncontended") {
            match uncontended::run(&cfg, &url, pid, 1).await {
                Ok(x) => (r.uncontended, r.uncontended_rslock) = (Some(x.redlock), Some(x.rslock)),
                Err(e) => report("uncontended", e),
            }
        }
        if wanted("distinct64") {
            match uncontended::run(&cfg, &url, pid, 64).await {
                Ok(x) => (r.distinct64, r.distinct64_rslock) = (Some(x.redlock), Some(x.rslock)),
                Err(e) => report("distinct64", e),
            }
        }
        if wanted("distance") {
            match distance::run(&cfg, &url, pid).await {
                Ok(x) => (r.distance, r.distance_rslock) = (Some(x.redlock), Some(x.rslock)),
                Err(e) => report("distance", e),
            }
        }
        if wanted("costs") {
            match costs::run(&cfg, &url, set_urls.as_deref()).await {
                Ok(c) => {
                    (r.acquire_vs_set, r.release_vs_cad) =
                        (Some(c.acquire_vs_set), Some(c.release_vs_cad))
                }
                Err(e) => report("costs", e),
            }
        }
        if wanted("handoff") {
            match handoff::run(&cfg, &url).await {
                Ok(h) => {
                    r.handoff_vs_poll = Some(h.vs_poll);
                    r.handoff_vs_rslock = Some(h.vs_rslock);
                    r.handoff_vs_rtt = Some(h.vs_rtt);
                    r.fifo = Some(h.fifo);
                }
                Err(e) => report("handoff", e),
            }
        }
        if wanted("fair") {
            match fair::run(&cfg, &url).await {
                Ok(x) => {
                    r.fair_rtts = Some(x.handoff_rtts);
                    r.fair_attempts = Some(x.attempts_per_release);
                    r.fair_violations = Some(x.violations as f64);
                }
                Err(e) => report("fair", e),
            }
        }
        if wanted("watchdog") {
            if let Err(e) = watchdog::run(&cfg, &url, pid).await {
                report("watchdog", e);
            }
        }
        if wanted("held") {
            match held::run(&cfg, &url).await {
                Ok(x) => r.held_100k = Some(x),
                Err(e) => report("held", e),
            }
        }
        if wanted("list") {
            match list::run(&cfg, &url).await {
                Ok(x) => r.list_100k_ping = Some(x),
                Err(e) => report("list", e),
            }
        }
        if let (Some(urls), true) = (&set_urls, wanted("redlock5")) {
            match redlock5::run(&cfg, urls, &set_pids).await {
                Ok(x) => {
                    r.redlock5_vs_single = Some(x.vs_single);
                    r.redlock5_vs_floor = Some(x.vs_floor);
                }
                Err(e) => report("redlock5", e),
            }
        }
        // After redlock5: it freezes one of the set's servers for a while.
        if let (Some(urls), true) = (&set_urls, wanted("frozen")) {
            match frozen::run(&cfg, urls, &set_pids).await {
                Ok(x) => r.frozen_node = Some(x),
                Err(e) => report("frozen", e),
            }
        }
        if wanted("macro") {
            match macro_guard::run(&cfg, &url).await {
                Ok(x) => r.macro_vs_guard = Some(x),
                Err(e) => report("macro", e),
            }
        }
        println!("\nfinished in {:.1} s", started.elapsed().as_secs_f64());
        println!("{}", r.line());
        failed
    });
    rt.shutdown_timeout(Duration::from_secs(2));
    drop(set);
    drop(server);
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

#[derive(Default)]
struct Ratios {
    uncontended: Option<f64>,
    uncontended_rslock: Option<f64>,
    distinct64: Option<f64>,
    distinct64_rslock: Option<f64>,
    distance: Option<f64>,
    distance_rslock: Option<f64>,
    acquire_vs_set: Option<f64>,
    release_vs_cad: Option<f64>,
    handoff_vs_poll: Option<f64>,
    handoff_vs_rslock: Option<f64>,
    handoff_vs_rtt: Option<f64>,
    fifo: Option<f64>,
    fair_rtts: Option<f64>,
    fair_attempts: Option<f64>,
    fair_violations: Option<f64>,
    redlock5_vs_single: Option<f64>,
    redlock5_vs_floor: Option<f64>,
    frozen_node: Option<f64>,
    macro_vs_guard: Option<f64>,
    held_100k: Option<f64>,
    list_100k_ping: Option<f64>,
}

impl Ratios {
    fn line(&self) -> String {
        let f = |x: Option<f64>, digits: usize| match x {
            Some(x) if x.is_finite() => format!("{x:.digits$}"),
            _ => "n/a".into(),
        };
        format!(
            "ratios: uncontended={} uncontended_rslock={} distinct64={} distinct64_rslock={} distance={} distance_rslock={} acquire_vs_set={} release_vs_cad={} handoff_vs_poll={} handoff_vs_rslock={} handoff_vs_rtt={} fifo={} fair_rtts={} fair_attempts={} fair_violations={} redlock5_vs_single={} redlock5_vs_floor={} frozen_node={} macro_vs_guard={} held_100k={} list_100k_ping={}",
            f(self.uncontended, 2),
            f(self.uncontended_rslock, 2),
            f(self.distinct64, 2),
            f(self.distinct64_rslock, 2),
            f(self.distance, 2),
            f(self.distance_rslock, 2),
            f(self.acquire_vs_set, 2),
            f(self.release_vs_cad, 2),
            f(self.handoff_vs_poll, 1),
            f(self.handoff_vs_rslock, 1),
            f(self.handoff_vs_rtt, 2),
            f(self.fifo, 3),
            f(self.fair_rtts, 2),
            f(self.fair_attempts, 2),
            f(self.fair_violations, 0),
            f(self.redlock5_vs_single, 2),
            f(self.redlock5_vs_floor, 2),
            f(self.frozen_node, 2),
            f(self.macro_vs_guard, 3),
            f(self.held_100k, 2),
            f(self.list_100k_ping, 2),
        )
    }
}
