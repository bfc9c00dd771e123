// A call that locks several keys names at least one.
use redlock::{distributed_lock, LockError};

#[distributed_lock(keys = [])]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {
    let _ = transfer(1, 2);
}
