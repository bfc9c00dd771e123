//! `guard = g` binds `&LockGuard` in the body.

use redlock::{distributed_lock, LockError, LockGuard};

fn token_of(guard: &LockGuard) -> u64 {
    guard.fencing_token()
}

#[distributed_lock(key = "ledger_<account>", guard = g)]
async fn append(account: u64, entry: String) -> Result<(u64, String), LockError> {
    let token: u64 = g.fencing_token();
    let key: &str = g.key();
    let held: bool = g.is_held();
    assert_eq!(token, token_of(g));
    let _ = (held, entry);
    Ok((token, key.to_owned()))
}

// The guard can be awaited on (`lost()`) inside the body.
#[distributed_lock(key = "watch_<n>", guard = lock, on_lost = "continue")]
async fn watch(n: u32) -> Result<u32, LockError> {
    let lost = lock.lost();
    drop(lost);
    Ok(n)
}

fn is_send<T: Send>(_: T) {}

fn main() {
    is_send(append(1, String::new()));
    is_send(watch(1));
}
