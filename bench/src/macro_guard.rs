//! `#[distributed_lock]` against the same critical section written with a hand-held
//! guard: 1 task, lock + empty body + release, many short interleaved slices.

use std::time::{Duration, Instant};

use redlock::{LockError, LockManager};

use crate::raw::{err, Res};
use crate::stats::{fixed, paired, with_spread, Runs, Table};
use crate::Config;

// ---------------------------------------------------------------------------------------
// MACRO HOOK: the annotated function. Keys of both sides have the same length.
#[redlock::distributed_lock(key = "m_<id>", manager = locks)]
async fn with_macro(locks: &LockManager, id: u32) -> Result<(), LockError> {
    std::hint::black_box(id);
    Ok(())
}
// ---------------------------------------------------------------------------------------

async fn with_guard(locks: &LockManager, id: u32) -> Result<(), LockError> {
    let guard = locks.lock(&format!("g_{{{id}}}")).await?;
    std::hint::black_box(id);
    guard.release().await
}

async fn slice(locks: &LockManager, use_macro: bool, dur: Duration) -> Res<f64> {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < dur {
        if use_macro {
            with_macro(locks, 7).await.map_err(err)?;
        } else {
            with_guard(locks, 7).await.map_err(err)?;
        }
        n += 1;
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// Per backend: µs/op for (guard, macro).
async fn measure(cfg: &Config, locks: &LockManager) -> Res<(Runs, Runs)> {
    let (mut guard, mut mac) = (Runs::default(), Runs::default());
    slice(locks, false, cfg.warmup).await?;
    slice(locks, true, cfg.warmup).await?;
    for s in 0..cfg.macro_slices {
        // Alternate which side goes first.
        for use_macro in [s % 2 == 0, s % 2 == 1] {
            let x = slice(locks, use_macro, cfg.macro_slice).await?;
            if use_macro {
                mac.push(x);
            } else {
                guard.push(x);
            }
        }
    }
    Ok((guard, mac))
}

/// Prints the table; returns the macro's cost ÷ the guard's on Redis, with the macro's
/// extra work taken from the in-memory backend (see the note it prints).
pub async fn run(cfg: &Config, url: &str) -> Res<f64> {
    let mut t = Table::new(
        format!(
            "#[distributed_lock] vs a hand-held guard: lock + empty body + release, 1 task ({} interleaved pairs of slices × {:.2} s, median ±half-range)",
            cfg.macro_slices,
            cfg.macro_slice.as_secs_f64()
        ),
        &["backend", "guard µs/op", "macro µs/op", "macro ÷ guard"],
    );
    let redis = LockManager::connect(url).await.map_err(err)?;
    let memory = LockManager::builder()
        .in_memory()
        .build()
        .await
        .map_err(err)?;
    let mut guard_us = [f64::NAN; 2];
    let mut extra_us = [f64::NAN; 2];
    for (i, (name, locks)) in [("redis (single)", &redis), ("in-memory", &memory)]
        .into_iter()
        .enumerate()
    {
        match measure(cfg, locks).await {
            Ok((g, m)) => {
                // Slices of a pair ran back to back: the median of their ratios.
                let x = paired(&m, &g);
                guard_us[i] = g.median();
                extra_us[i] = m.median() - g.median();
                t.row(vec![
                    name.into(),
                    with_spread(&g, fixed(2)),
                    with_spread(&m, fixed(2)),
                    with_spread(&x, fixed(3)),
                ]);
            }
            Err(e) => t.na(name, &e),
        }
    }
    // What the macro adds is client work only (the key string, a task-local scope, a
    // select on the lock-lost signal), the same on every backend. On the in-memory
    // backend a call costs a microsecond or two and that work is measurable; against a
    // Redis lock+release it is far below the run-to-run noise of a loopback round trip.
    let ratio = 1.0 + extra_us[1] / guard_us[0];
    t.note("macro ÷ guard: median over pairs of back-to-back slices of the macro's µs/op ÷ the guard's");
    t.note(format!(
        "the macro's own work, measured in memory: {:+.2} µs per call = {:+.2}% of a Redis lock+release here (macro_vs_guard = {ratio:.3})",
        extra_us[1],
        extra_us[1] / guard_us[0] * 100.0
    ));
    t.note("macro: key template \"m_<id>\", defaults (watchdog on, on_lost = \"abort\"); guard: lock(&format!(\"g_{{{id}}}\")) + release()");
    t.print();
    Ok(ratio)
}
