//! Stacked with `#[tracing::instrument]`, in both orders.

use redlock::{distributed_lock, LockError, LockManager};

#[distributed_lock(key = "outer_<id>")]
#[tracing::instrument(err)]
async fn lock_then_instrument(id: u64) -> Result<u64, LockError> {
    tracing::info!("inside");
    Ok(id)
}

#[tracing::instrument(skip(locks), ret)]
#[distributed_lock(key = "inner_<id>", manager = locks, guard = g)]
async fn instrument_then_lock(locks: &LockManager, id: u64) -> Result<u64, LockError> {
    Ok(id + g.fencing_token())
}

pub struct Repo {
    locks: LockManager,
    tenant: String,
}

impl Repo {
    #[tracing::instrument(skip(self), fields(tenant = %self.tenant))]
    #[distributed_lock(key = "repo_<self.tenant>_<id>", manager = self.locks)]
    pub async fn first(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }

    #[distributed_lock(key = "repo_<self.tenant>_<id>", manager = self.locks)]
    #[tracing::instrument(skip(self))]
    pub async fn second(&mut self, id: u64) -> Result<u64, LockError> {
        self.tenant.push('x');
        Ok(id)
    }
}

#[async_trait::async_trait]
pub trait Job {
    async fn run(&self, id: u64) -> Result<u64, LockError>;
    async fn run_too(&self, id: u64) -> Result<u64, LockError>;
}

#[async_trait::async_trait]
impl Job for Repo {
    #[distributed_lock(key = "job_<id>", manager = self.locks)]
    #[tracing::instrument(skip(self))]
    async fn run(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }

    #[tracing::instrument(skip(self))]
    #[distributed_lock(key = "job_<id>", manager = self.locks)]
    async fn run_too(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

fn is_send<T: Send>(_: T) {}

fn main() {
    fn check(locks: &LockManager, mut repo: Repo) {
        is_send(lock_then_instrument(1));
        is_send(instrument_then_lock(locks, 1));
        is_send(repo.first(1));
        is_send(repo.second(1));
    }
    let _ = check;
}
