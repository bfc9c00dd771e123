//! Server time per call of each script a lock runs, against a budget.
//!
//! Every request of the default lock is one Lua script on the server, and a script's
//! cost is paid by everyone on that server. This scenario runs each kind of request
//! alone, on distinct keys, and reads the server's own account of it (`INFO
//! commandstats`: calls and microseconds of `EVALSHA`, nested `redis.call`s included),
//! beside two baselines measured the same way in the same run: a native `SET NX PX`
//! (what an unfenced acquire costs) and the raw compare-and-delete script (the cheapest
//! script that does anything: one `GET`, one `DEL`). Each script has a budget, a ratio
//! to one of them; a script over its budget is named on a `budget broken:` line.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::try_join_all;
use redis::aio::MultiplexedConnection;
use redlock::{LockGuard, LockManager, LockOptions};

use crate::cpu::{command_times, CommandStat};
use crate::raw::{connect, err, token, Res};
use crate::stats::{fixed, Table};
use crate::Config;

const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// Requests in flight at once while a phase runs (the server's time per call does not
/// depend on it; the phase's wall time does).
const IN_FLIGHT: usize = 64;

/// One script's request and its budget: at most `budget` × the raw compare-and-delete's
/// server time per call.
struct Budget {
    request: &'static str,
    budget: f64,
}

/// The budgets, in the order the table prints them. Every request is one script, whose
/// call alone costs the server about what the raw compare-and-delete costs (entering Lua,
/// `KEYS` and `ARGV`): so each budget is a ratio to that script, and says how much a
/// request may do beyond it. An acquire issues a fence (`INCR`) and writes metadata: twice
/// it; a release also wakes the waiters (`PUBLISH`): half as much again; an extend or a
/// renewal compares and sets an expiry: as much as a compare-and-delete, a renewal less
/// (a batch shares one call). Readers and permits keep a set of holders and their expiries.
const BUDGETS: [Budget; 10] = [
    Budget {
        request: "lock (acquire.lua)",
        budget: 2.0,
    },
    Budget {
        request: "extend (extend.lua)",
        budget: 1.3,
    },
    Budget {
        request: "renewal, per lock (renew.lua)",
        budget: 1.0,
    },
    Budget {
        request: "release (release.lua)",
        budget: 1.5,
    },
    Budget {
        request: "read (acquire_shared.lua)",
        budget: 4.0,
    },
    Budget {
        request: "read release (release_shared.lua)",
        budget: 3.0,
    },
    Budget {
        request: "permit of 4 (acquire_shared.lua)",
        budget: 4.0,
    },
    Budget {
        request: "permit release (release_shared.lua)",
        budget: 3.0,
    },
    Budget {
        request: "lock_all of 4, per key (acquire_all.lua)",
        budget: 1.5,
    },
    Budget {
        request: "lock_all release, per key (release.lua)",
        budget: 1.5,
    },
];

/// What the `ratios:` line takes from this scenario.
pub struct Costs {
    /// The lock's acquire script ÷ a native `SET NX PX`, server time per call.
    pub acquire_vs_set: f64,
    /// The release script ÷ the raw compare-and-delete script.
    pub release_vs_cad: f64,
}

/// Calls and time of the script commands between two snapshots.
fn scripts(
    before: &HashMap<String, CommandStat>,
    after: &HashMap<String, CommandStat>,
) -> CommandStat {
    command(before, after, &["evalsha", "eval", "evalsha_ro", "eval_ro"])
}

/// Calls and time of `names` between two snapshots, summed.
fn command(
    before: &HashMap<String, CommandStat>,
    after: &HashMap<String, CommandStat>,
    names: &[&str],
) -> CommandStat {
    let mut out = CommandStat::default();
    for name in names {
        let a = after.get(*name).copied().unwrap_or_default();
        let b = before.get(*name).copied().unwrap_or_default();
        out.calls += a.calls - b.calls;
        out.usec += a.usec - b.usec;
    }
    out
}

/// One measured request: server µs per script call (per key for `lock_all`), and script
/// calls per request.
#[derive(Debug, Clone, Copy)]
struct Measured {
    us_per_call: f64,
    calls_per_op: f64,
}

impl Measured {
    /// `s` over `ops` requests of `keys` keys each.
    fn of(s: CommandStat, ops: usize, keys: usize) -> Self {
        let ops = ops.max(1);
        Self {
            // Per request (per key for lock_all), not per call: concurrent plain
            // requests share calls (coalescing), and the server's time is what counts.
            us_per_call: s.usec as f64 / (ops * keys) as f64,
            calls_per_op: s.calls as f64 / ops as f64,
        }
    }
}

/// Runs `op` on each of `items`, `IN_FLIGHT` at a time, and returns the server's
/// script calls and time of the phase.
async fn phase<T, F, Fut, R>(
    probe: &mut MultiplexedConnection,
    items: Vec<T>,
    op: F,
) -> Res<(CommandStat, Vec<R>)>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Res<R>>,
{
    let before = command_times(probe).await?;
    let mut out = Vec::with_capacity(items.len());
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        let chunk: Vec<Fut> = items.by_ref().take(IN_FLIGHT).map(&op).collect();
        out.extend(try_join_all(chunk).await?);
    }
    let after = command_times(probe).await?;
    Ok((scripts(&before, &after), out))
}

/// Server µs per call of a native `SET NX PX` and of the raw compare-and-delete, `n`
/// keys each.
async fn baselines(probe: &mut MultiplexedConnection, url: &str, n: usize) -> Res<(f64, f64)> {
    let con = connect(url).await?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(RELEASE)
        .query_async(&mut con.clone())
        .await
        .map_err(err)?;
    let keys: Vec<(String, [u8; 16])> = (0..n)
        .map(|i| (format!("costs:raw:{i}"), token()))
        .collect();
    let before = command_times(probe).await?;
    let mut set = keys.iter();
    let mut rest = keys.len();
    while rest > 0 {
        let chunk: Vec<_> = set.by_ref().take(IN_FLIGHT).collect();
        rest -= chunk.len();
        try_join_all(chunk.into_iter().map(|(k, t)| {
            let mut c = con.clone();
            async move {
                redis::cmd("SET")
                    .arg(k)
                    .arg(&t[..])
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async::<Option<String>>(&mut c)
                    .await
                    .map_err(err)
            }
        }))
        .await?;
    }
    let mid = command_times(probe).await?;
    for chunk in keys.chunks(IN_FLIGHT) {
        try_join_all(chunk.iter().map(|(k, t)| {
            let mut c = con.clone();
            let sha = sha.clone();
            async move {
                redis::cmd("EVALSHA")
                    .arg(&sha)
                    .arg(1)
                    .arg(k)
                    .arg(&t[..])
                    .query_async::<i64>(&mut c)
                    .await
                    .map_err(err)
            }
        }))
        .await?;
    }
    let after = command_times(probe).await?;
    let set = command(&before, &mid, &["set"]);
    let cad = scripts(&mid, &after);
    if set.calls != n as u64 || cad.calls != n as u64 {
        return Err(format!(
            "baselines: {} SETs and {} scripts for {n} keys",
            set.calls, cad.calls
        ));
    }
    Ok((
        set.usec as f64 / set.calls as f64,
        cad.usec as f64 / cad.calls as f64,
    ))
}

/// `n` keys named after `what`.
fn keys(what: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("costs:{what}:{i}")).collect()
}

/// Every request of the exclusive, read, permit and `lock_all` kinds, in `BUDGETS` order.
async fn requests(
    probe: &mut MultiplexedConnection,
    locks: &LockManager,
    n: usize,
) -> Res<Vec<Measured>> {
    let one = |s: CommandStat| Measured::of(s, n, 1);
    let mut out = Vec::new();
    let (lock, guards) = phase(probe, keys("lock", n), |k| async move {
        locks.lock(&k).await.map_err(err)
    })
    .await?;
    out.push(one(lock));
    let (extend, guards) = phase(probe, guards, |g| async move {
        g.extend(Duration::from_secs(30)).await.map_err(err)?;
        Ok(g)
    })
    .await?;
    out.push(one(extend));
    out.push(renewal(probe, locks, n).await?);
    out.push(one(release(probe, guards).await?));
    let (read, guards) = phase(probe, keys("read", n), |k| async move {
        locks.read(&k).await.map_err(err)
    })
    .await?;
    out.push(one(read));
    out.push(one(release(probe, guards).await?));
    let (permit, guards) = phase(probe, keys("permit", n), |k| async move {
        locks.permit(&k, 4).await.map_err(err)
    })
    .await?;
    out.push(one(permit));
    out.push(one(release(probe, guards).await?));
    let sets: Vec<Vec<String>> = keys("all", n).chunks(4).map(<[String]>::to_vec).collect();
    let (all, guards) = phase(probe, sets, |ks| async move {
        locks
            .lock_all(ks.iter().map(String::as_str))
            .await
            .map_err(err)
    })
    .await?;
    out.push(Measured::of(all, n / 4, 4));
    let (all_release, _) = phase(
        probe,
        guards,
        |g| async move { g.release().await.map_err(err) },
    )
    .await?;
    out.push(Measured::of(all_release, n / 4, 4));
    Ok(out)
}

/// Releases every guard, a phase of its own.
async fn release(probe: &mut MultiplexedConnection, guards: Vec<LockGuard>) -> Res<CommandStat> {
    let (s, _) = phase(
        probe,
        guards,
        |g| async move { g.release().await.map_err(err) },
    )
    .await?;
    Ok(s)
}

/// The watchdog's renewal, per lock: `n` locks with a short ttl held over several
/// renewal ticks; the script time of the window over the locks renewed in it (each
/// renewed lock is one nested `PEXPIRE`).
async fn renewal(
    probe: &mut MultiplexedConnection,
    locks: &LockManager,
    n: usize,
) -> Res<Measured> {
    let ttl = Duration::from_millis(600);
    let options = LockOptions::new().ttl(ttl);
    let mut guards = Vec::with_capacity(n);
    for chunk in keys("renew", n).chunks(IN_FLIGHT) {
        guards.extend(
            try_join_all(chunk.iter().map(|k| locks.lock_with(k, options.clone())))
                .await
                .map_err(err)?,
        );
    }
    let before = command_times(probe).await?;
    tokio::time::sleep(ttl * 2).await;
    let after = command_times(probe).await?;
    release(probe, guards).await?;
    let s = scripts(&before, &after);
    let renewed = command(&before, &after, &["pexpire"]).calls;
    if renewed == 0 {
        return Err("no renewal in two ttls".into());
    }
    Ok(Measured {
        us_per_call: s.usec as f64 / renewed as f64,
        calls_per_op: s.calls as f64 / renewed as f64,
    })
}

/// Budget of a Redlock lock + release, its scripts' time summed over the masters, as a
/// ratio to what the same lock + release costs one server (the lock and release rows of
/// this run) times the masters: Redlock may add a tenth, not a script per master.
const REDLOCK_BUDGET: f64 = 1.1;

/// A Redlock lock + release over the masters at `urls`: the scripts' time on all of them
/// per pair, and script calls per pair.
async fn redlock_pair(urls: &[String], n: usize) -> Res<Measured> {
    let locks = LockManager::builder()
        .redlock(urls)
        .build()
        .await
        .map_err(err)?;
    let mut probes = Vec::with_capacity(urls.len());
    for url in urls {
        probes.push(connect(url).await?);
    }
    let snapshot = |mut probes: Vec<MultiplexedConnection>| async move {
        let mut stats = Vec::with_capacity(probes.len());
        for p in &mut probes {
            stats.push(command_times(p).await?);
        }
        Res::Ok((probes, stats))
    };
    let pair = |k: String| {
        let locks = &locks;
        async move {
            locks
                .lock(&k)
                .await
                .map_err(err)?
                .release()
                .await
                .map_err(err)
        }
    };
    // Warm-up.
    for k in keys("redlock:warm", IN_FLIGHT) {
        pair(k).await?;
    }
    let (probes, before) = snapshot(probes).await?;
    for chunk in keys("redlock", n).chunks(IN_FLIGHT) {
        try_join_all(chunk.iter().cloned().map(pair)).await?;
    }
    let (_, after) = snapshot(probes).await?;
    let mut total = CommandStat::default();
    for (b, a) in before.iter().zip(&after) {
        let s = scripts(b, a);
        total.calls += s.calls;
        total.usec += s.usec;
    }
    Ok(Measured {
        us_per_call: total.usec as f64 / n.max(1) as f64,
        calls_per_op: total.calls as f64 / n.max(1) as f64,
    })
}

/// Script calls per request: a fraction below 0.1 as `1/N` (a renewal batch's share).
fn per_request(x: f64) -> String {
    if x > 0.0 && x < 0.1 {
        format!("1/{:.0}", 1.0 / x)
    } else {
        fixed(2)(x)
    }
}

/// Measures every script on the server at `url` (and a Redlock lock + release on the
/// masters at `set`, when given) and prints the table.
pub async fn run(cfg: &Config, url: &str, set: Option<&[String]>) -> Res<Costs> {
    let n = if cfg.quick { 2_000 } else { 10_000 };
    let mut probe = connect(url).await?;
    let locks = LockManager::connect(url).await.map_err(err)?;
    // Warm-up: scripts loaded, connections open, allocator settled.
    let _ = requests(&mut probe, &locks, 256).await?;
    let (set_us, cad) = baselines(&mut probe, url, n).await?;
    let measured = requests(&mut probe, &locks, n).await?;
    let mut t = Table::new(
        format!("server time per request ({n} requests each, distinct keys, INFO commandstats)"),
        &[
            "request",
            "scripts/request",
            "µs/request",
            "÷ compare-and-delete",
            "budget",
            "",
        ],
    );
    t.row(vec![
        "SET NX PX (baseline)".into(),
        "-".into(),
        fixed(2)(set_us),
        String::new(),
        String::new(),
        String::new(),
    ]);
    t.row(vec![
        "raw compare-and-delete (baseline)".into(),
        "1.00".into(),
        fixed(2)(cad),
        format!("{} SET NX PX", fixed(2)(cad / set_us)),
        String::new(),
        String::new(),
    ]);
    let mut broken = Vec::new();
    for (b, m) in BUDGETS.iter().zip(&measured) {
        let ratio = m.us_per_call / cad;
        let over = ratio > b.budget;
        if over {
            broken.push(format!(
                "{} {ratio:.2}× compare-and-delete > {:.2}×",
                b.request, b.budget
            ));
        }
        t.row(vec![
            b.request.into(),
            per_request(m.calls_per_op),
            fixed(2)(m.us_per_call),
            fixed(2)(ratio),
            format!("≤ {}", fixed(2)(b.budget)),
            if over {
                "over budget".into()
            } else {
                "ok".into()
            },
        ]);
    }
    if let Some(urls) = set {
        let m = redlock_pair(urls, n / 4).await?;
        let base = urls.len() as f64 * (measured[0].us_per_call + measured[3].us_per_call);
        let ratio = m.us_per_call / base;
        let request = format!("Redlock-{} lock + release, all masters", urls.len());
        if ratio > REDLOCK_BUDGET {
            broken.push(format!(
                "{request} {ratio:.2}× {} single-server lock + release > {REDLOCK_BUDGET:.2}×",
                urls.len()
            ));
        }
        t.row(vec![
            request,
            per_request(m.calls_per_op),
            fixed(2)(m.us_per_call),
            format!("{} {}×(lock+release)", fixed(2)(ratio), urls.len()),
            format!("≤ {}", fixed(2)(REDLOCK_BUDGET)),
            if ratio > REDLOCK_BUDGET {
                "over budget".into()
            } else {
                "ok".into()
            },
        ]);
    }
    t.note("µs/request: the server's usec in EVALSHA over the phase (nested redis.calls included) ÷ its requests, per key for lock_all; a renewal is one lock's share of a watchdog batch");
    t.note("scripts/request: script calls the server saw per request (1.00: one call each; below 1: concurrent plain locks and releases shared calls)");
    t.print();
    if broken.is_empty() {
        println!("budgets: every script within its budget");
    } else {
        println!("budget broken: {}", broken.join("; "));
    }
    Ok(Costs {
        acquire_vs_set: measured[0].us_per_call / set_us,
        release_vs_cad: measured[3].us_per_call / cad,
    })
}
