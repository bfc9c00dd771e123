//! The nemesis's drain check of the fair queues: "the queue always drains".
//!
//! At the end of each round, once every client stopped (no wait is left, every guard
//! released or dropped) and every fault healed, each lock key's fair queue
//! (`<full key>:~queue`, its waiters by ticket, and `<full key>:~heartbeats`, when each
//! place runs out) must be empty, or absent, on every node that holds the key's slot (the
//! single server, each Redlock node, the Cluster master that owns it, the replicated
//! set's primary now) within [`DRAIN_BOUND`]: a waiter whose wait ended withdraws its
//! place at once, and one whose withdrawal a fault lost (a cut, a blackhole, a frozen
//! server) is dropped by the server's clock `FAIR_PLACE_LASTS` after its last attempt,
//! which came before the clients stopped. Whatever is left after the bound is a queue
//! that does not drain: reported with the key, the node and the places left.
//!
//! Asked directly (not through the clients' fault proxies), one key per request (a
//! Cluster's keys of a round may lie in different slots), every [`EVERY`] until the bound.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use super::poll::{Plan, PREFIX};

/// How long a fair waiter's place lasts without another attempt
/// (`FAIR_PLACE_LASTS` in `redlock-runtime/src/manager/wait.rs`).
const FAIR_PLACE_LASTS: Duration = Duration::from_secs(3);
/// The bound on the drain, from the check's start: a lost withdrawal's reclaim, plus
/// slack for requests a healed proxy still delivers late and the check's own polls.
pub(super) const DRAIN_BOUND: Duration = Duration::from_secs(FAIR_PLACE_LASTS.as_secs() + 2);
/// Time between two looks.
const EVERY: Duration = Duration::from_millis(50);
/// Bound on each request.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(500);

/// For each pair of KEYS (a queue and its heartbeats): '' when both are empty, else what
/// is left (the places with their tickets, the heartbeats with the time left, by the
/// server's clock, and each key's PTTL).
const SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS, 2 do
  local q = redis.call('ZRANGE', KEYS[i], 0, -1, 'WITHSCORES')
  local h = redis.call('ZRANGE', KEYS[i + 1], 0, -1, 'WITHSCORES')
  if #q == 0 and #h == 0 then
    out[#out + 1] = ''
  else
    local s = 'queue ['
    for j = 1, #q, 2 do
      s = s .. q[j] .. ' ticket ' .. q[j + 1] .. '; '
    end
    s = s .. '] pttl ' .. redis.call('PTTL', KEYS[i]) .. ', heartbeats ['
    for j = 1, #h, 2 do
      s = s .. h[j] .. ' runs out in ' .. (tonumber(h[j + 1]) - now) .. ' ms; '
    end
    out[#out + 1] = s .. '] pttl ' .. redis.call('PTTL', KEYS[i + 1])
  end
end
return out
";

/// What the drain check of one round found.
pub(super) struct Drained {
    /// Keys whose queue was not empty (or not answered for) at the check's start.
    pub(super) left_at_start: usize,
    /// How long until every queue was empty (the bound when it never was).
    pub(super) took: Duration,
    /// Per key not drained within the bound: the key, and what was left where.
    pub(super) stuck: Vec<String>,
}

/// Waits until the fair queue of every key of `keys` (user keys) is empty on every
/// node `plan` names for it, up to [`DRAIN_BOUND`].
pub(super) async fn check(plan: &Plan, keys: &[String]) -> Drained {
    let started = Instant::now();
    let mut conns = Conns::default();
    let mut left_at_start = None;
    // Bounded by DRAIN_BOUND.
    loop {
        let left = look(&mut conns, plan, keys).await;
        left_at_start.get_or_insert(left.len());
        let took = started.elapsed();
        if left.is_empty() || took >= DRAIN_BOUND {
            return Drained {
                left_at_start: left_at_start.unwrap_or(0),
                took,
                stuck: left,
            };
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// One look at every key: for each key not drained, what is left where (or which node
/// did not answer).
async fn look(conns: &mut Conns, plan: &Plan, keys: &[String]) -> Vec<String> {
    let mut left = Vec::new();
    for key in keys {
        let full = format!("{PREFIX}{key}");
        let names = [format!("{full}:~queue"), format!("{full}:~heartbeats")];
        let mut found = Vec::new();
        let answered = match plan {
            // Every node holds the key: each must answer.
            Plan::Everywhere(nodes) => {
                let nodes = nodes.lock().map(|n| n.clone()).unwrap_or_default();
                let mut all = true;
                for node in nodes {
                    match conns.ask(node, &names).await {
                        Some(what) if what.is_empty() => {}
                        Some(what) => found.push(format!("on {node}: {what}")),
                        None => {
                            all = false;
                            found.push(format!("no answer from {node}"));
                        }
                    }
                }
                all
            }
            // The master that owns the key's slot answers; the others redirect.
            Plan::Owner(masters) => {
                let mut owner = false;
                for &node in masters {
                    if let Some(what) = conns.ask(node, &names).await {
                        owner = true;
                        if !what.is_empty() {
                            found.push(format!("on {node}: {what}"));
                        }
                    }
                }
                if !owner {
                    found.push("no master answered".to_owned());
                }
                owner
            }
        };
        if !answered || !found.is_empty() {
            left.push(format!("{key}: {}", found.join("; ")));
        }
    }
    left
}

/// One connection per node, reopened after an error.
#[derive(Default)]
struct Conns(HashMap<SocketAddr, redis::aio::MultiplexedConnection>);

impl Conns {
    /// What is left of one key's queue on `node` ('' for nothing); `None` on any error
    /// (a redirect included) or timeout.
    async fn ask(&mut self, node: SocketAddr, names: &[String; 2]) -> Option<String> {
        let mut conn = match self.0.get(&node) {
            Some(c) => c.clone(),
            None => {
                let client = redis::Client::open(format!("redis://{node}")).ok()?;
                let c = tokio::time::timeout(
                    REQUEST_TIMEOUT,
                    client.get_multiplexed_async_connection(),
                )
                .await
                .ok()?
                .ok()?;
                self.0.insert(node, c.clone());
                c
            }
        };
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(SCRIPT).arg(2).arg(&names[..]);
        match tokio::time::timeout(REQUEST_TIMEOUT, cmd.query_async::<Vec<String>>(&mut conn)).await
        {
            Ok(Ok(mut v)) if v.len() == 1 => v.pop(),
            _ => {
                self.0.remove(&node);
                None
            }
        }
    }
}
