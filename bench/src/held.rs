//! Lock + drop while many other locks are held: what one operation costs as the number
//! of locks held by the same manager grows. The watchdog files every held lock; taking,
//! dropping and renewing a lock must not cost more because others are held.
//!
//! One manager on one Redis server. The held locks have a 300 s ttl, so no renewal falls
//! inside the measurement; the operation is `drop(lock(key))` (the release goes to the
//! manager's background task, which the drop wakes), one task, cycling over 10 000 keys.
//! Levels are measured in the order 0, 10 000, 100 000, then 0 again after every held
//! lock is released; the baseline is the median of all the runs with none held.

use std::time::{Duration, Instant};

use redlock::{LockGuard, LockManager};
use tokio::task::JoinSet;

use crate::raw::{err, Res};
use crate::stats::{fixed, group, with_spread, Runs, Table};
use crate::Config;

const HELD_TTL: Duration = Duration::from_secs(300);
const LEVELS: [usize; 3] = [0, 10_000, 100_000];
const KEYS: usize = 10_000;
const ACQUIRERS: usize = 64;

/// µs per lock + drop, one value per run.
async fn measure(cfg: &Config, m: &LockManager, runs: &mut Runs) -> Res<()> {
    let mut i = 0usize;
    let warm = Instant::now();
    while warm.elapsed() < cfg.warmup / 4 {
        drop(
            m.lock(&format!("held_op_{{{}}}", i % KEYS))
                .await
                .map_err(err)?,
        );
        i += 1;
    }
    for _ in 0..cfg.runs {
        let (start, mut ops) = (Instant::now(), 0u32);
        while start.elapsed() < cfg.dur {
            drop(
                m.lock(&format!("held_op_{{{}}}", i % KEYS))
                    .await
                    .map_err(err)?,
            );
            i += 1;
            ops += 1;
        }
        runs.push(start.elapsed().as_secs_f64() * 1e6 / f64::from(ops.max(1)));
    }
    Ok(())
}

/// Takes `n` more locks (numbered from `from`), 64 tasks at once.
async fn take(m: &LockManager, from: usize, n: usize) -> Res<Vec<LockGuard>> {
    let mut set = JoinSet::new();
    for a in 0..ACQUIRERS {
        let m = m.clone();
        set.spawn(async move {
            let mut held = Vec::new();
            for i in (from + a..from + n).step_by(ACQUIRERS) {
                held.push(m.lock(&format!("held_{{{i}}}")).await.map_err(err)?);
            }
            Ok::<_, String>(held)
        });
    }
    let mut guards = Vec::with_capacity(n);
    while let Some(r) = set.join_next().await {
        guards.extend(r.map_err(err)??);
    }
    Ok(guards)
}

/// Releases every guard, 64 tasks at once, each release awaited.
async fn release(guards: Vec<LockGuard>) -> Res<()> {
    let mut chunks: Vec<Vec<LockGuard>> = (0..ACQUIRERS).map(|_| Vec::new()).collect();
    for (i, g) in guards.into_iter().enumerate() {
        chunks[i % ACQUIRERS].push(g);
    }
    let mut set = JoinSet::new();
    for chunk in chunks {
        set.spawn(async move {
            for g in chunk {
                g.release().await.map_err(err)?;
            }
            Ok::<(), String>(())
        });
    }
    while let Some(r) = set.join_next().await {
        r.map_err(err)??;
    }
    Ok(())
}

/// Prints the table; returns µs per lock + drop with 100 000 held ÷ with none.
pub async fn run(cfg: &Config, url: &str) -> Res<f64> {
    let m = LockManager::builder()
        .single(url)
        .default_ttl(HELD_TTL)
        .build()
        .await
        .map_err(err)?;
    let mut none = Runs::default();
    let mut levels: Vec<(usize, Runs)> = Vec::new();
    let mut guards: Vec<LockGuard> = Vec::new();
    for n in LEVELS {
        let more = take(&m, guards.len(), n - guards.len()).await?;
        guards.extend(more);
        if m.watched_locks() < n {
            return Err(format!("{} locks watched, {n} expected", m.watched_locks()));
        }
        let mut runs = Runs::default();
        measure(cfg, &m, &mut runs).await?;
        levels.push((n, runs));
    }
    let held = guards.iter().filter(|g| g.is_held()).count();
    if held != guards.len() {
        return Err(format!("only {held} of {} locks still held", guards.len()));
    }
    release(guards).await?;
    measure(cfg, &m, &mut none).await?;
    for (n, runs) in &levels {
        if *n == 0 {
            none.0.extend(runs.0.iter().copied());
        }
    }
    let base = none.median();
    let mut t = Table::new(
        format!(
            "lock + drop while other locks are held (one manager, single Redis, held ttl {} s, {} runs per level)",
            HELD_TTL.as_secs(),
            cfg.runs
        ),
        &["locks held", "µs per lock + drop", "÷ none held"],
    );
    let mut top = f64::NAN;
    for (n, runs) in &levels {
        let ratio = if *n == 0 { 1.0 } else { runs.median() / base };
        if *n == 100_000 {
            top = ratio;
        }
        t.row(vec![
            group(*n as f64),
            if *n == 0 {
                with_spread(&none, fixed(1))
            } else {
                with_spread(runs, fixed(1))
            },
            format!("{ratio:.2}"),
        ]);
    }
    t.note("none held: the runs before taking any lock and after releasing them all, together");
    t.note("target: ≤ 1.5 with 100 000 held (issue 12: 52 µs with none, 1.5 ms with 20 000, 6 ms with 60 000 before the watchdog's schedule)");
    t.print();
    Ok(top)
}
