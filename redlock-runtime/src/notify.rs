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
    interest: Mutex<HashMap<String, usize>>,
}

impl Subscriber {
    /// Wraps a RESP3 connection whose pushes go to a [`push_handler`].
    pub(crate) fn new(con: ConnectionManager) -> Self {
        Self {
            con,
            interest: Mutex::new(HashMap::new()),
        }
    }

    /// Adds one interest in `key`; the first one subscribes (and waits for the reply).
    pub(crate) async fn subscribe(&self, key: &str) -> Result<(), LockError> {
        let mut interest = self.interest.lock().await;
        if let Some(n) = interest.get_mut(key) {
            *n += 1;
            return Ok(());
        }
        self.con
            .clone()
            .subscribe(key)
            .await
            .map_err(LockError::backend("subscribe"))?;
        interest.insert(key.to_owned(), 1);
        Ok(())
    }

    /// Drops one interest in `key`; the last one unsubscribes.
    pub(crate) async fn unsubscribe(&self, key: &str) -> Result<(), LockError> {
        let mut interest = self.interest.lock().await;
        let Some(n) = interest.get_mut(key) else {
            return Ok(());
        };
        *n -= 1;
        if *n > 0 {
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
