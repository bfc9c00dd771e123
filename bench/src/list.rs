//! `LockManager::list` over 100 000 held locks (issue 16): how long the listing takes, and
//! that Redis keeps answering meanwhile (`SCAN ... COUNT 1000`, never `KEYS`).
//!
//! One manager holds the locks (300 s ttl: no renewal during the measurement); another
//! lists them, as the `redlock list` command does. A third connection sends `PING`s
//! one after another the whole time; their latency while listing is set against the
//! same `PING` loop on the idle server, and against a single `KEYS` of the same keys
//! (what listing must not do: it blocks the server for the whole keyspace).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock::{LockGuard, LockManager};
use tokio::task::JoinSet;

use crate::raw::{err, Res};
use crate::stats::{quantile, us, Table};
use crate::Config;

const LOCKS: usize = 100_000;
const TAKERS: usize = 64;
const HELD_TTL: Duration = Duration::from_secs(300);

/// `PING` latencies on a connection of its own until `stop` is set.
async fn pings(url: String, stop: Arc<AtomicBool>) -> Res<Vec<Duration>> {
    let client = redis::Client::open(url).map_err(err)?;
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .map_err(err)?;
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) && out.len() < 10_000_000 {
        let t = Instant::now();
        redis::cmd("PING")
            .query_async::<()>(&mut con)
            .await
            .map_err(err)?;
        out.push(t.elapsed());
    }
    Ok(out)
}

/// Runs `work` with the `PING` loop beside it: its result, how long it took, and the
/// sorted latencies.
async fn with_pings<T>(
    url: &str,
    work: impl std::future::Future<Output = Res<T>>,
) -> Res<(T, Duration, Vec<Duration>)> {
    let stop = Arc::new(AtomicBool::new(false));
    let pinger = tokio::spawn(pings(url.to_owned(), stop.clone()));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let t = Instant::now();
    let out = work.await;
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut lat = pinger.await.map_err(err)??;
    lat.sort();
    Ok((out?, took, lat))
}

async fn take(m: &LockManager) -> Res<Vec<LockGuard>> {
    let mut set = JoinSet::new();
    for a in 0..TAKERS {
        let m = m.clone();
        set.spawn(async move {
            let mut held = Vec::new();
            for i in (a..LOCKS).step_by(TAKERS) {
                held.push(m.lock(&format!("list_{{{i}}}")).await.map_err(err)?);
            }
            Ok::<_, String>(held)
        });
    }
    let mut guards = Vec::with_capacity(LOCKS);
    while let Some(r) = set.join_next().await {
        guards.extend(r.map_err(err)??);
    }
    Ok(guards)
}

/// Prints the table; returns the `PING` p99 while listing ÷ idle.
pub async fn run(cfg: &Config, url: &str) -> Res<f64> {
    let holder = LockManager::builder()
        .single(url)
        .default_ttl(HELD_TTL)
        .build()
        .await
        .map_err(err)?;
    let lister = LockManager::builder()
        .single(url)
        .build()
        .await
        .map_err(err)?;
    let guards = take(&holder).await?;
    let idle = with_pings(url, async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok(())
    })
    .await?
    .2;
    let runs = if cfg.quick { 2 } else { 5 };
    let mut listings = Vec::new();
    for _ in 0..runs {
        let (found, took, lat) =
            with_pings(url, async { lister.list("list_*").await.map_err(err) }).await?;
        if found.len() != LOCKS {
            return Err(format!("listed {} of {LOCKS} locks", found.len()));
        }
        listings.push((took, lat));
    }
    let keys = with_pings(url, async {
        let client = redis::Client::open(url).map_err(err)?;
        let mut con = client
            .get_multiplexed_async_connection()
            .await
            .map_err(err)?;
        let names: Vec<String> = redis::cmd("KEYS")
            .arg("lock:list_*")
            .query_async(&mut con)
            .await
            .map_err(err)?;
        Ok(names.len())
    })
    .await?;
    if keys.0 != LOCKS {
        return Err(format!("KEYS found {} of {LOCKS}", keys.0));
    }
    drop(guards);

    let mut t = Table::new(
        format!("list: {LOCKS} held locks, single Redis, {runs} listings"),
        &[
            "while",
            "took",
            "PING p50 µs",
            "PING p99 µs",
            "PING max µs",
            "PINGs",
        ],
    );
    let row = |t: &mut Table, name: &str, took: Option<Duration>, lat: &[Duration]| {
        t.row(vec![
            name.to_owned(),
            took.map_or_else(|| "-".to_owned(), |d| format!("{:.2} s", d.as_secs_f64())),
            format!("{:.0}", us(quantile(lat, 0.5))),
            format!("{:.0}", us(quantile(lat, 0.99))),
            format!("{:.0}", us(lat.last().copied().unwrap_or_default())),
            lat.len().to_string(),
        ]);
    };
    row(&mut t, "idle (500 ms)", None, &idle);
    for (took, lat) in &listings {
        row(&mut t, "redlock list (SCAN COUNT 1000)", Some(*took), lat);
    }
    row(&mut t, "one KEYS (for contrast)", Some(keys.1), &keys.2);
    t.note("PING latency from a third connection, one PING after another; 'max' while listing is what the longest single SCAN step or inspect burst cost other clients");
    t.print();
    let p99 = |lat: &[Duration]| us(quantile(lat, 0.99)).max(1.0);
    let worst = listings.iter().map(|(_, lat)| p99(lat)).fold(0.0, f64::max);
    Ok(worst / p99(&idle))
}
