//! Redis Cluster hash slots.

/// Number of hash slots in a Redis Cluster.
pub const SLOT_COUNT: u16 = 16384;

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of the key, modulo 16384.
///
/// Hash-tag rule: if the key contains `{`, and a `}` follows it with at least one byte in
/// between, only the bytes between the first `{` and the first `}` after it are hashed, so
/// `lock:{order-42}` and `fence:{order-42}` share a slot. Agrees with `CLUSTER KEYSLOT`.
///
/// ```
/// use redlock_testkit::key_slot;
/// assert_eq!(key_slot(b"buy_{42}"), key_slot(b"42"));
/// assert_eq!(key_slot(b"123456789"), 12739);
/// ```
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) % SLOT_COUNT
}

/// The fencing counter the library uses for the lock key `full_key` (prefix included)
/// under `prefix`: `<prefix>fence:{<tag>}`, one per hash slot, where `<tag>` is the
/// first string of one to three characters of `0-9a-zA-Z` (shorter first, then in that
/// order) whose slot is the key's. Computed here independently of the library, from the
/// description in `docs/usage.md` ("LockGuard").
///
/// ```
/// use redlock_testkit::{fence_key, key_slot};
/// let counter = fence_key("lock:", "lock:buy_{42}");
/// assert!(counter.starts_with("lock:fence:{"));
/// assert_eq!(key_slot(counter.as_bytes()), key_slot(b"lock:buy_{42}"));
/// assert_eq!(counter, fence_key("lock:", "lock:sell_{42}"));
/// ```
pub fn fence_key(prefix: &str, full_key: &str) -> String {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let slot = key_slot(full_key.as_bytes());
    let singles = ALPHABET.iter().map(|&a| vec![a]);
    let pairs = ALPHABET
        .iter()
        .flat_map(|&a| ALPHABET.iter().map(move |&b| vec![a, b]));
    let triples = ALPHABET.iter().flat_map(|&a| {
        ALPHABET
            .iter()
            .flat_map(move |&b| ALPHABET.iter().map(move |&c| vec![a, b, c]))
    });
    let tag = singles
        .chain(pairs)
        .chain(triples)
        .find(|t| crc16(t) % SLOT_COUNT == slot)
        .expect("every slot has a tag of at most three characters");
    format!("{prefix}fence:{{{}}}", String::from_utf8_lossy(&tag))
}

/// The part of `key` that is hashed (see [`key_slot`]).
fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        let after = &key[open + 1..];
        if let Some(close) = after.iter().position(|&b| b == b'}') {
            if close > 0 {
                return &after[..close];
            }
        }
    }
    key
}

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no reflection.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_check_value() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
    }

    #[test]
    fn hash_tags() {
        assert_eq!(hash_tag(b"foo"), b"foo");
        assert_eq!(hash_tag(b"{user1000}.following"), b"user1000");
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hash_tag(b"{"), b"{");
        assert_eq!(hash_tag(b"a{b"), b"a{b");
        assert_eq!(hash_tag(b""), b"");
    }

    #[test]
    fn known_slots() {
        // Values measured with CLUSTER KEYSLOT on redis 7.0.
        assert_eq!(key_slot(b"buy_{42}"), 8000);
        assert_eq!(key_slot(b"buy_42"), 13876);
        assert_eq!(key_slot(b"buy_43"), 9749);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b""), 0);
    }
}
