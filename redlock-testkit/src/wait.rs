//! A bounded polling helper.

use std::thread;
use std::time::{Duration, Instant};

/// Calls `f` every `poll` until it returns `true` or `timeout` has passed; returns whether it
/// did.
///
/// Bounded in time and in count: `f` runs at most `timeout / poll + 2` times (`poll` is raised
/// to at least 1 ms), and once more is never attempted after the deadline. Blocks the thread.
pub fn wait_until(timeout: Duration, poll: Duration, mut f: impl FnMut() -> bool) -> bool {
    let poll = poll.max(Duration::from_millis(1));
    let deadline = Instant::now() + timeout;
    let max_rounds = timeout.as_millis() / poll.as_millis() + 2;
    for _ in 0..max_rounds {
        if f() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        thread::sleep(poll.min(deadline - now));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_on_success_and_on_timeout() {
        let mut n = 0;
        assert!(wait_until(
            Duration::from_secs(1),
            Duration::from_millis(1),
            || {
                n += 1;
                n == 3
            }
        ));
        assert_eq!(n, 3);

        let started = Instant::now();
        let mut calls = 0u32;
        assert!(!wait_until(
            Duration::from_millis(50),
            Duration::from_millis(10),
            || {
                calls += 1;
                false
            }
        ));
        assert!(started.elapsed() < Duration::from_millis(500));
        assert!(calls <= 7, "calls = {calls}");
    }
}
