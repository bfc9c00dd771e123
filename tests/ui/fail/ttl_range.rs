use redlock::{distributed_lock, LockError};

#[distributed_lock(key = "zero_<id>", ttl = "0ms")]
async fn zero(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "long_<id>", ttl = "31d")]
async fn too_long(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = (zero(1), too_long(1));
}
