// `key` names one lock and `keys` several: not both.
use redlock::{distributed_lock, LockError};

#[distributed_lock(key = "account_<from>", keys = ["account_<from>", "account_<to>"])]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {
    let _ = transfer(1, 2);
}
