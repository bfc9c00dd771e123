use redlock::distributed_lock;

#[distributed_lock(key = "count_<id>")]
async fn count(id: u64) -> Option<u64> {
    Some(id)
}

fn main() {
    let _ = count(1);
}
