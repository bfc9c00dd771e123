//! The other kinds of lock: `mode`, `permits`, `keys` (with a `MultiGuard` guard) and
//! `hold_at_least`, on free functions, methods and `#[async_trait]` methods; every
//! future stays `Send`.

use async_trait::async_trait;
use redlock::{distributed_lock, LockError, LockKind, LockManager, MultiGuard};

#[distributed_lock(key = "report_<id>", mode = "read", guard = g)]
pub async fn show(id: u64) -> Result<LockKind, LockError> {
    let _ = id;
    Ok(g.kind())
}

#[distributed_lock(key = "report_<id>", mode = "write", hold_at_least = "30s")]
pub async fn rebuild(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "report_<id>", mode = "exclusive", wait = "0s")]
pub async fn purge(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "export", permits = 4, ttl = "10s", guard = g)]
pub async fn export() -> Result<u64, LockError> {
    Ok(g.fencing_token())
}

#[distributed_lock(
    keys = ["account_<from>", "account_<to>"],
    manager = locks,
    wait = "2s",
    hold_at_least = "1s",
    guard = g
)]
pub async fn transfer(locks: &LockManager, from: u64, to: u64) -> Result<Vec<u64>, LockError> {
    let _: &MultiGuard = g;
    let _ = (g.keys(), g.is_held());
    Ok(g.fencing_tokens())
}

pub struct Bank {
    locks: LockManager,
    branch: String,
}

impl Bank {
    #[distributed_lock(keys = ["<self.branch>_<id>", "<self.branch>_audit"], manager = self.locks)]
    pub async fn audit(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

#[async_trait]
pub trait Ledger {
    async fn post(&self, from: u64, to: u64) -> Result<usize, LockError>;
    async fn peek(&self, id: u64) -> Result<u64, LockError>;
}

#[async_trait]
impl Ledger for Bank {
    #[distributed_lock(keys = ["ledger_<from>", "ledger_<to>"], manager = self.locks, guard = g)]
    async fn post(&self, from: u64, to: u64) -> Result<usize, LockError> {
        Ok(g.keys().len())
    }

    #[distributed_lock(key = "ledger_<id>", mode = "read", manager = self.locks)]
    async fn peek(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

fn is_send<T: Send>(_: T) {}

fn main() {
    fn check(locks: &LockManager, bank: &Bank) {
        is_send(show(1));
        is_send(rebuild(1));
        is_send(purge(1));
        is_send(export());
        is_send(transfer(locks, 1, 2));
        is_send(bank.audit(3));
        is_send(bank.post(1, 2));
        is_send(bank.peek(1));
    }
    let _ = check;
}
