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
    /// One holder at a time, granted in the order of arrival across every process:
    /// [`fair`](crate::LockManager::fair).
    Fair,
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl LockKind {
    /// Every kind, in declaration order (`ALL[kind as usize] == kind`).
    pub(crate) const ALL: [Self; 4] = [Self::Exclusive, Self::Read, Self::Permit, Self::Fair];

    /// The kind's name, as shown and as the metrics' `kind` label.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Exclusive => "exclusive",
            Self::Read => "read",
            Self::Permit => "permit",
            Self::Fair => "fair",
        }
    }

    /// The letter a lock's metadata records its kind by (`|e|`, `|r|`, `|p|` in the
    /// value, and `inspect.lua`'s first field).
    pub(crate) fn code(self) -> char {
        match self {
            Self::Exclusive => 'e',
            Self::Read => 'r',
            Self::Permit => 'p',
            Self::Fair => 'f',
        }
    }

    /// The kind recorded as `code` (see [`code`](Self::code)).
    pub(crate) fn from_code(code: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|kind| code.len() == 1 && code.starts_with(kind.code()))
    }
}

/// What an acquisition asks for: the one enum of a lock's kind from the attribute's
/// option (`#[distributed_lock]` expansions name it through the facade's hidden
/// `__private` module) to the script's arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The key alone: the default, `mode = "write"` or `mode = "exclusive"`; also every
    /// key of `lock_all` and of the attribute's `keys`.
    Exclusive,
    /// A place among the readers: `mode = "read"`.
    Read,
    /// One of this many places: `permits = n`.
    Permit(u32),
    /// The key alone, in the order of arrival on the server: `mode = "fair"`.
    Fair,
}

impl Mode {
    /// The kind of lock a grant of this mode is.
    pub(crate) fn kind(self) -> LockKind {
        match self {
            Self::Exclusive => LockKind::Exclusive,
            Self::Read => LockKind::Read,
            Self::Permit(_) => LockKind::Permit,
            Self::Fair => LockKind::Fair,
        }
    }

    /// Whether holders share the key (read, permits): they are members of its holder
    /// set, each with an expiry of its own, rather than the key's value.
    pub(crate) fn is_shared(self) -> bool {
        !matches!(self, Self::Exclusive | Self::Fair)
    }

    /// How many holders may share the key (`acquire_shared.lua`'s limit): `n` for
    /// permits, 0 (no limit) otherwise.
    pub(crate) fn limit(self) -> u32 {
        match self {
            Self::Permit(n) => n,
            Self::Exclusive | Self::Read | Self::Fair => 0,
        }
    }

    /// Whether new holders of this mode stay out while a writer waits for the key:
    /// readers do (a writer is not starved by readers); a permit is no reader.
    pub(crate) fn yields_to_writers(self) -> bool {
        matches!(self, Self::Read)
    }

    /// The marker a shared holder kind writes into the lock key (`acquire_shared.lua`).
    pub(crate) fn marker(self) -> &'static str {
        match self {
            Self::Read => "~read",
            Self::Permit(_) | Self::Exclusive | Self::Fair => "~permit",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_in_all_at_its_own_index() {
        for (i, kind) in LockKind::ALL.into_iter().enumerate() {
            assert_eq!(kind as usize, i, "{kind}");
        }
    }

    #[test]
    fn every_kind_is_read_back_from_its_code_and_nothing_else_is() {
        for kind in LockKind::ALL {
            assert_eq!(LockKind::from_code(&kind.code().to_string()), Some(kind));
        }
        for other in ["", "x", "ee", "E", "exclusive"] {
            assert_eq!(LockKind::from_code(other), None, "{other:?}");
        }
    }
}
