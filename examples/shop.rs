//! The seed scenario: over-selling. Goods 42 has 10 in stock and 30 buyers arrive at
//! once. `buy` reads the stock, checks the payment, and writes the stock back: without a
//! lock every buyer reads "10 left" and the shop sells 30 items it does not have; with
//! `#[distributed_lock(key = "buy_<goods_id>")]` exactly 10 orders go through.
//!
//! Backend: Redis when `REDIS_URL` is set (the stock then lives in Redis too, so several
//! copies of this program share it); otherwise the in-memory backend.
//!
//! ```text
//! cargo run --example shop
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example shop
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use redis::AsyncCommands;
use redlock::{distributed_lock, LockError, LockManager};

const GOODS_ID: u64 = 42;
const STOCK: u32 = 10;
const BUYERS: usize = 30;

/// Where the stock lives: a database row, in effect. Reads and writes are separate
/// steps, as they are in most applications, so concurrent buyers race.
enum Store {
    Redis(redis::aio::MultiplexedConnection),
    Memory(Mutex<HashMap<u64, u32>>),
}

static STORE: OnceLock<Store> = OnceLock::new();

fn store() -> &'static Store {
    STORE.get().expect("the store is set up in main")
}

impl Store {
    fn key(goods_id: u64) -> String {
        format!("shop:stock:{goods_id}")
    }

    async fn stock(&self, goods_id: u64) -> Result<u32, ShopError> {
        match self {
            Store::Redis(con) => {
                let n: Option<u32> = con.clone().get(Self::key(goods_id)).await?;
                Ok(n.unwrap_or(0))
            }
            Store::Memory(rows) => Ok(rows.lock().unwrap().get(&goods_id).copied().unwrap_or(0)),
        }
    }

    async fn set_stock(&self, goods_id: u64, n: u32) -> Result<(), ShopError> {
        match self {
            Store::Redis(con) => Ok(con.clone().set(Self::key(goods_id), n).await?),
            Store::Memory(rows) => {
                rows.lock().unwrap().insert(goods_id, n);
                Ok(())
            }
        }
    }
}

#[derive(Debug)]
struct Order {
    goods_id: u64,
    qty: u32,
}

#[derive(Debug)]
enum ShopError {
    SoldOut { left: u32 },
    Lock(LockError),
    Store(redis::RedisError),
}

impl From<LockError> for ShopError {
    fn from(e: LockError) -> Self {
        ShopError::Lock(e)
    }
}

impl From<redis::RedisError> for ShopError {
    fn from(e: redis::RedisError) -> Self {
        ShopError::Store(e)
    }
}

impl fmt::Display for ShopError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShopError::SoldOut { left } => write!(f, "sold out ({left} left)"),
            ShopError::Lock(_) => f.write_str("could not lock the goods"),
            ShopError::Store(_) => f.write_str("the stock store failed"),
        }
    }
}

impl std::error::Error for ShopError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ShopError::SoldOut { .. } => None,
            ShopError::Lock(e) => Some(e),
            ShopError::Store(e) => Some(e),
        }
    }
}

/// Read, check, write: correct alone, wrong under concurrency.
async fn buy_unlocked(goods_id: u64, qty: u32) -> Result<Order, ShopError> {
    let left = store().stock(goods_id).await?;
    if left < qty {
        return Err(ShopError::SoldOut { left });
    }
    // The payment provider takes a moment; other buyers read the same stock meanwhile.
    tokio::time::sleep(Duration::from_millis(5)).await;
    store().set_stock(goods_id, left - qty).await?;
    Ok(Order { goods_id, qty })
}

/// The same body, holding the lock `lock:buy_{<goods_id>}` while it runs. The lock is
/// released on every way out, the sold-out `return` and the `?`s included.
#[distributed_lock(key = "buy_<goods_id>", ttl = "10s", wait = "5s")]
async fn buy(goods_id: u64, qty: u32) -> Result<Order, ShopError> {
    buy_unlocked(goods_id, qty).await
}

/// Runs `BUYERS` concurrent purchases of one item each; prints and returns the orders.
async fn rush<F, Fut>(label: &str, buy: F) -> Result<usize, ShopError>
where
    F: Fn(u64, u32) -> Fut,
    Fut: std::future::Future<Output = Result<Order, ShopError>> + Send + 'static,
{
    store().set_stock(GOODS_ID, STOCK).await?;
    let buyers: Vec<_> = (0..BUYERS)
        .map(|_| tokio::spawn(buy(GOODS_ID, 1)))
        .collect();
    let (mut sold, mut sold_out) = (0, 0);
    for buyer in buyers {
        match buyer.await.expect("buyer task") {
            Ok(order) => {
                assert_eq!(order.goods_id, GOODS_ID);
                sold += order.qty as usize;
            }
            Err(ShopError::SoldOut { .. }) => sold_out += 1,
            Err(e) => return Err(e),
        }
    }
    let left = store().stock(GOODS_ID).await?;
    let oversold = sold.saturating_sub(STOCK as usize);
    println!(
        "{label:<26} {sold:>2} sold, {sold_out:>2} turned away, stock now {left:>2}, \
         oversold by {oversold}"
    );
    Ok(sold)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let locks = match std::env::var("REDIS_URL") {
        Ok(url) => {
            let client = redis::Client::open(url.as_str())?;
            let con = client.get_multiplexed_async_connection().await?;
            let _ = STORE.set(Store::Redis(con));
            LockManager::connect(&url).await?
        }
        Err(_) => {
            let _ = STORE.set(Store::Memory(Mutex::default()));
            LockManager::builder().in_memory().build().await?
        }
    };
    println!(
        "backend: {} ({})",
        locks.backend_name(),
        if locks.backend_name() == "memory" {
            "set REDIS_URL to use Redis"
        } else {
            "stock and locks in Redis"
        }
    );
    // `#[distributed_lock]` without `manager =` uses the global manager.
    locks.install_global();
    println!("goods {GOODS_ID}: {STOCK} in stock, {BUYERS} buyers of 1 each");

    rush("without a lock:", buy_unlocked).await?;
    let sold = rush("with #[distributed_lock]:", buy).await?;
    if sold != STOCK as usize {
        return Err(format!("sold {sold} with the lock, expected exactly {STOCK}").into());
    }
    Ok(())
}
