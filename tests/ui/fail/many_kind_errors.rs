// Every mistake in the options of the other kinds of lock is reported in one
// pass, each at its own token.
use redlock::{distributed_lock, LockError};

#[distributed_lock(
    key = "account_<from>",
    keys = ["account_<from>", "account_<too>", "account_<from>", ""],
    mode = "shared",
    permits = 0,
    hold_at_least = "1w"
)]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

#[distributed_lock(key = "export", mode = "read", permits = 3)]
async fn export(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = (transfer(1, 2), export(3));
}
