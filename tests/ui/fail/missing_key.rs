use redlock::{distributed_lock, LockError};

#[distributed_lock(ttl = "1s")]
async fn job(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = job(1);
}
