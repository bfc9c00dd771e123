//! The classic demonstration: three workers each add 1 to a shared Redis counter N
//! times with a non-atomic read-modify-write (GET, think, SET). Without a lock updates
//! are lost; with one the total is exact.
//!
//! Backend: `REDIS_URL` when set; otherwise a throwaway `redis-server` from PATH on a
//! free loopback port; otherwise the in-memory backend (the counter then lives in
//! process memory too).
//!
//! ```text
//! cargo run --example quickstart
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redlock::{LockManager, LockOptions};
use tokio::sync::Mutex;

const WORKERS: usize = 3;
const INCREMENTS: usize = 200;

/// Where the counter lives.
#[derive(Clone)]
enum Counter {
    Redis(redis::aio::MultiplexedConnection),
    Memory(Arc<Mutex<i64>>),
}

impl Counter {
    async fn get(&mut self) -> redis::RedisResult<i64> {
        match self {
            Self::Redis(con) => Ok(con
                .get::<_, Option<i64>>("quickstart:counter")
                .await?
                .unwrap_or(0)),
            Self::Memory(n) => Ok(*n.lock().await),
        }
    }

    async fn set(&mut self, value: i64) -> redis::RedisResult<()> {
        match self {
            Self::Redis(con) => con.set("quickstart:counter", value).await,
            Self::Memory(n) => {
                *n.lock().await = value;
                Ok(())
            }
        }
    }

    /// GET, a pause where another worker can slip in, SET.
    async fn increment(&mut self) -> redis::RedisResult<()> {
        let value = self.get().await?;
        tokio::time::sleep(Duration::from_micros(100)).await;
        self.set(value + 1).await
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Keeps a throwaway server alive until the end of main.
    let mut _server = None;
    let url = match std::env::var("REDIS_URL") {
        Ok(url) => Some(url),
        Err(_) if redlock_testkit::redis_available() => {
            let server = redlock_testkit::RedisServer::start();
            let url = server.url();
            println!("started a throwaway redis-server at {url}");
            _server = Some(server);
            Some(url)
        }
        Err(_) => {
            println!("no REDIS_URL and no redis-server on PATH: using the in-memory backend");
            None
        }
    };
    let (locks, counter) = match &url {
        Some(url) => {
            let client = redis::Client::open(url.as_str())?;
            let con = client.get_multiplexed_async_connection().await?;
            (LockManager::connect(url).await?, Counter::Redis(con))
        }
        None => (
            LockManager::builder().in_memory().build().await?,
            Counter::Memory(Arc::default()),
        ),
    };
    println!("backend: {}", locks.backend_name());

    // 1. Without the lock: lost updates.
    counter.clone().set(0).await?;
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let mut counter = counter.clone();
        workers.push(tokio::spawn(async move {
            for _ in 0..INCREMENTS {
                counter.increment().await?;
            }
            Ok::<_, redis::RedisError>(())
        }));
    }
    for w in workers {
        w.await??;
    }
    let unlocked = counter.clone().get().await?;
    println!(
        "without a lock: {unlocked} (expected {}, lost {})",
        WORKERS * INCREMENTS,
        (WORKERS * INCREMENTS) as i64 - unlocked
    );

    // 2. With the lock: each worker has its own manager, as separate processes would.
    counter.clone().set(0).await?;
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let locks = match &url {
            Some(url) => LockManager::connect(url).await?,
            None => locks.clone(),
        };
        let mut counter = counter.clone();
        workers.push(tokio::spawn(async move {
            for _ in 0..INCREMENTS {
                let guard = locks
                    .lock_with(
                        "quickstart_{counter}",
                        LockOptions::new().ttl(Duration::from_secs(5)),
                    )
                    .await?;
                counter.increment().await?;
                guard.release().await?;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for w in workers {
        w.await?.map_err(|e| e as Box<dyn std::error::Error>)?;
    }
    let elapsed = start.elapsed();
    let locked = counter.clone().get().await?;
    let handoffs = WORKERS * INCREMENTS;
    println!(
        "with redlock:   {locked} (expected {})",
        WORKERS * INCREMENTS
    );
    println!(
        "{handoffs} lock hand-offs in {elapsed:.2?}: {:.0} per second",
        handoffs as f64 / elapsed.as_secs_f64()
    );
    if locked != (WORKERS * INCREMENTS) as i64 {
        return Err("the locked total is wrong".into());
    }
    Ok(())
}
