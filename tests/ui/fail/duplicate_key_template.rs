// Each template of `keys` is listed once.
use redlock::{distributed_lock, LockError};

#[distributed_lock(keys = ["account_<from>", "account_<to>", "account_<from>"])]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {
    let _ = transfer(1, 2);
}
