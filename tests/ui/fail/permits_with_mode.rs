// A permit is neither a read nor a write lock.
use redlock::{distributed_lock, LockError};

#[distributed_lock(key = "export", permits = 4, mode = "write")]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {
    let _ = transfer(1, 2);
}
