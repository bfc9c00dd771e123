//! The nemesis's poller: every few milliseconds, each key's state on the server, asked
//! directly (not through the clients' fault proxies) with one atomic script per node, for
//! the liveness checker ([`redlock_faults::liveness`]).
//!
//! For each key the script reports, at the server's `TIME`: whether the lock key exists
//! and whether it holds the readers' marker, how many live holders its holders set has
//! (readers, permits, `hold_at_least` keeps under their kept names), how many live
//! writers' intents, and how many of its first three permit places (Redlock's permits)
//! exist. Grantable on a node, and so when on every node asked:
//!
//! * a lock key, for a writer (`lock`, `write`): nothing there but maybe writers'
//!   intents (an exclusive acquire does not look at intents, see `acquire.lua`);
//!   sampled under the key's name;
//! * a lock key, for a reader: free, or held by readers alone, and no live intent
//!   (`acquire_shared.lua` refuses readers while one is unexpired); sampled under
//!   [`reader_series`] of the key's name;
//! * a permit key of `n` outside Redlock: fewer than `n` live holders; on Redlock
//!   (where a permit is one of `n` places) only when everything is absent.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlock_faults::clock::now_ns;
use redlock_faults::liveness::Sample;
use tokio::time::Instant;

/// The default key prefix of a `LockManager`.
pub(super) const PREFIX: &str = "lock:";
/// Names per key passed to the script: its holders, its writers' intents, three permit
/// places, and the key itself.
const NAMES: usize = 6;
/// Time between polls.
const EVERY: Duration = Duration::from_millis(4);
/// Bound on each poll's reply (a frozen server yields no sample).
const POLL_TIMEOUT: Duration = Duration::from_millis(100);
/// Polls per round, at most (the round's end bounds it first).
const MAX_POLLS: usize = 10_000;

/// Per key, four counts at the server's now: the key (0 absent, 1 the readers' marker,
/// 2 anything else), live holders, live intents, permit places that exist.
const SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS, 6 do
  local k = redis.call('GET', KEYS[i + 5])
  local code = 0
  if k then
    code = 2
    if string.sub(k, 1, 5) == '~read' then
      code = 1
    end
  end
  out[#out + 1] = code
  out[#out + 1] = redis.call('ZCOUNT', KEYS[i], '(' .. now, '+inf')
  out[#out + 1] = redis.call('ZCOUNT', KEYS[i + 1], '(' .. now, '+inf')
  out[#out + 1] = redis.call('EXISTS', KEYS[i + 2], KEYS[i + 3], KEYS[i + 4])
end
return out
";

/// A key to poll: its user key and, for a permit key judged by count, its `n`.
#[derive(Clone, Debug)]
pub(super) struct PollKey {
    pub(super) key: String,
    /// `Some(n)`: grantable while fewer than `n` holders live; `None`: only when free.
    pub(super) permits: Option<u32>,
}

impl PollKey {
    /// The names the library uses for the key (`key.rs`: companions of a key with a
    /// hash tag are the key plus a suffix).
    fn names(&self) -> [String; NAMES] {
        let k = format!("{PREFIX}{}", self.key);
        [
            format!("{k}:~holders"),
            format!("{k}:~writers"),
            format!("{k}:~permit:0"),
            format!("{k}:~permit:1"),
            format!("{k}:~permit:2"),
            k,
        ]
    }

    /// The sample series of the key: a permit key's, or a lock key's for writers and
    /// for readers.
    fn series(&self) -> Vec<String> {
        match self.permits {
            Some(_) => vec![self.key.clone()],
            None => vec![self.key.clone(), reader_series(&self.key)],
        }
    }

    /// Whether a node's four counts leave the key grantable, per [`series`](Self::series).
    fn grantable(&self, counts: &[i64]) -> Vec<bool> {
        let &[key, holders, intents, places] = counts else {
            return vec![false; self.series().len()];
        };
        match self.permits {
            Some(n) => vec![holders < i64::from(n) && intents == 0 && places == 0],
            None => {
                let free = key == 0 && holders == 0 && places == 0;
                let read = (free || key == 1) && intents == 0 && places == 0;
                vec![free, read]
            }
        }
    }
}

/// The name under which a lock key's state for readers is sampled (and its readers'
/// waits recorded).
pub(super) fn reader_series(key: &str) -> String {
    format!("{key} (read)")
}

/// Which node answers for which keys.
pub(super) enum Plan {
    /// Every node of the shared list (the current primary, or Redlock's nodes) has every
    /// key; the list may change (a failover).
    Everywhere(Arc<Mutex<Vec<SocketAddr>>>),
    /// A Cluster: each key on the master that owns its slot, found by asking each.
    Owner(Vec<SocketAddr>),
}

/// Polls `keys` until `end`; returns the samples by user key.
pub(super) async fn run(
    plan: Plan,
    keys: Vec<PollKey>,
    end: Instant,
) -> BTreeMap<String, Vec<Sample>> {
    let mut conns = Conns::default();
    let owners = match &plan {
        Plan::Owner(masters) => Some(owners(&mut conns, masters, &keys).await),
        Plan::Everywhere(_) => None,
    };
    let mut out: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    for _ in 0..MAX_POLLS {
        if Instant::now() >= end {
            break;
        }
        let tick = Instant::now();
        // (node, indices of the keys it answers for)
        let groups: Vec<(SocketAddr, Vec<usize>)> = match (&plan, &owners) {
            (Plan::Owner(_), Some(owners)) => owners
                .iter()
                .enumerate()
                .filter_map(|(i, o)| o.map(|node| (node, vec![i])))
                .collect(),
            (Plan::Everywhere(nodes), _) => {
                let nodes = nodes.lock().map(|n| n.clone()).unwrap_or_default();
                let all: Vec<usize> = (0..keys.len()).collect();
                nodes.into_iter().map(|n| (n, all.clone())).collect()
            }
            _ => Vec::new(),
        };
        poll_once(&mut conns, &groups, &keys, &mut out).await;
        tokio::time::sleep_until(tick + EVERY).await;
    }
    out
}

/// One poll of every group; a key's series get a sample when every node asked about
/// the key answered.
async fn poll_once(
    conns: &mut Conns,
    groups: &[(SocketAddr, Vec<usize>)],
    keys: &[PollKey],
    out: &mut BTreeMap<String, Vec<Sample>>,
) {
    // Per key: (before, after, grantable so far per series).
    let mut state: Vec<Option<(u64, u64, Vec<bool>)>> = vec![None; keys.len()];
    let mut failed = vec![false; keys.len()];
    for (node, idx) in groups {
        let before = now_ns();
        let asked: Vec<&PollKey> = idx.iter().map(|&i| &keys[i]).collect();
        let reply = conns.counts(*node, &asked).await;
        let after = now_ns();
        match reply {
            Some(counts) if counts.len() == 4 * idx.len() => {
                for (j, &i) in idx.iter().enumerate() {
                    let ok = keys[i].grantable(&counts[4 * j..4 * j + 4]);
                    let s = state[i].get_or_insert_with(|| (before, after, vec![true; ok.len()]));
                    s.0 = s.0.min(before);
                    s.1 = s.1.max(after);
                    s.2.iter_mut().zip(ok).for_each(|(g, ok)| *g = *g && ok);
                }
            }
            _ => idx.iter().for_each(|&i| failed[i] = true),
        }
    }
    for (i, s) in state.into_iter().enumerate() {
        let (Some((before, after, grantable)), false) = (s, failed[i]) else {
            continue;
        };
        for (name, grantable) in keys[i].series().into_iter().zip(grantable) {
            out.entry(name).or_default().push(Sample {
                before,
                after,
                grantable,
            });
        }
    }
}

/// For each key, the master that owns it (the one that runs the script on it), asked
/// for up to 2 s.
async fn owners(
    conns: &mut Conns,
    masters: &[SocketAddr],
    keys: &[PollKey],
) -> Vec<Option<SocketAddr>> {
    let mut found = vec![None; keys.len()];
    let started = Instant::now();
    while found.iter().any(Option::is_none) && started.elapsed() < Duration::from_secs(2) {
        for (i, key) in keys.iter().enumerate() {
            if found[i].is_some() {
                continue;
            }
            for &m in masters {
                if conns.counts(m, &[key]).await.is_some() {
                    found[i] = Some(m);
                    break;
                }
            }
        }
    }
    found
}

/// One connection per node, reopened after an error (`CLIENT KILL` kills it too).
#[derive(Default)]
struct Conns(HashMap<SocketAddr, redis::aio::MultiplexedConnection>);

impl Conns {
    /// The script's counts for `keys` on `node`; `None` on any error or timeout.
    async fn counts(&mut self, node: SocketAddr, keys: &[&PollKey]) -> Option<Vec<i64>> {
        let conn = match self.0.get(&node) {
            Some(c) => c.clone(),
            None => {
                let client = redis::Client::open(format!("redis://{node}")).ok()?;
                let c =
                    tokio::time::timeout(POLL_TIMEOUT, client.get_multiplexed_async_connection())
                        .await
                        .ok()?
                        .ok()?;
                self.0.insert(node, c.clone());
                c
            }
        };
        let mut conn = conn;
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(SCRIPT).arg(keys.len() * NAMES);
        for k in keys {
            cmd.arg(&k.names()[..]);
        }
        match tokio::time::timeout(POLL_TIMEOUT, cmd.query_async::<Vec<i64>>(&mut conn)).await {
            Ok(Ok(v)) => Some(v),
            _ => {
                self.0.remove(&node);
                None
            }
        }
    }
}
