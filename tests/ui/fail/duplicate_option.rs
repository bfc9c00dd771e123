use redlock::{distributed_lock, LockError};

#[distributed_lock(key = "job_<id>", ttl = "1s", ttl = "2s")]
async fn job(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = job(1);
}
