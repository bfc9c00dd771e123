//! Redlock with one node frozen (SIGSTOP, like a long GC pause) against the same managers
//! healthy, 3 and 5 masters: lock+release latency, 1 task, in the same run.

use std::time::{Duration, Instant};

use redlock::LockManager;

use crate::raw::{err, Res};
use crate::stats::{fixed, quantile, us, Table};
use crate::Config;

/// `n` sequential lock+release latencies on `key`, sorted.
async fn samples(locks: &LockManager, key: &str, n: usize) -> Res<Vec<Duration>> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let guard = locks.lock(key).await.map_err(err)?;
        guard.release().await.map_err(err)?;
        v.push(t.elapsed());
    }
    v.sort();
    Ok(v)
}

/// Sends `signal` (`STOP`, `CONT`) to a server process.
fn signal(pid: u32, signal: &str) -> Res<()> {
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .map_err(err)?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -{signal} {pid}: {status}"))
    }
}

/// Prints the table; returns the larger of frozen p50 ÷ healthy p50 over 3 and 5 masters.
/// `urls`/`pids`: a set of at least 5 servers; the first one is the one frozen.
pub async fn run(cfg: &Config, urls: &[String], pids: &[u32]) -> Res<f64> {
    let sizes = [3usize, 5];
    let mut managers = Vec::new();
    for &n in &sizes {
        let nodes = urls.get(..n).ok_or("the frozen scenario needs 5 servers")?;
        managers.push(
            LockManager::builder()
                .redlock(nodes)
                .build()
                .await
                .map_err(err)?,
        );
    }
    let n = if cfg.quick { 300 } else { 1000 };
    let key = |m: usize| format!("frozen_{{{m}}}");
    // Warm-up (scripts cached, connections hot), then healthy and frozen, interleaved by
    // size so that both phases see the same machine.
    for (m, locks) in sizes.iter().zip(&managers) {
        samples(locks, &key(*m), n / 5).await?;
    }
    let mut healthy = Vec::new();
    for (m, locks) in sizes.iter().zip(&managers) {
        healthy.push(samples(locks, &key(*m), n).await?);
    }
    let frozen_pid = *pids.first().ok_or("no server pid")?;
    signal(frozen_pid, "STOP")?;
    let mut frozen = Vec::new();
    for (m, locks) in sizes.iter().zip(&managers) {
        frozen.push(samples(locks, &key(*m), n).await);
    }
    signal(frozen_pid, "CONT")?;
    let mut t = Table::new(
        format!("Redlock with one master frozen (SIGSTOP): lock+release, 1 task, {n} sequential samples each"),
        &["masters", "healthy p50 µs", "frozen p50 µs", "frozen p99 µs", "frozen ÷ healthy (p50)"],
    );
    let mut worst = f64::NAN;
    for ((m, h), f) in sizes.iter().zip(&healthy).zip(frozen) {
        match f {
            Ok(f) => {
                let ratio = us(quantile(&f, 0.5)) / us(quantile(h, 0.5));
                worst = if worst.is_nan() {
                    ratio
                } else {
                    worst.max(ratio)
                };
                t.row(vec![
                    format!("Redlock-{m}"),
                    fixed(1)(us(quantile(h, 0.5))),
                    fixed(1)(us(quantile(&f, 0.5))),
                    fixed(1)(us(quantile(&f, 0.99))),
                    fixed(2)(ratio),
                ]);
            }
            Err(e) => t.na(&format!("Redlock-{m}"), &e),
        }
    }
    t.note("frozen: the first master SIGSTOPped for the whole phase (default per-node timeout 200 ms); frozen_node = the larger ratio");
    t.print();
    // Let the resumed server work off its backlog before anything else runs.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(worst)
}
