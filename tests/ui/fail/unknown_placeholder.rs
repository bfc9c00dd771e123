use redlock::{distributed_lock, LockError};

#[distributed_lock(key = "buy_<goods>_<qty>")]
async fn buy(goods_id: u64, qty: u32) -> Result<u32, LockError> {
    Ok(qty + goods_id as u32)
}

fn main() {
    let _ = buy(1, 2);
}
