//! Key names no other test of the process uses.

use std::sync::atomic::{AtomicU64, Ordering};

/// `<prefix>_<pid>_<n>`, with `n` counting up per process: a key name no other test of
/// this process (nor a concurrent test process) uses. It has no hash tag.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
