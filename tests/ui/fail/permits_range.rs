// Permit counts are `u32`.
use redlock::{distributed_lock, LockError};

#[distributed_lock(key = "export", permits = 4294967296)]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {
    let _ = transfer(1, 2);
}
