// The error type must be able to hold the lock's own errors.
use redlock::distributed_lock;

#[derive(Debug)]
pub struct MyError;

#[distributed_lock(key = "job_<id>")]
async fn job(id: u64) -> Result<u64, MyError> {
    Ok(id)
}

fn main() {
    let _ = job(1);
}
