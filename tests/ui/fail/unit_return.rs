use redlock::distributed_lock;

#[distributed_lock(key = "log_<id>")]
async fn log(id: u64) {
    println!("{id}");
}

fn main() {
    let _ = log(1);
}
