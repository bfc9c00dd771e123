//! The 128-bit random owner token that proves who holds a lock.

use std::fmt;

/// 16 bytes from the operating system's CSPRNG. Never printed: `Debug` is redacted.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Token([u8; 16]);

impl Token {
    /// Draws a fresh token.
    pub(crate) fn random() -> Self {
        let mut bytes = [0u8; 16];
        // The OS generator only fails when the platform has none at all; fall back to
        // a per-process hash so the library never panics (tokens stay unique per call).
        if getrandom::fill(&mut bytes).is_err() {
            bytes = fallback_bytes();
        }
        Self(bytes)
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
}
