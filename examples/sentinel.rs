//! Locks on a primary with replicas under Redis Sentinel: the manager asks the Sentinels
//! where the master is and follows it through failovers, without being rebuilt. With
//! `min_replicas(1)` a lock is granted only once a replica has it, so a failover that
//! promotes that replica keeps it.
//!
//! ```text
//! SENTINEL_URLS=redis://10.0.0.1:26379,redis://10.0.0.2:26379,redis://10.0.0.3:26379 \
//!     SENTINEL_MASTER=mymaster cargo run --example sentinel
//! cargo run --example sentinel   # starts a throwaway master, replica and three Sentinels
//!                                # (redis-server on PATH), then kills the master
//! ```

use std::time::{Duration, Instant};

use redlock::{LockManager, LockOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Only for this demo: without SENTINEL_URLS, start a Sentinel set and keep it to the end.
    let mut throwaway = None;
    let (master, sentinels): (String, Vec<String>) = match std::env::var("SENTINEL_URLS") {
        Ok(list) => (
            std::env::var("SENTINEL_MASTER").unwrap_or_else(|_| "mymaster".to_owned()),
            list.split(',').map(str::to_owned).collect(),
        ),
        Err(_) if redlock_testkit::redis_available() => {
            let set = throwaway.insert(redlock_testkit::Sentinels::start());
            println!(
                "started a master ({}), a replica and Sentinels {}",
                set.current_master_url(),
                set.sentinel_urls().join(" ")
            );
            (set.master_name().to_owned(), set.sentinel_urls())
        }
        Err(_) => {
            eprintln!("set SENTINEL_URLS (and SENTINEL_MASTER), or put redis-server on PATH");
            return Ok(());
        }
    };

    let locks = match LockManager::builder()
        .sentinel(&master, &sentinels)
        .build()
        .await
    {
        Ok(locks) => locks,
        Err(e) => {
            eprintln!("cannot find master {master:?} through {sentinels:?}: {e}");
            return Ok(());
        }
    };
    let replicated = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .min_replicas(1);
    let guard = locks.lock_with("report_{7}", replicated).await?;
    println!("{} held, token {}", guard.key(), guard.fencing_token());

    let Some(set) = throwaway.as_mut() else {
        return Ok(guard.release().await?);
    };
    set.kill_master();
    let killed = Instant::now();
    println!("killed the master (kill -9); the Sentinels promote the replica");
    // The same manager: granted once it has followed the failover.
    let other = locks
        .lock_with(
            "report_{8}",
            LockOptions::new().wait(Duration::from_secs(30)),
        )
        .await?;
    println!(
        "{} granted on the new master {} ms after the kill",
        other.key(),
        killed.elapsed().as_millis()
    );
    // The replicated lock survived: extending it is a compare-token script there.
    guard.extend(Duration::from_secs(10)).await?;
    println!("{} still held after the failover", guard.key());
    other.release().await?;
    Ok(guard.release().await?)
}
