//! Contended hand-off: 16 tasks spread over 4 managers (4 processes' worth of connections)
//! take turns on one key in a tight loop (lock, release, lock again), each a fixed number
//! of times.
//!
//! Every acquisition is logged in the order the lock was held. The *hand-off latency* of a
//! release runs from the holder calling `release()` to the first later `lock().await` of
//! another task returning: how long the waiters go on waiting once the lock was released.
//! With FIFO hand-off that is simply the next acquisition; a polling waiter sleeps while
//! the releaser takes the lock straight back, so its waiters also wait out the rest of the
//! releaser's streak. (The instant `release().await` returns is no use as a start: the
//! releaser often learns of its own reply after the next holder already has the lock.)
//! `fifo` is the fraction of acquisitions that changed holder.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redlock::{LockGuard, LockManager, LockOptions};
use tokio::task::JoinSet;

use crate::lockers::{ARL, RSLOCK, TTL};
use crate::raw::{err, Raw, RawHeld, Res};
use crate::stats::{fixed, quantile, us, Runs, Table};
use crate::Config;

pub const MANAGERS: usize = 4;
pub const WAITERS: usize = 16;
/// The naive polling waiter's fixed sleep (the peers default to 100-200 ms).
pub const POLL: Duration = Duration::from_millis(10);
/// A run that takes longer is abandoned (rslock's `acquire` loops forever).
const RUN_CAP: Duration = Duration::from_secs(20);

enum Kind {
    Redlock(Vec<LockManager>),
    Poll(Vec<Raw>),
    Rslock(Vec<rslock::LockManager>),
    Arl(Vec<async_redis_lock::Locker>),
}

enum Held {
    Redlock(LockGuard),
    Raw(RawHeld),
    Rslock(rslock::LockGuard),
    Arl(Box<async_redis_lock::Lock>),
}

impl Kind {
    async fn acquire(&self, m: usize, key: &str) -> Res<Held> {
        Ok(match self {
            Self::Redlock(v) => Held::Redlock(
                v[m].lock_with(key, LockOptions::new().wait(Duration::from_secs(30)))
                    .await
                    .map_err(err)?,
            ),
            Self::Poll(v) => Held::Raw(v[m].lock_polling(key, TTL, POLL).await?),
            Self::Rslock(v) => Held::Rslock(v[m].acquire(key, TTL).await.map_err(err)?),
            Self::Arl(v) => Held::Arl(Box::new(
                v[m].acquire_with_options(&async_redis_lock::Options::new().timeout(None), key)
                    .await
                    .map_err(err)?,
            )),
        })
    }

    async fn release(&self, m: usize, held: Held) -> Res<()> {
        match (self, held) {
            (_, Held::Redlock(g)) => g.release().await.map_err(err),
            (Self::Poll(v), Held::Raw(h)) => v[m].release(h).await.map(drop),
            (_, Held::Rslock(g)) => {
                g.release().await;
                Ok(())
            }
            (_, Held::Arl(l)) => l.release().await.map_err(err),
            _ => Err("mismatched lock".into()),
        }
    }

    fn key(&self) -> &'static str {
        match self {
            Self::Redlock(_) => "handoff",
            Self::Poll(_) => "raw:handoff",
            Self::Rslock(_) => "rsl:handoff",
            Self::Arl(_) => "arl:handoff",
        }
    }
}

#[derive(Clone, Copy)]
struct Rec {
    holder: usize,
    acquired: Instant,
    release_call: Instant,
}

#[derive(Default)]
struct Figures {
    /// Every hand-off of every run, pooled: the percentiles come from these.
    all: Vec<Duration>,
    /// Per-run p50, for the spread.
    p50: Runs,
    handoffs_per_s: Runs,
    acq_per_s: Runs,
    fifo: Runs,
}

async fn one_run(kind: &Arc<Kind>, per_task: usize) -> Res<Vec<Rec>> {
    let log: Arc<Mutex<Vec<Rec>>> = Arc::new(Mutex::new(Vec::with_capacity(per_task * WAITERS)));
    let mut set = JoinSet::new();
    for me in 0..WAITERS {
        let (kind, log) = (kind.clone(), log.clone());
        set.spawn(async move {
            let m = me % MANAGERS;
            for _ in 0..per_task {
                let held = kind.acquire(m, kind.key()).await?;
                let acquired = Instant::now();
                let seq = {
                    let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
                    log.push(Rec {
                        holder: me,
                        acquired,
                        release_call: acquired,
                    });
                    log.len() - 1
                };
                let release_call = Instant::now();
                log.lock().unwrap_or_else(PoisonError::into_inner)[seq].release_call = release_call;
                kind.release(m, held).await?;
                // Let other tasks run before asking again (the in-memory backend never
                // yields by itself).
                tokio::task::yield_now().await;
            }
            Ok::<(), String>(())
        });
    }
    join_within(&mut set, RUN_CAP).await?;
    let log = std::mem::take(&mut *log.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(log)
}

/// Waits for every task of `set`, the first error its answer; past `cap`, the tasks
/// left are aborted and the run is an error.
pub async fn join_within(set: &mut JoinSet<Res<()>>, cap: Duration) -> Res<()> {
    let joined = tokio::time::timeout(cap, async {
        while let Some(r) = set.join_next().await {
            r.map_err(err)??;
        }
        Ok::<(), String>(())
    })
    .await;
    joined.unwrap_or_else(|_| {
        set.abort_all();
        Err(format!("a run took over {} s", cap.as_secs()))
    })
}

fn digest(log: &[Rec], f: &mut Figures) {
    // For every release, the first later acquisition by another task: how long the
    // waiters went on waiting after the lock was released. With FIFO hand-off that is the
    // next acquisition; when the releaser takes the lock straight back (a polling waiter
    // sleeps meanwhile), the waiters wait for the rest of its streak too. Releases after
    // which nobody else ever acquired (no one was left waiting) are not counted.
    let mut next_other = vec![None; log.len()];
    for k in (0..log.len().saturating_sub(1)).rev() {
        next_other[k] = if log[k + 1].holder != log[k].holder {
            Some(k + 1)
        } else {
            next_other[k + 1]
        };
    }
    let mut waits: Vec<Duration> = (0..log.len())
        .filter_map(|k| {
            next_other[k].map(|j| {
                log[j]
                    .acquired
                    .saturating_duration_since(log[k].release_call)
            })
        })
        .collect();
    waits.sort();
    let changes = log
        .windows(2)
        .filter(|w| w[1].holder != w[0].holder)
        .count();
    let span = log.last().zip(log.first()).map_or(0.0, |(l, f)| {
        l.acquired.duration_since(f.acquired).as_secs_f64()
    });
    f.p50.push(us(quantile(&waits, 0.5)));
    f.all.extend_from_slice(&waits);
    f.handoffs_per_s.push(changes as f64 / span);
    f.acq_per_s.push((log.len() - 1) as f64 / span);
    f.fifo.push(changes as f64 / (log.len() - 1) as f64);
}

/// What the `ratios:` line needs from this scenario.
pub struct Ratios {
    pub vs_poll: f64,
    pub vs_rslock: f64,
    pub vs_rtt: f64,
    pub fifo: f64,
}

pub async fn run(cfg: &Config, url: &str) -> Res<Ratios> {
    let mut kinds: Vec<(String, Res<Arc<Kind>>)> = Vec::new();
    let mut redlock = Vec::new();
    let mut memory = Vec::new();
    let mut poll = Vec::new();
    let mut rsl = Vec::new();
    let mut arl = Vec::new();
    for _ in 0..MANAGERS {
        redlock.push(LockManager::connect(url).await.map_err(err)?);
        memory.push(
            LockManager::builder()
                .in_memory()
                .build()
                .await
                .map_err(err)?,
        );
        poll.push(Raw::connect(url).await?);
        rsl.push(rslock::LockManager::new(vec![url]));
        arl.push(
            async_redis_lock::Locker::from_redis_url(url)
                .await
                .map_err(err)?,
        );
    }
    kinds.push(("redlock".into(), Ok(Arc::new(Kind::Redlock(redlock)))));
    kinds.push((
        format!("poll: SET NX + {} ms sleep", POLL.as_millis()),
        Ok(Arc::new(Kind::Poll(poll))),
    ));
    kinds.push((
        format!("{RSLOCK} (acquire)"),
        Ok(Arc::new(Kind::Rslock(rsl))),
    ));
    kinds.push((
        format!("{ARL} (100 ms retry)"),
        Ok(Arc::new(Kind::Arl(arl))),
    ));
    kinds.push((
        "redlock in-memory".into(),
        Ok(Arc::new(Kind::Redlock(memory))),
    ));

    // For profiling: BENCH_ONLY=redlock (names, comma-separated; redlock always runs).
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    if !only.is_empty() {
        kinds.retain(|(n, _)| n == "redlock" || only.split(',').any(|o| n.starts_with(o)));
    }
    let rtt_probe = Raw::connect(url).await?;
    // One raw SET round trip, measured right before each of redlock's runs.
    let mut rtt = Runs::default();
    // redlock's p50 and p99 in round trips of its own run.
    let (mut p50_rtts, mut p99_rtts) = (Runs::default(), Runs::default());
    let mut figs: Vec<Res<Figures>> = kinds.iter().map(|_| Ok(Figures::default())).collect();
    // Warm-up: one short run each.
    for (i, (_, k)) in kinds.iter().enumerate() {
        if let Ok(k) = k {
            if let Err(e) = one_run(k, 4).await {
                figs[i] = Err(e);
            }
        }
    }
    for run in 0..cfg.handoff_runs {
        for j in 0..kinds.len() {
            let i = (j + run) % kinds.len();
            let Ok(k) = &kinds[i].1 else { continue };
            if figs[i].is_err() {
                continue;
            }
            let unit = if i == 0 {
                let r = us(rtt_probe.set_rtt(cfg.rtt_samples).await?);
                rtt.push(r);
                Some(r)
            } else {
                None
            };
            match one_run(k, cfg.handoff_per_task).await {
                Ok(log) => {
                    if let Ok(f) = &mut figs[i] {
                        let before = f.all.len();
                        digest(&log, f);
                        if let Some(unit) = unit {
                            let mut this: Vec<Duration> = f.all[before..].to_vec();
                            this.sort();
                            p50_rtts.push(us(quantile(&this, 0.5)) / unit);
                            p99_rtts.push(us(quantile(&this, 0.99)) / unit);
                        }
                    }
                }
                Err(e) => figs[i] = Err(e),
            }
        }
    }

    let rtt_us = rtt.median();
    for f in figs.iter_mut().flatten() {
        f.all.sort();
    }
    let pct = |i: usize, q: f64| {
        figs[i]
            .as_ref()
            .map_or(f64::NAN, |f| us(quantile(&f.all, q)))
    };
    let ours = pct(0, 0.5);
    let by_name = |prefix: &str| kinds.iter().position(|(n, _)| n.starts_with(prefix));
    let mut t = Table::new(
        format!(
            "contended hand-off: {WAITERS} tasks over {MANAGERS} managers on one key, {} acquisitions each per run ({} runs; percentiles over all runs' releases, ± = half-range of the per-run p50s)",
            cfg.handoff_per_task, cfg.handoff_runs
        ),
        &[
            "implementation",
            "hand-off p50 µs",
            "p90 µs",
            "p99 µs",
            "hand-offs/s",
            "acquisitions/s",
            "fifo",
            "p50 ÷ redlock's",
        ],
    );
    for (i, ((name, _), f)) in kinds.iter().zip(&figs).enumerate() {
        match f {
            Ok(f) => t.row(vec![
                name.clone(),
                format!("{:.0} ±{:.0}%", pct(i, 0.5), f.p50.spread() * 100.0),
                fixed(0)(pct(i, 0.9)),
                fixed(0)(pct(i, 0.99)),
                fixed(0)(f.handoffs_per_s.median()),
                fixed(0)(f.acq_per_s.median()),
                fixed(3)(f.fifo.median()),
                format!("{:.1}", pct(i, 0.5) / ours),
            ]),
            Err(e) => t.na(name, e),
        }
    }
    t.note(format!(
        "one raw SET round trip (p50 of {} sequential SETs right before each redlock run): {rtt_us:.0} µs ±{:.0}%; redlock's hand-off in round trips of its run: p50 {:.2} ±{:.0}%, p99 {:.2}",
        cfg.rtt_samples,
        rtt.spread() * 100.0,
        p50_rtts.median(),
        p50_rtts.spread() * 100.0,
        p99_rtts.median(),
    ));
    t.note("hand-off: a holder calls release() → the first later lock().await of another task returns (for every release some other task was waiting on)");
    t.note("fifo: acquisitions that changed holder ÷ all; hand-offs/s: holder changes per second of the run");
    t.note(format!(
        "releases measured (all runs): {}",
        kinds
            .iter()
            .zip(&figs)
            .filter_map(|((n, _), f)| f.as_ref().ok().map(|f| format!("{n}: {}", f.all.len())))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    t.note("pollers: the releaser comes straight back while the others sleep, so they mostly get the lock when its quota ends (or when a poll slips in between its DEL and its next SET)");
    t.print();
    Ok(Ratios {
        vs_poll: by_name("poll").map_or(f64::NAN, |i| pct(i, 0.5) / ours),
        vs_rslock: by_name(RSLOCK).map_or(f64::NAN, |i| pct(i, 0.5) / ours),
        vs_rtt: p50_rtts.median(),
        fifo: figs[0].as_ref().map_or(f64::NAN, |f| f.fifo.median()),
    })
}
