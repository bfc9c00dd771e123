use redlock::{distributed_lock, LockError};

#[distributed_lock(key = "tenant_<self.tenant>")]
async fn free(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = free(1);
}
