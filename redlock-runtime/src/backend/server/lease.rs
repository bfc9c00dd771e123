//! The requests of one lease that single servers and cluster nodes answer alike:
//! extend, release, force-unlock and the withdrawal of a writer's intent. The shared
//! functions build each request and read its reply; each backend sends it its own way
//! ([`LeaseSender`]).

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{FromRedisValue, Value};

use super::renew::renew_call;
use super::{decode, is_dropped, ttl_ms, ScriptCall};
use crate::key::LockKey;
use crate::kind::Mode;
use crate::scripts::{EXTEND, FORCE_UNLOCK, RELEASE, RELEASE_SHARED, WITHDRAW};
use crate::token::Token;
use crate::wire::Seen;
use crate::wire::{LeaseRef, Publish, Renewal, ReplicaWait};
use crate::LockError;

/// A release: compare-token delete (or keep, with `keep` > 0) and a wake-up by `publish`.
pub(crate) fn release_call(lease: LeaseRef<'_>, keep: Duration, publish: Publish) -> ScriptCall {
    let key = lease.key;
    let token = lease.token.as_bytes().to_vec();
    let keep = ttl_ms_or_zero(keep).to_string().into_bytes();
    if lease.mode.is_shared() {
        ScriptCall {
            script: &RELEASE_SHARED,
            keys: vec![key.full().to_owned(), key.holders()],
            args: vec![
                token,
                publish.command().as_bytes().to_vec(),
                lease.mode.marker().as_bytes().to_vec(),
                keep,
            ],
        }
    } else {
        let mut keys = vec![key.full().to_owned()];
        if lease.mode == Mode::Fair {
            // The wake-up names the queue's first waiter.
            keys.extend([key.queue(), key.heartbeats()]);
        }
        ScriptCall {
            script: &RELEASE,
            keys,
            args: vec![token, publish.command().as_bytes().to_vec(), keep],
        }
    }
}

/// An extend of `lease` to `ttl`: `extend.lua` for the key alone, `renew_shared.lua` for
/// one place; either wakes by `publish` when the hold gets shorter (waiters were told
/// the later expiry).
fn extend_call(lease: LeaseRef<'_>, ttl: Duration, publish: Publish) -> ScriptCall {
    if !lease.mode.is_shared() {
        return ScriptCall {
            script: &EXTEND,
            keys: vec![lease.key.full().to_owned()],
            args: vec![
                lease.token.as_bytes().to_vec(),
                ttl_ms(ttl).to_string().into_bytes(),
                publish.command().as_bytes().to_vec(),
            ],
        };
    }
    let renewal = Renewal {
        key: lease.key,
        token: lease.token,
        ttl,
        mode: lease.mode,
        replicas: lease.replicas,
    };
    let mut call = renew_call(std::slice::from_ref(&renewal));
    call.args.push(publish.command().as_bytes().to_vec());
    call
}

/// Whether an [`extend_call`]'s reply says extended (`extend.lua`: 1; `renew_shared.lua`:
/// `[1]`).
fn decode_extended(reply: Value) -> Result<bool, LockError> {
    match reply {
        Value::Array(flags) => Ok(matches!(flags.as_slice(), [Value::Int(1)])),
        other => decode::<i64>(other, "extend").map(|flag| flag == 1),
    }
}

/// `d` in whole milliseconds, rounded up (a keep is never cut short), 0 for zero (a
/// keep of 0 deletes at once).
fn ttl_ms_or_zero(d: Duration) -> u64 {
    let partial = !d.subsec_nanos().is_multiple_of(1_000_000);
    u64::try_from(d.as_millis() + u128::from(partial)).unwrap_or(u64::MAX)
}

/// The withdrawal of `waiter` from `key` (`withdraw.lua`): a writer's intent or a fair
/// waiter's place, and a wake-up by `publish` for the readers an intent kept out, or the
/// fair waiter first behind a place.
pub(crate) fn withdraw_call(key: &LockKey, waiter: u64, publish: Publish) -> ScriptCall {
    ScriptCall {
        script: &WITHDRAW,
        keys: vec![
            key.full().to_owned(),
            key.intents(),
            key.queue(),
            key.heartbeats(),
        ],
        args: vec![
            waiter.to_string().into_bytes(),
            publish.command().as_bytes().to_vec(),
        ],
    }
}

/// `force_unlock.lua` for `key` on `con` (waking by `publish`), whoever holds it or only
/// the grant `seen`: true when something was deleted. Not sent again after a dropped
/// connection: the caller asks.
pub(crate) async fn force_unlock_on<C>(
    con: &C,
    key: &LockKey,
    publish: Publish,
    seen: Option<Seen<'_>>,
) -> Result<bool, LockError>
where
    C: ConnectionLike + Clone,
{
    let holder = seen.and_then(|s| s.holder).unwrap_or_default();
    let fence = seen.and_then(|s| s.fence).map(|f| f.to_string());
    let call = ScriptCall {
        script: &FORCE_UNLOCK,
        keys: vec![key.full().to_owned(), key.holders(), key.intents()],
        args: vec![
            publish.command().as_bytes().to_vec(),
            holder.as_bytes().to_vec(),
            fence.unwrap_or_default().into_bytes(),
        ],
    };
    let deleted: i64 = call
        .invoke(con)
        .await
        .map_err(LockError::backend("force_unlock"))?;
    Ok(deleted == 1)
}

/// Whether a backend sends a lease's request again itself after the connection dropped
/// under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Once, here (the connection manager reconnects on that error): every script is
    /// idempotent per token, and a release whose second send finds the key gone was
    /// released by the first one, whose reply was lost.
    OnceAfterDrop,
    /// Never here: the client re-sends by itself, out of sight (the cluster client), so
    /// a reply cannot be told to answer a second send.
    ByClient,
}

/// How a backend sends the requests of one lease: the shared [`extend_lease`] and
/// [`release_lease`] build each request and read its reply, the backend supplies its
/// command connection, its [`Resend`] rule and its `WAIT` pipeline.
pub(crate) trait LeaseSender {
    /// The command connection's type.
    type Con: ConnectionLike + Clone;

    /// Whether a request is sent again here after a dropped connection.
    const RESEND: Resend;

    /// The command connection (multiplexed: requests go out concurrently).
    fn command_con(&self) -> &Self::Con;

    /// `call`, then a `WAIT` for `rw`, as one pipeline on the master of `key` and on a
    /// connection of its own (`WAIT` blocks the connection): the call's reply, and how
    /// many replicas acknowledged it.
    async fn send_waiting(
        &self,
        call: &ScriptCall,
        key: &LockKey,
        rw: ReplicaWait,
        operation: &'static str,
    ) -> Result<(Value, u32), LockError>;
}

/// One request of a lease on the command connection.
enum LeaseRequest<'a> {
    /// The plain exclusive release (the uncontended path), built in place.
    Release {
        key: &'a LockKey,
        token: Token,
        publish: Publish,
    },
    /// Any other request, as a script call.
    Call(ScriptCall),
}

/// A reply, and whether it answers a request sent a second time.
struct Sent<T> {
    reply: T,
    resent: bool,
}

impl LeaseRequest<'_> {
    /// `EVALSHA`, then `EVAL` on `NOSCRIPT`.
    async fn invoke<T, C>(&self, con: &C) -> redis::RedisResult<T>
    where
        T: FromRedisValue,
        C: ConnectionLike + Clone,
    {
        match self {
            Self::Release {
                key,
                token,
                publish,
            } => {
                RELEASE
                    .invoke(con, &[key.full()], (token.as_bytes(), *publish))
                    .await
            }
            Self::Call(call) => call.invoke(con).await,
        }
    }

    /// Sends the request on `sender`'s command connection, and once more after a dropped
    /// connection when its rule says so ([`Resend::OnceAfterDrop`]).
    async fn send<T, S>(&self, sender: &S) -> redis::RedisResult<Sent<T>>
    where
        T: FromRedisValue,
        S: LeaseSender,
    {
        let con = sender.command_con();
        match self.invoke(con).await {
            Err(e) if S::RESEND == Resend::OnceAfterDrop && is_dropped(&e) => {
                let reply = self.invoke(con).await?;
                Ok(Sent {
                    reply,
                    resent: true,
                })
            }
            other => other.map(|reply| Sent {
                reply,
                resent: false,
            }),
        }
    }
}

/// Extends `lease` to `ttl` ([`extend_call`], waking by `publish`), sent by `sender`.
///
/// With the lease's replicas to wait for (`min_replicas`), the extend and a `WAIT` go
/// as one pipeline on a connection of their own, and the extend counts only once
/// acknowledged: [`LockError::ReplicasUnavailable`] otherwise (the lease keeps its
/// earlier deadline).
pub(crate) async fn extend_lease<S: LeaseSender>(
    sender: &S,
    lease: LeaseRef<'_>,
    ttl: Duration,
    publish: Publish,
) -> Result<bool, LockError> {
    let call = extend_call(lease, ttl, publish);
    let Some(rw) = lease.replicas else {
        let sent: Sent<Value> = LeaseRequest::Call(call)
            .send(sender)
            .await
            .map_err(LockError::backend("extend"))?;
        return decode_extended(sent.reply);
    };
    let (reply, acked) = sender.send_waiting(&call, lease.key, rw, "extend").await?;
    let extended = decode_extended(reply)?;
    if extended {
        replicas_met(lease.key, rw, acked)?;
    }
    Ok(extended)
}

/// Releases `lease` ([`release_call`]: deletes its hold, or keeps the key for `keep`),
/// waking by `publish`, sent by `sender`: true when our lock is gone because of this call.
///
/// When the connection dropped under the first request and `sender` sends it again
/// ([`Resend::OnceAfterDrop`]), the first may have been applied with its reply lost; the
/// second then finds the key gone, which means released (a lock the caller still held
/// cannot have expired), not lost.
///
/// A release that keeps the key (`hold_at_least`) of a lease waiting for replicas sends
/// a `WAIT` with it: [`LockError::ReplicasUnavailable`] when too few acknowledged (the
/// key is kept on the primary, but a failover may cut the hold).
pub(crate) async fn release_lease<S: LeaseSender>(
    sender: &S,
    lease: LeaseRef<'_>,
    keep: Duration,
    publish: Publish,
) -> Result<bool, LockError> {
    if let (Some(rw), false) = (lease.replicas, keep.is_zero()) {
        let call = release_call(lease, keep, publish);
        let (reply, acked) = sender.send_waiting(&call, lease.key, rw, "release").await?;
        let released: i64 = decode(reply, "release")?;
        if released == 1 {
            replicas_met(lease.key, rw, acked)?;
        }
        return Ok(released == 1);
    }
    let request = if lease.mode == Mode::Exclusive && keep.is_zero() {
        LeaseRequest::Release {
            key: lease.key,
            token: lease.token,
            publish,
        }
    } else {
        LeaseRequest::Call(release_call(lease, keep, publish))
    };
    let sent: Sent<i64> = request
        .send(sender)
        .await
        .map_err(LockError::backend("release"))?;
    // Gone on the second send: the first one released it.
    let released = match sent {
        Sent {
            reply: 0,
            resent: true,
        } => 1,
        Sent { reply, .. } => reply,
    };
    Ok(released == 1)
}

/// `Ok` when `acked` replicas meet what the lease of `key` waits for, else
/// [`LockError::ReplicasUnavailable`].
fn replicas_met(key: &LockKey, rw: ReplicaWait, acked: u32) -> Result<(), LockError> {
    if acked >= rw.replicas {
        return Ok(());
    }
    Err(LockError::ReplicasUnavailable {
        key: key.full().to_owned(),
        acked,
        wanted: rw.replicas,
    })
}
