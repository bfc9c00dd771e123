use redlock::{distributed_lock, LockError};

#[distributed_lock(key = "sync_<id>")]
fn not_async(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = not_async(1);
}
