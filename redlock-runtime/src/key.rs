//! Lock keys: prefixing, validation and the hash tag every auxiliary key shares.

use crate::LockError;

/// The longest full key (prefix included) the library accepts, in bytes.
pub const MAX_KEY_LEN: usize = 64 * 1024;

/// A validated lock key and the fencing-counter key that lives in the same hash slot.
///
/// The wake-up channel is the lock key itself: channel names hash like keys, so the
/// sharded-pub/sub channel lives in the same slot too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockKey {
    full: String,
    fence: String,
}

impl LockKey {
    /// Validates `full` (the prefix already applied) and derives the fence key.
    ///
    /// With a hash tag (`lock:buy_{42}`) the fence key appends to the key
    /// (`lock:buy_{42}:fence`); without one the whole key becomes the tag
    /// (`{lock:jobs}:fence`), which Redis hashes exactly like the bare key.
    pub(crate) fn new(full: String) -> Result<Self, LockError> {
        if full.len() > MAX_KEY_LEN {
            return Err(LockError::InvalidKey {
                reason: format!("{} bytes exceeds the {MAX_KEY_LEN}-byte limit", full.len()),
            });
        }
        let fence = if hash_tag(&full).is_some() {
            format!("{full}:fence")
        } else if full.contains('}') {
            return Err(LockError::InvalidKey {
                reason: "a key with '}' must contain a non-empty {hash tag}".into(),
            });
        } else {
            format!("{{{full}}}:fence")
        };
        Ok(Self { full, fence })
    }

    /// Joins `prefix` and a user key, rejecting an empty user key.
    pub(crate) fn prefixed(prefix: &str, key: &str) -> Result<Self, LockError> {
        if key.is_empty() {
            return Err(LockError::InvalidKey {
                reason: "the key is empty".into(),
            });
        }
        let mut full = String::with_capacity(prefix.len() + key.len());
        full.push_str(prefix);
        full.push_str(key);
        Self::new(full)
    }

    /// The full lock key.
    pub(crate) fn full(&self) -> &str {
        &self.full
    }

    /// The fencing counter's key.
    pub(crate) fn fence(&self) -> &str {
        &self.fence
    }

    /// Gives back the full key string.
    pub(crate) fn into_full(self) -> String {
        self.full
    }
}

/// The part of `key` Redis Cluster hashes when it has a non-empty `{tag}`.
pub(crate) fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')?;
    (close > 0).then(|| &key[open + 1..open + 1 + close])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_keys_append_the_fence_suffix() {
        let k = LockKey::prefixed("lock:", "buy_{42}").unwrap();
        assert_eq!(k.full(), "lock:buy_{42}");
        assert_eq!(k.fence(), "lock:buy_{42}:fence");
        assert_eq!(hash_tag(k.fence()), Some("42"));
    }

    #[test]
    fn untagged_keys_become_the_tag_of_the_fence() {
        let k = LockKey::prefixed("lock:", "jobs").unwrap();
        assert_eq!(k.fence(), "{lock:jobs}:fence");
        assert_eq!(hash_tag(k.fence()), Some("lock:jobs"));
    }

    #[test]
    fn empty_tags_are_not_tags() {
        assert_eq!(hash_tag("a{}b"), None);
        assert!(matches!(
            LockKey::prefixed("lock:", "a{}b"),
            Err(LockError::InvalidKey { .. })
        ));
        let k = LockKey::prefixed("lock:", "a{b").unwrap();
        assert_eq!(hash_tag(k.fence()), Some("lock:a{b"));
    }

    #[test]
    fn bad_keys_are_rejected() {
        assert!(matches!(
            LockKey::prefixed("lock:", ""),
            Err(LockError::InvalidKey { .. })
        ));
        let huge = "x".repeat(MAX_KEY_LEN);
        assert!(matches!(
            LockKey::prefixed("lock:", &huge),
            Err(LockError::InvalidKey { .. })
        ));
        assert!(LockKey::prefixed("", &huge).is_ok());
    }
}
