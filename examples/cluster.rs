//! Locks on a Redis Cluster: give the builder a few seed nodes (the others are
//! discovered), and the lock, its fencing counter and its wake-ups all live in the key's
//! hash slot — `{42}` in `order_{42}` is the hash tag, so keys sharing it share a slot.
//!
//! ```text
//! REDIS_CLUSTER_URLS=redis://10.0.0.1:7000,redis://10.0.0.2:7000 cargo run --example cluster
//! cargo run --example cluster   # starts a throwaway 3-master cluster (redis-server >= 7 on PATH)
//! ```

use std::time::Duration;

use redlock::{LockManager, LockOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Only for this demo: without REDIS_CLUSTER_URLS, start a cluster and keep it to the end.
    let mut _throwaway = None;
    let seeds: Vec<String> = match std::env::var("REDIS_CLUSTER_URLS") {
        Ok(list) => list.split(',').map(str::to_owned).collect(),
        Err(_) => {
            let cluster = _throwaway.insert(redlock_testkit::RedisCluster::start(3, 0));
            println!("started a throwaway cluster: {}", cluster.urls().join(" "));
            cluster.urls()
        }
    };

    let locks = LockManager::builder().cluster(&seeds).build().await?;

    // Eight workers on two orders (two slots, most likely on two masters): each order is
    // held by one worker at a time, and its fencing tokens only go up.
    let mut workers = Vec::new();
    for worker in 0..8 {
        let locks = locks.clone();
        let key = format!("order_{{{}}}", 42 + worker % 2);
        workers.push(tokio::spawn(async move {
            let options = LockOptions::new().ttl(Duration::from_secs(5));
            let guard = locks.lock_with(&key, options).await?;
            tokio::time::sleep(Duration::from_millis(20)).await; // the critical section
            println!(
                "worker {worker}: {} token {}",
                guard.key(),
                guard.fencing_token()
            );
            guard.release().await
        }));
    }
    for worker in workers {
        worker.await??;
    }
    Ok(())
}
