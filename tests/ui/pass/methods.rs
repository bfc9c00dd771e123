//! Methods: `&self`, `&mut self`, `self`, `self: Arc<Self>`, with
//! `manager = self.locks` and `<self.tenant>`; `Self` in the return type.

use std::sync::Arc;

use redlock::{distributed_lock, LockError, LockManager};

pub struct Account {
    pub id: u64,
    pub owner: String,
}

pub struct Accounts {
    locks: LockManager,
    tenant: String,
    balance: i64,
}

impl Accounts {
    #[distributed_lock(key = "balance_<self.tenant>", manager = self.locks)]
    pub async fn balance(&self) -> Result<i64, LockError> {
        Ok(self.balance)
    }

    #[distributed_lock(key = "deposit_<self.tenant>_<account.id>", manager = self.locks, ttl = "5s")]
    pub async fn deposit(&mut self, account: &Account, amount: i64) -> Result<i64, LockError> {
        self.balance += amount;
        let _ = &account.owner;
        Ok(self.balance)
    }

    /// The body moves `self` although the manager and the key borrowed it.
    #[distributed_lock(key = "close_<self.tenant>", manager = self.locks)]
    pub async fn close(self) -> Result<String, LockError> {
        let Accounts { tenant, .. } = self;
        Ok(tenant)
    }

    #[distributed_lock(key = "fork_<self.tenant>", manager = self.locks)]
    pub async fn fork(&self, tenant: String) -> Result<Self, LockError> {
        Ok(Self {
            locks: self.locks.clone(),
            tenant,
            balance: 0,
        })
    }

    #[distributed_lock(key = "shared_<self.tenant>", manager = self.locks)]
    pub async fn shared(self: Arc<Self>) -> Result<Arc<Self>, LockError> {
        Ok(self)
    }
}

/// A manager behind an `Arc`, and a `&LockManager` parameter.
pub struct Service<'a> {
    locks: Arc<LockManager>,
    name: &'a str,
}

impl<'a> Service<'a> {
    #[distributed_lock(key = "svc_<self.name>", manager = self.locks)]
    async fn named(&self) -> Result<&'a str, LockError> {
        Ok(self.name)
    }

    #[distributed_lock(key = "with_<n>", manager = locks)]
    async fn with_manager(locks: &LockManager, n: u32) -> Result<u32, LockError> {
        let _ = locks;
        Ok(n)
    }

    #[distributed_lock(key = "renamed_<self.name>", manager = self.locks)]
    async fn renamed(&self, name: &'a str) -> Result<Self, LockError> {
        Ok(Service {
            locks: Arc::clone(&self.locks),
            name,
        })
    }
}

/// Trait default methods.
pub trait Tenant: Sync {
    fn locks(&self) -> &LockManager;
    fn tenant(&self) -> &str;

    #[allow(async_fn_in_trait)]
    #[distributed_lock(key = "trait_<id>", manager = self.locks())]
    async fn touch(&self, id: u64) -> Result<u64, LockError> {
        Ok(id + self.tenant().len() as u64)
    }
}

fn is_send<T: Send>(_: T) {}

fn main() {
    fn check(mut accounts: Accounts, account: Account, service: Service<'_>) {
        is_send(accounts.balance());
        is_send(accounts.deposit(&account, 1));
        is_send(accounts.fork(String::new()));
        is_send(service.named());
        is_send(service.renamed("x"));
        is_send(Service::with_manager(&service.locks, 1));
        is_send(accounts.close());
    }
    let _ = check;
}
