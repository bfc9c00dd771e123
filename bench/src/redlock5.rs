//! Redlock over 5 independent masters against one server: uncontended lock + release,
//! 1 task. Both sides run on servers of the same set, so only the topology differs.

use std::sync::Arc;

use redlock::LockManager;

use crate::lockers::{Locker, RSLOCK};
use crate::raw::{err, Res};
use crate::stats::{fixed, group, paired, with_spread, Runs, Table};
use crate::uncontended::measure;
use crate::Config;

// ---------------------------------------------------------------------------------------
// REDLOCK BACKEND HOOK. The one place that builds a Redlock manager; `None` prints
// "n/a: redlock backend not available" and leaves `redlock5_vs_single` n/a.
async fn redlock_manager(urls: &[String]) -> Option<Res<LockManager>> {
    Some(
        LockManager::builder()
            .redlock(urls)
            .build()
            .await
            .map_err(err),
    )
}
// ---------------------------------------------------------------------------------------

/// Prints the table; returns Redlock-5's µs per lock+release ÷ single's.
pub async fn run(cfg: &Config, urls: &[String], pids: &[u32]) -> Res<f64> {
    let single = LockManager::connect(&urls[0]).await.map_err(err)?;
    let mut impls: Vec<(String, Arc<Locker>)> =
        vec![("redlock single".into(), Arc::new(Locker::Redlock(single)))];
    let mut missing = None;
    match redlock_manager(urls).await {
        Some(Ok(m)) => impls.push(("redlock Redlock-5".into(), Arc::new(Locker::Redlock(m)))),
        Some(Err(e)) => missing = Some(e),
        None => missing = Some("redlock backend not available".into()),
    }
    impls.push((
        format!("{RSLOCK} single"),
        Arc::new(Locker::Rslock(rslock::LockManager::new(vec![
            urls[0].as_str()
        ]))),
    ));
    impls.push((
        format!("{RSLOCK} Redlock-5"),
        Arc::new(Locker::Rslock(rslock::LockManager::new(urls.to_vec()))),
    ));
    let results = measure(cfg, &impls, "r5", 1, pids).await;
    let mut t = Table::new(
        format!(
            "Redlock over {} masters vs one server: lock+release, 1 task ({} runs × {:.2} s each, in interleaved slices)",
            urls.len(),
            cfg.runs,
            cfg.dur.as_secs_f64()
        ),
        &[
            "implementation",
            "ops/s",
            "µs/op",
            "client CPU µs/op",
            "servers' CPU µs/op",
            "µs/op ÷ single",
        ],
    );
    let mut single: [Option<&Runs>; 2] = [None; 2];
    let mut ratio = f64::NAN;
    for ((name, _), r) in impls.iter().zip(&results) {
        let crate_ix = usize::from(name.starts_with(RSLOCK));
        match r {
            Ok(m) => {
                let per_op = 1e6 / m.ops.median();
                if name.ends_with("single") {
                    single[crate_ix] = Some(&m.ops);
                }
                // Time per op ÷ single's = single's ops/s ÷ this one's, run by run.
                let x = single[crate_ix].map_or_else(Runs::default, |s| paired(s, &m.ops));
                if name == "redlock Redlock-5" {
                    ratio = x.median();
                }
                t.row(vec![
                    name.clone(),
                    with_spread(&m.ops, group),
                    fixed(1)(per_op),
                    fixed(1)(m.client_us.median()),
                    fixed(1)(m.server_us.median()),
                    with_spread(&x, fixed(2)),
                ]);
            }
            Err(e) => t.na(name, e),
        }
        if name == "redlock single" {
            if let Some(why) = &missing {
                t.na("redlock Redlock-5", why);
            }
        }
    }
    t.note("single = the first server of the same set; Redlock-5 acquires on all masters concurrently and needs a quorum of 3");
    t.note("servers' CPU: all five redis-server processes, charged to the operations of each row");
    t.print();
    Ok(ratio)
}
