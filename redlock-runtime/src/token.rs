//! The 128-bit random owner token that proves who holds a lock.

use std::fmt;

/// 16 bytes from the operating system's CSPRNG. Never printed: `Debug` is redacted.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Token([u8; 16]);

/// Tokens drawn from the OS per refill of a thread's [`Pool`]: one `getrandom` call of
/// 512 bytes costs about as much as two of 16 (perf: drawing 16 bytes per token was
/// ~20 % of an in-memory lock + release, ~400 ns each here).
const POOLED: usize = 32;

/// A thread's unused OS random bytes, each token's 16 taken once. Emptied when the
/// process id changes: a forked child must not hand out the tokens its parent will.
struct Pool {
    bytes: [u8; 16 * POOLED],
    next: usize,
    pid: u32,
}

thread_local! {
    static POOL: std::cell::RefCell<Pool> = const {
        std::cell::RefCell::new(Pool { bytes: [0; 16 * POOLED], next: POOLED, pid: 0 })
    };
}

impl Token {
    /// Draws a fresh token.
    pub(crate) fn random() -> Self {
        // The OS generator only fails when the platform has none at all (and the pool
        // is gone only while the thread exits); fall back to a per-process hash so the
        // library never panics (tokens stay unique per call).
        Self(draw(std::process::id()).unwrap_or_else(fallback_bytes))
    }

    /// A *kept name* (the in-memory backend's): `digest` as 16 hex digits, as the
    /// scripts name a holder kept by `hold_at_least` after its release, where a
    /// holder's token is 16 random bytes.
    pub(crate) fn kept_name(digest: u64) -> Self {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut name = [0u8; 16];
        for (i, digit) in name.iter_mut().enumerate() {
            *digit = HEX[((digest >> (60 - 4 * i)) & 0xf) as usize];
        }
        Self(name)
    }

    /// Whether this names a holder kept after its release (see
    /// [`kept_name`](Self::kept_name)).
    pub(crate) fn is_kept_name(&self) -> bool {
        self.0.iter().all(u8::is_ascii_hexdigit)
    }

    /// The raw bytes sent to Redis.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// The next 16 unused bytes of this thread's pool, refilled when it is empty or was
/// filled by another process (`pid`: the caller's).
fn draw(pid: u32) -> Option<[u8; 16]> {
    POOL.try_with(|pool| {
        let mut pool = pool.borrow_mut();
        if pool.next == POOLED || pool.pid != pid {
            getrandom::fill(&mut pool.bytes).ok()?;
            (pool.next, pool.pid) = (0, pid);
        }
        let at = pool.next * 16;
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(pool.bytes.get(at..at + 16)?);
        pool.next += 1;
        Some(bytes)
    })
    .ok()
    .flatten()
}

fn fallback_bytes() -> [u8; 16] {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut out = [0u8; 16];
    for chunk in out.chunks_mut(8) {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_differ_and_are_redacted() {
        let (a, b) = (Token::random(), Token::random());
        assert_ne!(a, b);
        assert_eq!(format!("{a:?}"), "Token(<redacted>)");
    }

    #[test]
    fn pooled_tokens_are_distinct_across_refills_and_threads() {
        let draw = || {
            (0..3 * POOLED + 1)
                .map(|_| Token::random())
                .collect::<Vec<_>>()
        };
        let mut all = draw();
        all.extend(std::thread::spawn(draw).join().unwrap());
        let distinct: std::collections::HashSet<_> = all.iter().collect();
        assert_eq!(distinct.len(), all.len());
        assert!(
            all.iter().all(|t| t.0 != [0; 16]),
            "every token drawn from the OS"
        );
    }

    /// A forked child (another process id) must not hand out the tokens its parent's
    /// pool still holds.
    #[test]
    fn a_pool_filled_by_another_process_is_not_used() {
        std::thread::spawn(|| {
            let parent = u32::MAX - 1;
            draw(parent).unwrap();
            let parents_next = POOL.with(|p| {
                let p = p.borrow();
                let mut b = [0u8; 16];
                b.copy_from_slice(&p.bytes[p.next * 16..p.next * 16 + 16]);
                b
            });
            assert_ne!(draw(parent - 1).unwrap(), parents_next);
            assert_eq!(POOL.with(|p| p.borrow().pid), parent - 1);
        })
        .join()
        .unwrap();
    }
}
