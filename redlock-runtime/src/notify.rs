//! Wake-ups from the server: one subscriber connection per node, shared by all keys.
//!
//! A release publishes on the lock key's own channel. The subscriber is a RESP3
//! [`ConnectionManager`] that reconnects and resubscribes by itself; it hands each push
//! to [`push_handler`], which wakes the local head waiting for that key on the spot (no
//! dispatcher task of our own, so a hand-off waits for one task hop fewer). A
//! `Disconnection` push means messages may have been lost, so every head is woken to
//! retry at once. Interest is reference-counted per key and (un)subscribe calls are
//! issued under one async lock, so the server sees them in the order they were decided.

use std::collections::HashMap;
use std::sync::Weak;

use redis::aio::ConnectionManager;
use redis::{PushInfo, PushKind};
use tokio::sync::Mutex;

use crate::waiters::Waiters;
use crate::LockError;

/// One node's subscriber connection.
pub(crate) struct Subscriber {
    con: ConnectionManager,
    interest: Mutex<HashMap<String, Interest>>,
}

/// The interests in one channel, and whether the server confirmed the subscription.
///
/// An interest is counted *before* its `SUBSCRIBE` is sent: a request that is cancelled
/// or fails after reaching the server still leaves an interest behind, so the channel is
/// unsubscribed when the interest is dropped, never left subscribed with nobody to
/// unsubscribe it.
#[derive(Debug, Default)]
pub(crate) struct Interest {
    count: usize,
    confirmed: bool,
}

impl Interest {
    /// Counts one more interest if `register` (or if none is counted: the caller holds
    /// one). Returns whether the channel still needs a `SUBSCRIBE`.
    pub(crate) fn add(&mut self, register: bool) -> bool {
        if register || self.count == 0 {
            self.count += 1;
        }
        !self.confirmed
    }

    /// Records the server's confirmation.
    pub(crate) fn confirm(&mut self) {
        self.confirmed = true;
    }

    /// Drops one interest; true when none is left (the channel is to be unsubscribed).
    pub(crate) fn drop_one(&mut self) -> bool {
        self.count = self.count.saturating_sub(1);
        self.count == 0
    }
}

impl Subscriber {
    /// Wraps a RESP3 connection whose pushes go to a [`push_handler`].
    pub(crate) fn new(con: ConnectionManager) -> Self {
        Self {
            con,
            interest: Mutex::new(HashMap::new()),
        }
    }

    /// Adds one interest in `key` when `register` (a caller retrying a subscription whose
    /// confirmation it never saw passes `false`), and subscribes unless the server
    /// already confirmed the channel (waiting for the reply).
    pub(crate) async fn subscribe(&self, key: &str, register: bool) -> Result<(), LockError> {
        let mut interest = self.interest.lock().await;
        if !interest.entry(key.to_owned()).or_default().add(register) {
            return Ok(());
        }
        self.con
            .clone()
            .subscribe(key)
            .await
            .map_err(LockError::backend("subscribe"))?;
        if let Some(entry) = interest.get_mut(key) {
            entry.confirm();
        }
        Ok(())
    }

    /// Drops one interest in `key`; the last one unsubscribes (confirmed or not).
    pub(crate) async fn unsubscribe(&self, key: &str) -> Result<(), LockError> {
        let mut interest = self.interest.lock().await;
        let Some(entry) = interest.get_mut(key) else {
            return Ok(());
        };
        if !entry.drop_one() {
            return Ok(());
        }
        interest.remove(key);
        self.con
            .clone()
            .unsubscribe(key)
            .await
            .map_err(LockError::backend("unsubscribe"))
    }
}

/// The push sender of a subscriber connection: turns each push into wake-ups for
/// `waiters` where the connection manager hands it over (it only takes a std mutex and
/// notifies, so it never blocks the connection). Reports [`ManagerGone`] once the
/// manager is dropped.
pub(crate) fn push_handler(
    waiters: Weak<Waiters>,
) -> impl Fn(PushInfo) -> Result<(), ManagerGone> + Send + Sync + 'static {
    move |push| {
        let waiters = waiters.upgrade().ok_or(ManagerGone)?;
        match push.kind {
            PushKind::Disconnection => {
                tracing::debug!("subscriber reconnecting: waking every waiter");
                waiters.wake_all();
            }
            PushKind::Message | PushKind::SMessage => {
                if let Some(msg) = redis::Msg::from_push_info(push) {
                    waiters.wake(msg.get_channel_name());
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// The manager that received a connection's pushes no longer exists.
#[derive(Debug)]
pub(crate) struct ManagerGone;
