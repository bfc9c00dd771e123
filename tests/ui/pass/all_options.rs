//! Every option at once, and `crate = "..."` through a re-export.

use redlock::{distributed_lock, LockError, LockManager};

mod facade {
    pub use redlock::*;
}

pub struct Ctx {
    pub locks: LockManager,
}

#[distributed_lock(
    key = "all_<id>",
    ttl = "1m",
    wait = "0s",
    watchdog = false,
    manager = ctx.locks,
    guard = g,
    on_lost = "continue",
    crate = "::redlock",
)]
pub async fn all(ctx: &Ctx, id: u64) -> Result<u64, LockError> {
    Ok(id + g.fencing_token())
}

#[distributed_lock(
    key = "abort_<id>",
    ttl = "250ms",
    wait = "10s",
    watchdog = true,
    on_lost = "abort",
    crate = "crate::facade"
)]
pub async fn through_reexport(id: u64) -> Result<u64, facade::LockError> {
    Ok(id)
}

// A manager made per call: a temporary that lives for the whole call.
fn make_manager(ctx: &Ctx) -> LockManager {
    ctx.locks.clone()
}

#[distributed_lock(key = "temp_<id>", manager = make_manager(ctx), ttl = "43200m")]
pub async fn temporary(ctx: &Ctx, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// Hours and days (issue 14): 30 days is the longest ttl.
#[distributed_lock(key = "month_<id>", manager = ctx.locks, ttl = "30d", wait = "1h")]
pub async fn monthly(ctx: &Ctx, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "daily_<id>", manager = ctx.locks, ttl = "24h", hold_at_least = "1d")]
pub async fn daily(ctx: &Ctx, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn is_send<T: Send>(_: T) {}

fn main() {
    fn check(ctx: &Ctx) {
        is_send(all(ctx, 1));
        is_send(through_reexport(1));
        is_send(temporary(ctx, 1));
    }
    let _ = check;
}
