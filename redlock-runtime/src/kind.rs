//! The kinds of lock: exclusive (also the write side of a read/write lock), read, and
//! leased permits.

use std::fmt;

/// What a [`LockGuard`](crate::LockGuard) holds.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), redlock::LockError> {
/// use redlock::{LockKind, LockManager};
/// let locks = LockManager::builder().in_memory().build().await?;
/// let reader = locks.read("report_{7}").await?;
/// assert_eq!(reader.kind(), LockKind::Read);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockKind {
    /// One holder at a time: [`lock`](crate::LockManager::lock) and
    /// [`write`](crate::LockManager::write).
    Exclusive,
    /// One of any number of readers, while no writer holds or waits:
    /// [`read`](crate::LockManager::read).
    Read,
    /// One of at most `n` holders: [`permit`](crate::LockManager::permit).
    Permit,
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Exclusive => "exclusive",
            Self::Read => "read",
            Self::Permit => "permit",
        })
    }
}

/// What an acquisition asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The key alone.
    Exclusive,
    /// A place among the readers.
    Read,
    /// One of this many places.
    Permit(u32),
}

impl Mode {
    /// The kind of lock a grant of this mode is.
    pub(crate) fn kind(self) -> LockKind {
        match self {
            Self::Exclusive => LockKind::Exclusive,
            Self::Read => LockKind::Read,
            Self::Permit(_) => LockKind::Permit,
        }
    }

    /// Whether holders share the key (read, permits): they are members of its holder
    /// set, each with an expiry of its own, rather than the key's value.
    pub(crate) fn is_shared(self) -> bool {
        !matches!(self, Self::Exclusive)
    }
}
