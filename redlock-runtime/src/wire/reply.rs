//! What the stores answer: an acquisition attempt's outcome (one key, or several at
//! once) and a renewal's; the scripts' acquire replies read as [`FromRedisValue`].

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

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
    /// A fair lock's waiter whose turn it is not: the key is held for about
    /// `remaining` (`None`: free, someone else's turn, or no expiry), and the waiter's
    /// place has `ticket`.
    Queued {
        remaining: Option<Duration>,
        holder: Option<u64>,
        ticket: u64,
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

impl Attempt {
    /// The attempt, a grant counting `acked` replicas (the `WAIT` that followed it).
    pub(crate) fn acked(self, acked: Option<u32>) -> Self {
        match self {
            Self::Acquired { fence, .. } => Self::Acquired {
                fence,
                replicas: acked,
            },
            held => held,
        }
    }
}

/// The reply of `acquire.lua`, `acquire_shared.lua` and `acquire_fair.lua`: the grant's
/// fencing token, or `{pttl, holder}` when held (`{pttl, holder, ticket}`: a fair
/// waiter's turn has not come).
///
/// A grant whose fence is not a positive integer that fits a `u64` is an error, never
/// token 0: the caller gives the lock back (the manager's pending-attempt release). A
/// holder that is not 16 hex digits is simply not named.
impl FromRedisValue for Attempt {
    fn from_redis_value(reply: Value) -> Result<Self, ParsingError> {
        let items = match reply {
            Value::Array(items) => items,
            fence => {
                return Ok(Self::Acquired {
                    fence: fence_of(&fence)?,
                    replicas: None,
                })
            }
        };
        let mut items = items.into_iter();
        let pttl = items.next().ok_or("an empty array".to_owned())?;
        let pttl = i64::from_redis_value(pttl)?;
        let holder = items
            .next()
            .and_then(|h| String::from_redis_value(h).ok())
            .filter(|h| h.len() == 16)
            .and_then(|h| u64::from_str_radix(&h, 16).ok());
        let remaining = u64::try_from(pttl).ok().map(Duration::from_millis);
        match items.next() {
            None => Ok(Self::Held { remaining, holder }),
            Some(ticket) => Ok(Self::Queued {
                remaining,
                holder,
                ticket: u64::from_redis_value(ticket)?,
            }),
        }
    }
}

/// The reply of `acquire_all.lua`: `{1, fence..}` (one per key) or
/// `{0, i, pttl, holder}`. The caller checks the number of fences.
impl FromRedisValue for Together {
    fn from_redis_value(reply: Value) -> Result<Self, ParsingError> {
        let Value::Array(items) = reply else {
            return Err(format!("{reply:?} from acquire_all").into());
        };
        let mut items = items.into_iter();
        match items.next() {
            Some(Value::Int(1)) => items
                .map(|f| fence_of(&f))
                .collect::<Result<Vec<_>, _>>()
                .map(Self::Acquired),
            Some(Value::Int(0)) => {
                let pttl = items.nth(1).and_then(|p| i64::from_redis_value(p).ok());
                Ok(Self::Held(
                    pttl.and_then(|p| u64::try_from(p).ok())
                        .map(Duration::from_millis),
                ))
            }
            other => Err(format!("{other:?} leading an acquire_all reply").into()),
        }
    }
}

/// The fencing token in a grant: an integer, or the counter's decimal digits, exactly
/// (above 2^53 a Lua number would round it).
fn fence_of(value: &Value) -> Result<u64, ParsingError> {
    let digits = match value {
        Value::Int(n) => {
            return u64::try_from(*n)
                .ok()
                .filter(|&fence| fence >= 1)
                .ok_or_else(|| format!("fencing token {n} is not positive").into())
        }
        Value::BulkString(bytes) => bytes.as_slice(),
        Value::SimpleString(s) => s.as_bytes(),
        other => return Err(format!("fencing token {other:?}").into()),
    };
    std::str::from_utf8(digits)
        .ok()
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|&fence| fence >= 1)
        .ok_or_else(|| {
            format!(
                "fencing token {:?} is not a positive 64-bit integer",
                String::from_utf8_lossy(digits)
            )
            .into()
        })
}
