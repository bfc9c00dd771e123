//! The watchdog with many held locks: what keeping them alive costs per renewal tick.
//!
//! Locks are taken with a 3 s ttl (renewal every ttl/3 = 1 s, so a run is short; the
//! default 30 s ttl renews ten times less often for the same cost per tick). Figures come
//! from the server (`INFO commandstats` deltas, /proc CPU time of redis-server) and from
//! getrusage for this process, over a window of whole ticks.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redlock::{LockGuard, LockManager, LockOptions};
use redlock_testkit::RedisServer;
use tokio::task::JoinSet;

use crate::cpu::{commandstats, delta, proc_cpu, self_cpu};
use crate::lockers::ARL;
use crate::raw::{connect, err, Res};
use crate::stats::{group, Table};
use crate::Config;

const TTL: Duration = Duration::from_secs(3);
const TICK: Duration = Duration::from_secs(1);
const ACQUIRERS: usize = 64;

struct Window {
    cmds: HashMap<String, u64>,
    client_cpu: f64,
    server_cpu: f64,
    ticks: f64,
}

async fn window(probe: &mut MultiplexedConnection, pid: u32, ticks: u32) -> Res<Window> {
    let s0 = commandstats(probe).await?;
    let (c0, p0, t0) = (self_cpu(), proc_cpu(pid), Instant::now());
    tokio::time::sleep(TICK * ticks).await;
    let s1 = commandstats(probe).await?;
    let (c1, p1, wall) = (self_cpu(), proc_cpu(pid), t0.elapsed().as_secs_f64());
    Ok(Window {
        cmds: delta(&s0, &s1),
        client_cpu: (c1 - c0).as_secs_f64() / wall,
        server_cpu: (p1 - p0).as_secs_f64() / wall,
        ticks: wall / TICK.as_secs_f64(),
    })
}

/// Waits for the first renewal after the locks were taken (the first commands the server
/// sees from an otherwise idle client), then for half a tick, so the window of whole ticks
/// starts between two renewals.
async fn align_to_ticks(probe: &mut MultiplexedConnection) -> Res<()> {
    let base = commandstats(probe).await?;
    let deadline = Instant::now() + TTL;
    loop {
        let now = commandstats(probe).await?;
        if delta(&base, &now).values().sum::<u64>() > 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err("no renewal seen within one ttl".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(TICK / 2).await;
    Ok(())
}

/// `n` locks held by one manager (taken with `min_replicas(replicas)` when not 0), over
/// `ticks` renewal ticks.
async fn redlock_row(url: &str, pid: u32, n: usize, ticks: u32, replicas: u32) -> Res<Window> {
    let m = LockManager::builder()
        .single(url)
        .default_ttl(TTL)
        .build()
        .await
        .map_err(err)?;
    let mut set = JoinSet::new();
    for a in 0..ACQUIRERS {
        let m = m.clone();
        set.spawn(async move {
            let mut held: Vec<LockGuard> = Vec::new();
            let opts = LockOptions::new().min_replicas(replicas);
            for i in (a..n).step_by(ACQUIRERS) {
                let key = format!("wd{n}r{replicas}_{{{i}}}");
                held.push(m.lock_with(&key, opts.clone()).await.map_err(err)?);
            }
            Ok::<_, String>(held)
        });
    }
    let mut guards = Vec::with_capacity(n);
    while let Some(r) = set.join_next().await {
        guards.extend(r.map_err(err)??);
    }
    let mut probe = connect(url).await?;
    align_to_ticks(&mut probe).await?;
    let w = window(&mut probe, pid, ticks).await?;
    let held = guards.iter().filter(|g| g.is_held()).count();
    if held != n || m.watched_locks() != n {
        return Err(format!(
            "only {held} of {n} locks still held after the window"
        ));
    }
    release_all(guards, |g| async move { g.release().await.map_err(err) }).await?;
    Ok(w)
}

/// [`redlock_row`] with `min_replicas(1)`, a replica attached to the server for the row
/// (stopped after it).
async fn replicated_row(url: &str, pid: u32, n: usize, ticks: u32) -> Res<Window> {
    let port = url
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse::<u16>().ok())
        .ok_or_else(|| format!("no port in {url}"))?;
    let _replica = RedisServer::builder().replica_of(port).start();
    let mut probe = connect(url).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    // Attached once a write of this connection is acknowledged (a `WAIT` after no write
    // counts a replica still in its initial sync).
    loop {
        let (acked,): (u32,) = redis::pipe()
            .cmd("SET")
            .arg("bench:replica-probe")
            .arg(1)
            .ignore()
            .cmd("WAIT")
            .arg(1)
            .arg(100)
            .query_async(&mut probe)
            .await
            .map_err(err)?;
        if acked >= 1 {
            break;
        }
        if Instant::now() > deadline {
            return Err("the replica did not attach within 10 s".into());
        }
    }
    redlock_row(url, pid, n, ticks, 1).await
}

async fn arl_row(url: &str, pid: u32, n: usize, ticks: u32) -> Res<Window> {
    let locker = async_redis_lock::Locker::from_redis_url(url)
        .await
        .map_err(err)?;
    let opts = async_redis_lock::Options::new()
        .ttl(TTL)
        .extend(TTL / 3)
        .timeout(None);
    let mut set = JoinSet::new();
    for a in 0..ACQUIRERS {
        let (l, opts) = (locker.clone(), opts.clone());
        set.spawn(async move {
            let mut held = Vec::new();
            for i in (a..n).step_by(ACQUIRERS) {
                held.push(
                    l.acquire_with_options(&opts, format!("arl:wd{n}_{{{i}}}"))
                        .await
                        .map_err(err)?,
                );
            }
            Ok::<_, String>(held)
        });
    }
    let mut locks = Vec::with_capacity(n);
    while let Some(r) = set.join_next().await {
        locks.extend(r.map_err(err)??);
    }
    // Its renewals are one timer task per lock, not aligned: let them settle, then measure.
    tokio::time::sleep(TICK + TICK / 2).await;
    let mut probe = connect(url).await?;
    let w = window(&mut probe, pid, ticks).await?;
    let lost = locks.iter().filter(|l| l.is_lost()).count();
    if lost > 0 {
        return Err(format!("{lost} of {n} locks lost during the window"));
    }
    release_all(locks, |l| async move { l.release().await.map_err(err) }).await?;
    Ok(w)
}

async fn release_all<T, F, Fut>(items: Vec<T>, f: F) -> Res<()>
where
    T: Send + 'static,
    F: Fn(T) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Res<()>> + Send,
{
    let f = Arc::new(f);
    let mut chunks: Vec<Vec<T>> = (0..ACQUIRERS).map(|_| Vec::new()).collect();
    for (i, x) in items.into_iter().enumerate() {
        chunks[i % ACQUIRERS].push(x);
    }
    let mut set = JoinSet::new();
    for chunk in chunks {
        let f = f.clone();
        set.spawn(async move {
            for x in chunk {
                f(x).await?;
            }
            Ok::<(), String>(())
        });
    }
    while let Some(r) = set.join_next().await {
        r.map_err(err)??;
    }
    Ok(())
}

fn per_tick(w: &Window, names: &[&str]) -> f64 {
    names
        .iter()
        .map(|n| w.cmds.get(*n).copied().unwrap_or(0))
        .sum::<u64>() as f64
        / w.ticks
}

/// Prints the table; returns redlock's round trips per tick with the most locks.
pub async fn run(cfg: &Config, url: &str, pid: u32) -> Res<f64> {
    let mut t = Table::new(
        format!(
            "watchdog: locks held with a {} s ttl, renewed every {} s ({} ticks measured per row)",
            TTL.as_secs(),
            TICK.as_secs(),
            cfg.watchdog_ticks
        ),
        &[
            "implementation",
            "locks",
            "round trips/tick",
            "requests/tick",
            "server commands/tick",
            "client CPU",
            "redis-server CPU",
            "server commands ÷ redlock's",
        ],
    );
    let mut ours = f64::NAN;
    let mut ours_cmds = f64::NAN;
    let mut rows: Vec<(String, usize, Res<Window>)> = Vec::new();
    for &n in &cfg.watchdog_locks {
        rows.push((
            "redlock".into(),
            n,
            redlock_row(url, pid, n, cfg.watchdog_ticks, 0).await,
        ));
    }
    let top = *cfg.watchdog_locks.iter().max().unwrap_or(&0);
    rows.push((
        "redlock min_replicas(1)".into(),
        top,
        replicated_row(url, pid, top, cfg.watchdog_ticks).await,
    ));
    rows.push((
        ARL.into(),
        top,
        arl_row(url, pid, top, cfg.watchdog_ticks).await,
    ));
    for (name, n, w) in &rows {
        match w {
            Ok(w) => {
                let cmds = w.cmds.values().sum::<u64>() as f64 / w.ticks;
                // Requests the client sent (script calls), as opposed to the commands
                // those scripts ran inside the server.
                let requests = per_tick(w, &["evalsha", "eval", "script|load"]);
                let trips = if name.starts_with("redlock") {
                    // Each renewal is one pipeline that opens with SCRIPT LOAD.
                    per_tick(w, &["script|load"])
                } else {
                    // Each lock's extension is its own request, awaited on its own.
                    requests
                };
                if name == "redlock" && *n == top {
                    ours = trips;
                    ours_cmds = cmds;
                }
                t.row(vec![
                    name.clone(),
                    group(*n as f64),
                    format!("{trips:.1}"),
                    format!("{requests:.1}"),
                    format!("{cmds:.0}"),
                    format!("{:.1}%", w.client_cpu * 100.0),
                    format!("{:.1}%", w.server_cpu * 100.0),
                    String::new(),
                ]);
            }
            Err(e) => t.na(name, e),
        }
    }
    // The ratio column, now that redlock's top row is known.
    for ((_, _, w), row) in rows.iter().zip(t.rows_mut()) {
        if let Ok(w) = w {
            let cmds = w.cmds.values().sum::<u64>() as f64 / w.ticks;
            row[7] = format!("{:.2}", cmds / ours_cmds);
        }
    }
    t.note("round trips/tick: redlock = renewal pipelines (SCRIPT LOAD + one EVALSHA per 1 000 locks, sent together); async-redis-lock = one EVALSHA request per lock");
    t.note("min_replicas(1): every renewal pipeline ends in one WAIT (on a connection of its own), whatever the number of locks; a replica attached for the row");
    t.note("requests/tick: EVAL/EVALSHA/SCRIPT LOAD calls; server commands/tick: all of INFO commandstats, the GET + PEXPIRE each script runs per lock included");
    t.note("CPU: % of one core over the window (this process: getrusage; redis-server: /proc/PID/stat)");
    t.note(format!(
        "{}: n/a: no automatic extension (manual extend only)",
        crate::lockers::RSLOCK
    ));
    t.print();
    Ok(ours)
}
