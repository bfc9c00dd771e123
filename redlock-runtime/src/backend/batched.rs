//! The plain exclusive acquire and release as requests that ride a shared call
//! ([`Coalescer`](super::coalesce::Coalescer)): `acquire_batch.lua` and
//! `release_batch.lua`, one reply per request.

use redis::aio::ConnectionManager;
use redis::{RedisResult, Value};

use super::coalesce::Batched;
use super::server::{is_dropped, reconnecting};
use crate::info::{owner_suffix, unix_ms_now};
use crate::kind::Mode;
use crate::scripts::{ACQUIRE_BATCH, RELEASE, RELEASE_BATCH};
use crate::token::Token;

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
    /// time finds its own token and is granted again (`acquire_batch.lua`).
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
        Ok(per_request(reply)?
            .into_iter()
            .map(|outcome| match outcome {
                // `{message}`: this claim's counter failed it (a refusal has two items).
                Ok(Value::Array(mut items)) if items.len() == 1 => {
                    let message = redis::from_redis_value::<String>(items.remove(0))
                        .unwrap_or_else(|e| format!("unreadable failure: {e}"));
                    Err(redis::RedisError::from((
                        redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                        "acquire failed",
                        message,
                    )))
                }
                other => other,
            })
            .collect())
    }

    /// A grant, or an outcome not known, is released (with its wake-up): nobody holds it.
    async fn orphaned(self, con: ConnectionManager, outcome: RedisResult<Value>) {
        if let Ok(Value::Array(_)) = outcome {
            return;
        }
        let released = RELEASE
            .invoke::<i64, _, _, _>(
                &con,
                &[self.key.as_str()],
                (self.token.as_bytes(), "PUBLISH"),
            )
            .await;
        tracing::debug!(
            key = %self.key,
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
        args.push(b"PUBLISH");
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

/// A batch script's array reply as one outcome per request.
fn per_request(reply: Value) -> RedisResult<Vec<RedisResult<Value>>> {
    match reply {
        Value::Array(items) => Ok(items.into_iter().map(Ok).collect()),
        other => Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "a batch script answered something other than an array",
            format!("{other:?}"),
        ))),
    }
}
