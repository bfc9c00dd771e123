//! Who holds what: the owner metadata stored with every lock, and [`LockInfo`], what
//! [`LockManager::inspect`](crate::LockManager::inspect) and
//! [`list`](crate::LockManager::list) make of it.
//!
//! # The stored format (version 1)
//! A lock key's value is its 16-byte owner token (or a shared kind's marker, `~read` or
//! `~permit` padded to 16 bytes with `~`) followed by
//! `|1|<acquired, Unix ms>|<fencing token>|<kind>|<pid>|<host>`, where `<kind>` is
//! `e`, `r` or `p`. The acquire scripts write the first three fields (the acquiring
//! process's clock for an exclusive lock, sent with the request: the server's `TIME`
//! cost the acquire script a quarter of its time; the server's clock for readers and
//! permits, whose script reads it for their expiries anyway; the fence they issued); the
//! rest is [`owner_suffix`], built once per process and sent as one argument, so nothing
//! costs an extra round trip or key. Every script
//! that compares a token compares the first 16 bytes only: a value of the token alone,
//! written before this format, compares the same. A reader or permit holder's own entry
//! in the holders set stays its token: the key's value describes the latest grant, and
//! `holders` counts the live ones. Nothing here, nor anything `inspect` returns, holds a
//! token: the holder is named by a 64-bit digest of it.

use std::fmt;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::Value;

use crate::kind::{LockKind, Mode};
use crate::LockError;

/// What is known about a held lock: its kind, owner and timing. `Debug` and `Display`
/// show all of it; none of it can release or extend the lock (no token is in here).
///
/// The owner fields are `None` for a lock written by a version of this library from
/// before owner metadata (or by something else); for readers and permits they describe
/// the latest grant, `holders` counting the live ones.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The full key, prefix included (as [`LockGuard::key`](crate::LockGuard::key)).
    pub key: String,
    /// Exclusive (or write), read, or permit.
    pub kind: LockKind,
    /// How many hold it: 1, or the live readers or permit holders.
    pub holders: u32,
    /// How many of `holders` are only kept: released with
    /// [`hold_at_least`](crate::LockOptions::hold_at_least) before their minimum hold,
    /// held until it ends with no job running under them (0 or 1 for an exclusive lock).
    pub kept: u32,
    /// How many waiters have a place in its queue: a [fair](crate::LockManager::fair)
    /// lock's, 0 for the other kinds.
    pub queued: u32,
    /// The time left before it expires unless renewed (`None`: no expiry set).
    pub ttl: Option<Duration>,
    /// The fencing token of the (latest) grant.
    pub fencing_token: Option<u64>,
    /// The holder's host name.
    pub host: Option<String>,
    /// The holder's process id.
    pub pid: Option<u32>,
    /// When it was granted: by the acquiring process's clock for an exclusive lock (and
    /// `lock_all`), by the server's for readers and permits (the process clock in
    /// memory).
    pub acquired_at: Option<SystemTime>,
    /// How long it has been held: the server's clock at `inspect` less `acquired_at`
    /// (for an exclusive lock, off by the skew between the acquiring host's clock and
    /// the server's; never below zero).
    pub held_for: Option<Duration>,
    /// 16 hex digits naming the holder, the same for one holder on every node (the
    /// digest Redis replies name holders by); never the token.
    pub holder: String,
    /// Each live reader or permit holder, the soonest to expire first (empty for an
    /// exclusive lock): how `redlock watch` tells one holder's exit from another's.
    pub shared: Vec<SharedHolder>,
}

/// One live holder of a read lock or permit, as [`LockInfo::shared`] lists it.
///
/// ```
/// # #[tokio::main] async fn main() -> Result<(), redlock::LockError> {
/// let locks = redlock::LockManager::builder().in_memory().build().await?;
/// let _a = locks.permit("printer", 2).await?;
/// let _b = locks.permit("printer", 2).await?;
/// let info = locks.inspect("printer").await?.expect("held");
/// assert_eq!(info.shared.len(), 2);
/// assert_ne!(info.shared[0].name, info.shared[1].name);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SharedHolder {
    /// Names the holder, never its token, and stays its name while it is kept by
    /// [`hold_at_least`](crate::LockOptions::hold_at_least) after its release: 16 hex
    /// digits, or on Redlock the permit place it holds (`place 3`).
    pub name: String,
    /// Its time left (`None`: no expiry).
    pub ttl: Option<Duration>,
    /// Released with `hold_at_least` and only kept until its minimum hold.
    pub kept: bool,
    /// Its own fencing token, where the backend records one per holder (Redlock's
    /// permit places); elsewhere the lock's `fencing_token` is the latest grant's.
    pub fencing_token: Option<u64>,
}

/// Orders a lock's holders the soonest to expire first (those without an expiry last),
/// then by name, the one order every backend lists them in.
pub(crate) fn soonest_to_expire_first(shared: &mut [SharedHolder]) {
    shared.sort_by(|a, b| {
        let left = |h: &SharedHolder| h.ttl.unwrap_or(Duration::MAX);
        left(a).cmp(&left(b)).then_with(|| a.name.cmp(&b.name))
    });
}

impl fmt::Display for LockInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}", self.key, self.kind)?;
        if self.holders != 1 {
            write!(f, ", {} holders", self.holders)?;
        }
        match self.kept {
            0 => {}
            kept if kept == self.holders => f.write_str(", kept by hold_at_least")?,
            kept => write!(f, ", {kept} kept by hold_at_least")?,
        }
        if self.queued > 0 {
            write!(f, ", {} queued", self.queued)?;
        }
        f.write_str(")")?;
        if let Some(fence) = self.fencing_token {
            write!(f, " fencing token {fence}")?;
        }
        match (&self.host, self.pid) {
            (Some(host), Some(pid)) => write!(f, " held by {host} pid {pid}")?,
            _ => write!(f, " held by {}", self.holder)?,
        }
        if let Some(held) = self.held_for {
            write!(f, " for {}", short(held))?;
        }
        match self.ttl {
            Some(ttl) => write!(f, ", {} left", short(ttl)),
            None => f.write_str(", no expiry"),
        }
    }
}

/// A duration to the millisecond, for people (`0ms` under one: not `0ns`).
fn short(d: Duration) -> String {
    match u64::try_from(d.as_millis()).unwrap_or(u64::MAX) {
        0 => "0ms".to_owned(),
        ms => format!("{:?}", Duration::from_millis(ms)),
    }
}

/// This process's part of the metadata (kind, pid, host), one string per kind.
struct Owner {
    host: String,
    /// By kind, in [`LockKind::ALL`]'s order.
    suffixes: [String; LockKind::ALL.len()],
}

static OWNER: LazyLock<Owner> = LazyLock::new(|| {
    let (pid, host) = (std::process::id(), host_name());
    let suffixes = LockKind::ALL.map(|kind| format!("|{}|{pid}|{host}", kind.code()));
    Owner { host, suffixes }
});

/// This machine's name as locks record it (see [`host_name`]), read once.
pub(crate) fn this_host() -> &'static str {
    &OWNER.host
}

/// The metadata argument of the acquire scripts for a grant of `mode`:
/// `|<kind>|<pid>|<host>`.
pub(crate) fn owner_suffix(mode: Mode) -> &'static str {
    &OWNER.suffixes[mode.kind() as usize]
}

/// The acquire time the scripts record: this process's clock, in Unix milliseconds (0
/// before the epoch). Shown to operators only (`acquired_at`, `held_for`); nothing
/// decides on it, so the server's `TIME` is not worth its cost in the acquire script.
pub(crate) fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// This machine's name: `/proc/sys/kernel/hostname`, else `$HOSTNAME`, else `unknown`;
/// kept to letters, digits, `.`, `-` and `_` (anything else becomes `_`), at most 255
/// bytes, so it can never break the format.
fn host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    raw.chars()
        .take(255)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The owner fields of a value's metadata: `|1|<ms>|<fence>|<kind>|<pid>|<host>`.
#[derive(Debug, Default, PartialEq)]
struct Meta {
    acquired_ms: Option<u64>,
    fence: Option<u64>,
    kind: Option<LockKind>,
    pid: Option<u32>,
    host: Option<String>,
}

fn parse_meta(meta: &[u8]) -> Meta {
    let Some(rest) = std::str::from_utf8(meta)
        .ok()
        .and_then(|m| m.strip_prefix("|1|"))
    else {
        return Meta::default();
    };
    let mut fields = rest.splitn(5, '|');
    let mut next = || fields.next().filter(|f| !f.is_empty());
    Meta {
        acquired_ms: next().and_then(|f| f.parse().ok()),
        fence: next().and_then(|f| f.parse().ok()).filter(|&f| f >= 1),
        kind: next().and_then(LockKind::from_code),
        pid: next().and_then(|f| f.parse().ok()),
        host: next().map(str::to_owned),
    }
}

/// The time `ms` milliseconds after the Unix epoch.
fn from_ms(ms: u64) -> Option<SystemTime> {
    UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}

/// A reply of `inspect.lua` for `key`: `None` for nil (nothing held).
pub(crate) fn decode_inspect(key: &str, reply: Value) -> Result<Option<LockInfo>, LockError> {
    let items = match reply {
        Value::Nil => return Ok(None),
        Value::Array(items) => items,
        other => return Err(LockError::unexpected_reply("inspect", format!("{other:?}"))),
    };
    let Ok([kind, pttl, holder, holders, meta, now, kept, shared, queued]) =
        <[Value; 9]>::try_from(items)
    else {
        return Err(LockError::unexpected_reply(
            "inspect",
            "not 9 fields".to_owned(),
        ));
    };
    let text = |v: Value| redis::from_redis_value::<String>(v).ok();
    let kind = text(kind);
    let Some(kind) = kind.as_deref().and_then(LockKind::from_code) else {
        return Err(LockError::unexpected_reply(
            "inspect",
            format!("kind {kind:?}"),
        ));
    };
    let pttl: i64 = redis::from_redis_value(pttl)
        .map_err(|e| LockError::unexpected_reply("inspect", e.to_string()))?;
    let holders: u32 = redis::from_redis_value(holders)
        .map_err(|e| LockError::unexpected_reply("inspect", e.to_string()))?;
    let kept: u32 = redis::from_redis_value(kept)
        .map_err(|e| LockError::unexpected_reply("inspect", e.to_string()))?;
    let queued: u32 = redis::from_redis_value(queued)
        .map_err(|e| LockError::unexpected_reply("inspect", e.to_string()))?;
    let meta = parse_meta(&redis::from_redis_value::<Vec<u8>>(meta).unwrap_or_default());
    let now = text(now).and_then(|n| n.parse::<u64>().ok());
    let shared: Vec<(String, i64)> = redis::from_redis_value(shared)
        .map_err(|e| LockError::unexpected_reply("inspect", e.to_string()))?;
    let mut shared: Vec<SharedHolder> = shared
        .into_iter()
        .map(|(name, ms)| SharedHolder {
            kept: is_kept_name(&name),
            name: name.get(..16).unwrap_or(&name).to_owned(),
            ttl: u64::try_from(ms).ok().map(Duration::from_millis),
            fencing_token: None,
        })
        .collect();
    soonest_to_expire_first(&mut shared);
    Ok(Some(LockInfo {
        key: key.to_owned(),
        // A Redlock permit's place is an exclusive key held for a permit.
        kind: meta
            .kind
            .filter(|_| kind == LockKind::Exclusive)
            .unwrap_or(kind),
        holders,
        kept,
        queued,
        ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
        fencing_token: meta.fence,
        host: meta.host,
        pid: meta.pid,
        acquired_at: meta.acquired_ms.and_then(from_ms),
        held_for: meta
            .acquired_ms
            .zip(now)
            .map(|(at, now)| Duration::from_millis(now.saturating_sub(at))),
        holder: text(holder).unwrap_or_default(),
        shared,
    }))
}

/// Whether `inspect.lua` named a shared holder as kept: its name with `~kept` after
/// the 16 digits.
fn is_kept_name(name: &str) -> bool {
    name.len() == 21 && name.ends_with("~kept")
}

/// What the in-memory backend knows of a grant, as a [`LockInfo`]: an exclusive lock
/// (`shared` empty; `kept`: held only under a kept name), or its shared holders.
pub(crate) fn local(
    key: &str,
    kind: LockKind,
    (kept, shared): (bool, Vec<SharedHolder>),
    ttl: Duration,
    fence: u64,
    acquired_at: SystemTime,
    holder: u64,
) -> LockInfo {
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let (holders, kept) = if shared.is_empty() {
        (1, u32::from(kept))
    } else {
        (
            count(shared.len()),
            count(shared.iter().filter(|h| h.kept).count()),
        )
    };
    LockInfo {
        key: key.to_owned(),
        kind,
        holders,
        kept,
        queued: 0,
        ttl: Some(ttl),
        fencing_token: Some(fence),
        host: Some(this_host().to_owned()),
        pid: Some(std::process::id()),
        acquired_at: Some(acquired_at),
        held_for: SystemTime::now().duration_since(acquired_at).ok(),
        holder: format!("{holder:016x}"),
        shared,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_and_odd_values_parse_to_nothing() {
        let suffix = owner_suffix(Mode::Read);
        let meta = parse_meta(format!("|1|1700000000123|42{suffix}").as_bytes());
        assert_eq!(meta.acquired_ms, Some(1_700_000_000_123));
        assert_eq!(meta.fence, Some(42));
        assert_eq!(meta.kind, Some(LockKind::Read));
        assert_eq!(meta.pid, Some(std::process::id()));
        assert_eq!(meta.host.as_deref(), Some(host_name().as_str()));
        for odd in [
            &b""[..],
            b"|2|1|2|e|3|h",
            b"garbage",
            b"|1|x|y",
            b"\xff\xfe",
        ] {
            let meta = parse_meta(odd);
            assert_eq!((meta.fence, meta.pid, meta.host), (None, None, None));
        }
    }

    /// A lock inspected the moment it was granted read "held … for 0ns".
    #[test]
    fn durations_read_to_the_millisecond() {
        assert_eq!(short(Duration::ZERO), "0ms");
        assert_eq!(short(Duration::from_micros(999)), "0ms");
        assert_eq!(short(Duration::from_micros(1_500)), "1ms");
        assert_eq!(short(Duration::from_millis(29_999)), "29.999s");
    }

    #[test]
    fn host_names_cannot_break_the_format() {
        let host = host_name();
        assert!(!host.is_empty() && host.len() <= 255);
        assert!(!host.contains('|'));
    }
}
