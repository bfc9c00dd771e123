//! Uncontended lock + release: 1 task on one key, and 64 tasks on distinct keys.

use std::sync::Arc;

use redlock::LockManager;

use crate::lockers::{closed_loop, Locker, ARL, RSLOCK};
use crate::raw::{err, Raw, Res};
use crate::stats::{fixed, group, paired, with_spread, Runs, Table};
use crate::Config;

/// The named implementations, connected to `url`.
pub async fn contenders(url: &str) -> Res<Vec<(String, Arc<Locker>)>> {
    let mut v = vec![
        (
            "raw redis-rs".to_owned(),
            Locker::Raw(Raw::connect(url).await?),
        ),
        (
            "redlock".to_owned(),
            Locker::Redlock(LockManager::connect(url).await.map_err(err)?),
        ),
    ];
    v.push((
        RSLOCK.to_owned(),
        Locker::Rslock(rslock::LockManager::new(vec![url])),
    ));
    v.push((
        ARL.to_owned(),
        Locker::Arl(
            async_redis_lock::Locker::from_redis_url(url)
                .await
                .map_err(err)?,
        ),
    ));
    v.push((
        "redlock in-memory".to_owned(),
        Locker::Redlock(
            LockManager::builder()
                .in_memory()
                .build()
                .await
                .map_err(err)?,
        ),
    ));
    // For profiling one implementation alone: BENCH_ONLY=redlock (names, comma-separated;
    // the raw baseline always runs).
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    Ok(v.into_iter()
        .filter(|(n, _)| only.is_empty() || n == "raw redis-rs" || only.split(',').any(|o| o == n))
        .map(|(n, l)| (n, Arc::new(l)))
        .collect())
}

/// Throughput and CPU cost per operation of one implementation, one value per run.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    pub ops: Runs,
    pub client_us: Runs,
    pub server_us: Runs,
}

/// Slices each run is cut into: the implementations take turns slice by slice, so the
/// figures of one run all come from the same stretch of time on this shared machine.
const SLICES: u32 = 10;

/// Warms every implementation up, then measures `runs` runs; within a run the
/// implementations take turns in `SLICES` short slices (the order rotating), and each
/// figure of the run is the total over its slices.
pub async fn measure(
    cfg: &Config,
    impls: &[(String, Arc<Locker>)],
    tag: &str,
    tasks: usize,
    servers: &[u32],
) -> Vec<Result<Measured, String>> {
    let mut out: Vec<Result<Measured, String>> = vec![Ok(Measured::default()); impls.len()];
    for (i, (_, l)) in impls.iter().enumerate() {
        if let Err(e) = closed_loop(l, tag, tasks, cfg.warmup, servers).await {
            out[i] = Err(e);
        }
    }
    let slice = cfg.dur / SLICES;
    let mut turn = 0;
    for _ in 0..cfg.runs {
        // Per implementation: operations, seconds, client and server CPU µs.
        let mut acc = vec![(0.0f64, 0.0f64, 0.0f64, 0.0f64); impls.len()];
        for _ in 0..SLICES {
            turn += 1;
            for k in 0..impls.len() {
                let i = (k + turn) % impls.len();
                if out[i].is_err() {
                    continue;
                }
                match closed_loop(&impls[i].1, tag, tasks, slice, servers).await {
                    Ok(x) => {
                        let ops = x.ops as f64;
                        acc[i].0 += ops;
                        acc[i].1 += x.secs;
                        acc[i].2 += x.client_us_per_op * ops;
                        acc[i].3 += x.server_us_per_op * ops;
                    }
                    Err(e) => out[i] = Err(e),
                }
            }
        }
        for (o, (ops, secs, client, server)) in out.iter_mut().zip(acc) {
            if let Ok(m) = o {
                m.ops.push(ops / secs);
                m.client_us.push(client / ops);
                m.server_us.push(server / ops);
            }
        }
    }
    out
}

/// The medians of ops/s ÷ raw's: redlock's and rslock's (NaN when one did not run).
pub struct VsRaw {
    pub redlock: f64,
    pub rslock: f64,
}

/// Prints the table; returns redlock's and rslock's ops/s ÷ raw's.
pub async fn run(cfg: &Config, url: &str, pid: u32, tasks: usize) -> Res<VsRaw> {
    let title = if tasks == 1 {
        "uncontended lock+release, 1 task".to_owned()
    } else {
        format!(
            "uncontended lock+release, {tasks} tasks on distinct keys, one connection each impl"
        )
    };
    compare(cfg, url, pid, tasks, &title).await
}

/// Measures every implementation connected to `url` (the server's process `pid`) with
/// `tasks` tasks on distinct keys, prints the table under `title`; returns redlock's and
/// rslock's ops/s ÷ raw's.
pub async fn compare(cfg: &Config, url: &str, pid: u32, tasks: usize, title: &str) -> Res<VsRaw> {
    let impls = contenders(url).await?;
    let tag = if tasks == 1 { "u" } else { "d" };
    let results = measure(cfg, &impls, tag, tasks, &[pid]).await;
    let raw = results[0].as_ref().map_err(Clone::clone)?.ops.clone();
    let mut t = Table::new(
        format!(
            "{title} ({} runs × {:.2} s, median ±half-range)",
            cfg.runs,
            cfg.dur.as_secs_f64()
        ),
        &[
            "implementation",
            "ops/s",
            "µs/op",
            "client CPU µs/op",
            "server CPU µs/op",
            "÷ raw",
        ],
    );
    let mut ratio = VsRaw {
        redlock: f64::NAN,
        rslock: f64::NAN,
    };
    for ((name, _), r) in impls.iter().zip(&results) {
        match r {
            Ok(m) => {
                let x = paired(&m.ops, &raw);
                if name == "redlock" {
                    ratio.redlock = x.median();
                } else if name == RSLOCK {
                    ratio.rslock = x.median();
                }
                t.row(vec![
                    name.clone(),
                    with_spread(&m.ops, group),
                    fixed(1)(1e6 / m.ops.median() * tasks as f64),
                    fixed(1)(m.client_us.median()),
                    fixed(1)(m.server_us.median()),
                    with_spread(&x, fixed(2)),
                ]);
            }
            Err(e) => t.na(name, e),
        }
    }
    let ops = |wanted: &str| {
        let found = impls.iter().zip(&results).find(|((n, _), _)| n == wanted);
        found.and_then(|(_, r)| r.as_ref().ok()).map(|m| &m.ops)
    };
    if let (Some(ours), Some(theirs)) = (ops("redlock"), ops(RSLOCK)) {
        // Both measured in the same slices: their own ratio is steadier than two ratios
        // to raw, which each carry raw's noise too.
        let vs = paired(ours, theirs);
        t.note(format!(
            "redlock ÷ {RSLOCK}, run by run: median {:.3} ±{:.1}%, redlock ahead in {} of {} runs",
            vs.median(),
            vs.spread() * 100.0,
            vs.above(1.0),
            vs.0.len()
        ));
    }
    t.note("÷ raw: median (±half-range) over runs of ops/s ÷ the same run's raw redis-rs (SET NX PX + EVALSHA compare-and-delete, one multiplexed connection, TCP_NODELAY)");
    t.note("redlock: LockManager::lock + LockGuard::release (default options: 30 s ttl, watchdog on); in-memory: no network, for scale");
    t.note("CPU µs/op: user+system time of this process / of redis-server over the run ÷ operations (lock+release pairs)");
    if tasks > 1 {
        t.note("µs/op: per task (latency of one lock+release under this load)");
    }
    t.print();
    Ok(ratio)
}
