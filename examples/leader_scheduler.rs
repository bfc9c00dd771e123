//! A scheduler that runs a job every 300 ms on exactly one of three instances: each
//! instance (a task with a `LockManager` of its own, standing for a process) campaigns for
//! the leadership of `"scheduler"` with `lead`, and runs the ticks while it leads. Every
//! four ticks the leader steps down (as in a rolling deploy), and another instance takes
//! over within a few round trips; an observer prints each change of leader. The program
//! ends after 12 ticks, each run once.
//!
//! Backend: Redis when `REDIS_URL` is set, otherwise the in-memory backend (whose
//! managers in one process share one store, as processes share a Redis).
//!
//! ```text
//! cargo run --example leader_scheduler
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlock::{LockError, LockManager, LockOptions};

const INSTANCES: usize = 3;
const TICK: Duration = Duration::from_millis(300);
const TICKS: usize = 12;
/// Ticks a leader runs before stepping down.
const TERM_TICKS: usize = 4;

/// What the instances share: in a real deployment, the database the job writes to.
#[derive(Default)]
struct Runs {
    /// (tick, instance, term), one per run.
    log: Vec<(usize, usize, u64)>,
}

/// How a term of leadership ended.
enum Ended {
    /// Stepped down after its ticks: campaign again.
    SteppedDown,
    /// Every tick has run.
    AllDone,
}

async fn manager() -> Result<LockManager, LockError> {
    match std::env::var("REDIS_URL") {
        Ok(url) => LockManager::connect(&url).await,
        Err(_) => LockManager::builder().in_memory().build().await,
    }
}

/// One instance: campaigns, runs ticks while leader, steps down, campaigns again.
async fn instance(id: usize, runs: Arc<Mutex<Runs>>) -> Result<(), LockError> {
    let locks = manager().await?;
    // A 2 s lease: if this process died, another would take over about 2 s later.
    let opts = LockOptions::new().ttl(Duration::from_secs(2));
    loop {
        let ended = locks
            .lead_with("scheduler", opts.clone(), |term| {
                let runs = runs.clone();
                async move {
                    for _ in 0..TERM_TICKS {
                        tokio::time::sleep(TICK).await;
                        let mut runs = runs.lock().unwrap();
                        let tick = runs.log.len();
                        if tick == TICKS {
                            return Ended::AllDone;
                        }
                        runs.log.push((tick, id, term));
                        println!("tick {tick:2}: instance {id} ran the job (term {term})");
                    }
                    Ended::SteppedDown
                }
            })
            .await?;
        if matches!(ended, Ended::AllDone) {
            return Ok(());
        }
        // Let another instance have a turn before campaigning again.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let runs = Arc::new(Mutex::new(Runs::default()));
    let observer = manager().await?;
    let mut watch = observer.watch_leader("scheduler").await?;
    let watching = tokio::spawn(async move {
        // Bounded by the program: aborted once the ticks are done.
        loop {
            match watch.changed().await {
                Ok(Some(leader)) => println!(
                    "observer: leader is pid {:?} on {:?}, term {}",
                    leader.pid, leader.host, leader.term
                ),
                Ok(None) => println!("observer: nobody leads"),
                Err(e) => println!("observer: {e}"),
            }
        }
    });
    let mut instances = Vec::new();
    for id in 0..INSTANCES {
        instances.push(tokio::spawn(instance(id, runs.clone())));
    }
    let all = async {
        for i in instances {
            i.await.expect("instance task")?;
        }
        Ok::<_, LockError>(())
    };
    // Every instance stops once the last tick ran (each checks at its next tick).
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("the scheduler finishes")?;
    watching.abort();
    let runs = runs.lock().unwrap();
    let ticks: Vec<usize> = runs.log.iter().map(|r| r.0).collect();
    assert_eq!(ticks, (0..TICKS).collect::<Vec<_>>(), "each tick ran once");
    let terms: Vec<u64> = runs.log.iter().map(|r| r.2).collect();
    assert!(
        terms.windows(2).all(|w| w[0] <= w[1]),
        "terms never go back"
    );
    let mut leaders: Vec<usize> = runs.log.iter().map(|r| r.1).collect();
    leaders.sort_unstable();
    leaders.dedup();
    println!(
        "{TICKS} ticks, each run once, by {} of the {INSTANCES} instances taking turns",
        leaders.len()
    );
    Ok(())
}
