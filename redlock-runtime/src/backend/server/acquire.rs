//! Acquisition requests (`acquire.lua`, `acquire_shared.lua`, `acquire_all.lua`) and
//! their replies: grants with their fencing tokens, or the holder and its remaining hold.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{FromRedisValue, Value};

use super::{reconnecting, ttl_ms, ScriptCall};
use crate::info::{owner_suffix, unix_ms_now};
use crate::key::LockKey;
use crate::kind::Mode;
use crate::scripts::{ACQUIRE, ACQUIRE_ALL, ACQUIRE_FAIR, ACQUIRE_SHARED};
use crate::token::Token;
use crate::wire::{Attempt, Claim, Flag, Publish, Purpose, Together};
use crate::LockError;

/// An acquire script's reply ([`Attempt`]'s `FromRedisValue`), a grant counting
/// `replicas` acknowledgements when a `WAIT` followed it.
pub(crate) fn decode_acquire(reply: Value, replicas: Option<u32>) -> Result<Attempt, LockError> {
    Attempt::from_redis_value(reply)
        .map(|attempt| attempt.acked(replicas))
        .map_err(|e| LockError::unexpected_reply("acquire", e.to_string()))
}

/// The call of `acquire_all.lua` for `keys` (every key, then every key's counter).
pub(crate) fn acquire_all_call(keys: &[&LockKey], token: Token, ttl: Duration) -> ScriptCall {
    let full = keys.iter().map(|k| k.full().to_owned());
    let fences = keys.iter().map(|k| k.fence().to_owned());
    ScriptCall {
        script: &ACQUIRE_ALL,
        keys: full.chain(fences).collect(),
        args: vec![
            token.as_bytes().to_vec(),
            ttl_ms(ttl).to_string().into_bytes(),
            owner_suffix(Mode::Exclusive).as_bytes().to_vec(),
            unix_ms_now().to_string().into_bytes(),
        ],
    }
}

/// The arguments of the plain exclusive `acquire.lua` call (no writer intent): token,
/// ttl and the owner metadata.
pub(crate) fn acquire_args(
    token: &Token,
    ttl: Duration,
) -> (&[u8], u64, &'static str, &'static str, &'static str, u64) {
    (
        token.as_bytes(),
        ttl_ms(ttl),
        owner_suffix(Mode::Exclusive),
        "",
        "",
        unix_ms_now(),
    )
}

/// An `acquire_all.lua` reply for `n` keys ([`Together`]'s `FromRedisValue`), with
/// one fence per key.
pub(crate) fn decode_acquire_all(reply: Value, n: usize) -> Result<Together, LockError> {
    let unexpected = |detail| LockError::unexpected_reply("acquire", detail);
    match Together::from_redis_value(reply).map_err(|e| unexpected(e.to_string()))? {
        Together::Acquired(fences) if fences.len() != n => {
            Err(unexpected(format!("{} fences for {n} keys", fences.len())))
        }
        together => Ok(together),
    }
}

/// An acquisition attempt: `acquire_shared.lua` for a reader or a permit,
/// `acquire.lua` with the writer's intent for an exclusive claim, `acquire_fair.lua`
/// (telling a new first waiter by `publish`) for a fair one.
pub(crate) fn acquire_call(claim: &Claim<'_>, publish: Publish) -> ScriptCall {
    let key = claim.key;
    let token = claim.token.as_bytes().to_vec();
    let ttl = ttl_ms(claim.ttl).to_string().into_bytes();
    match claim.mode {
        Mode::Exclusive => {
            let mut keys = vec![key.full().to_owned(), key.fence().to_owned()];
            let mut args = vec![token, ttl, owner_suffix(claim.mode).as_bytes().to_vec()];
            match claim.intent {
                Some(intent) => {
                    keys.push(key.intents());
                    args.push(intent.waiter.to_string().into_bytes());
                    args.push(ttl_ms(intent.until).to_string().into_bytes());
                }
                None => args.extend([Vec::new(), Vec::new()]),
            }
            args.push(unix_ms_now().to_string().into_bytes());
            ScriptCall {
                script: &ACQUIRE,
                keys,
                args,
            }
        }
        Mode::Fair => fair_call(claim, publish),
        Mode::Read | Mode::Permit(_) => ScriptCall {
            script: &ACQUIRE_SHARED,
            keys: vec![
                key.full().to_owned(),
                key.holders(),
                key.fence().to_owned(),
                key.intents(),
            ],
            args: vec![
                token,
                ttl,
                claim.mode.marker().as_bytes().to_vec(),
                claim.mode.limit().to_string().into_bytes(),
                Flag(claim.mode.yields_to_writers()).arg().to_vec(),
                owner_suffix(claim.mode).as_bytes().to_vec(),
            ],
        },
    }
}

/// A fair claim's `acquire_fair.lua` call: `acquire.lua`'s keys and arguments (no writer
/// intent), then the queue's.
fn fair_call(claim: &Claim<'_>, publish: Publish) -> ScriptCall {
    let key = claim.key;
    let (waiter, ticket, heartbeat, bound) = match claim.arrival {
        Some(a) => (a.waiter.to_string(), a.ticket, ttl_ms(a.heartbeat), a.bound),
        None => (String::new(), 0, 1, 0),
    };
    let settle = claim.arrival.is_some_and(|a| a.purpose == Purpose::Settle);
    ScriptCall {
        script: &ACQUIRE_FAIR,
        keys: vec![
            key.full().to_owned(),
            key.fence().to_owned(),
            key.intents(),
            key.queue(),
            key.heartbeats(),
        ],
        args: vec![
            claim.token.as_bytes().to_vec(),
            ttl_ms(claim.ttl).to_string().into_bytes(),
            owner_suffix(claim.mode).as_bytes().to_vec(),
            Vec::new(),
            Vec::new(),
            unix_ms_now().to_string().into_bytes(),
            waiter.into_bytes(),
            ticket.to_string().into_bytes(),
            heartbeat.to_string().into_bytes(),
            bound.to_string().into_bytes(),
            publish.command().as_bytes().to_vec(),
            if settle {
                b"place".to_vec()
            } else {
                Vec::new()
            },
        ],
    }
}

/// Whether an attempt goes through [`acquire_call`] (a reader, a permit, a writer with
/// an intent) rather than the plain exclusive request the uncontended path builds in
/// place.
pub(crate) fn by_script_call(claim: &Claim<'_>) -> bool {
    claim.mode != Mode::Exclusive || claim.intent.is_some()
}

/// One attempt through [`acquire_call`] on `con`, sent again once if the connection
/// dropped under it (a retry finding its own place is granted again, with a token of
/// its own).
pub(crate) async fn acquire_by_call<C>(
    con: &C,
    claim: &Claim<'_>,
    publish: Publish,
) -> Result<Attempt, LockError>
where
    C: ConnectionLike + Clone,
{
    let call = acquire_call(claim, publish);
    let reply: Value = reconnecting(|| call.invoke(con))
        .await
        .map_err(LockError::backend("acquire"))?;
    decode_acquire(reply, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_replies_decode_to_exact_fences_or_the_holder() {
        let fence = |reply| match decode_acquire(reply, None) {
            Ok(Attempt::Acquired { fence, .. }) => Ok(fence),
            Ok(other) => panic!("not a grant: {other:?}"),
            Err(e) => Err(e.to_string()),
        };
        // Below 2^53 the script sends an integer; above, the counter's digits.
        assert_eq!(fence(Value::Int(7)), Ok(7));
        let max = Value::BulkString(u64::MAX.to_string().into_bytes());
        assert_eq!(fence(max), Ok(u64::MAX));
        for bad in [
            Value::Int(0),
            Value::Int(-3),
            Value::BulkString(b"18446744073709551616".to_vec()),
            Value::BulkString(b"12a".to_vec()),
            Value::Nil,
        ] {
            assert!(fence(bad.clone()).is_err(), "{bad:?} was taken for a fence");
        }
        let held = Value::Array(vec![
            Value::Int(1500),
            Value::BulkString(b"00000000000000ff".to_vec()),
        ]);
        match decode_acquire(held, None).unwrap() {
            Attempt::Held { remaining, holder } => {
                assert_eq!(remaining, Some(Duration::from_millis(1500)));
                assert_eq!(holder, Some(255));
            }
            other => panic!("not held: {other:?}"),
        }
    }
}
