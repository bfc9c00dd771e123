// No call could ever run with 0 permits.
use redlock::{distributed_lock, LockError};

#[distributed_lock(key = "export", permits = 0)]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {
    let _ = transfer(1, 2);
}
