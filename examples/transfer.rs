//! The ATM story: money moves between two accounts, in both directions at once. Each
//! transfer reads both balances, works a little, and writes both back. Without a lock
//! concurrent transfers overwrite each other and money appears or vanishes; with
//! `lock_all([from, to])` the total is exact. Transfers name the accounts in opposite
//! orders, which with two plain locks taken one after the other would deadlock;
//! `lock_all` takes keys in one order whatever order they are named in.
//!
//! Backend: Redis when `REDIS_URL` is set, otherwise the in-memory backend.
//!
//! ```text
//! cargo run --example transfer
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example transfer
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlock::{LockError, LockManager};

const TRANSFERS: usize = 200;
const OPENING: i64 = 1_000;

/// Two accounts in a "database": reads and writes are separate steps.
#[derive(Default)]
struct Bank(Mutex<HashMap<&'static str, i64>>);

impl Bank {
    fn balance(&self, account: &str) -> i64 {
        self.0.lock().unwrap().get(account).copied().unwrap_or(0)
    }

    fn set(&self, account: &'static str, balance: i64) {
        self.0.lock().unwrap().insert(account, balance);
    }

    fn total(&self) -> i64 {
        self.0.lock().unwrap().values().sum()
    }
}

/// Moves `amount` from `from` to `to`: a withdrawal, then a deposit, each a read, a
/// little work (checks, an audit log) and a write.
async fn transfer(bank: &Bank, from: &'static str, to: &'static str, amount: i64) {
    let a = bank.balance(from);
    tokio::time::sleep(Duration::from_millis(1)).await;
    bank.set(from, a - amount);
    let b = bank.balance(to);
    tokio::time::sleep(Duration::from_millis(1)).await;
    bank.set(to, b + amount);
}

/// Transfer `i`'s amount: they differ, so lost updates do not cancel out.
fn amount(i: usize) -> i64 {
    i64::try_from(i % 7 + 1).unwrap_or(1) * 10
}

/// Runs every transfer at once, each under `lock_all` when `locks` is given.
async fn run(locks: Option<LockManager>) -> Result<i64, LockError> {
    let bank = Arc::new(Bank::default());
    bank.set("alice", OPENING);
    bank.set("bob", OPENING);
    let mut tasks = Vec::new();
    for i in 0..TRANSFERS {
        let (bank, locks) = (bank.clone(), locks.clone());
        let (from, to) = if i % 2 == 0 {
            ("alice", "bob")
        } else {
            ("bob", "alice")
        };
        tasks.push(tokio::spawn(async move {
            match locks {
                Some(locks) => {
                    let keys = [format!("account_{{{from}}}"), format!("account_{{{to}}}")];
                    let both = locks.lock_all(&keys).await?;
                    transfer(&bank, from, to, amount(i)).await;
                    both.release().await
                }
                None => {
                    transfer(&bank, from, to, amount(i)).await;
                    Ok(())
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("transfer task")?;
    }
    Ok(bank.total())
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let locks = match std::env::var("REDIS_URL") {
        Ok(url) => LockManager::connect(&url).await?,
        Err(_) => LockManager::builder().in_memory().build().await?,
    };
    println!("{TRANSFERS} transfers between alice and bob, both ways at once");
    println!("total before: {}", 2 * OPENING);
    println!("total after, no lock:       {}", run(None).await?);
    println!("total after, with lock_all: {}", run(Some(locks)).await?);
    Ok(())
}
