use redlock::{distributed_lock, LockError};

#[distributed_lock(key = job, ttl = 10, watchdog = "yes", on_lost = "retry", crate = "not a path")]
async fn job(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = job(1);
}
