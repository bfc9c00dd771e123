//! Redlock over five independent Redis masters: a lock is held when a majority (3 of 5)
//! granted it, so two masters may be down without losing or blocking any lock; with a
//! third one down, `lock()` fails with `QuorumUnavailable` instead of hanging.
//!
//! ```text
//! cargo run --example redlock_quorum   # starts five throwaway redis-servers from PATH
//! ```
//!
//! With your own masters it is one builder line:
//! `LockManager::builder().redlock(["redis://a:6379", "redis://b:6379", "redis://c:6379"])`.

use std::time::Duration;

use redlock::{LockError, LockManager, LockOptions};
use redlock_testkit::RedisServer;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !redlock_testkit::redis_available() {
        println!("this demo starts its own masters and needs redis-server on PATH");
        return Ok(());
    }
    let mut masters: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let locks = LockManager::builder().redlock(&urls).build().await?;
    let options = || LockOptions::new().wait(Duration::from_secs(1));

    for down in 0..=3 {
        match locks.lock_with("report_{daily}", options()).await {
            Ok(guard) => {
                println!(
                    "{down} of 5 down: held, fencing token {}",
                    guard.fencing_token()
                );
                guard.release().await?;
            }
            Err(e @ LockError::QuorumUnavailable { .. }) => {
                println!("{down} of 5 down: {e}");
            }
            Err(e) => return Err(e.into()),
        }
        if let Some(master) = masters.get_mut(down).filter(|_| down < 3) {
            master.kill9(); // the next attempt runs with one more master down
        }
    }
    Ok(())
}
