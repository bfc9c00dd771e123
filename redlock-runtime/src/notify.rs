//! Wake-ups from the server: one subscriber connection per node, shared by all keys.
//!
//! A release publishes on the lock key's own channel. The subscriber is a RESP3
//! [`ConnectionManager`] that reconnects and resubscribes by itself; its pushes are read
//! by one dispatcher task that wakes the local head waiting for that key. A
//! `Disconnection` push means messages may have been lost, so every head is woken to
//! retry at once. Interest is reference-counted per key and (un)subscribe calls are
//! issued under one async lock, so the server sees them in the order they were decided.

use std::collections::HashMap;
use std::sync::Weak;

use redis::aio::ConnectionManager;
use redis::{PushInfo, PushKind};
use tokio::sync::{mpsc, Mutex};

use crate::waiters::Waiters;
use crate::LockError;

/// One node's subscriber connection.
pub(crate) struct Subscriber {
    con: ConnectionManager,
    interest: Mutex<HashMap<String, usize>>,
}

impl Subscriber {
    /// Wraps a RESP3 connection whose pushes arrive on `pushes`, and starts the task
    /// that turns them into wake-ups for `waiters`. The task ends with the connection.
    pub(crate) fn new(
        con: ConnectionManager,
        pushes: mpsc::UnboundedReceiver<PushInfo>,
        waiters: Weak<Waiters>,
    ) -> Self {
        tokio::spawn(dispatch(pushes, waiters));
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

async fn dispatch(mut pushes: mpsc::UnboundedReceiver<PushInfo>, waiters: Weak<Waiters>) {
    while let Some(push) = pushes.recv().await {
        let Some(waiters) = waiters.upgrade() else {
            return;
        };
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
    }
}
