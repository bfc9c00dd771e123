//! Lock keys: prefixing, validation, hash slots and the fencing counter of each slot.
//!
//! # Fencing counters
//! Counters outlive locks, so there must not be one per key ever locked (a service
//! locking `buy_<order_id>` would leave millions behind). There is one per prefix and
//! Redis Cluster hash slot instead, `<prefix>fence:{<tag>}`, where `<tag>` is a short
//! string hashing to that slot (see [`slot_tag`]): at most 16 384 counters per prefix,
//! whatever the number of distinct keys. Every key of a slot shares its counter, which
//! only ever grows, so the tokens of each key still strictly increase; they just skip
//! the values other keys of the slot took. The counter lives in the key's own slot, so
//! the acquire script stays single-slot on a cluster, and under the prefix, so an ACL
//! limited to `~<prefix>*` covers it.

use std::sync::LazyLock;

use crate::LockError;

/// The longest full key (prefix included) the library accepts, in bytes.
pub const MAX_KEY_LEN: usize = 64 * 1024;

/// Number of hash slots in a Redis Cluster.
pub(crate) const SLOTS: usize = 16384;

/// What follows the prefix in a fencing counter's name, before its `{tag}`.
const FENCE_INFIX: &str = "fence:";

/// The end of a key's holder set: readers or permit holders, each with its expiry.
const HOLDERS_SUFFIX: &str = ":~holders";
/// The end of a key's writer intents: writers waiting for its readers to leave.
const INTENTS_SUFFIX: &str = ":~writers";
/// The end of a fair lock's queue: its waiters in the order of arrival.
const QUEUE_SUFFIX: &str = ":~queue";
/// The end of a fair lock's heartbeats: when each queued waiter's place runs out.
const HEARTBEATS_SUFFIX: &str = ":~heartbeats";
/// What precedes the number of one of a key's permit places (Redlock, see
/// [`LockKey::place`]).
pub(crate) const PLACE_INFIX: &str = ":~permit:";

/// Whether `full` names a key the lock kinds keep beside a lock key.
fn is_reserved(full: &str) -> bool {
    // Suffix checks only: a substring search would cost every acquisition more.
    let number = full.trim_end_matches(|c: char| c.is_ascii_digit());
    let place = number.len() < full.len() && number.ends_with(PLACE_INFIX);
    place
        || [
            HOLDERS_SUFFIX,
            INTENTS_SUFFIX,
            QUEUE_SUFFIX,
            HEARTBEATS_SUFFIX,
        ]
        .iter()
        .any(|suffix| full.ends_with(suffix))
}

/// A validated lock key and the fencing counter of its hash slot.
///
/// The wake-up channel is the lock key itself: channel names hash like keys, so the
/// sharded-pub/sub channel lives in the same slot too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockKey {
    full: String,
    fence: String,
    prefix_len: usize,
}

impl LockKey {
    /// Validates `full` (which starts with `prefix`, already checked by
    /// [`check_prefix`]) and names its slot's fencing counter.
    pub(crate) fn new(prefix: &str, full: String) -> Result<Self, LockError> {
        if full.len() > MAX_KEY_LEN {
            return Err(LockError::InvalidKey {
                reason: format!("{} bytes exceeds the {MAX_KEY_LEN}-byte limit", full.len()),
            });
        }
        if hash_tag(&full).is_none() && full.contains('}') {
            // `{}` or a stray `}`: most likely a hash tag gone wrong (an empty value).
            return Err(LockError::InvalidKey {
                reason: "a key with '}' must contain a non-empty {hash tag}".into(),
            });
        }
        if is_reserved(&full) {
            return Err(LockError::InvalidKey {
                reason: format!(
                    "keys ending in {HOLDERS_SUFFIX:?}, {INTENTS_SUFFIX:?}, {QUEUE_SUFFIX:?}, {HEARTBEATS_SUFFIX:?} or {PLACE_INFIX:?} and a number are reserved for read/write locks, fair locks and permits"
                ),
            });
        }
        if Self::untagged_inside(prefix, &full).is_some() {
            // `prefix{key}` is where the untagged `key` keeps its holders and places.
            return Err(LockError::InvalidKey {
                reason: format!(
                    "{full:?} is reserved: a key without a hash tag keeps its companions under {full:?}"
                ),
            });
        }
        let slot = key_slot(&full);
        let fence = format!("{prefix}{FENCE_INFIX}{{{}}}", slot_tag(slot));
        if fence == full {
            return Err(LockError::InvalidKey {
                reason: format!("{full:?} is reserved for a fencing counter"),
            });
        }
        if key_slot(&fence) != slot {
            // Only a prefix `check_prefix` refuses can get here.
            return Err(LockError::InvalidKey {
                reason: format!("the prefix {prefix:?} puts the fencing counter of {full:?} in another hash slot"),
            });
        }
        Ok(Self {
            full,
            fence,
            prefix_len: prefix.len(),
        })
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
        Self::new(prefix, full)
    }

    /// The full lock key.
    pub(crate) fn full(&self) -> &str {
        &self.full
    }

    /// The key of the fencing counter of the lock key's slot.
    pub(crate) fn fence(&self) -> &str {
        &self.fence
    }

    /// The sorted set of the key's shared holders (readers or permit holders; member:
    /// token, score: expiry in the server's milliseconds), in the key's hash slot.
    pub(crate) fn holders(&self) -> String {
        self.companion(HOLDERS_SUFFIX)
    }

    /// The sorted set of writers waiting for the key's readers to leave (member: the
    /// writer's waiter id, score: when it gives up, in the server's milliseconds).
    pub(crate) fn intents(&self) -> String {
        self.companion(INTENTS_SUFFIX)
    }

    /// A fair lock's queue, a sorted set (member: a waiter's id; score: its ticket, the
    /// order of arrival).
    pub(crate) fn queue(&self) -> String {
        self.companion(QUEUE_SUFFIX)
    }

    /// A fair lock's heartbeats, a sorted set (member: a queued waiter's id; score: the
    /// server time in milliseconds its place runs out at unless it asks again).
    pub(crate) fn heartbeats(&self) -> String {
        self.companion(HEARTBEATS_SUFFIX)
    }

    /// Permit place `i` of the key: on Redlock, a permit of `n` is one of `n` exclusive
    /// locks, the key's places (a majority vote cannot bound a count above 1: each node
    /// could grant its `n` places to a different set of callers). Same slot and
    /// counter as the key.
    pub(crate) fn place(&self, i: u32) -> LockKey {
        LockKey {
            full: self.companion(&format!("{PLACE_INFIX}{i}")),
            fence: self.fence.clone(),
            prefix_len: self.prefix_len,
        }
    }

    /// The prefix the key was made under.
    pub(crate) fn prefix(&self) -> &str {
        &self.full[..self.prefix_len]
    }

    /// What every permit place's name of the key starts with (see [`place`](Self::place)).
    pub(crate) fn places_prefix(&self) -> String {
        self.companion(PLACE_INFIX)
    }

    /// The lock key under `prefix` and the number of the permit place named `name`
    /// (see [`place`](Self::place)), if `name` is one.
    pub(crate) fn place_owner(prefix: &str, name: &str) -> Option<(LockKey, u32)> {
        if !name.starts_with(prefix) {
            return None;
        }
        let base_len = name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let i: u32 = name[base_len..].parse().ok()?;
        let base = name[..base_len].strip_suffix(PLACE_INFIX)?;
        let owner = Self::untagged_inside(prefix, base).unwrap_or(base);
        let owner = LockKey::new(prefix, owner.to_owned()).ok()?;
        (owner.places_prefix() == name[..base_len]).then_some((owner, i))
    }

    /// The key without a hash tag whose companions `full` is the base of
    /// (`prefix{key}`, see [`companion`](Self::companion)), if it is one.
    fn untagged_inside<'a>(prefix: &str, full: &'a str) -> Option<&'a str> {
        full.strip_prefix(prefix)?
            .strip_prefix('{')?
            .strip_suffix('}')
            .filter(|key| key.starts_with(prefix) && hash_tag(key).is_none())
    }

    /// A key of the lock's own, under the prefix and in the lock key's hash slot: the
    /// key with `suffix` when it has a hash tag, else the key as the hash tag (a key
    /// without a tag has no `}`, see [`new`](Self::new)).
    fn companion(&self, suffix: &str) -> String {
        if hash_tag(&self.full).is_some() {
            [self.full.as_str(), suffix].concat()
        } else {
            let prefix = self.prefix();
            [prefix, "{", self.full.as_str(), "}", suffix].concat()
        }
    }
}

/// Checks that every key under `prefix` can have its slot's counter under `prefix` too.
///
/// A `{` in the prefix must open a complete, non-empty hash tag inside the prefix (then
/// every key of the prefix, counters included, hashes to that tag): otherwise Redis
/// would read the counter's tag as starting inside the prefix, in another slot.
pub(crate) fn check_prefix(prefix: &str) -> Result<(), LockError> {
    if prefix.contains('{') && hash_tag(prefix).is_none() {
        return Err(LockError::invalid_option(format!(
            "prefix {prefix:?}: a '{{' in the prefix must open a non-empty {{hash tag}} \
             closed within the prefix, or the fencing counters could not share their keys' hash slots"
        )));
    }
    Ok(())
}

/// The part of `key` Redis Cluster hashes when it has a non-empty `{tag}`.
pub(crate) fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')?;
    (close > 0).then(|| &key[open + 1..open + 1 + close])
}

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole
/// key without one, modulo 16 384 (`CLUSTER KEYSLOT`).
pub(crate) fn key_slot(key: &str) -> u16 {
    let hashed = hash_tag(key).unwrap_or(key);
    // The remainder is below 16 384, so it fits.
    (crc16(hashed.as_bytes()) as usize % SLOTS) as u16
}

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no reflection.
fn crc16(data: &[u8]) -> u16 {
    data.iter().fold(0u16, |crc, &byte| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ byte)]
    })
}

/// The CRC16 of each byte value, built at compile time.
static CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// The characters of slot tags, in enumeration order.
const TAG_ALPHABET: &[u8; 62] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
/// The longest slot tag: three characters of [`TAG_ALPHABET`] reach every slot.
const MAX_TAG_LEN: usize = 3;

/// One slot's tag: `len` characters of [`TAG_ALPHABET`] (0 only if none was found, which
/// the unit tests rule out and [`LockKey::new`] would refuse).
#[derive(Clone, Copy, Default)]
struct SlotTag {
    bytes: [u8; MAX_TAG_LEN],
    len: u8,
}

/// The tag of every slot, computed once on first use (about 240 000 short CRCs).
static SLOT_TAGS: LazyLock<Vec<SlotTag>> = LazyLock::new(|| {
    let mut tags = vec![SlotTag::default(); SLOTS];
    let mut missing = SLOTS;
    for len in 1..=MAX_TAG_LEN {
        let count = TAG_ALPHABET.len().pow(len as u32);
        for n in 0..count {
            // The n-th string of `len` characters, first character most significant.
            let mut tag = SlotTag {
                bytes: [0; MAX_TAG_LEN],
                len: len as u8,
            };
            let mut rest = n;
            for i in (0..len).rev() {
                tag.bytes[i] = TAG_ALPHABET[rest % TAG_ALPHABET.len()];
                rest /= TAG_ALPHABET.len();
            }
            let slot = usize::from(crc16(&tag.bytes[..len])) % SLOTS;
            if let Some(entry) = tags.get_mut(slot) {
                if entry.len == 0 {
                    *entry = tag;
                    missing -= 1;
                    if missing == 0 {
                        return tags;
                    }
                }
            }
        }
    }
    tags
});

/// The tag naming `slot`'s fencing counter: the first string, by length and then in
/// [`TAG_ALPHABET`] order (`0-9a-zA-Z`), of at most three such characters whose CRC16
/// lands in the slot.
fn slot_tag(slot: u16) -> &'static str {
    SLOT_TAGS
        .get(usize::from(slot))
        .and_then(|t| std::str::from_utf8(&t.bytes[..usize::from(t.len)]).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_has_a_tag_that_hashes_to_it() {
        for slot in 0..SLOTS as u16 {
            let tag = slot_tag(slot);
            assert!(!tag.is_empty() && tag.len() <= MAX_TAG_LEN, "slot {slot}");
            assert_eq!(key_slot(tag), slot, "tag {tag:?}");
        }
    }

    #[test]
    fn slots_agree_with_cluster_keyslot() {
        // Values measured with CLUSTER KEYSLOT on redis 7.0.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot("123456789"), 12739);
        assert_eq!(key_slot("buy_{42}"), 8000);
        assert_eq!(key_slot("buy_42"), 13876);
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot(""), 0);
        assert_eq!(hash_tag("foo{}{bar}"), None);
        assert_eq!(key_slot("foo{{bar}}zap"), key_slot("{bar"));
    }

    #[test]
    fn a_place_names_its_owner() {
        for (prefix, key) in [
            ("lock:", "buy_{42}"),
            ("lock:", "export"),
            ("lock:", "a{b"),
            ("{app}:", "job"),
        ] {
            let owner = LockKey::prefixed(prefix, key).unwrap();
            for i in [0, 7, 12] {
                let place = owner.place(i);
                let (found, n) = LockKey::place_owner(prefix, place.full()).unwrap();
                assert_eq!(n, i);
                assert_eq!(found.places_prefix(), owner.places_prefix(), "{key}");
            }
            assert_eq!(LockKey::place_owner(prefix, owner.full()), None);
            assert_eq!(LockKey::place_owner(prefix, &owner.holders()), None);
        }
        for name in [
            "lock:x:~permit:",
            "lock:x:~permit:-1",
            "other:{a}:~permit:1",
            "lock:x:~permit:99999999999",
        ] {
            assert_eq!(LockKey::place_owner("lock:", name), None, "{name}");
        }
    }

    /// `lock:{lock:job}` would share `lock:job`'s holder set, writer intents and permit
    /// places (its companions are `lock:{lock:job}:~holders` and so on).
    #[test]
    fn a_key_named_as_an_untagged_keys_companions_is_refused() {
        for reserved in ["{lock:job}", "{lock:a{b}"] {
            let err = LockKey::prefixed("lock:", reserved).unwrap_err();
            assert!(err.to_string().contains("reserved"), "{err}");
        }
        let untagged = LockKey::prefixed("lock:", "job").unwrap();
        assert_eq!(untagged.holders(), "lock:{lock:job}:~holders");
        for fine in ["{job}", "{lock:job}x", "{lock:a}b", "{other:job}"] {
            assert!(LockKey::prefixed("lock:", fine).is_ok(), "{fine}");
        }
        assert!(
            LockKey::prefixed("{app}:", "{{app}:job}").is_ok(),
            "a tagged prefix"
        );
    }

    #[test]
    fn companions_share_the_slot_and_the_prefix() {
        for (prefix, key) in [
            ("lock:", "buy_{42}"),
            ("lock:", "export"),
            ("lock:", "a{b"),
            ("{app}:", "report"),
            ("", "x"),
        ] {
            let k = LockKey::prefixed(prefix, key).unwrap();
            for companion in [k.holders(), k.intents(), k.place(7).full().to_owned()] {
                assert!(companion.starts_with(prefix), "{companion:?}");
                assert_eq!(key_slot(&companion), key_slot(k.full()), "{companion:?}");
                assert_ne!(companion, k.full());
                // A companion is never another lock's key.
                assert!(
                    LockKey::new(prefix, companion.clone()).is_err(),
                    "{companion:?}"
                );
            }
        }
        let k = LockKey::prefixed("lock:", "export").unwrap();
        assert_eq!(k.holders(), "lock:{lock:export}:~holders");
        assert_eq!(k.intents(), "lock:{lock:export}:~writers");
    }

    #[test]
    fn the_counter_is_per_slot_under_the_prefix() {
        let k = LockKey::prefixed("lock:", "buy_{42}").unwrap();
        assert_eq!(k.full(), "lock:buy_{42}");
        assert_eq!(k.fence(), format!("lock:fence:{{{}}}", slot_tag(8000)));
        assert_eq!(key_slot(k.fence()), 8000);
        // Another key of the slot shares it.
        let other = LockKey::prefixed("lock:", "sell_{42}").unwrap();
        assert_eq!(other.fence(), k.fence());
        // Untagged keys: the slot of the whole key.
        let jobs = LockKey::prefixed("lock:", "jobs").unwrap();
        assert_eq!(key_slot(jobs.fence()), key_slot("lock:jobs"));
        assert!(jobs.fence().starts_with("lock:fence:{"));
    }

    #[test]
    fn a_tagged_prefix_puts_everything_in_its_slot() {
        check_prefix("app{7}:").unwrap();
        let k = LockKey::prefixed("app{7}:", "jobs").unwrap();
        assert_eq!(key_slot(k.fence()), key_slot("7"));
        assert!(k.fence().starts_with("app{7}:fence:{"));
    }

    #[test]
    fn prefixes_that_would_move_the_counter_are_refused() {
        for prefix in ["a{b", "a{}:", "{"] {
            assert!(
                matches!(check_prefix(prefix), Err(LockError::InvalidOption { .. })),
                "{prefix}"
            );
        }
        for prefix in ["", "lock:", "a}", "x{y}z", "x{y}{"] {
            check_prefix(prefix).unwrap();
        }
        // Unchecked, the mismatch is still caught per key.
        assert!(matches!(
            LockKey::prefixed("a{b", "jobs"),
            Err(LockError::InvalidKey { .. })
        ));
    }

    #[test]
    fn a_key_named_like_a_counter_is_reserved() {
        let counter = LockKey::prefixed("lock:", "x").unwrap().fence().to_owned();
        let user_key = counter.strip_prefix("lock:").unwrap();
        let err = LockKey::prefixed("lock:", user_key).unwrap_err();
        assert!(err.to_string().contains("reserved"), "{err}");
        // Names that merely look alike are fine.
        LockKey::prefixed("lock:", "fence:x").unwrap();
    }

    #[test]
    fn empty_tags_are_not_tags() {
        assert_eq!(hash_tag("a{}b"), None);
        for key in ["a{}b", "a}b", "}"] {
            assert!(
                matches!(
                    LockKey::prefixed("lock:", key),
                    Err(LockError::InvalidKey { .. })
                ),
                "{key}"
            );
        }
        for key in ["a{b", "{", "a}{b}", "{{b}}"] {
            let k = LockKey::prefixed("lock:", key).unwrap();
            assert_eq!(key_slot(k.fence()), key_slot(k.full()), "{key}");
        }
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
