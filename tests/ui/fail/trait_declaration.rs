use redlock::{distributed_lock, LockError};

pub trait Jobs {
    #[distributed_lock(key = "job_<id>")]
    async fn job(&self, id: u64) -> Result<u64, LockError>;
}

fn main() {}
