//! Exports hit a database that takes at most 3 at once: every worker takes one of 3
//! permits of `"export"` for each job. Each permit is a lease of its own, renewed while
//! held and freed by its ttl if the worker dies, so a crashed worker cannot leak a
//! permit for good.
//!
//! Backend: Redis when `REDIS_URL` is set, otherwise the in-memory backend.
//!
//! ```text
//! cargo run --example export_workers
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redlock::{LockError, LockManager, LockOptions};

const PERMITS: u32 = 3;
const WORKERS: usize = 10;
const JOBS: usize = 4;

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let locks = match std::env::var("REDIS_URL") {
        Ok(url) => LockManager::connect(&url).await?,
        Err(_) => LockManager::builder().in_memory().build().await?,
    };
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    // A worker that died holding a permit (never released, not renewed): its permit
    // comes back after its 500 ms ttl.
    std::mem::forget(
        locks
            .permit_with(
                "export",
                PERMITS,
                LockOptions::new()
                    .ttl(Duration::from_millis(500))
                    .watchdog(false),
            )
            .await?,
    );
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (locks, running, most) = (locks.clone(), running.clone(), most.clone());
        workers.push(tokio::spawn(async move {
            for job in 0..JOBS {
                let permit = locks.permit("export", PERMITS).await?;
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(30)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                println!(
                    "worker {w} exported job {job} (permit token {})",
                    permit.fencing_token()
                );
                permit.release().await?;
            }
            Ok::<_, LockError>(())
        }));
    }
    for worker in workers {
        worker.await.expect("worker task")?;
    }
    println!(
        "{} jobs, at most {} at once (permits: {PERMITS})",
        WORKERS * JOBS,
        most.load(Ordering::SeqCst)
    );
    Ok(())
}
