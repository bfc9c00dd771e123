//! A free function using the global manager: `return`, `?` and the hash tag rule.

use redlock::{distributed_lock, LockError};

#[derive(Debug)]
pub enum ShopError {
    SoldOut,
    Lock(LockError),
}

impl From<LockError> for ShopError {
    fn from(e: LockError) -> Self {
        ShopError::Lock(e)
    }
}

pub struct Order {
    pub goods_id: u64,
    pub qty: u32,
}

async fn stock(_goods_id: u64) -> Result<u32, ShopError> {
    Ok(10)
}

/// Buys `qty` of `goods_id` (docs are kept).
#[distributed_lock(key = "buy_<goods_id>", ttl = "10s", wait = "2s")]
pub async fn buy(goods_id: u64, qty: u32) -> Result<Order, ShopError> {
    let left = stock(goods_id).await?;
    if left < qty {
        return Err(ShopError::SoldOut);
    }
    Ok(Order { goods_id, qty })
}

// No placeholder: the whole key is the hash tag.
#[distributed_lock(key = "nightly_report")]
pub(crate) async fn nightly_report() -> Result<(), LockError> {
    Ok(())
}

// A hash tag written by hand is kept as it is.
#[distributed_lock(key = "order:{<region>}:<id>", wait = "0s")]
async fn order(region: &str, id: u64) -> Result<String, LockError> {
    Ok(format!("{region}/{id}"))
}

// A `Result` alias.
pub type ShopResult<T> = Result<T, ShopError>;

#[distributed_lock(key = "alias_<n>")]
async fn alias(n: u8) -> ShopResult<u8> {
    Ok(n)
}

#[allow(clippy::needless_return)]
#[distributed_lock(key = "boxed_<n>", ttl = "1ms")]
async fn boxed(n: u8) -> Result<u8, Box<dyn std::error::Error + Send + Sync>> {
    let parsed: u8 = "7".parse()?;
    return Ok(parsed + n);
}

// A body that never returns normally.
#[distributed_lock(key = "diverge_<n>")]
async fn diverges(n: u8) -> Result<(), LockError> {
    loop {
        if n > 0 {
            return Ok(());
        }
    }
}

// Inner attributes stay at the top of the body.
#[distributed_lock(key = "inner_<n>")]
async fn inner_attribute(n: u8) -> Result<u8, LockError> {
    #![allow(unused_variables)]
    let unused = 1;
    Ok(n)
}

fn is_send<T: Send>(_: T) {}

fn main() {
    is_send(buy(1, 2));
    is_send(nightly_report());
    is_send(order("eu", 5));
    is_send(alias(1));
    is_send(boxed(1));
    is_send(diverges(1));
    is_send(inner_attribute(1));
}
