use redlock::{distributed_lock, LockError};

#[distributed_lock(key = "buy_<goods id>")]
async fn buy(goods: u64) -> Result<u64, LockError> {
    Ok(goods)
}

#[distributed_lock(key = "buy_<goods")]
async fn unclosed(goods: u64) -> Result<u64, LockError> {
    Ok(goods)
}

#[distributed_lock(key = "buy_<>")]
async fn empty(goods: u64) -> Result<u64, LockError> {
    Ok(goods)
}

fn main() {
    let _ = (buy(1), unclosed(1), empty(1));
}
