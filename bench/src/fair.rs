//! The fair lock under contention: 32 tasks (8 in each of 4 managers) take turns on one
//! key, each lock, release and queue again, a fixed number of times; against the plain
//! lock on the same load, and a hand-written polling fair queue (a sorted set of
//! tickets; each waiter asks every 10 ms whether it is first and the key free).
//!
//! Per implementation: the hand-off (a holder calls `release()` → the next holder's
//! call returns) at p50 and p99 in raw `SET` round trips; acquisition attempts per
//! release across all managers, beyond each call's arrival (from the server's
//! `INFO commandstats` for the library's scripts, counted by the client for the
//! poller); and order violations: grants to a waiter while another that arrived
//! [`ORDER_MARGIN`] or more before it was still waiting.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redlock::{LockGuard, LockManager, LockOptions};
use tokio::task::JoinSet;

use crate::cpu::{commandstats, delta};
use crate::handoff::join_within;
use crate::raw::{connect, err, token, Raw, Res};
use crate::stats::{fixed, quantile, us, Table};
use crate::Config;

const MANAGERS: usize = 4;
const PER_MANAGER: usize = 8;
/// The polling queue's pause between asks.
const POLL: Duration = Duration::from_millis(10);
/// Arrivals closer than this are not ordered by the count of violations: a client's
/// clock is read before its request reaches the server, and a loaded runtime may hold
/// the request back for a moment.
const ORDER_MARGIN: Duration = Duration::from_millis(2);
/// A run that takes longer is abandoned.
const RUN_CAP: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(30);

/// The polling fair queue: a ticket in a sorted set on arrival; an attempt takes the
/// key only for the first ticket.
const POLL_ARRIVE: &str = "redis.call('ZADD', KEYS[1], redis.call('INCR', KEYS[2]), ARGV[1])";
const POLL_ATTEMPT: &str = "if redis.call('ZRANGE', KEYS[2], 0, 0)[1] == ARGV[1] and redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PX', ARGV[3]) then redis.call('ZREM', KEYS[2], ARGV[1]) return 1 end return 0";

enum Kind {
    Fair(Vec<LockManager>),
    Plain(Vec<LockManager>),
    Poll(Vec<Raw>, Vec<MultiplexedConnection>, Arc<AtomicU64>),
}

enum Held {
    Guard(LockGuard),
    Raw(crate::raw::RawHeld),
}

impl Kind {
    async fn acquire(&self, m: usize, key: &str, me: usize) -> Res<Held> {
        let wait = LockOptions::new()
            .wait(Duration::from_secs(50))
            .ttl(TTL)
            .watchdog(false);
        Ok(match self {
            Self::Fair(v) => Held::Guard(v[m].fair_with(key, wait).await.map_err(err)?),
            Self::Plain(v) => Held::Guard(v[m].lock_with(key, wait).await.map_err(err)?),
            Self::Poll(raw, cons, attempts) => {
                let mut con = cons[m].clone();
                let (queue, seq) = (format!("{key}:q"), format!("{key}:seq"));
                let id = format!("w{me}");
                redis::Script::new(POLL_ARRIVE)
                    .key(&queue)
                    .key(&seq)
                    .arg(&id)
                    .invoke_async::<()>(&mut con)
                    .await
                    .map_err(err)?;
                let tok = token();
                for _ in 0..(RUN_CAP.as_millis() / POLL.as_millis()) {
                    attempts.fetch_add(1, Ordering::Relaxed);
                    let got: i64 = redis::Script::new(POLL_ATTEMPT)
                        .key(key)
                        .key(&queue)
                        .arg(&id)
                        .arg(&tok[..])
                        .arg(TTL.as_millis() as u64)
                        .invoke_async(&mut con)
                        .await
                        .map_err(err)?;
                    if got == 1 {
                        return Ok(Held::Raw(raw[m].held(key, tok)));
                    }
                    tokio::time::sleep(POLL).await;
                }
                return Err("the polling queue never served".into());
            }
        })
    }

    async fn release(&self, m: usize, held: Held) -> Res<()> {
        match (self, held) {
            (_, Held::Guard(g)) => g.release().await.map_err(err),
            (Self::Poll(raw, ..), Held::Raw(h)) => raw[m].release(h).await.map(drop),
            _ => Err("mismatched lock".into()),
        }
    }

    fn key(&self) -> &'static str {
        match self {
            Self::Fair(_) => "fair",
            Self::Plain(_) => "fair-plain",
            Self::Poll(..) => "raw:fair-poll",
        }
    }
}

#[derive(Clone, Copy)]
struct Rec {
    arrived: Instant,
    acquired: Instant,
    release_call: Instant,
}

/// One run: every grant in the order held.
async fn one_run(kind: &Arc<Kind>, per_task: usize) -> Res<Vec<Rec>> {
    let log: Arc<Mutex<Vec<Rec>>> = Arc::new(Mutex::new(Vec::new()));
    let mut set = JoinSet::new();
    for me in 0..MANAGERS * PER_MANAGER {
        let (kind, log) = (kind.clone(), log.clone());
        set.spawn(async move {
            let m = me % MANAGERS;
            for _ in 0..per_task {
                let arrived = Instant::now();
                let held = kind.acquire(m, kind.key(), me).await?;
                let acquired = Instant::now();
                let seq = {
                    let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
                    log.push(Rec {
                        arrived,
                        acquired,
                        release_call: acquired,
                    });
                    log.len() - 1
                };
                let release_call = Instant::now();
                log.lock().unwrap_or_else(PoisonError::into_inner)[seq].release_call = release_call;
                kind.release(m, held).await?;
                tokio::task::yield_now().await;
            }
            Ok::<(), String>(())
        });
    }
    join_within(&mut set, RUN_CAP).await?;
    let log = std::mem::take(&mut *log.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(log)
}

/// Hand-offs (each release → the next grant) and order violations of a run's log.
fn digest(log: &[Rec]) -> (Vec<Duration>, usize) {
    let handoffs = log
        .windows(2)
        .map(|w| w[1].acquired.saturating_duration_since(w[0].release_call))
        .collect();
    let violations = (0..log.len())
        .filter(|&k| {
            log[k + 1..]
                .iter()
                .any(|later| later.arrived + ORDER_MARGIN < log[k].arrived)
        })
        .count();
    (handoffs, violations)
}

/// What the `ratios:` line needs from this scenario.
pub struct Ratios {
    pub handoff_rtts: f64,
    pub attempts_per_release: f64,
    pub violations: usize,
}

struct Figures {
    handoffs: Vec<Duration>,
    violations: usize,
    grants: usize,
    attempts: u64,
}

pub async fn run(cfg: &Config, url: &str) -> Res<Ratios> {
    let per_task = (cfg.handoff_per_task / 4).max(5);
    let mut fair = Vec::new();
    let mut plain = Vec::new();
    let (mut raws, mut cons) = (Vec::new(), Vec::new());
    for _ in 0..MANAGERS {
        fair.push(LockManager::connect(url).await.map_err(err)?);
        plain.push(LockManager::connect(url).await.map_err(err)?);
        raws.push(Raw::connect(url).await?);
        cons.push(connect(url).await?);
    }
    let polls = Arc::new(AtomicU64::new(0));
    let kinds: Vec<(&str, Arc<Kind>)> = vec![
        ("redlock fair", Arc::new(Kind::Fair(fair))),
        ("redlock lock (not fair)", Arc::new(Kind::Plain(plain))),
        (
            "polling fair queue (10 ms)",
            Arc::new(Kind::Poll(raws, cons, polls.clone())),
        ),
    ];
    let probe = Raw::connect(url).await?;
    let mut stats_con = connect(url).await?;
    let rtt = us(probe.set_rtt(cfg.rtt_samples).await?);
    let mut table = Table::new(
        format!(
            "fair hand-off: {} tasks over {MANAGERS} managers on one key, {per_task} acquisitions each",
            MANAGERS * PER_MANAGER
        ),
        &[
            "implementation",
            "hand-off p50 µs",
            "p50 round trips",
            "p99 round trips",
            "attempts per release",
            "order violations",
        ],
    );
    let mut ratios = Ratios {
        handoff_rtts: f64::NAN,
        attempts_per_release: f64::NAN,
        violations: 0,
    };
    for (i, (name, kind)) in kinds.iter().enumerate() {
        one_run(kind, 2).await?; // warm-up: scripts cached, channels subscribed
        let before = commandstats(&mut stats_con).await?;
        let polled = polls.load(Ordering::Relaxed);
        let log = one_run(kind, per_task).await?;
        let after = commandstats(&mut stats_con).await?;
        let (mut handoffs, violations) = digest(&log);
        handoffs.sort();
        let calls = delta(&before, &after);
        let scripts =
            calls.get("evalsha").copied().unwrap_or(0) + calls.get("eval").copied().unwrap_or(0);
        let grants = log.len() as u64;
        // Each call's arrival is one attempt, each release one script: the rest are
        // attempts a release (or a heartbeat) caused.
        let attempts = match &**kind {
            Kind::Poll(..) => polls.load(Ordering::Relaxed) - polled - grants,
            _ => scripts.saturating_sub(2 * grants),
        };
        let f = Figures {
            handoffs,
            violations,
            grants: log.len(),
            attempts,
        };
        let releases = f.grants.saturating_sub(1).max(1) as f64;
        let per_release = f.attempts as f64 / releases;
        let p50 = us(quantile(&f.handoffs, 0.5));
        table.row(vec![
            (*name).to_owned(),
            fixed(0)(p50),
            fixed(2)(p50 / rtt),
            fixed(2)(us(quantile(&f.handoffs, 0.99)) / rtt),
            fixed(2)(per_release),
            format!("{} of {}", f.violations, f.grants),
        ]);
        if i == 0 {
            ratios = Ratios {
                handoff_rtts: p50 / rtt,
                attempts_per_release: per_release,
                violations: f.violations,
            };
        }
    }
    table.note(format!("one raw SET round trip: {rtt:.0} µs"));
    table.note("attempts per release: acquisition attempts beyond each call's arrival ÷ releases (the library: scripts run by the server, less one release and one arrival per grant, heartbeats included; the poller: its asks less one per grant); a fair release wakes the first waiter alone, a plain one each manager's first waiter");
    table.note(format!(
        "order violations: grants while a waiter that arrived {} ms or more earlier still waited (the plain lock promises no order)",
        ORDER_MARGIN.as_millis()
    ));
    table.print();
    Ok(ratios)
}
