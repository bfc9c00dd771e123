// The modes are "read", "write" and "exclusive".
use redlock::{distributed_lock, LockError};

#[distributed_lock(key = "account_<from>", mode = "shared")]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {
    let _ = transfer(1, 2);
}
