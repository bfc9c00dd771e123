//! Scenario 10: the randomized nemesis.
//!
//! Several clients (five `LockManager`s in this process, two tasks each, and a leader
//! candidate each, see below) contend on a few keys with random operations —
//! acquisitions of every kind (ttl 300 ms–2 s, short waits, some cancelled by a short
//! timeout, one in eight with `hold_at_least` up to 600 ms):
//! exclusive asks (40 %: `lock_with` 20 %, `write_with` about 7 %, `fair_with` about
//! 13 %, so fair holders and waiters meet plain ones on the same keys, which do not
//! queue and may go ahead of the fair queue) and `read_with` (20 %) on four keys,
//! `permit_with` (20 %) on two permit keys of 2 and 3 permits, `lock_all_with` (20 %, waiting
//! 100–800 ms) over 2–3 of the four keys in random order (in every other round the four
//! share a hash slot); then, on whatever guard it got (a `LockGuard` or a
//! `MultiGuard`), `extend` (longer and shorter than the current ttl, some cancelled
//! mid-flight by a short `tokio::time::timeout`), holding for random times, `release`,
//! dropping the guard — while a nemesis task injects random faults for random
//! durations:
//!
//! * through each client's own [`ChaosProxy`] per node (single, Redlock; a Cluster's
//!   clients share one proxy per node, which the node announces with
//!   `cluster-announce-port` so that discovery and redirects use it too): a lasting
//!   "weather" of 0–150 ms delays per client (0–30 ms for Redlock, whose per-node
//!   timeout is ttl/10), so that extends and watchdog renewals are in flight together
//!   and short timeouts cancel extends after they were sent; delay of requests, replies
//!   or both; blackhole of requests or of replies (request applied,
//!   reply held); a cut (every live connection reset), alone or after blackholing the
//!   replies (request applied, reply lost);
//! * on the servers: `CLIENT KILL TYPE normal`, `CLIENT KILL ADDR` of a random client
//!   connection, SIGSTOP/SIGCONT of one redis-server for 100–800 ms (Cluster masters at
//!   most 400 ms, below the node timeout: a failover would lose locks by design, see the
//!   table in docs/guarantees.md).
//!
//! * on a primary + replica set ([`replicated`], every acquisition with `min_replicas(1)`,
//!   so readers and permits, for which that option is an `InvalidOption`, are exclusive
//!   locks there): the replica frozen, the replication link (a proxy) blackholed or cut,
//!   during extends and renewals; and a failover (one certain in the second round): the
//!   primary killed or frozen, the replica promoted with `REPLICAOF NO ONE`, the
//!   clients' address moved to it (see [`replicated`] for why not Sentinel).
//!
//! Besides: one in eight acquisitions (a reader one in three) has no watchdog and may
//! leave by expiry; an extend is sometimes dropped right after it was sent (one poll, or
//! up to 2 ms) and the guard released or dropped at once (a `hold_at_least` keep must not
//! be re-armed by it); and each round has a **calm spell** of 3 s with no fault at all,
//! in which acquisitions favour long ttls (2–5 s) and long waits (2–4 s) and nothing but
//! a waiter takes a key (no `lock_all`, single attempts or cancelled acquires), so that
//! a waiter not woken shows as a long gap; no fair waiter begins in it (a fair ask is a
//! `lock` there, see below).
//!
//! Every client samples `is_held()` every 1–5 ms while it holds a lock (also while an
//! operation is in flight), and right before and after each operation, reading the clock
//! *before* the call. Every grant is recorded with what it holds (a `MultiGuard` as one
//! exclusive grant per key, sampled by its own `is_held()`). The checker
//! ([`redlock_faults::belief`]) reports overlaps of belief (invariant 1: a reader's may
//! overlap other readers', never an exclusive holder's; at most `n` permit holders of a
//! key believing at once) and fencing-order violations (invariant 2; on Redlock, readers or
//! permits granted at the same moment may share a token); see there for why it has no
//! false positives.
//!
//! Liveness: a poller reads every key's state on the server every 4 ms ([`poll`]), and
//! [`redlock_faults::liveness`] measures, in the calm spells, how long a key stayed
//! grantable while a waiter that began in the spell waited for it (see there for why
//! faults, `hold_at_least` keeps, waits that ran out and writers' intents cause no false
//! positive); a gap over `WAKE_BOUND` (1 s) fails the run.
//!
//! Fair locks: their holders are exclusive holders for the safety checker (no other
//! believed holder of the key, fencing order). Their liveness is "the queue always
//! drains", judged by [`drain`] rather than by the calm spells' wake-up bound: a fair
//! waiter may rightly wait up to `FAIR_PLACE_LASTS` (3 s) plus a heartbeat (1 s) behind
//! a place whose withdrawal a fault lost before the spell (the server reclaims it by its
//! clock), longer than the spell leaves to judge, while the poller sees the key
//! grantable; so no fair waiter begins in a calm spell (a fair ask is a `lock` there,
//! as a `lock_all` is), and those begun before it are never eligible (see
//! [`redlock_faults::liveness`]). Instead, at the end of each round, once the clients
//! stopped and every fault healed, every lock key's fair queue (`:~queue` and
//! `:~heartbeats`, on every node holding the key's slot) must be empty within
//! `FAIR_PLACE_LASTS` + 2 s, or the run fails naming the key and what was left.
//!
//! Leader election ([`leader`]): besides the two tasks, each manager runs a leader
//! candidate, and the five contend for one leader name per round under the same faults:
//! bounded campaigns (`leader_with`, or one in four `lead_with` whose body holds for a
//! random time), then, once elected, `is_held()` sampled every 1–5 ms, a random hold, and
//! `resign()` or a drop. Each term is an exclusive grant on the leader's lock key
//! `lock:leader:{<name>}` with the term as its token, so the safety checker also checks
//! that no two leaders believe at once and that terms strictly increase in grant order.
//! The poller reads the leader key as a lock key, and the calm spell's wake-up bound
//! judges it: the leadership must not stay vacant over `WAKE_BOUND` while a campaign
//! begun at least `SETTLE` into the spell runs (see [`leader`] for why that is sound
//! although a campaign, unlike a `lock`, goes on after a failed attempt).
//!
//! The test prints per backend: rounds, operations by call (`lock`, `write`, `fair`,
//! `read`, `permit`, `lock_all`) and outcome, faults by kind, grants by kind (a fair
//! grant is an exclusive one), violations (the first few in detail, with the seed),
//! waits watched, gaps judged and the worst wake-up gap (explained), the fair queues'
//! drain (keys not yet empty when the check began, the slowest drain, those left), a
//! `leader:` line (campaigns, elected, resigned, dropped, lost, timeouts, errors; the
//! campaigns watched and vacancies judged in calm spells, the worst), and fails when
//! there is any violation, a gap over the bound, a fair queue not drained, no wait
//! watched, a kind never granted (a fair lock included), or nobody ever elected.
//!
//! Run sizes: the default run takes about 20 s per backend (single, Cluster 3+3, Redlock
//! over 3 masters, primary + replica); `REDLOCK_SOAK=1` about 220 s per backend (Redlock
//! over 5 masters).
//! Every run prints its seed; `REDLOCK_NEMESIS_SEED=<seed>` replays the same random
//! choices (operations, durations, faults; the interleaving itself still depends on
//! timing):
//!
//! ```text
//! REDLOCK_NEMESIS_SEED=1234 cargo test -p redlock-faults --test faults nemesis -- --nocapture
//! REDLOCK_SOAK=1 cargo test -p redlock-faults --test faults nemesis -- --nocapture
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redlock::{LockError, LockGuard, LockManager, LockOptions, MultiGuard};
use redlock_faults::belief::{self, Grant, Hold, Tokens, Violation};
use redlock_faults::clock::now_ns;
use redlock_faults::liveness::{self, Calm, Liveness, Waiter};
use redlock_testkit::{ChaosProxy, Direction, Fault, RedisCluster, RedisServer, RedisSet};
use tokio::time::Instant;

use crate::support::{require_redis, soak, unique, HEAVY};

mod drain;
mod leader;
mod poll;
mod replicated;

use replicated::Replicated;

/// Clients (managers) per backend, each with its own proxies.
const CLIENTS: usize = 5;
/// Tasks per manager, each doing its own random operations (a "client" of the checker).
const TASKS: usize = 2;
/// Keys contended per round by `lock`, `write`, `read` and `lock_all`.
const KEYS: usize = 4;
/// Keys contended per round by `permit(key, n)`: their `n`.
const PERMITS: [u32; 2] = [2, 3];
/// The longest ttl an extend sets.
const MAX_EXTEND: Duration = Duration::from_secs(3);
/// Length of one round.
const ROUND: Duration = Duration::from_secs(6);
/// Length of each round's calm spell (no fault at all), in which wake-ups are judged.
const CALM: Duration = Duration::from_millis(3_000);
/// How long into a calm spell wake-up gaps and waiters start counting: above the
/// response timeout, so that no request of a fault is still pending (see
/// [`redlock_faults::liveness`]).
const SETTLE: Duration = Duration::from_secs(1);
/// The longest wake-up gap allowed in a calm spell: a few round trips plus the retry
/// jitter (Redlock's is at most 50 ms, a failed attempt's backoff at most 500 ms)
/// leave it generous.
const WAKE_BOUND: Duration = Duration::from_secs(1);
/// Poll samples further apart than this do not continue one gap.
const MAX_SAMPLE_GAP: Duration = Duration::from_millis(50);
/// Operations per client per round, at most (the round's time bounds it first).
const MAX_OPS: usize = 5_000;
/// Faults per round, at most.
const MAX_FAULTS: usize = 500;
/// Violations printed in detail (plus the first of each kind of suspect).
const SHOWN: usize = 5;
/// Bound on each reply: a blackholed request fails after this.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(800);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Single,
    Cluster,
    Redlock,
    /// A primary and a replica, every acquisition with `min_replicas(1)` (see
    /// [`replicated`]).
    Replicated,
}

/// The servers of one backend, owned by the nemesis while a round runs.
enum Servers {
    Single(RedisServer),
    /// The cluster and its masters' indices (read before the nodes announce proxy ports,
    /// which the testkit's slot-map helpers do not know).
    Cluster(RedisCluster, Vec<usize>),
    Redlock(RedisSet),
    /// The clients' nodes are the primary alone.
    Replicated(Replicated),
}

impl Servers {
    async fn start(kind: Kind) -> Servers {
        match kind {
            Kind::Single => Servers::Single(RedisServer::start()),
            Kind::Cluster => {
                let c = RedisCluster::start_default();
                let masters = c.master_indices();
                Servers::Cluster(c, masters)
            }
            Kind::Redlock => Servers::Redlock(RedisSet::start(if soak() { 5 } else { 3 })),
            Kind::Replicated => Servers::Replicated(Replicated::start().await),
        }
    }

    /// The nodes the clients use (a replicated set's primary).
    fn nodes(&self) -> &[RedisServer] {
        match self {
            Servers::Single(s) => std::slice::from_ref(s),
            Servers::Cluster(c, _) => c.nodes(),
            Servers::Redlock(r) => r.nodes(),
            Servers::Replicated(r) => std::slice::from_ref(r.primary()),
        }
    }

    fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        match self {
            Servers::Single(s) => s,
            Servers::Cluster(c, _) => c.node_mut(i),
            Servers::Redlock(r) => r.node_mut(i),
            Servers::Replicated(r) => r.primary_mut(),
        }
    }

    /// What the liveness poller asks, and where.
    fn poll_plan(&self) -> poll::Plan {
        match self {
            Servers::Cluster(c, masters) => {
                poll::Plan::Owner(masters.iter().map(|&i| c.nodes()[i].addr()).collect())
            }
            Servers::Replicated(r) => poll::Plan::Everywhere(r.poll_targets()),
            _ => poll::Plan::Everywhere(Arc::new(std::sync::Mutex::new(
                self.nodes().iter().map(RedisServer::addr).collect(),
            ))),
        }
    }

    /// The nodes whose pause matters (a Cluster's masters), as indices.
    fn pausable(&self) -> Vec<usize> {
        match self {
            Servers::Cluster(_, masters) => masters.clone(),
            _ => (0..self.nodes().len()).collect(),
        }
    }

    /// The longest pause: below a Cluster's node timeout (no failover).
    fn max_pause(&self) -> Duration {
        match self {
            Servers::Cluster(..) => Duration::from_millis(400),
            _ => Duration::from_millis(800),
        }
    }
}

/// Counters by name, printed in the closing note.
type Counts = BTreeMap<String, u64>;

fn bump(counts: &mut Counts, name: &str) {
    *counts.entry(name.to_owned()).or_default() += 1;
}

/// A random duration in `lo..hi` from `rng`.
fn between(rng: &mut fastrand::Rng, lo: Duration, hi: Duration) -> Duration {
    let span = u64::try_from(hi.saturating_sub(lo).as_micros())
        .unwrap_or(1)
        .max(1);
    lo + Duration::from_micros(rng.u64(0..span))
}

/// The seed of this run: `REDLOCK_NEMESIS_SEED`, or a fresh one.
fn seed() -> u64 {
    match std::env::var("REDLOCK_NEMESIS_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("REDLOCK_NEMESIS_SEED={s:?} is not a u64")),
        Err(_) => fastrand::u64(..),
    }
}

/// The keys of one round.
struct Keys {
    /// Taken by `lock`, `write`, `read` and `lock_all`.
    locks: Vec<String>,
    /// Taken by `permit(key, n)`, each with its `n`.
    permits: Vec<(String, u32)>,
    /// The leader name the round's candidates campaign for ([`leader`]).
    leader: String,
    /// Whether every acquisition asks for `min_replicas(1)` (the replicated backend).
    min_replicas: bool,
    /// Set while the round's calm spell lasts: acquisitions then favour long ttls and
    /// long waits, so that a missed wake-up shows as a gap over the bound.
    calm: Arc<std::sync::atomic::AtomicBool>,
}

/// What a client holds: one lock, or the keys of a `lock_all`.
enum Guard {
    One(LockGuard),
    All(MultiGuard),
}

impl Guard {
    fn is_held(&self) -> bool {
        match self {
            Guard::One(g) => g.is_held(),
            Guard::All(g) => g.is_held(),
        }
    }

    async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        match self {
            Guard::One(g) => g.extend(ttl).await,
            Guard::All(g) => g.extend(ttl).await,
        }
    }

    async fn release(self) -> Result<(), LockError> {
        match self {
            Guard::One(g) => g.release().await,
            Guard::All(g) => g.release().await,
        }
    }

    /// Each key held and its fencing token.
    fn locks(&self) -> Vec<(String, u64)> {
        match self {
            Guard::One(g) => vec![(g.key().to_owned(), g.fencing_token())],
            Guard::All(g) => g
                .keys()
                .into_iter()
                .map(str::to_owned)
                .zip(g.fencing_tokens())
                .collect(),
        }
    }
}

/// The lock a client holds: the guard, its grants' indices in the client's record (one
/// per key), its ttl, and what call took it (`lock`, `write`, `fair`, `read`, `permit`,
/// `lock_all`), for the counts.
struct Held {
    guard: Guard,
    grants: Vec<usize>,
    ttl: Duration,
    call: &'static str,
    /// Its `hold_at_least`, if any.
    at_least: Option<Duration>,
}

/// One step of a client or of the nemesis, for the report of a violation.
struct Step {
    /// The keys and tokens it was on (none for the nemesis).
    locks: Vec<(String, u64)>,
    start: u64,
    end: u64,
    what: String,
    /// For an extend: whether it asked for a shorter ttl than the lock had.
    shorter: Option<bool>,
}

impl Step {
    /// Whether the step was on `g`'s lock.
    fn on(&self, g: &Grant) -> bool {
        self.locks.iter().any(|(k, t)| *k == g.key && *t == g.token)
    }
}

/// One client's record of a round.
#[derive(Default)]
struct ClientLog {
    grants: Vec<Grant>,
    /// Operations by call and outcome (`"read: extend ok"`).
    ops: Counts,
    /// The operations on held locks (and the grants), in order.
    trace: Vec<Step>,
    /// Its single-key acquire calls with a wait, for the liveness checker.
    waits: Vec<Waiter>,
    /// A leader candidate's counts ([`leader`]).
    leader: leader::Tally,
}

impl ClientLog {
    /// Counts an operation `name` of `call` and, for a held lock, traces it.
    fn note(&mut self, call: &str, name: &str, held: Option<&Held>, start: u64, detail: &str) {
        bump(&mut self.ops, &format!("{call}: {name}"));
        if let Some(h) = held {
            self.trace.push(Step {
                locks: h.guard.locks(),
                start,
                end: now_ns(),
                what: format!("{call}: {name}{detail}"),
                shorter: None,
            });
        }
    }

    /// Records a single-key acquire call with a wait that started at `sent` and ends now
    /// (a reader's under its key's reader series, see [`poll`]).
    fn waited(&mut self, id: usize, ask: &Ask<'_>, wait: Duration, sent: u64) {
        if let (Some(key), false) = (ask.key(), wait.is_zero()) {
            let key = match ask {
                Ask::Read(_) => poll::reader_series(key),
                _ => key.to_owned(),
            };
            self.waits.push(Waiter {
                client: id,
                manager: id / TASKS,
                key,
                sent,
                end: now_ns(),
            });
        }
    }

    /// Samples `is_held()`, reading the clock first (the belief held at that instant).
    fn sample(&mut self, held: &Held) {
        let at = now_ns();
        if held.guard.is_held() {
            for &g in &held.grants {
                self.grants[g].held_at(at);
            }
        }
    }

    /// Runs `op` while sampling `held`'s `is_held()` every 1–5 ms.
    async fn sampled<F: Future>(
        &mut self,
        rng: &mut fastrand::Rng,
        held: &Held,
        op: F,
    ) -> F::Output {
        self.sample(held);
        tokio::pin!(op);
        // Bounded: the ops themselves are bounded by timeouts (wait, response timeout).
        let out = loop {
            let pause = Duration::from_micros(rng.u64(1_000..5_000));
            tokio::select! {
                out = &mut op => break out,
                () = tokio::time::sleep(pause) => self.sample(held),
            }
        };
        self.sample(held);
        out
    }
}

/// One client: random operations until `end`.
async fn client(
    id: usize,
    locks: LockManager,
    keys: Arc<Keys>,
    mut rng: fastrand::Rng,
    end: Instant,
) -> ClientLog {
    let mut log = ClientLog::default();
    let mut held: Option<Held> = None;
    for _ in 0..MAX_OPS {
        if Instant::now() >= end {
            break;
        }
        held = match held.take() {
            None => acquire(id, &locks, &keys, &mut rng, &mut log).await,
            Some(h) => operate(h, &mut rng, &mut log, end).await,
        };
    }
    if let Some(h) = held {
        log.sample(&h);
        drop(h.guard);
    }
    log
}

/// What an acquire asks for.
enum Ask<'k> {
    /// `lock_with` (`write` false) or `write_with` (the same exclusive lock).
    Exclusive {
        key: &'k str,
        write: bool,
    },
    /// `fair_with`: exclusive, in the order of arrival on the server.
    Fair(&'k str),
    Read(&'k str),
    Permit(&'k str, u32),
    /// `lock_all_with` over these keys, in this (random) order.
    All(Vec<&'k str>),
}

impl Ask<'_> {
    /// A random ask over `keys`: exclusive 40 % (a third of it `fair`, a sixth
    /// `write`, the rest `lock`), read 20 %, permit 20 %, `lock_all` 20 % (over 2 keys,
    /// a quarter of the time 3).
    /// With `min_replicas` (an `InvalidOption` for readers and permits) a read is a
    /// write and a permit a lock.
    fn random<'k>(keys: &'k Keys, rng: &mut fastrand::Rng) -> Ask<'k> {
        let key = keys.locks[rng.usize(..keys.locks.len())].as_str();
        let choice = rng.u8(..10);
        if keys.min_replicas && (4..=7).contains(&choice) {
            return Ask::Exclusive {
                key,
                write: choice < 6,
            };
        }
        match choice {
            0..=3 => match rng.u8(..6) {
                0 | 1 => Ask::Fair(key),
                share => Ask::Exclusive {
                    key,
                    write: share == 2,
                },
            },
            4 | 5 => Ask::Read(key),
            6 | 7 => {
                let (key, n) = &keys.permits[rng.usize(..keys.permits.len())];
                Ask::Permit(key, *n)
            }
            _ => {
                let mut all: Vec<&str> = keys.locks.iter().map(String::as_str).collect();
                rng.shuffle(&mut all);
                all.truncate(if rng.u8(..4) == 0 { 3 } else { 2 });
                Ask::All(all)
            }
        }
    }

    /// What is asked instead in the calm spell, where a key is taken only by a waiter of
    /// it (nor are there single attempts or cancelled acquires, see [`acquire`]):
    /// * a `lock` of a `lock_all`'s first key: its attempts hold free keys for a moment,
    ///   which would take a key a waiter failed to be woken for, and hide that;
    /// * a `lock` for a fair ask: a fair waiter may rightly wait up to
    ///   `FAIR_PLACE_LASTS` behind a place whose withdrawal a fault lost before the
    ///   spell (see the module doc); the fair queues are judged by [`drain`] instead.
    fn in_calm(self) -> Self {
        match self {
            Ask::All(all) => Ask::Exclusive {
                key: all[0],
                write: false,
            },
            Ask::Fair(key) => Ask::Exclusive { key, write: false },
            ask => ask,
        }
    }

    /// The call's name, for the counts.
    fn call(&self) -> &'static str {
        match self {
            Ask::Exclusive { write: false, .. } => "lock",
            Ask::Exclusive { write: true, .. } => "write",
            Ask::Fair(_) => "fair",
            Ask::Read(_) => "read",
            Ask::Permit(..) => "permit",
            Ask::All(_) => "lock_all",
        }
    }

    /// The key of a single-key ask (`None` for `lock_all`).
    fn key(&self) -> Option<&str> {
        match self {
            Ask::Exclusive { key, .. } | Ask::Fair(key) | Ask::Read(key) | Ask::Permit(key, _) => {
                Some(key)
            }
            Ask::All(_) => None,
        }
    }

    /// What each grant of it holds.
    fn hold(&self) -> Hold {
        match self {
            Ask::Read(_) => Hold::Read,
            Ask::Permit(_, n) => Hold::Permit(*n),
            Ask::Exclusive { .. } | Ask::Fair(_) | Ask::All(_) => Hold::Exclusive,
        }
    }

    async fn run(&self, locks: &LockManager, opts: LockOptions) -> Result<Guard, LockError> {
        match self {
            Ask::Exclusive { key, write: false } => {
                locks.lock_with(key, opts).await.map(Guard::One)
            }
            Ask::Exclusive { key, write: true } => {
                locks.write_with(key, opts).await.map(Guard::One)
            }
            Ask::Fair(key) => locks.fair_with(key, opts).await.map(Guard::One),
            Ask::Read(key) => locks.read_with(key, opts).await.map(Guard::One),
            Ask::Permit(key, n) => locks.permit_with(key, *n, opts).await.map(Guard::One),
            Ask::All(keys) => locks.lock_all_with(keys, opts).await.map(Guard::All),
        }
    }
}

/// A random acquire of a random kind; its grants (one per key) are recorded.
async fn acquire(
    id: usize,
    locks: &LockManager,
    keys: &Keys,
    rng: &mut fastrand::Rng,
    log: &mut ClientLog,
) -> Option<Held> {
    let calm = keys.calm.load(std::sync::atomic::Ordering::Relaxed);
    let mut ask = Ask::random(keys, rng);
    if calm {
        ask = ask.in_calm();
    }
    let call = ask.call();
    // Mostly short ttls: the watchdog renews every ttl/3 (100-300 ms), racing extends.
    // In the calm spell most are long: a waiter that missed a wake-up then sleeps until
    // an expiry it was told, usually more than the liveness bound away.
    let ttl = match rng.u8(..4) {
        _ if calm && rng.u8(..4) != 0 => {
            between(rng, Duration::from_secs(2), Duration::from_secs(5))
        }
        0 => between(rng, Duration::from_millis(900), Duration::from_secs(2)),
        1 => between(rng, Duration::from_millis(600), Duration::from_millis(900)),
        _ => between(rng, Duration::from_millis(300), Duration::from_millis(600)),
    };
    // Four in ten are single attempts, repeated every few ms: they catch a lock that
    // expired early (waiters sleep until the ttl they last saw, or a release).
    // A `lock_all` always waits a little: all its keys are seldom free at one instant.
    // Three in ten wait long: the waiters the liveness checker judges (still waiting a
    // second after a key they want became grantable).
    let wait = if matches!(ask, Ask::All(_)) {
        between(rng, Duration::from_millis(100), Duration::from_millis(800))
    } else {
        match rng.u8(..10) {
            // In the calm spell, only long waits.
            _ if calm => between(rng, Duration::from_secs(2), Duration::from_secs(4)),
            0..=3 => Duration::ZERO,
            4..=6 => between(
                rng,
                Duration::from_millis(1_200),
                Duration::from_millis(2_500),
            ),
            _ => between(rng, Duration::ZERO, Duration::from_millis(600)),
        }
    };
    let mut opts = LockOptions::new().ttl(ttl).wait(wait);
    if keys.min_replicas {
        opts = opts.min_replicas(1);
    }
    // One in eight is not renewed (a reader one in three): held past its ttl, it leaves
    // by expiry, maybe after a shortening extend, while others wait for the key.
    let watchdog = rng.u8(..if matches!(ask, Ask::Read(_)) { 3 } else { 8 }) != 0;
    if !watchdog {
        opts = opts.watchdog(false);
    }
    // Some keep the key after an early release (ShedLock's lockAtLeastFor).
    let at_least = (rng.u8(..8) == 0)
        .then(|| between(rng, Duration::from_millis(1), Duration::from_millis(600)));
    if let Some(d) = at_least {
        opts = opts.hold_at_least(d);
    }
    let cancel_after = (rng.u8(..8) == 0 && !calm)
        .then(|| between(rng, Duration::from_millis(1), Duration::from_millis(50)));
    let sent = now_ns();
    let result = match cancel_after {
        Some(limit) => match tokio::time::timeout(limit, ask.run(locks, opts)).await {
            Ok(r) => r,
            Err(_) => {
                log.waited(id, &ask, wait, sent);
                log.note(call, "cancelled", None, sent, "");
                return None;
            }
        },
        None => ask.run(locks, opts).await,
    };
    log.waited(id, &ask, wait, sent);
    let returned = now_ns();
    match result {
        Ok(guard) => {
            let mut grants = Vec::new();
            for (key, token) in guard.locks() {
                log.grants
                    .push(Grant::new(id, key, token, sent, returned).holding(ask.hold()));
                grants.push(log.grants.len() - 1);
            }
            let held = Held {
                guard,
                grants,
                ttl,
                call,
                at_least,
            };
            let renewed = if watchdog { "" } else { ", no watchdog" };
            let detail = match at_least {
                Some(d) => format!(" (ttl {ttl:?}, hold_at_least {d:?}{renewed})"),
                None => format!(" (ttl {ttl:?}{renewed})"),
            };
            let name = if at_least.is_some() {
                "ok, hold_at_least"
            } else {
                "ok"
            };
            log.note(call, name, Some(&held), sent, &detail);
            log.sample(&held);
            Some(held)
        }
        Err(LockError::Timeout { .. }) => {
            log.note(call, "timeout", None, sent, "");
            if wait.is_zero() {
                tokio::time::sleep(between(
                    rng,
                    Duration::from_millis(2),
                    Duration::from_millis(10),
                ))
                .await;
            }
            None
        }
        Err(e) => {
            // "error ReplicasUnavailable": the variant's name.
            let debug = format!("{e:?}");
            let variant = debug.split([' ', '{', '(']).next().unwrap_or("?");
            log.note(call, &format!("error {variant}"), None, sent, "");
            // A failing backend: do not spin.
            tokio::time::sleep(Duration::from_millis(5)).await;
            None
        }
    }
}

/// A random operation on a held lock; `None` when it is no longer held by this client.
async fn operate(
    h: Held,
    rng: &mut fastrand::Rng,
    log: &mut ClientLog,
    end: Instant,
) -> Option<Held> {
    let start = now_ns();
    let call = h.call;
    match rng.u8(..12) {
        // Hold for a while (sampling): mostly short, some up to 1.5 ttl (outliving the
        // lease when renewals fail); never past the round's end.
        0..=3 => {
            let longest = if rng.u8(..4) == 0 {
                h.ttl.mul_f32(1.5)
            } else {
                h.ttl / 2
            };
            let hold = between(rng, Duration::from_millis(1), longest)
                .min(end.saturating_duration_since(Instant::now()));
            log.sampled(rng, &h, tokio::time::sleep(hold)).await;
            if !h.guard.is_held() {
                log.note(call, "hold, then found lost", Some(&h), start, "");
                drop(h.guard);
                return None;
            }
            log.note(call, "hold", Some(&h), start, "");
            Some(h)
        }
        // Extend, longer or (much) shorter than the current ttl; some cancelled mid-flight.
        4..=6 => extend(h, rng, log, start).await,
        // Release.
        7 | 8 => {
            log.sample(&h);
            let locks = h.guard.locks();
            let result = h.guard.release().await;
            let name = if result.is_ok() {
                "release ok"
            } else {
                "release error"
            };
            bump(&mut log.ops, &format!("{call}: {name}"));
            log.trace.push(Step {
                locks,
                start,
                end: now_ns(),
                what: format!("{call}: {name}"),
                shorter: None,
            });
            None
        }
        // Drop (released in the background).
        9 => {
            log.sample(&h);
            log.note(call, "drop", Some(&h), start, "");
            drop(h.guard);
            None
        }
        // An extend dropped right before the release or drop.
        choice => {
            extend_then_leave(h, rng, log, choice == 10).await;
            None
        }
    }
}

/// Extends `h`, longer or (much) shorter than its current ttl; some extends cancelled
/// mid-flight. The lock stays with the client (`Some`).
async fn extend(
    mut h: Held,
    rng: &mut fastrand::Rng,
    log: &mut ClientLog,
    start: u64,
) -> Option<Held> {
    let call = h.call;
    // Much longer (x3-x5): the next renewal, at ttl/3, then comes after the old
    // ttl ran out, so a renewal that raced the extend with the old ttl shows.
    let ttl = match rng.u8(..6) {
        0 => between(rng, h.ttl, (h.ttl * 2).min(MAX_EXTEND)),
        1..=2 => between(rng, h.ttl * 3, h.ttl * 5).min(MAX_EXTEND),
        3 => between(rng, Duration::from_millis(100), h.ttl),
        _ => between(rng, Duration::from_millis(10), h.ttl / 4),
    };
    // Some cancelled right after the request left (a loopback round trip takes
    // about a millisecond), some while a delayed request or reply is in flight.
    let cancel_after = match rng.u8(..4) {
        0 => Some(between(
            rng,
            Duration::from_micros(100),
            Duration::from_millis(2),
        )),
        1 => Some(between(
            rng,
            Duration::from_millis(2),
            Duration::from_millis(60),
        )),
        _ => None,
    };
    let guard = &h.guard;
    let result = match cancel_after {
        Some(limit) => {
            log.sampled(rng, &h, tokio::time::timeout(limit, guard.extend(ttl)))
                .await
        }
        None => Ok(log.sampled(rng, &h, guard.extend(ttl)).await),
    };
    let detail = format!(" ({:?} -> {ttl:?})", h.ttl);
    let shorter = ttl < h.ttl;
    match result {
        Ok(Ok(())) => {
            log.note(call, "extend ok", Some(&h), start, &detail);
            h.ttl = ttl;
        }
        Ok(Err(_)) => log.note(call, "extend error", Some(&h), start, &detail),
        Err(_) => log.note(call, "extend cancelled", Some(&h), start, &detail),
    }
    if let Some(step) = log.trace.last_mut() {
        step.shorter = Some(shorter);
    }
    Some(h)
}

/// Starts a longer `extend` on `h`, drops its future after one poll or up to 2 ms (the
/// request usually left), then at once releases (`release`) or drops the guard: the
/// extend, applied after the release, must re-arm nothing (a `hold_at_least` keep
/// included, issue 23's finding 2), and the release must still wake the waiters.
async fn extend_then_leave(h: Held, rng: &mut fastrand::Rng, log: &mut ClientLog, release: bool) {
    let start = now_ns();
    let call = h.call;
    let ttl = between(rng, h.ttl, (h.ttl * 3).min(MAX_EXTEND));
    log.sample(&h);
    let polled_once = rng.bool();
    let outcome = if polled_once {
        use futures::FutureExt as _;
        h.guard.extend(ttl).now_or_never().map(|r| r.is_ok())
    } else {
        let limit = between(rng, Duration::from_micros(50), Duration::from_millis(2));
        tokio::time::timeout(limit, h.guard.extend(ttl))
            .await
            .ok()
            .map(|r| r.is_ok())
    };
    log.sample(&h);
    let extend = match outcome {
        None => "cancelled",
        Some(true) => "ok",
        Some(false) => "error",
    };
    let kept = h
        .at_least
        .map_or(String::new(), |d| format!(", hold_at_least {d:?}"));
    let detail = format!(" ({:?} -> {ttl:?}{kept})", h.ttl);
    let locks = h.guard.locks();
    let name = if release {
        match h.guard.release().await {
            Ok(()) => format!("extend {extend}, release ok"),
            Err(_) => format!("extend {extend}, release error"),
        }
    } else {
        drop(h.guard);
        format!("extend {extend}, drop")
    };
    bump(&mut log.ops, &format!("{call}: {name}"));
    log.trace.push(Step {
        locks,
        start,
        end: now_ns(),
        what: format!("{call}: {name}{detail}"),
        shorter: Some(false),
    });
}

/// What the nemesis did: counts by kind, and each fault with its target and interval;
/// and its calm spells.
#[derive(Default)]
struct FaultLog {
    counts: Counts,
    trace: Vec<Step>,
    calm: Vec<Calm>,
    /// Whether a failover ended without the new replica's acknowledgement: every
    /// `min_replicas` attempt may fail then, calm or not (see [`leader`]).
    unsynced: bool,
}

impl FaultLog {
    fn note(&mut self, name: &'static str, start: u64, target: &str) {
        bump(&mut self.counts, name);
        self.trace.push(Step {
            locks: Vec::new(),
            start,
            end: now_ns(),
            what: format!("{name} {target}"),
            shorter: None,
        });
    }
}

/// The round's calm spell: when the nemesis starts it, how long it lasts, and the flag
/// the weather obeys (changed under its lock, so no weather starts inside the spell).
struct CalmGate {
    due: Instant,
    len: Duration,
    on: std::sync::Mutex<bool>,
    /// What the clients read ([`Keys::calm`]).
    flag: Arc<std::sync::atomic::AtomicBool>,
}

/// The nemesis: random faults for random durations until `end`, and one calm spell (no
/// fault at all) when `gate` is due; every fault is healed (which also clears that
/// manager's weather) before the next one and before it returns. `failover` makes the
/// first fault of a replicated set a failover.
async fn nemesis(
    servers: &mut Servers,
    proxies: &[Vec<Arc<ChaosProxy>>],
    rng: &mut fastrand::Rng,
    (end, gate, mut failover): (Instant, &CalmGate, bool),
    faults: &mut FaultLog,
) {
    let mut calmed = false;
    for _ in 0..MAX_FAULTS {
        let gap = between(rng, Duration::from_millis(20), Duration::from_millis(300));
        tokio::time::sleep(gap).await;
        if Instant::now() >= end {
            break;
        }
        // No fault may still be in effect when the spell is due.
        if !calmed && Instant::now() + Duration::from_millis(900) >= gate.due {
            calm_spell(servers, proxies, gate, end, faults).await;
            calmed = true;
            continue;
        }
        let start = now_ns();
        let len = between(rng, Duration::from_millis(100), Duration::from_millis(800));
        let choice = match servers {
            Servers::Replicated(_) if failover => 11,
            Servers::Replicated(_) => rng.u8(..12),
            _ if proxies.is_empty() => rng.u8(6..9),
            _ => rng.u8(..9),
        };
        match choice {
            0..=5 => proxy_fault(proxies, rng, choice, len, start, faults).await,
            6..=8 => server_fault(servers, rng, choice, len, start, faults).await,
            _ => {
                if let Servers::Replicated(set) = servers {
                    replica_fault(set, proxies, rng, (choice, len, start), faults).await;
                }
                failover = false;
            }
        }
    }
}

/// The calm spell: heals every proxy (the clients' weather included) and the
/// replication link, stops the weather, waits `gate.len` (or until `end`), and records
/// the spell.
async fn calm_spell(
    servers: &Servers,
    proxies: &[Vec<Arc<ChaosProxy>>],
    gate: &CalmGate,
    end: Instant,
    faults: &mut FaultLog,
) {
    let start = {
        let mut on = gate
            .on
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *on = true;
        gate.flag.store(true, std::sync::atomic::Ordering::Relaxed);
        proxies.iter().flatten().for_each(|p| p.heal());
        if let Servers::Replicated(set) = servers {
            set.link().heal();
        }
        now_ns()
    };
    tokio::time::sleep_until((Instant::now() + gate.len).min(end)).await;
    let mut on = gate
        .on
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *on = false;
    gate.flag.store(false, std::sync::atomic::Ordering::Relaxed);
    faults.calm.push(Calm {
        start,
        end: now_ns(),
    });
}

/// A fault on one client's proxies (to one node, or to all of them): delay, blackhole,
/// cut, refuse (`choice` 0-5), for `len`.
async fn proxy_fault(
    proxies: &[Vec<Arc<ChaosProxy>>],
    rng: &mut fastrand::Rng,
    choice: u8,
    len: Duration,
    start: u64,
    faults: &mut FaultLog,
) {
    let c = rng.usize(..proxies.len());
    let client = &proxies[c];
    let (chosen, target): (Vec<&Arc<ChaosProxy>>, String) = if rng.bool() {
        (
            client.iter().collect(),
            format!("{}, all nodes", who(proxies, c)),
        )
    } else {
        let n = rng.usize(..client.len());
        (vec![&client[n]], format!("{}, node {n}", who(proxies, c)))
    };
    let direction = [Direction::ToServer, Direction::ToClient][rng.usize(..2)];
    let (name, detail) = match choice {
        0 => {
            let d = between(rng, Duration::from_millis(10), Duration::from_millis(300));
            chosen.iter().for_each(|p| p.set(Fault::Delay(d)));
            tokio::time::sleep(len).await;
            ("delay both ways", format!("{d:?}"))
        }
        1 => {
            let d = between(rng, Duration::from_millis(10), Duration::from_millis(400));
            chosen
                .iter()
                .for_each(|p| p.set_direction(direction, Fault::Delay(d)));
            tokio::time::sleep(len).await;
            let name = if direction == Direction::ToServer {
                "delay requests"
            } else {
                "delay replies"
            };
            (name, format!("{d:?}"))
        }
        2 => {
            chosen
                .iter()
                .for_each(|p| p.set_direction(direction, Fault::Blackhole));
            tokio::time::sleep(len).await;
            let name = if direction == Direction::ToServer {
                "blackhole requests"
            } else {
                "blackhole replies"
            };
            (name, String::new())
        }
        3 => {
            // Requests applied, replies lost.
            chosen
                .iter()
                .for_each(|p| p.set_direction(Direction::ToClient, Fault::Blackhole));
            tokio::time::sleep(len.min(Duration::from_millis(300))).await;
            chosen.iter().for_each(|p| p.reset_all());
            ("blackhole replies, then cut", String::new())
        }
        4 => {
            chosen.iter().for_each(|p| p.reset_all());
            ("cut", String::new())
        }
        _ => {
            chosen.iter().for_each(|p| p.set(Fault::Refuse));
            tokio::time::sleep(len).await;
            ("refuse", String::new())
        }
    };
    chosen.iter().for_each(|p| p.heal());
    let target = if detail.is_empty() {
        format!("({target})")
    } else {
        format!("{detail} ({target})")
    };
    faults.note(name, start, &target);
}

/// A fault on a server the clients use: `CLIENT KILL TYPE normal` (6), `CLIENT KILL
/// ADDR` of a random connection (7), SIGSTOP for `len` (8).
async fn server_fault(
    servers: &mut Servers,
    rng: &mut fastrand::Rng,
    choice: u8,
    len: Duration,
    start: u64,
    faults: &mut FaultLog,
) {
    if choice == 8 {
        let candidates = servers.pausable();
        let node = candidates[rng.usize(..candidates.len())];
        let len = len.min(servers.max_pause());
        servers.node_mut(node).pause();
        tokio::time::sleep(len).await;
        servers.node_mut(node).resume();
        faults.note("SIGSTOP", start, &format!("(node {node})"));
        return;
    }
    let node = rng.usize(..servers.nodes().len());
    let port = servers.nodes()[node].port();
    let name = if choice == 6 {
        let _ = client_kill(port, None).await;
        "CLIENT KILL TYPE normal"
    } else {
        let _ = client_kill(port, Some(rng.u64(..))).await;
        "CLIENT KILL ADDR"
    };
    faults.note(name, start, &format!("(node {node})"));
}

/// A fault of the replicated set: the replica frozen for `len` (9), the replication
/// link blackholed for `len` or cut (10), a failover (11).
async fn replica_fault(
    set: &mut Replicated,
    proxies: &[Vec<Arc<ChaosProxy>>],
    rng: &mut fastrand::Rng,
    (choice, len, start): (u8, Duration, u64),
    faults: &mut FaultLog,
) {
    match choice {
        9 => {
            set.replica_mut().pause();
            tokio::time::sleep(len).await;
            set.replica_mut().resume();
            faults.note("replica SIGSTOP", start, "");
        }
        10 if rng.bool() => {
            set.link().set(Fault::Blackhole);
            tokio::time::sleep(len).await;
            set.link().heal();
            faults.note("replication link blackholed", start, "");
        }
        10 => {
            set.link().reset_all();
            faults.note("replication link cut", start, "");
        }
        _ => {
            let freeze = rng.bool();
            let settle = between(rng, Duration::ZERO, Duration::from_millis(200));
            let what = set.failover(proxies, freeze, settle).await;
            faults.unsynced |= what.contains("NOT synced");
            faults.note("failover", start, &format!("({what})"));
        }
    }
}

/// Changes the weather (see [`weather`]) of a random manager every 50-400 ms until `end`,
/// except in the calm spell.
async fn weather_loop(
    proxies: &[Vec<Arc<ChaosProxy>>],
    max_delay: Duration,
    rng: &mut fastrand::Rng,
    (end, gate): (Instant, &CalmGate),
    faults: &mut FaultLog,
) {
    if proxies.is_empty() {
        return;
    }
    for _ in 0..MAX_FAULTS {
        tokio::time::sleep(between(
            rng,
            Duration::from_millis(50),
            Duration::from_millis(400),
        ))
        .await;
        if Instant::now() >= end {
            break;
        }
        let start = now_ns();
        let target = {
            let on = gate
                .on
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if *on {
                continue;
            }
            weather(proxies, max_delay, rng)
        };
        faults.note("weather", start, &target);
    }
}

/// Changes one client's lasting network weather: a delay of up to `max_delay` on its
/// requests, replies or both, to every node, until the next fault on its proxies heals
/// them. This is
/// what puts extends and renewals in flight together and lets short timeouts cancel
/// extends after they were sent.
///
/// Returns what it did, for the trace.
fn weather(
    proxies: &[Vec<Arc<ChaosProxy>>],
    max_delay: Duration,
    rng: &mut fastrand::Rng,
) -> String {
    let c = rng.usize(..proxies.len());
    let client = &proxies[c];
    let d = between(rng, Duration::ZERO, max_delay);
    let fault = if d < Duration::from_millis(5) {
        Fault::Pass
    } else {
        Fault::Delay(d)
    };
    let which = rng.u8(..3);
    for p in client {
        match which {
            0 => p.set(fault),
            1 => p.set_direction(Direction::ToServer, fault),
            _ => p.set_direction(Direction::ToClient, fault),
        }
    }
    let direction = ["both ways", "requests", "replies"][usize::from(which)];
    format!("{fault:?} {direction} ({}, all nodes)", who(proxies, c))
}

/// Whose traffic proxy set `c` carries: one client's, or (Cluster) everyone's.
fn who(proxies: &[Vec<Arc<ChaosProxy>>], c: usize) -> String {
    if proxies.len() == 1 && CLIENTS > 1 {
        "all clients".to_owned()
    } else {
        format!("manager {c}")
    }
}

/// Puts one shared proxy in front of each Cluster node and makes the node announce the
/// proxy's port (`cluster-announce-port`), so that discovery and `MOVED` redirects lead
/// the clients through the proxies too; waits (10 s cap) until every node's view of the
/// cluster names only proxy ports. Returns the proxies and their URLs.
async fn announce_proxies(servers: &Servers) -> (Vec<Arc<ChaosProxy>>, Vec<String>) {
    let mut proxies = Vec::new();
    for node in servers.nodes() {
        let proxy = Arc::new(ChaosProxy::start(node.addr()).await.expect("proxy"));
        let port = proxy.addr().port().to_string();
        node.cmd_sync(&["CONFIG", "SET", "cluster-announce-port", &port])
            .expect("CONFIG SET cluster-announce-port");
        proxies.push(proxy);
    }
    let ports: Vec<String> = proxies
        .iter()
        .map(|p| format!(":{}@", p.addr().port()))
        .collect();
    let announced = || {
        servers.nodes().iter().all(|node| {
            let text = match node.cmd_sync(&["CLUSTER", "NODES"]) {
                Ok(redis::Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned(),
                Ok(redis::Value::VerbatimString { text, .. }) => text,
                _ => return false,
            };
            let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            lines.len() == ports.len()
                && lines
                    .iter()
                    .all(|l| ports.iter().any(|p| l.contains(p.as_str())))
        })
    };
    let ok = redlock_testkit::wait_until(
        Duration::from_secs(10),
        Duration::from_millis(20),
        announced,
    );
    assert!(
        ok,
        "the cluster nodes did not announce the proxy ports in time"
    );
    let urls = proxies.iter().map(|p| p.url()).collect();
    (proxies, urls)
}

/// `CLIENT KILL TYPE normal`, or (`pick` given) `CLIENT KILL ADDR` of a client connection
/// chosen from `CLIENT LIST` with `pick`; on a direct connection, bounded by a timeout.
async fn client_kill(port: u16, pick: Option<u64>) -> redis::RedisResult<()> {
    let limit = Duration::from_secs(2);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let run = async {
        let mut c = client.get_multiplexed_async_connection().await?;
        match pick {
            None => {
                let _: redis::Value = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg("normal")
                    .query_async(&mut c)
                    .await?;
            }
            Some(pick) => {
                let list: String = redis::cmd("CLIENT").arg("LIST").query_async(&mut c).await?;
                let me: i64 = redis::cmd("CLIENT").arg("ID").query_async(&mut c).await?;
                let addrs: Vec<&str> = list
                    .lines()
                    .filter(|l| !l.starts_with(&format!("id={me} ")))
                    .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("addr=")))
                    .collect();
                if !addrs.is_empty() {
                    let n = usize::try_from(pick).unwrap_or(0) % addrs.len();
                    let _: redis::Value = redis::cmd("CLIENT")
                        .arg("KILL")
                        .arg("ADDR")
                        .arg(addrs[n])
                        .query_async(&mut c)
                        .await?;
                }
            }
        }
        Ok(())
    };
    tokio::time::timeout(limit, run)
        .await
        .unwrap_or_else(|_| Err((redis::ErrorKind::Io, "CLIENT KILL timed out").into()))
}

/// A manager on `urls` (its proxies).
async fn manager(kind: Kind, urls: &[String]) -> LockManager {
    let b = LockManager::builder()
        .response_timeout(RESPONSE_TIMEOUT)
        .connect_timeout(Duration::from_secs(2));
    let b = match kind {
        Kind::Single => b.single(&urls[0]),
        Kind::Cluster => b.cluster(urls),
        Kind::Redlock => b.redlock(urls),
        Kind::Replicated => b.single(&urls[0]),
    };
    b.build().await.expect("manager builds")
}

/// What one backend's run saw.
#[derive(Default)]
struct Report {
    rounds: usize,
    ops: Counts,
    faults: Counts,
    /// Grants by what they hold (a `lock_all` counts once per key).
    grants: Counts,
    violations: Vec<Violation>,
    /// The first few violations, explained.
    details: Vec<String>,
    /// Per grant that kept believing (or got a bad token): its suspect's kind.
    suspects: Counts,
    /// The wake-up gaps judged.
    liveness: Liveness,
    /// Poll samples taken.
    polls: usize,
    /// The first few wake-up gaps over the bound, explained.
    gap_details: Vec<String>,
    /// The worst wake-up gap, explained.
    worst_gap: String,
    /// Rounds whose fair queues were checked for the drain ([`drain`]).
    drains: usize,
    /// Keys whose fair queue was not yet empty when the drain check began.
    left_at_start: usize,
    /// The longest drain, from the check's start.
    slowest_drain: Duration,
    /// The fair queues that did not drain within [`drain::DRAIN_BOUND`], explained.
    stuck: Vec<String>,
    /// Leader election's counts.
    leader: leader::Tally,
    /// The leader keys' share of the liveness findings (already in `liveness`).
    leader_liveness: Liveness,
}

/// The believing holder's last extend before the other grant returned (the usual
/// suspect), and what kind of step it was.
fn suspect<'a>(
    earlier: &Grant,
    later: &Grant,
    traces: &'a [Vec<Step>],
) -> (&'static str, Option<&'a Step>) {
    let step = traces.get(earlier.client).and_then(|steps| {
        steps
            .iter()
            .rev()
            .filter(|st| st.on(earlier))
            .find(|st| st.shorter.is_some() && st.start <= later.returned)
    });
    let kind = match step {
        None => "no extend",
        Some(st) => match (st.what.contains(": extend ok"), st.shorter) {
            (true, Some(false)) => "a longer extend succeeded (as in finding 1)",
            (true, _) => "a shorter extend succeeded (or was in flight)",
            (false, Some(true)) => "a shorter extend failed or was cancelled (as in finding 2)",
            (false, _) => "a longer extend failed or was cancelled",
        },
    };
    (kind, step)
}

/// A violation with what led to it: the steps of the holders of the grants involved on
/// those locks (times in ms from the first grant's acquire start) and the faults from 1 s
/// before the first grant until the last belief.
fn explain(
    v: &Violation,
    traces: &[Vec<Step>],
    faults: &[Step],
    seed: u64,
    round: usize,
) -> String {
    use std::fmt::Write as _;

    let grants = v.grants();
    let (first, last) = (grants[0], grants[grants.len() - 1]);
    let base = first.sent;
    let ms = |t: u64| redlock_faults::clock::ms(base, t);
    let mut out = format!("  seed {seed}, round {round}: {v}\n");
    for g in &grants {
        let who = if g.client >= CLIENTS * TASKS {
            format!("manager {}, leader candidate", g.client - CLIENTS * TASKS)
        } else {
            format!("manager {}, task {}", g.client / TASKS, g.client % TASKS)
        };
        let _ = writeln!(
            out,
            "    client {} = {who} ({}, token {}):",
            g.client, g.hold, g.token
        );
        let steps = traces.get(g.client).map_or(&[][..], Vec::as_slice);
        for st in steps.iter().filter(|st| st.on(g)) {
            let _ = writeln!(
                out,
                "      {:8.1} .. {:8.1} ms  {}",
                ms(st.start),
                ms(st.end),
                st.what
            );
        }
    }
    let (kind, step) = suspect(first, last, traces);
    let suspect = step.map_or_else(
        || kind.to_owned(),
        |st| format!("{:.1} ms: {} => {kind}", ms(st.start), st.what),
    );
    let _ = writeln!(
        out,
        "    first holder's last extend before the last grant: {suspect}"
    );
    let until = grants
        .iter()
        .map(|g| g.last_held.unwrap_or(g.returned).max(g.returned))
        .max()
        .unwrap_or(base);
    let _ = writeln!(out, "    faults:");
    for f in faults
        .iter()
        .filter(|f| f.end.saturating_add(1_000_000_000) >= base && f.start <= until)
    {
        let _ = writeln!(
            out,
            "      {:8.1} .. {:8.1} ms  {}",
            ms(f.start),
            ms(f.end),
            f.what
        );
    }
    out
}

/// The servers, their proxies and the managers of one backend's run.
struct Setup {
    servers: Servers,
    /// Per manager, one proxy per node (a Cluster: one shared set).
    proxies: Vec<Vec<Arc<ChaosProxy>>>,
    managers: Vec<LockManager>,
}

impl Setup {
    /// Starts the servers, the proxies and the managers of `kind`.
    async fn start(kind: Kind) -> Setup {
        let servers = Servers::start(kind).await;
        let nodes: Vec<std::net::SocketAddr> =
            servers.nodes().iter().map(RedisServer::addr).collect();
        // Per client, one proxy per node; a Cluster has one shared proxy per node,
        // announced by the node itself (per-client proxies would be bypassed by discovery
        // and redirects).
        let mut proxies: Vec<Vec<Arc<ChaosProxy>>> = Vec::new();
        let mut shared_urls = Vec::new();
        if kind == Kind::Cluster {
            let (shared, urls) = announce_proxies(&servers).await;
            proxies.push(shared);
            shared_urls = urls;
        }
        let mut managers = Vec::new();
        for _ in 0..CLIENTS {
            let urls: Vec<String> = if kind == Kind::Cluster {
                shared_urls.clone()
            } else {
                let mut mine = Vec::new();
                for addr in &nodes {
                    mine.push(Arc::new(ChaosProxy::start(*addr).await.expect("proxy")));
                }
                let urls = mine.iter().map(|p| p.url()).collect();
                proxies.push(mine);
                urls
            };
            managers.push(manager(kind, &urls).await);
        }
        Setup {
            servers,
            proxies,
            managers,
        }
    }
}

/// The keys of round `round` (every other round the lock keys share one hash slot, and
/// its fencing counter: a Cluster's `lock_all` is then one script, else one key after
/// the other).
fn round_keys(round: usize, min_replicas: bool) -> Keys {
    let slot = unique("nemesis");
    Keys {
        locks: (0..KEYS)
            .map(|k| {
                if round % 2 == 1 {
                    format!("{{{slot}}}:{k}")
                } else {
                    format!("{{{}}}", unique(&format!("nemesis{k}")))
                }
            })
            .collect(),
        permits: PERMITS
            .iter()
            .enumerate()
            .map(|(k, &n)| (format!("{{{}}}", unique(&format!("permits{k}"))), n))
            .collect(),
        leader: unique("nemesis-leader"),
        min_replicas,
        calm: Arc::default(),
    }
}

/// What the liveness poller watches in a round: every key (the leader's too, as a lock
/// key), permit keys judged by count
/// except on Redlock (where a permit is one of `n` places, judged free only when all
/// are).
fn poll_keys(keys: &Keys, kind: Kind) -> Vec<poll::PollKey> {
    let locks = keys.locks.iter().map(|k| poll::PollKey {
        key: k.clone(),
        permits: None,
    });
    let permits = keys.permits.iter().map(|(k, n)| poll::PollKey {
        key: k.clone(),
        permits: (kind != Kind::Redlock).then_some(*n),
    });
    let leader = std::iter::once(poll::PollKey {
        key: leader::poll_key(&keys.leader),
        permits: None,
    });
    locks.chain(permits).chain(leader).collect()
}

/// What the clients of one round recorded.
struct RoundLogs {
    grants: Vec<Grant>,
    traces: Vec<Vec<Step>>,
    waits: Vec<Waiter>,
}

/// Starts the round's clients, in their order as the checker numbers them: client `id <
/// CLIENTS * TASKS` is task `id % TASKS` of manager `id / TASKS`; client
/// `CLIENTS * TASKS + m` is manager `m`'s leader candidate.
fn spawn_clients(
    managers: &[LockManager],
    keys: &Arc<Keys>,
    rng: &mut fastrand::Rng,
    end: Instant,
) -> Vec<tokio::task::JoinHandle<ClientLog>> {
    let mut tasks: Vec<_> = (0..CLIENTS * TASKS)
        .map(|id| {
            let client_seed = rng.u64(..);
            tokio::spawn(client(
                id,
                managers[id / TASKS].clone(),
                Arc::clone(keys),
                fastrand::Rng::with_seed(client_seed),
                end,
            ))
        })
        .collect();
    tasks.extend((0..CLIENTS).map(|m| {
        let candidate_seed = rng.u64(..);
        tokio::spawn(leader::candidate(
            (CLIENTS * TASKS + m, m),
            managers[m].clone(),
            Arc::clone(keys),
            fastrand::Rng::with_seed(candidate_seed),
            end,
        ))
    }));
    tasks
}

/// Runs one round: the clients, the nemesis (with its calm spell), the weather and the
/// poller, until `ROUND` is over; adds the counts to `report`.
async fn play_round(
    kind: Kind,
    setup: &mut Setup,
    (round, rng, keys): (usize, &mut fastrand::Rng, &Arc<Keys>),
    report: &mut Report,
) -> (
    RoundLogs,
    FaultLog,
    BTreeMap<String, Vec<redlock_faults::liveness::Sample>>,
) {
    let now = Instant::now();
    let end = now + ROUND;
    let gate = CalmGate {
        due: now + between(rng, Duration::from_millis(1_000), ROUND - CALM),
        len: CALM,
        on: std::sync::Mutex::new(false),
        flag: Arc::clone(&keys.calm),
    };
    let poller = tokio::spawn(poll::run(
        setup.servers.poll_plan(),
        poll_keys(keys, kind),
        end,
    ));
    let tasks = spawn_clients(&setup.managers, keys, rng, end);
    // Redlock's per-node timeout is ttl/10 (30-200 ms here): a longer weather would
    // only make its requests fail.
    let max_delay = if kind == Kind::Redlock {
        Duration::from_millis(30)
    } else {
        Duration::from_millis(150)
    };
    let mut nemesis_rng = fastrand::Rng::with_seed(rng.u64(..));
    let mut weather_rng = fastrand::Rng::with_seed(rng.u64(..));
    let (mut faults, mut weather) = (FaultLog::default(), FaultLog::default());
    // One failover is certain in the second round of a replicated set (the others are
    // random).
    let failover = round == 1;
    let (servers, proxies) = (&mut setup.servers, &setup.proxies);
    tokio::join!(
        nemesis(
            servers,
            proxies,
            &mut nemesis_rng,
            (end, &gate, failover),
            &mut faults
        ),
        weather_loop(
            proxies,
            max_delay,
            &mut weather_rng,
            (end, &gate),
            &mut weather
        ),
    );
    faults.trace.extend(weather.trace);
    faults.trace.sort_by_key(|f| f.start);
    for (name, n) in faults.counts.iter().chain(&weather.counts) {
        *report.faults.entry(name.clone()).or_default() += n;
    }
    let mut logs = RoundLogs {
        grants: Vec::new(),
        traces: Vec::new(),
        waits: Vec::new(),
    };
    for task in tasks {
        // Bounded: every client op (a campaign, a hold) is bounded by its wait, timeouts
        // and the round's end.
        let log = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("client task ends")
            .expect("client task did not panic");
        report.leader.merge(&log.leader);
        for (name, n) in log.ops {
            *report.ops.entry(name).or_default() += n;
        }
        logs.grants.extend(log.grants);
        logs.traces.push(log.trace);
        logs.waits.extend(log.waits);
    }
    let samples = tokio::time::timeout(Duration::from_secs(10), poller)
        .await
        .expect("the poller ends")
        .expect("the poller did not panic");
    (logs, faults, samples)
}

/// Checks one round's beliefs and fencing tokens; adds the violations (the first few
/// explained) to `report`.
fn check_safety(
    kind: Kind,
    logs: &RoundLogs,
    faults: &FaultLog,
    (seed, round): (u64, usize),
    report: &mut Report,
) {
    let (grants, traces) = (&logs.grants, &logs.traces);
    for g in grants {
        bump(&mut report.grants, &g.hold.to_string());
    }
    let tokens = if kind == Kind::Redlock {
        Tokens::SharedMayRepeat
    } else {
        Tokens::Unique
    };
    let found = belief::check(grants, tokens);
    if !found.is_empty() {
        println!(
            "s10 nemesis {kind:?}: round {round}: {} violation(s)",
            found.len()
        );
    }
    // One explanation per believing (or out-of-order) grant: its later partners
    // usually share one cause.
    let mut explained = std::collections::HashSet::new();
    for v in &found {
        let grants = v.grants();
        let (first, last) = (grants[0], grants[grants.len() - 1]);
        if !explained.insert((first.key.clone(), first.token)) {
            continue;
        }
        let kind = match v {
            Violation::Fencing { .. } => "fencing",
            _ => suspect(first, last, traces).0,
        };
        // The first few, and the first of every kind of suspect.
        let first_of_kind = !report.suspects.contains_key(kind);
        bump(&mut report.suspects, kind);
        if report.details.len() < SHOWN || first_of_kind {
            report
                .details
                .push(explain(v, traces, &faults.trace, seed, round));
        }
    }
    report.violations.extend(found);
}

/// Checks one round's wake-ups ([`redlock_faults::liveness`]); adds the findings (the
/// first few gaps over the bound explained) to `report`.
fn check_liveness(
    (logs, keys): (&RoundLogs, &Keys),
    faults: &FaultLog,
    samples: &BTreeMap<String, Vec<redlock_faults::liveness::Sample>>,
    (seed, round): (u64, usize),
    report: &mut Report,
) {
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let rules = liveness::Rules {
        bound: nanos(WAKE_BOUND),
        settle: nanos(SETTLE),
        max_sample_gap: nanos(MAX_SAMPLE_GAP),
    };
    // A grant of a key ends a gap of either of its series (a leader's grant is on the
    // full key, `lock:leader:{<name>}`, polled without the prefix).
    let returned: Vec<(String, u64)> = logs
        .grants
        .iter()
        .flat_map(|g| {
            let series = g.key.strip_prefix(poll::PREFIX).unwrap_or(&g.key);
            [
                (series.to_owned(), g.returned),
                (poll::reader_series(series), g.returned),
            ]
        })
        .collect();
    // Leader campaigns are judged only when begun a settle into a calm spell, and not in
    // a round whose failover left the replica unsynced (see [`leader`]).
    let leader_key = leader::poll_key(&keys.leader);
    let waits: Vec<Waiter> = logs
        .waits
        .iter()
        .filter(|w| {
            w.key != leader_key
                || (!faults.unsynced && leader::judged(w, &faults.calm, rules.settle))
        })
        .cloned()
        .collect();
    let found = liveness::check(samples, &returned, &waits, &faults.calm, rules);
    let leader_samples: BTreeMap<String, Vec<liveness::Sample>> = samples
        .iter()
        .filter(|(k, _)| **k == leader_key)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    report.leader_liveness.merge(liveness::check(
        &leader_samples,
        &returned,
        &waits,
        &faults.calm,
        rules,
    ));
    report.polls += samples.values().map(Vec::len).sum::<usize>();
    if let Some(worst) = &found.worst {
        if report
            .liveness
            .worst
            .as_ref()
            .is_none_or(|w| worst.len() > w.len())
        {
            report.worst_gap = explain_gap(worst, logs, faults, (seed, round));
        }
    }
    for gap in &found.violations {
        if report.gap_details.len() < SHOWN {
            report
                .gap_details
                .push(explain_gap(gap, logs, faults, (seed, round)));
        }
    }
    report.liveness.merge(found);
}

/// Checks that every fair queue of the round drains ([`drain`]), once its clients
/// stopped and its faults healed; adds the findings to `report`.
async fn check_drain(
    servers: &Servers,
    keys: &Keys,
    (seed, round): (u64, usize),
    report: &mut Report,
) {
    let found = drain::check(&servers.poll_plan(), &keys.locks).await;
    report.drains += 1;
    report.left_at_start += found.left_at_start;
    report.slowest_drain = report.slowest_drain.max(found.took);
    for left in found.stuck {
        report.stuck.push(format!(
            "  seed {seed}, round {round}: the fair queue of {left} (after {:?})",
            found.took
        ));
    }
}

/// A wake-up gap with what the clients did on its key around it (ms from its start).
fn explain_gap(
    gap: &liveness::Gap,
    logs: &RoundLogs,
    faults: &FaultLog,
    (seed, round): (u64, usize),
) -> String {
    use std::fmt::Write as _;

    let ms = |t: u64| redlock_faults::clock::ms(gap.from, t);
    let mut out = format!("  seed {seed}, round {round}: wake-up gap: {gap}\n");
    let near =
        |start: u64, end: u64| end.saturating_add(3_000_000_000) >= gap.from && start <= gap.to;
    for w in logs
        .waits
        .iter()
        .filter(|w| w.key == gap.key && near(w.sent, w.end))
    {
        let _ = writeln!(
            out,
            "      {:8.1} .. {:8.1} ms  client {} (manager {}) waits",
            ms(w.sent),
            ms(w.end),
            w.client,
            w.manager
        );
    }
    for (client, steps) in logs.traces.iter().enumerate() {
        for st in steps
            .iter()
            .filter(|st| st.locks.iter().any(|(k, _)| *k == gap.key))
        {
            if near(st.start, st.end) {
                let _ = writeln!(
                    out,
                    "      {:8.1} .. {:8.1} ms  client {client}: {}",
                    ms(st.start),
                    ms(st.end),
                    st.what
                );
            }
        }
    }
    for c in &faults.calm {
        let _ = writeln!(
            out,
            "    calm spell {:.1} .. {:.1} ms",
            ms(c.start),
            ms(c.end)
        );
    }
    out
}

async fn run(kind: Kind) {
    let _heavy = HEAVY.lock().await;
    let seed = seed();
    println!("s10 nemesis {kind:?}: seed {seed} (REDLOCK_NEMESIS_SEED={seed} replays it)");
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut setup = Setup::start(kind).await;
    let rounds = if soak() { 36 } else { 3 };
    let mut report = Report::default();
    let started = std::time::Instant::now();
    for round in 0..rounds {
        let keys = Arc::new(round_keys(round, kind == Kind::Replicated));
        let (logs, faults, samples) =
            play_round(kind, &mut setup, (round, &mut rng, &keys), &mut report).await;
        check_safety(kind, &logs, &faults, (seed, round), &mut report);
        check_liveness(
            (&logs, &keys),
            &faults,
            &samples,
            (seed, round),
            &mut report,
        );
        check_drain(&setup.servers, &keys, (seed, round), &mut report).await;
        report.rounds += 1;
        // Let dropped guards be released before the next round's keys (they differ anyway).
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(setup.managers);
    print_report(kind, seed, &report, started.elapsed());
    assert!(
        report.violations.is_empty(),
        "s10 nemesis {kind:?}: {} violation(s) of the safety invariants (seed {seed}; first: {})",
        report.violations.len(),
        report.violations[0]
    );
    assert!(
        report.liveness.violations.is_empty(),
        "s10 nemesis {kind:?}: {} wake-up gap(s) over {WAKE_BOUND:?} in calm spells (seed {seed}; first: {})",
        report.liveness.violations.len(),
        report.liveness.violations[0]
    );
    assert!(
        report.stuck.is_empty(),
        "s10 nemesis {kind:?}: {} fair queue(s) not drained within {:?} (seed {seed}; first: {})",
        report.stuck.len(),
        drain::DRAIN_BOUND,
        report.stuck[0]
    );
    assert!(
        report.liveness.watched > 0,
        "s10 nemesis {kind:?}: no wait was watched in a calm spell: the run did not check liveness"
    );
    let kinds: &[&str] = if kind == Kind::Replicated {
        &["exclusive"]
    } else {
        &["exclusive", "read", "permit of 2", "permit of 3"]
    };
    for hold in kinds {
        assert!(
            report.grants.contains_key(*hold),
            "s10 nemesis {kind:?}: no {hold} lock was ever granted: the run did not check that kind"
        );
    }
    assert!(
        report.leader.elected > 0,
        "s10 nemesis {kind:?}: nobody was ever elected leader in {} campaigns: the run did not check leader election",
        report.leader.campaigns
    );
    let fair_grants: u64 = ["fair: ok", "fair: ok, hold_at_least"]
        .iter()
        .filter_map(|name| report.ops.get(*name))
        .sum();
    assert!(
        fair_grants > 0,
        "s10 nemesis {kind:?}: no fair lock was ever granted: the run did not check that kind"
    );
}

/// Prints what one backend's run saw: rounds, operations, faults, grants, violations,
/// wake-up gaps.
fn print_report(kind: Kind, seed: u64, report: &Report, took: Duration) {
    let total: u64 = report.ops.values().sum();
    let faults: u64 = report.faults.values().sum();
    let grants: u64 = report.grants.values().sum();
    println!(
        "s10 nemesis {kind:?}: seed {seed}, {} rounds in {:.1} s, {CLIENTS} managers x {TASKS} tasks, \
         {KEYS} keys + permit keys of {PERMITS:?}/round; {total} operations; {faults} faults {:?}; \
         {grants} grants {:?}; {} violations",
        report.rounds,
        took.as_secs_f64(),
        report.faults,
        report.grants,
        report.violations.len(),
    );
    // Operations by call: "lock: ok" counted under `lock`.
    let mut by_call: BTreeMap<&str, Counts> = BTreeMap::new();
    for (name, n) in &report.ops {
        let (call, op) = name.split_once(": ").unwrap_or(("?", name));
        by_call.entry(call).or_default().insert(op.to_owned(), *n);
    }
    for (call, ops) in &by_call {
        println!(
            "s10 nemesis {kind:?}: {call}: {} operations {ops:?}",
            ops.values().sum::<u64>()
        );
    }
    let l = &report.liveness;
    println!(
        "s10 nemesis {kind:?}: wake-ups: {} waits watched and {} gaps judged in calm spells ({} polls), worst gap {:.1} ms{}, {} over {WAKE_BOUND:?}",
        l.watched,
        l.judged,
        report.polls,
        l.worst_ms(),
        l.worst.as_ref().map_or(String::new(), |g| format!(" ({g})")),
        l.violations.len(),
    );
    println!(
        "s10 nemesis {kind:?}: fair queues: {} rounds checked, {} key(s) not yet drained when the check began, slowest drain {:.1} ms, {} not drained within {:?}",
        report.drains,
        report.left_at_start,
        report.slowest_drain.as_secs_f64() * 1e3,
        report.stuck.len(),
        drain::DRAIN_BOUND,
    );
    let (t, ll) = (&report.leader, &report.leader_liveness);
    println!(
        "s10 nemesis {kind:?}: leader: {} campaigns, {} elected, {} resigned, {} dropped, {} lost, {} timeouts, {} errors; \
         {} campaigns watched and {} vacancies judged in calm spells, worst {:.1} ms{}",
        t.campaigns,
        t.elected,
        t.resigned,
        t.dropped,
        t.lost,
        t.timeouts,
        t.errors,
        ll.watched,
        ll.judged,
        ll.worst_ms(),
        ll.worst.as_ref().map_or(String::new(), |g| format!(" ({g})")),
    );
    if !report.suspects.is_empty() {
        println!(
            "s10 nemesis {kind:?}: grants involved in violations, by the holder's last extend: {:?}",
            report.suspects
        );
    }
    for d in report
        .details
        .iter()
        .chain(&report.gap_details)
        .chain(&report.stuck)
    {
        println!("{d}");
    }
    if report.liveness.violations.is_empty() && !report.worst_gap.is_empty() {
        println!(
            "s10 nemesis {kind:?}: the worst wake-up gap:\n{}",
            report.worst_gap
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nemesis_single() {
    require_redis!();
    run(Kind::Single).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nemesis_cluster() {
    require_redis!();
    run(Kind::Cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nemesis_redlock() {
    require_redis!();
    run(Kind::Redlock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nemesis_replicated() {
    require_redis!();
    run(Kind::Replicated).await;
}
