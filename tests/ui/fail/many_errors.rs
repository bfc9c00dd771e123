// Every mistake is reported in one pass, and the body's use of the guard
// binding is not reported on top of them.
use redlock::distributed_lock;

#[distributed_lock(
    key = "order_<user.id>_<order>",
    ttl = "5 s",
    wait = "2s",
    wait = "3s",
    retries = 3,
    on_lost = "ignore",
    guard = g
)]
fn order(user_id: u64, qty: u32) -> u64 {
    let _ = g.fencing_token();
    user_id + u64::from(qty)
}

fn main() {
    let _ = order(1, 2);
}
