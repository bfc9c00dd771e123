//! Connect, lock, release. Needs a Redis server at `REDIS_URL` (default
//! `redis://127.0.0.1:6379`): `cargo run --example hello`.
use redlock::{LockError, LockManager};

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let locks = LockManager::connect(&url).await?;
    let guard = locks.lock("hello").await?; // waits up to 10 s if someone else holds it
    println!(
        "holding {} (fencing token {})",
        guard.key(),
        guard.fencing_token()
    );
    guard.release().await?; // or just drop it: released in the background
    Ok(())
}
