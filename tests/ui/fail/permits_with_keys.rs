// Several keys are always locked exclusively: no permits.
use redlock::{distributed_lock, LockError};

#[distributed_lock(keys = ["account_<from>", "account_<to>"], permits = 2)]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {
    let _ = transfer(1, 2);
}
