//! What the stores answer: an acquisition attempt's outcome (one key, or several at
//! once) and a renewal's.

use std::time::Duration;

/// The outcome of one acquisition attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The lock is ours, with this fencing token; `replicas` is the `WAIT` count when
    /// replicas were asked for.
    Acquired { fence: u64, replicas: Option<u32> },
    /// Someone else holds it for about this long (`None`: no expiry was set). `holder`
    /// names the holder when the server said who (a digest of its token, the same on
    /// every node that holder holds; Redis backends only).
    Held {
        remaining: Option<Duration>,
        holder: Option<u64>,
    },
}

/// The outcome of one attempt at several keys at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Together {
    /// Every key is ours, with these fencing tokens (in key order).
    Acquired(Vec<u64>),
    /// A key is held by someone else for about this long; nothing was taken.
    Held(Option<Duration>),
}

/// What one renewal of a batch found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewed {
    /// The lock lives another ttl.
    Yes,
    /// The server (or a Redlock majority) no longer has our token.
    Lost,
    /// No answer for this lock (its node or slot failed): retry soon.
    Unknown,
}

impl From<bool> for Renewed {
    fn from(renewed: bool) -> Self {
        if renewed {
            Self::Yes
        } else {
            Self::Lost
        }
    }
}
