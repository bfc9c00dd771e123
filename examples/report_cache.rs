//! A report cache read by many and rebuilt by one: readers share `read(k)`, the rebuild
//! takes `write(k)` and excludes them, so no reader ever sees a half-written report.
//! Writers are preferred: once a rebuild waits, new readers queue behind it, so a
//! steady stream of readers cannot starve it.
//!
//! Backend: Redis when `REDIS_URL` is set, otherwise the in-memory backend.
//!
//! ```text
//! cargo run --example report_cache
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlock::{LockError, LockManager};

/// The cached report: its two halves are written one after the other.
#[derive(Default)]
struct Report {
    header: Mutex<u32>,
    body: Mutex<u32>,
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let locks = match std::env::var("REDIS_URL") {
        Ok(url) => LockManager::connect(&url).await?,
        Err(_) => LockManager::builder().in_memory().build().await?,
    };
    let report = Arc::new(Report::default());
    let (reads, torn) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let end = Instant::now() + Duration::from_secs(2);
    let mut readers = Vec::new();
    for _ in 0..8 {
        let (locks, report, reads, torn) =
            (locks.clone(), report.clone(), reads.clone(), torn.clone());
        readers.push(tokio::spawn(async move {
            while Instant::now() < end {
                let guard = locks.read("report_{daily}").await?;
                let header = *report.header.lock().unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
                if *report.body.lock().unwrap() != header {
                    torn.fetch_add(1, Ordering::Relaxed);
                }
                reads.fetch_add(1, Ordering::Relaxed);
                guard.release().await?;
            }
            Ok::<_, LockError>(())
        }));
    }
    let mut rebuilds = 0;
    let mut slowest = Duration::ZERO;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let asked = Instant::now();
        let guard = locks.write("report_{daily}").await?;
        slowest = slowest.max(asked.elapsed());
        let version = *report.header.lock().unwrap() + 1;
        *report.header.lock().unwrap() = version;
        tokio::time::sleep(Duration::from_millis(20)).await;
        *report.body.lock().unwrap() = version;
        rebuilds += 1;
        guard.release().await?;
    }
    for reader in readers {
        reader.await.expect("reader task")?;
    }
    println!(
        "{} reads, {rebuilds} rebuilds (slowest wait for the write lock: {slowest:?}), {} torn reads",
        reads.load(Ordering::Relaxed),
        torn.load(Ordering::Relaxed)
    );
    Ok(())
}
