//! The plain exclusive acquire and release as requests that ride a shared call
//! ([`Coalescer`](super::coalesce::Coalescer)): `acquire_batch.lua` and
//! `release_batch.lua`, one reply per request.

use redis::aio::ConnectionManager;
use redis::{RedisResult, Value};

use super::coalesce::Batched;
use super::server::{is_dropped, reconnecting, RELEASE_RETRIES};
use crate::info::{owner_suffix, unix_ms_now};
use crate::kind::Mode;
use crate::scripts::{ACQUIRE_BATCH, RELEASE, RELEASE_BATCH};
use crate::token::Token;
use crate::wire::Publish;

/// An exclusive claim without a writer intent or replicas to wait for.
pub(crate) struct AcquireRequest {
    pub(crate) key: String,
    pub(crate) fence: String,
    pub(crate) token: Token,
    pub(crate) ttl_ms: u64,
}

/// A release that keeps nothing, of a lease without replicas to wait for.
pub(crate) struct ReleaseRequest {
    pub(crate) key: String,
    pub(crate) token: Token,
}

impl Batched for AcquireRequest {
    /// Sent again once if the connection dropped under it: a claim applied the first
    /// time finds its own token and is granted again (`acquire_batch.lua`). Not counted in
    /// `SingleBackend::resends`, which only Redlock reads: its nodes never coalesce.
    async fn send(con: ConnectionManager, batch: &[Self]) -> RedisResult<Vec<RedisResult<Value>>> {
        let mut keys = Vec::with_capacity(batch.len() * 2);
        let mut args: Vec<Vec<u8>> = Vec::with_capacity(batch.len() * 2 + 2);
        args.push(owner_suffix(Mode::Exclusive).as_bytes().to_vec());
        args.push(unix_ms_now().to_string().into_bytes());
        for claim in batch {
            keys.push(claim.key.as_str());
            keys.push(claim.fence.as_str());
            args.push(claim.token.as_bytes().to_vec());
            args.push(claim.ttl_ms.to_string().into_bytes());
        }
        let reply: Value = reconnecting(|| ACQUIRE_BATCH.invoke(&con, &keys, &args[..])).await?;
        per_request(reply)
    }

    /// A grant, or an outcome not known, is released (with its wake-up): nobody holds it.
    /// Tried again after [`RELEASE_RETRIES`] while it fails: this is the only undo once
    /// the manager's own may have reached the server before the grant.
    async fn orphaned(self, con: ConnectionManager, outcome: RedisResult<Value>) {
        if let Ok(Value::Array(_)) = outcome {
            return;
        }
        let keys = [self.key.as_str()];
        let args = (self.token.as_bytes(), Publish::Channel);
        let mut released = RELEASE.invoke::<i64, _, _, _>(&con, &keys, args).await;
        for pause in RELEASE_RETRIES {
            if released.is_ok() {
                break;
            }
            tokio::time::sleep(pause).await;
            released = RELEASE.invoke::<i64, _, _, _>(&con, &keys, args).await;
        }
        tracing::debug!(
            target: "redlock",
            key = %self.key,
            backend = "single",
            ?released,
            "coalesced acquire answered after its caller gave up: released"
        );
    }
}

impl Batched for ReleaseRequest {
    /// Sent again once if the connection dropped under it; a key the second call finds
    /// gone was released by the first (a lock still held cannot have expired).
    async fn send(con: ConnectionManager, batch: &[Self]) -> RedisResult<Vec<RedisResult<Value>>> {
        let keys: Vec<&str> = batch.iter().map(|r| r.key.as_str()).collect();
        let mut args: Vec<&[u8]> = Vec::with_capacity(batch.len() + 1);
        args.push(Publish::Channel.command().as_bytes());
        args.extend(batch.iter().map(|r| r.token.as_bytes()));
        let request = || RELEASE_BATCH.invoke::<Value, _, _, _>(&con, &keys, &args[..]);
        match request().await {
            Err(e) if is_dropped(&e) => {
                let again = per_request(request().await?)?;
                Ok(again
                    .into_iter()
                    .map(|r| match r {
                        Ok(Value::Int(0)) => Ok(Value::Int(1)),
                        other => other,
                    })
                    .collect())
            }
            other => per_request(other?),
        }
    }

    /// Nothing to do: the release was applied, or the lock's ttl frees it.
    async fn orphaned(self, _con: ConnectionManager, _outcome: RedisResult<Value>) {}
}

/// A batch script's array reply as one outcome per request: `{message}` (a one-item
/// array; a refusal has two) is that request's failure, the error the server would have
/// answered the request alone.
fn per_request(reply: Value) -> RedisResult<Vec<RedisResult<Value>>> {
    match reply {
        Value::Array(items) => Ok(items
            .into_iter()
            .map(|item| match item {
                Value::Array(mut failure) if failure.len() == 1 => {
                    let message = redis::from_redis_value::<String>(failure.remove(0))
                        .unwrap_or_else(|e| format!("ERR unreadable failure: {e}"));
                    Err(server_error(&message))
                }
                other => Ok(other),
            })
            .collect()),
        other => Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "a batch script answered something other than an array",
            format!("{other:?}"),
        ))),
    }
}

/// The error a server reply `-message` makes (the text as the server wrote it).
fn server_error(message: &str) -> redis::RedisError {
    let line = format!("-{}\r\n", message.replace(['\r', '\n'], " "));
    match redis::parse_redis_value(line.as_bytes()) {
        Ok(Value::ServerError(e)) => e.into(),
        _ => redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "script failed",
            message.to_owned(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed request of a batch reads as the error the server would have answered it
    /// alone: its code, and its text.
    #[test]
    fn a_failed_request_is_the_servers_own_error() {
        let reply = Value::Array(vec![
            Value::Int(7),
            Value::Array(vec![Value::BulkString(
                b"WRONGTYPE Operation against a key holding the wrong kind of value".to_vec(),
            )]),
            Value::Array(vec![Value::Int(15), Value::BulkString(b"00ff".to_vec())]),
            Value::Array(vec![Value::BulkString(
                b"ERR fencing counter lock:fence:{4} holds no positive integer".to_vec(),
            )]),
        ]);
        let outcomes = per_request(reply).unwrap();
        assert_eq!(outcomes[0], Ok(Value::Int(7)));
        let wrong = outcomes[1].as_ref().unwrap_err();
        assert_eq!(wrong.code(), Some("WRONGTYPE"));
        assert!(wrong.to_string().contains("wrong kind of value"), "{wrong}");
        assert!(matches!(outcomes[2], Ok(Value::Array(ref v)) if v.len() == 2));
        let counter = outcomes[3].as_ref().unwrap_err();
        assert!(
            counter
                .to_string()
                .contains("fencing counter lock:fence:{4}"),
            "{counter}"
        );
        assert!(
            per_request(Value::Int(1)).is_err(),
            "a reply that is no array"
        );
    }
}
