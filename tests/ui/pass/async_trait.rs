//! Methods of `#[async_trait]` impls (the attribute sees the transformed method).

use async_trait::async_trait;
use redlock::{distributed_lock, LockError, LockManager};

pub struct Item {
    pub id: u64,
}

#[async_trait]
pub trait Store {
    async fn reserve(&self, item: &Item, qty: u32) -> Result<u32, LockError>;
    async fn rename(&mut self, id: u64, name: String) -> Result<(), LockError>;
    async fn pair(&self, pair: (u64, u64)) -> Result<u64, LockError>;
    async fn consume(self) -> Result<String, LockError>;
}

pub struct RedisStore {
    locks: LockManager,
    tenant: String,
    name: String,
}

#[async_trait]
impl Store for RedisStore {
    #[distributed_lock(key = "reserve_<self.tenant>_<item.id>", manager = self.locks, guard = g)]
    async fn reserve(&self, item: &Item, qty: u32) -> Result<u32, LockError> {
        let _ = (self.tenant.len(), g.fencing_token());
        if qty == 0 {
            return Ok(0);
        }
        Ok(qty + item.id as u32)
    }

    #[distributed_lock(key = "rename_<id>", manager = self.locks, wait = "0s")]
    async fn rename(&mut self, id: u64, name: String) -> Result<(), LockError> {
        self.name = name;
        let _ = id;
        Ok(())
    }

    // A destructuring pattern: `#[async_trait]` renames the parameter, the key
    // still reaches `a` and `b`.
    #[distributed_lock(key = "pair_<a>_<b>", manager = self.locks)]
    async fn pair(&self, (a, mut b): (u64, u64)) -> Result<u64, LockError> {
        b += 1;
        Ok(a + b)
    }

    #[distributed_lock(key = "consume_<self.tenant>", manager = self.locks)]
    async fn consume(self) -> Result<String, LockError> {
        Ok(self.name)
    }
}

#[async_trait(?Send)]
pub trait LocalStore {
    async fn local(&self, id: u64) -> Result<u64, LockError>;
}

#[async_trait(?Send)]
impl LocalStore for RedisStore {
    #[distributed_lock(key = "local_<id>", manager = self.locks)]
    async fn local(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

fn main() {
    fn object_safe(_: &dyn Store) {}
    let _ = object_safe;
}
