// Each template of `keys` gets the placeholder checks of `key`; the body's use of
// the `MultiGuard` binding is not reported on top.
use redlock::{distributed_lock, LockError};

#[distributed_lock(keys = ["account_<from>", "account_<dest>"], guard = g)]
async fn transfer(from: u64, to: u64) -> Result<usize, LockError> {
    let _ = (from, to);
    Ok(g.keys().len() + g.fencing_tokens().len())
}

fn main() {
    let _ = transfer(1, 2);
}
