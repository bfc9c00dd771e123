//! A monotonic clock shared by every process on the machine.
//!
//! `CLOCK_MONOTONIC` counts from boot, is the same for all processes, never jumps, and
//! keeps running while a process is stopped (SIGSTOP): exactly what comparing a paused
//! holder's critical section with another client's needs. `std::time::Instant` reads the
//! same clock on Linux but does not expose its value.

use std::time::Duration;

/// Nanoseconds on `CLOCK_MONOTONIC`.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always available on
    // Linux, and on failure `ts` stays zero (no undefined behaviour either way).
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// `later - earlier` as a duration (zero when `later` is earlier).
pub fn between(earlier: u64, later: u64) -> Duration {
    Duration::from_nanos(later.saturating_sub(earlier))
}

/// A signed difference in milliseconds, for reports (`later - earlier`).
pub fn ms(earlier: u64, later: u64) -> f64 {
    // Precision loss is irrelevant for printing.
    #[allow(clippy::cast_precision_loss)]
    let d = (later as f64 - earlier as f64) / 1e6;
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_monotonic_and_moves() {
        let a = now_ns();
        std::thread::sleep(Duration::from_millis(2));
        let b = now_ns();
        assert!(b > a);
        assert!(between(a, b) >= Duration::from_millis(2));
        assert_eq!(between(b, a), Duration::ZERO);
        assert!(ms(a, b) >= 2.0);
    }
}
