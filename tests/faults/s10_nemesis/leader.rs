//! The nemesis's leader candidates: one task per manager contending for one leader name
//! per round, under every fault the round injects.
//!
//! Each candidate campaigns, again and again until the round ends, with a bounded
//! campaign ([`tokio::time::timeout`] around the call: 50 ms–2.5 s, at most until the
//! round's end; ttl 300 ms–2 s; attempt wait 0–2.5 s, which the runtime raises to 1 s):
//!
//! * three in four with [`leader_with`](LockManager::leader_with); once elected it
//!   behaves like the other holders: samples `is_held()` every 1–5 ms (the clock read
//!   *before* the call) for a random hold of up to two ttls, then resigns (`resign()`)
//!   or drops the [`Leadership`](redlock::Leadership) (resigned in the background); a
//!   sample that answers false is a loss (dropped at once);
//! * one in four with [`lead_with`](LockManager::lead_with), whose body holds for a
//!   random time; a body dropped on a loss is followed, inside the same call, by another
//!   campaign and another body with the next term.
//!
//! Every term is recorded as an exclusive [`Grant`] on the leader's lock key,
//! `lock:leader:{<name>}` ([`lock_key`]), with the term as its fencing token, so the
//! safety checker ([`redlock_faults::belief`]) checks that no two leaders believe at
//! once and that terms strictly increase in grant order, together with everything else.
//!
//! A body's belief: `lead_with` stops its body, when leadership is lost, at its next
//! `.await` (it `select!`s the body against `lost()`, which reads the clock at every
//! poll). So a body that resumes after an `.await` it entered at `t` (the clock read just
//! before it) was still leader after `t`: its belief is sampled at `t`, as an
//! `is_held()` call is sampled at the instant read before it. A body's grant returned
//! when it was entered (after the election); a later term's campaign began after the
//! previous body's last sample (its `sent`).
//!
//! Liveness: the leader key is polled like the lock keys (`leader:{<name>}` in
//! [`poll`](super::poll), under the manager's prefix) and judged by the same
//! [`redlock_faults::liveness`] rule: in a calm spell, campaigns run 2–4 s with 2–4 s
//! waits and 2–5 s ttls (mostly), leaders hold up to 1.5 s, and the key must not stay
//! grantable over the bound while a campaign begun at least `SETTLE` into the spell
//! runs. Why that is sound:
//!
//! * each attempt of a campaign is the exclusive lock's own wait, and an attempt whose
//!   wait ran out is followed at once by the next (the runtime's `MIN_ATTEMPT` pause
//!   applies only to an attempt shorter than 1 s, i.e. one that failed), so a campaign
//!   waits as a `lock` waiter does — except after a failed attempt, which pauses until
//!   1 s after the attempt began. Hence only campaigns begun at least `SETTLE` into a
//!   calm spell are judged ([`judged`]): by then no connection is broken and no fault
//!   acts, so no attempt fails (a `lock` waiter's failure would end its wait, and with
//!   it the judged gap; a campaign's does not). The one failure left, a replica that
//!   never synced after a failover (`ReplicasUnavailable` on every attempt), drops that
//!   round's campaigns from the liveness check (see `check_liveness`);
//! * a manager has one candidate, which campaigns once at a time, so no other wait of
//!   its manager on the key (begun during a fault) holds a judged campaign back; only a
//!   `lead_with`'s first campaign is recorded (the start of a later one, inside the
//!   call, is not observed), which only judges less;
//! * in the spell only campaigns take the key; one cancelled at its time limit may still
//!   be granted and resign in the background: a short hold, which hides a gap, never
//!   makes one.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redlock::{Leadership, LockError, LockManager, LockOptions};
use redlock_faults::belief::Grant;
use redlock_faults::clock::now_ns;
use redlock_faults::liveness::{Calm, Waiter};
use tokio::time::Instant;

use super::poll::PREFIX;
use super::{between, bump, ClientLog, Keys, Step, MAX_OPS};

/// The leader-election counts of a run (the report's "leader:" line).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Tally {
    /// Campaigns begun (`leader_with` or `lead_with` calls).
    pub(super) campaigns: u64,
    /// Terms won (a `lead_with` may win several).
    pub(super) elected: u64,
    /// Leaderships resigned (`resign()`, or a `lead_with` whose body returned).
    pub(super) resigned: u64,
    /// Leaderships dropped (resigned in the background), a `lead_with` cut by its
    /// timeout included.
    pub(super) dropped: u64,
    /// Leaderships found lost (`is_held()` false, or a body dropped by `lead_with`).
    pub(super) lost: u64,
    /// Campaigns that ran out of time before an election.
    pub(super) timeouts: u64,
    /// Campaigns that ended in an error.
    pub(super) errors: u64,
}

impl Tally {
    /// Adds another task's counts.
    pub(super) fn merge(&mut self, o: &Tally) {
        self.campaigns += o.campaigns;
        self.elected += o.elected;
        self.resigned += o.resigned;
        self.dropped += o.dropped;
        self.lost += o.lost;
        self.timeouts += o.timeouts;
        self.errors += o.errors;
    }
}

/// The round's leader name, as the poller and the liveness checker name its key:
/// `leader:{<name>}` (the manager adds its prefix).
pub(super) fn poll_key(name: &str) -> String {
    format!("leader:{{{name}}}")
}

/// The leader's lock key as the runtime writes it, `lock:leader:{<name>}`: the key of
/// its grants.
pub(super) fn lock_key(name: &str) -> String {
    format!("{PREFIX}{}", poll_key(name))
}

/// Whether the liveness checker may judge the campaign `w`: begun at least `settle`
/// into a calm spell (see the module doc).
pub(super) fn judged(w: &Waiter, calm: &[Calm], settle: u64) -> bool {
    calm.iter()
        .any(|c| c.start.saturating_add(settle) <= w.sent && w.sent < c.end)
}

/// What one campaign is given: its options and its time limit.
struct Campaign {
    opts: LockOptions,
    ttl: Duration,
    limit: Duration,
    calm: bool,
}

impl Campaign {
    /// A random campaign (longer ones in the calm spell), bounded by the round's `end`;
    /// `None` once the round is over.
    fn random(keys: &Keys, rng: &mut fastrand::Rng, end: Instant) -> Option<Campaign> {
        let left = end.saturating_duration_since(Instant::now());
        if left < Duration::from_millis(20) {
            return None;
        }
        let calm = keys.calm.load(std::sync::atomic::Ordering::Relaxed);
        let secs = Duration::from_secs;
        let ms = Duration::from_millis;
        let ttl = match rng.u8(..4) {
            _ if calm && rng.u8(..4) != 0 => between(rng, secs(2), secs(5)),
            0 => between(rng, ms(900), secs(2)),
            1 => between(rng, ms(600), ms(900)),
            _ => between(rng, ms(300), ms(600)),
        };
        let (wait, limit) = if calm {
            (
                between(rng, secs(2), secs(4)),
                between(rng, secs(2), secs(4)),
            )
        } else {
            (
                between(rng, Duration::ZERO, ms(2_500)),
                between(rng, ms(50), ms(2_500)),
            )
        };
        let mut opts = LockOptions::new().ttl(ttl).wait(wait);
        if keys.min_replicas {
            opts = opts.min_replicas(1);
        }
        Some(Campaign {
            opts,
            ttl,
            limit: limit.min(left),
            calm,
        })
    }

    /// A random hold for a leader elected by it, at most until `end`.
    fn hold(&self, rng: &mut fastrand::Rng, end: Instant) -> Duration {
        let longest = if self.calm {
            Duration::from_millis(1_500)
        } else {
            self.ttl * 2
        };
        between(rng, Duration::from_millis(1), longest)
            .min(end.saturating_duration_since(Instant::now()))
    }
}

/// One leader candidate (client `id`, of manager `manager`): campaigns until `end`.
pub(super) async fn candidate(
    (id, manager): (usize, usize),
    locks: LockManager,
    keys: Arc<Keys>,
    mut rng: fastrand::Rng,
    end: Instant,
) -> ClientLog {
    let mut log = ClientLog::default();
    let mut tally = Tally::default();
    let me = Me {
        id,
        manager,
        name: &keys.leader,
    };
    for _ in 0..MAX_OPS {
        let Some(c) = Campaign::random(&keys, &mut rng, end) else {
            break;
        };
        tally.campaigns += 1;
        if rng.u8(..4) == 0 {
            me.lead(&locks, &c, &mut rng, end, (&mut log, &mut tally))
                .await;
        } else {
            me.campaign(&locks, &c, &mut rng, end, (&mut log, &mut tally))
                .await;
        }
    }
    log.leader = tally;
    log
}

/// Who campaigns, and for what.
struct Me<'a> {
    id: usize,
    manager: usize,
    name: &'a str,
}

/// One term won inside a `lead_with` call: its body's record.
struct Run {
    term: u64,
    /// When the body was entered (after the election).
    entered: u64,
    /// The last instant its belief was sampled at (see the module doc).
    last_held: Option<u64>,
    /// Whether the body returned (else `lead_with` dropped it, or the timeout did).
    done: bool,
}

impl Me<'_> {
    /// Records a campaign from `sent` to now as a wait for the leader key.
    fn waited(&self, log: &mut ClientLog, sent: u64, end: u64) {
        log.waits.push(Waiter {
            client: self.id,
            manager: self.manager,
            key: poll_key(self.name),
            sent,
            end,
        });
    }

    /// Traces a step on term `term`.
    fn trace(log: &mut ClientLog, key: &str, term: u64, (start, end): (u64, u64), what: String) {
        log.trace.push(Step {
            locks: vec![(key.to_owned(), term)],
            start,
            end,
            what,
            shorter: None,
        });
    }

    /// A `leader_with` campaign; once elected, holds (sampling `is_held()`), then
    /// resigns or drops the leadership.
    async fn campaign(
        &self,
        locks: &LockManager,
        c: &Campaign,
        rng: &mut fastrand::Rng,
        end: Instant,
        (log, tally): (&mut ClientLog, &mut Tally),
    ) {
        let sent = now_ns();
        let result =
            tokio::time::timeout(c.limit, locks.leader_with(self.name, c.opts.clone())).await;
        let returned = now_ns();
        self.waited(log, sent, returned);
        let leadership = match result {
            Err(_) => {
                tally.timeouts += 1;
                bump(&mut log.ops, "leader: timeout");
                return;
            }
            Ok(Err(e)) => {
                failed(log, tally, &e).await;
                return;
            }
            Ok(Ok(l)) => l,
        };
        tally.elected += 1;
        let key = lock_key(self.name);
        let term = leadership.fencing_token();
        log.grants
            .push(Grant::new(self.id, key.clone(), term, sent, returned));
        let g = log.grants.len() - 1;
        let ttl = c.ttl;
        Self::trace(
            log,
            &key,
            term,
            (sent, returned),
            format!("leader: elected (ttl {ttl:?})"),
        );
        let start = now_ns();
        let hold = c.hold(rng, end);
        if !hold_sampled(&leadership, hold, rng, &mut log.grants[g]).await {
            tally.lost += 1;
            bump(&mut log.ops, "leader: lost");
            drop(leadership);
            Self::trace(
                log,
                &key,
                term,
                (start, now_ns()),
                "leader: found lost, drop".into(),
            );
            return;
        }
        let what = if rng.bool() {
            tally.resigned += 1;
            match leadership.resign().await {
                Ok(()) => "resign ok",
                Err(_) => "resign error",
            }
        } else {
            tally.dropped += 1;
            drop(leadership);
            "drop"
        };
        bump(&mut log.ops, &format!("leader: {what}"));
        Self::trace(
            log,
            &key,
            term,
            (start, now_ns()),
            format!("leader: hold {hold:?}, {what}"),
        );
    }

    /// A `lead_with` call whose body holds for a random time; each term it won is
    /// recorded as a grant.
    async fn lead(
        &self,
        locks: &LockManager,
        c: &Campaign,
        rng: &mut fastrand::Rng,
        end: Instant,
        (log, tally): (&mut ClientLog, &mut Tally),
    ) {
        let runs: Mutex<Vec<Run>> = Mutex::new(Vec::new());
        let lock = || runs.lock().unwrap_or_else(PoisonError::into_inner);
        let sent = now_ns();
        // The campaign's limit, plus the body's longest hold.
        let limit = (c.limit + c.hold(rng, end)).min(end.saturating_duration_since(Instant::now()));
        let body = |term: u64| {
            let hold = c.hold(rng, end);
            let mut pauses = fastrand::Rng::with_seed(rng.u64(..));
            let runs = &runs;
            async move {
                let entered = now_ns();
                let i = {
                    let mut r = runs.lock().unwrap_or_else(PoisonError::into_inner);
                    r.push(Run {
                        term,
                        entered,
                        last_held: None,
                        done: false,
                    });
                    r.len() - 1
                };
                let until = Instant::now() + hold;
                loop {
                    let before = now_ns();
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    let pause = Duration::from_micros(pauses.u64(1_000..5_000));
                    tokio::time::sleep(pause.min(left)).await;
                    // Resumed: `lead_with` found the leadership not lost after `before`.
                    let mut r = runs.lock().unwrap_or_else(PoisonError::into_inner);
                    r[i].last_held = Some(before);
                }
                let mut r = runs.lock().unwrap_or_else(PoisonError::into_inner);
                r[i].done = true;
            }
        };
        let result =
            tokio::time::timeout(limit, locks.lead_with(self.name, c.opts.clone(), body)).await;
        let returned = now_ns();
        let runs = std::mem::take(&mut *lock());
        self.waited(log, sent, runs.first().map_or(returned, |r| r.entered));
        self.record_runs(log, tally, &runs, sent);
        let what = match (&result, runs.last()) {
            (Ok(Ok(())), _) => {
                tally.resigned += 1;
                "returned, resigned"
            }
            (Ok(Err(e)), _) => {
                failed(log, tally, e).await;
                return;
            }
            (Err(_), None) => {
                tally.timeouts += 1;
                "timeout"
            }
            (Err(_), Some(_)) => {
                tally.dropped += 1;
                "cut by the timeout, dropped"
            }
        };
        bump(&mut log.ops, &format!("lead: {what}"));
        let (key, term) = (lock_key(self.name), runs.last().map_or(0, |r| r.term));
        Self::trace(log, &key, term, (sent, returned), format!("lead: {what}"));
    }

    /// Records the terms a `lead_with` call won (begun at `sent`) as grants; a body
    /// `lead_with` dropped before it returned, but for the last one, was lost.
    fn record_runs(&self, log: &mut ClientLog, tally: &mut Tally, runs: &[Run], sent: u64) {
        let key = lock_key(self.name);
        let mut campaign_from = sent;
        for (k, r) in runs.iter().enumerate() {
            tally.elected += 1;
            let mut g = Grant::new(self.id, key.clone(), r.term, campaign_from, r.entered);
            if let Some(t) = r.last_held {
                g.held_at(t);
            }
            log.grants.push(g);
            let last = r.last_held.unwrap_or(r.entered).max(r.entered);
            let lost = !r.done && k + 1 < runs.len();
            if lost {
                tally.lost += 1;
                bump(&mut log.ops, "lead: body dropped on a loss");
            }
            let what = if lost {
                "lead: body, lost"
            } else {
                "lead: body"
            };
            Self::trace(log, &key, r.term, (r.entered, last), what.to_owned());
            campaign_from = last;
        }
    }
}

/// Samples `l.is_held()` every 1–5 ms for `hold` into `g`; `false` as soon as it
/// answers false.
async fn hold_sampled(
    l: &Leadership,
    hold: Duration,
    rng: &mut fastrand::Rng,
    g: &mut Grant,
) -> bool {
    let until = Instant::now() + hold;
    loop {
        let at = now_ns();
        if !l.is_held() {
            return false;
        }
        g.held_at(at);
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        let pause = Duration::from_micros(rng.u64(1_000..5_000));
        tokio::time::sleep(pause.min(left)).await;
    }
}

/// Counts a campaign that failed with `e` and pauses (a failing backend: no spinning).
async fn failed(log: &mut ClientLog, tally: &mut Tally, e: &LockError) {
    tally.errors += 1;
    let debug = format!("{e:?}");
    let variant = debug.split([' ', '{', '(']).next().unwrap_or("?");
    bump(&mut log.ops, &format!("leader: error {variant}"));
    tokio::time::sleep(Duration::from_millis(5)).await;
}
