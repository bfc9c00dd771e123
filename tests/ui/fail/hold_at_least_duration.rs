// `hold_at_least` is a duration literal, like `ttl` and `wait`.
use redlock::{distributed_lock, LockError};

#[distributed_lock(key = "report_<from>", hold_at_least = "30 s")]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {
    let _ = transfer(1, 2);
}
