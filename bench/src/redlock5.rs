//! Redlock over 5 independent masters against one server: uncontended lock + release,
//! 1 task. Both sides run on servers of the same set, so only the topology differs.

use std::sync::Arc;

use redlock::LockManager;

use crate::lockers::{Locker, RSLOCK};
use crate::raw::{err, Raw, Res};
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

/// The names of the raw rows: the machine's floor, one server and all of them at once.
const RAW_ONE: &str = "raw redis-rs ×1";
const RAW_ALL: &str = "raw redis-rs ×N in parallel (floor)";

/// Redlock-5's µs per lock+release ÷ single's, and ÷ the floor's.
pub struct Ratios {
    pub vs_single: f64,
    pub vs_floor: f64,
}

/// Prints the table.
pub async fn run(cfg: &Config, urls: &[String], pids: &[u32]) -> Res<Ratios> {
    let single = LockManager::connect(&urls[0]).await.map_err(err)?;
    let mut impls: Vec<(String, Arc<Locker>)> =
        vec![("redlock single".into(), Arc::new(Locker::Redlock(single)))];
    let mut missing = None;
    match redlock_manager(urls).await {
        Some(Ok(m)) => {
            let all3 = Locker::RedlockAll3(m.clone());
            impls.push(("redlock Redlock-5".into(), Arc::new(Locker::Redlock(m))));
            impls.push(("redlock Redlock-5 lock_all ×3".into(), Arc::new(all3)));
        }
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
    let mut all = Vec::with_capacity(urls.len());
    for url in urls {
        all.push(Raw::connect(url).await?);
    }
    impls.push((
        RAW_ONE.into(),
        Arc::new(Locker::Raw(Raw::connect(&urls[0]).await?)),
    ));
    impls.push((RAW_ALL.into(), Arc::new(Locker::RawParallel(all))));
    let results = measure(cfg, &impls, "r5", 1, pids).await;
    let floor = impls
        .iter()
        .zip(&results)
        .find(|((name, _), _)| name == RAW_ALL)
        .and_then(|(_, r)| r.as_ref().ok())
        .map(|m| m.ops.clone());
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
            "µs/op ÷ floor",
        ],
    );
    let mut single: [Option<&Runs>; 2] = [None; 2];
    let mut ratios = Ratios {
        vs_single: f64::NAN,
        vs_floor: f64::NAN,
    };
    for ((name, _), r) in impls.iter().zip(&results) {
        let crate_ix = usize::from(name.starts_with(RSLOCK));
        match r {
            Ok(m) => {
                let per_op = 1e6 / m.ops.median();
                if name.ends_with("single") {
                    single[crate_ix] = Some(&m.ops);
                }
                // Time per op ÷ single's = single's ops/s ÷ this one's, run by run.
                let x = match name.as_str() {
                    RAW_ONE | RAW_ALL => Runs::default(),
                    _ => single[crate_ix].map_or_else(Runs::default, |s| paired(s, &m.ops)),
                };
                let f = floor
                    .as_ref()
                    .map_or_else(Runs::default, |f| paired(f, &m.ops));
                if name == "redlock Redlock-5" {
                    ratios.vs_single = x.median();
                    ratios.vs_floor = f.median();
                }
                t.row(vec![
                    name.clone(),
                    with_spread(&m.ops, group),
                    fixed(1)(per_op),
                    fixed(1)(m.client_us.median()),
                    fixed(1)(m.server_us.median()),
                    with_spread(&x, fixed(2)),
                    with_spread(&f, fixed(2)),
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
    t.note("lock_all ×3 = lock_all of three keys + release on Redlock-5: one acquire_all.lua call per node, then three releases");
    t.note("servers' CPU: all five redis-server processes, charged to the operations of each row");
    t.note(format!("floor: raw SET NX PX on all {} servers at once, then compare-and-delete on all at once (what a Redlock lock+release has to wait for, without any library); {RAW_ONE}: the same on the first server alone", urls.len()));
    t.print();
    Ok(ratios)
}
