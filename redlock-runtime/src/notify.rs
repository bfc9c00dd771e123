//! Wake-ups from the server: one subscriber connection per node, shared by all keys.
//!
//! A release publishes on the lock key's own channel. The subscriber is a RESP3
//! [`ConnectionManager`] that reconnects and resubscribes by itself; it hands each push
//! to [`push_handler`], which wakes the local head waiting for that key on the spot (no
//! dispatcher task of our own, so a hand-off waits for one task hop fewer).
//!
//! Redlock's nodes' subscribers hear together ([`Hearing`]): a channel is heard while
//! enough of them listen on it; a lost connection wakes a head only when that makes its
//! channel unheard, a first confirmation only when it makes it heard, and every
//! resubscription wakes it.
//!
//! A `Disconnection` push means messages may have been lost and the subscriptions are
//! gone until the connection manager has restored them: every channel is marked *lost*
//! (so its head polls instead of sleeping until its fallback timer) and every head is
//! woken to retry at once. A release between that retry and the server's confirmation
//! of the resubscription would still go unheard, so the head of each channel that was
//! not confirmed is woken again when the `subscribe` push confirming it arrives. Interest is
//! reference-counted per key, counted and dropped synchronously (never lost to a timeout
//! or a cancelled request). The (un)subscribe commands of one channel are issued under
//! that channel's async lock ([`ChannelLocks`]), so the server sees them in the order they
//! were decided; those of different channels do not wait for each other (the multiplexed
//! connection pipelines them), so a burst of new waiters is subscribed in about one round
//! trip, not one round trip each.
//!
//! The cluster backend's sharded subscriber keeps its interests in [`Channels`] and
//! orders its commands with [`ChannelLocks`] too; only its commands and its recovery
//! after a loss are its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, MutexGuard, OnceLock, PoisonError, Weak};

use redis::aio::ConnectionManager;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::error::chain;
use crate::waiters::{Call, Wake};
use crate::LockError;

/// One node's subscriber connection.
pub(crate) struct Subscriber {
    con: ConnectionManager,
    channels: Arc<Channels>,
    /// Which connection of `channels` this is: a Sentinel deployment replaces the
    /// connection when the master moves, and a retired one confirms nothing.
    generation: u64,
    /// Serialises each channel's (un)subscribe commands so the server sees them in
    /// decision order (shared with the tasks that send the `UNSUBSCRIBE`s).
    ops: Arc<ChannelLocks>,
    /// The backend this node serves, for logs.
    backend: &'static str,
}

/// One async lock per channel, held across an (un)subscribe command of that channel and
/// its reply: a channel's `SUBSCRIBE`s and `UNSUBSCRIBE`s reach the server in the order
/// they were decided, while commands for different channels go out concurrently. An
/// entry lives only while some task holds or waits for its lock.
#[derive(Debug, Default)]
pub(crate) struct ChannelLocks {
    locks: StdMutex<HashMap<String, ChannelLock>>,
}

#[derive(Debug, Default)]
struct ChannelLock {
    lock: Arc<Mutex<()>>,
    /// Tasks holding or waiting for `lock` (their [`ChannelTurn`]s).
    users: usize,
}

/// A turn on one channel's lock ([`ChannelLocks::lock`]). Dropping it (also while it
/// still waits) leaves the lock, and the last user removes the channel's entry.
#[derive(Debug)]
pub(crate) struct ChannelTurn {
    guard: Option<OwnedMutexGuard<()>>,
    locks: Arc<ChannelLocks>,
    channel: String,
}

impl ChannelLocks {
    fn locks(&self) -> MutexGuard<'_, HashMap<String, ChannelLock>> {
        self.locks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for `channel`'s turn (FIFO among the tasks asking for the same channel).
    pub(crate) async fn lock(self: &Arc<Self>, channel: &str) -> ChannelTurn {
        let lock = {
            let mut locks = self.locks();
            let entry = locks.entry(channel.to_owned()).or_default();
            entry.users += 1;
            entry.lock.clone()
        };
        // Counted from here: dropped while waiting, the turn still leaves.
        let mut turn = ChannelTurn {
            guard: None,
            locks: self.clone(),
            channel: channel.to_owned(),
        };
        turn.guard = Some(lock.lock_owned().await);
        turn
    }

    /// The number of channels whose lock is held or waited for (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.locks().len()
    }
}

impl Drop for ChannelTurn {
    fn drop(&mut self) {
        // Released before the entry can go: a newer entry's lock is only ever created
        // once nobody holds (or waits for) the old one.
        self.guard.take();
        let mut locks = self.locks.locks();
        if let Some(entry) = locks.get_mut(&self.channel) {
            entry.users -= 1;
            if entry.users == 0 {
                locks.remove(&self.channel);
            }
        }
    }
}

/// The channels a subscriber connection wants, shared with its [`push_handler`].
#[derive(Debug, Default)]
pub(crate) struct Channels {
    state: StdMutex<ChannelState>,
    /// The subscribers that hear a channel together with this one (Redlock's nodes);
    /// unset: this connection alone.
    hearing: OnceLock<Arc<Hearing>>,
}

/// The subscriber connections of several nodes, of which `needed` must listen on a
/// channel for its releases to be heard (Redlock: a release publishes on every node it
/// reaches, and a successful one reaches a quorum, so it reaches one of any
/// N − quorum + 1 nodes). A lost connection wakes a head only when its channel falls
/// below that line.
#[derive(Debug)]
pub(crate) struct Hearing {
    members: Vec<Weak<Channels>>,
    needed: usize,
    /// Serialises the push handlers' decisions (each counts every member's listeners).
    decide: StdMutex<()>,
}

impl Hearing {
    /// Makes `subscribers` hear together, `needed` of them listening being enough.
    pub(crate) fn join<'a>(subscribers: impl IntoIterator<Item = &'a Subscriber>, needed: usize) {
        let channels: Vec<&Arc<Channels>> = subscribers.into_iter().map(|s| &s.channels).collect();
        Self::join_channels(&channels, needed);
    }

    /// [`join`](Self::join), given the subscribers' channels.
    fn join_channels(members: &[&Arc<Channels>], needed: usize) {
        let hearing = Arc::new(Hearing {
            members: members.iter().map(|c| Arc::downgrade(c)).collect(),
            needed,
            decide: StdMutex::default(),
        });
        for c in members {
            let _ = c.hearing.set(hearing.clone());
        }
    }

    /// The members whose server confirmed `channel` on their current connection.
    pub(crate) fn listeners(&self, channel: &str) -> usize {
        self.members
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|c| c.listening(channel))
            .count()
    }

    fn decide(&self) -> MutexGuard<'_, ()> {
        self.decide.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug, Default)]
struct ChannelState {
    /// Counts the connection's disconnections: a `SUBSCRIBE` reply that raced one says
    /// nothing about the new connection.
    epoch: u64,
    /// The connection that carries the subscriptions now (0 unless replaced, see
    /// [`Channels::move_to`]).
    generation: u64,
    interest: HashMap<String, Interest>,
}

impl Channels {
    fn state(&self) -> MutexGuard<'_, ChannelState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the server confirmed `channel` on the current connection.
    pub(crate) fn listening(&self, channel: &str) -> bool {
        self.state()
            .interest
            .get(channel)
            .is_some_and(Interest::is_confirmed)
    }

    /// Hands the subscriptions over to connection `generation` (a new master): nothing
    /// confirmed so far counts any more, and a reply or push of an older connection
    /// confirms nothing. Returns every channel with an interest, each to be subscribed
    /// on the new connection.
    pub(crate) fn move_to(&self, generation: u64) -> Vec<String> {
        let mut state = self.state();
        state.generation = generation;
        state.lose_all();
        state.interest.keys().cloned().collect()
    }

    /// Whether connection `generation` still carries the subscriptions.
    fn is_current(&self, generation: u64) -> bool {
        self.state().generation == generation
    }

    /// Counts one more interest in `channel` for `Register::New` (or if none is counted: the
    /// caller holds one), at once, so an unsubscription decided from now on sees it.
    /// Returns whether the channel still needs a subscription (it is not confirmed).
    pub(crate) fn register(&self, channel: &str, register: Register) -> bool {
        self.state()
            .interest
            .entry(channel.to_owned())
            .or_default()
            .add(register)
    }

    /// Drops one interest in `channel`, at once (no timeout or cancellation can lose the
    /// decrement); true when it was the last: the channel is no longer wanted, and is to
    /// be unsubscribed.
    pub(crate) fn drop_interest(&self, channel: &str) -> bool {
        let mut state = self.state();
        let Some(entry) = state.interest.get_mut(channel) else {
            return false;
        };
        if !entry.drop_one() {
            return false;
        }
        state.interest.remove(channel);
        true
    }

    /// Whether some interest in `channel` is counted.
    pub(crate) fn wants(&self, channel: &str) -> bool {
        self.state().interest.contains_key(channel)
    }

    /// The number of channels with an interest (for tests of what is left behind).
    pub(crate) fn interests(&self) -> usize {
        self.state().interest.len()
    }

    /// Whether `channel` was confirmed, then lost with its connection.
    pub(crate) fn is_lost(&self, channel: &str) -> bool {
        self.state()
            .interest
            .get(channel)
            .is_some_and(Interest::is_lost)
    }

    /// Whether `channel` is wanted and its subscription neither confirmed nor lost: asked
    /// for (or about to be), not confirmed yet.
    pub(crate) fn pending(&self, channel: &str) -> bool {
        self.state()
            .interest
            .get(channel)
            .is_some_and(|i| i.state == SubState::Pending)
    }

    /// Records the server's confirmation of `channel`, if it is wanted.
    pub(crate) fn confirm(&self, channel: &str) {
        if let Some(entry) = self.state().interest.get_mut(channel) {
            entry.confirm();
        }
    }

    /// Marks `channel` lost (no longer subscribed on the server) if it is wanted;
    /// whether it is.
    pub(crate) fn lose(&self, channel: &str) -> bool {
        self.state()
            .interest
            .get_mut(channel)
            .map(Interest::lose)
            .is_some()
    }

    /// The channels the server confirmed and that were not lost since.
    pub(crate) fn confirmed(&self) -> Vec<String> {
        self.state()
            .interest
            .iter()
            .filter(|(_, i)| i.is_confirmed())
            .map(|(c, _)| c.clone())
            .collect()
    }

    /// Those of `channels` still confirmed (looked at all at once).
    pub(crate) fn still_confirmed(&self, channels: Vec<String>) -> Vec<String> {
        let state = self.state();
        channels
            .into_iter()
            .filter(|c| state.interest.get(c).is_some_and(Interest::is_confirmed))
            .collect()
    }

    /// Every channel with an interest.
    pub(crate) fn wanted(&self) -> Vec<String> {
        self.state().interest.keys().cloned().collect()
    }

    /// The connection carrying the subscriptions dropped: nothing confirmed so far
    /// counts any more, and a reply that raced the drop confirms nothing.
    pub(crate) fn lose_all(&self) {
        self.state().lose_all();
    }
}

impl ChannelState {
    /// See [`Channels::lose_all`].
    fn lose_all(&mut self) {
        self.epoch += 1;
        self.interest.values_mut().for_each(Interest::lose);
    }
}

/// The interests in one channel, and where its subscription stands.
///
/// An interest is counted *before* its `SUBSCRIBE` is sent: a request that is cancelled
/// or fails after reaching the server still leaves an interest behind, so the channel is
/// unsubscribed when the interest is dropped, never left subscribed with nobody to
/// unsubscribe it.
#[derive(Debug, Default)]
struct Interest {
    count: usize,
    state: SubState,
}

/// Where a channel's subscription stands on the server.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum SubState {
    /// Asked for (or about to be), not confirmed yet.
    #[default]
    Pending,
    /// Confirmed by the server on the current connection.
    Confirmed,
    /// Was confirmed, then the connection dropped: not listening until confirmed again.
    Lost,
}

/// Whether a subscription brings an interest in the channel of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Register {
    /// A new interest (a queue that had none): counted, even in a channel listened to.
    New,
    /// The caller's interest is counted already: it asks again for a subscription whose
    /// confirmation it never saw (or on a new master). Counted only if none is.
    Again,
}

impl Interest {
    /// Counts one more interest for `Register::New` (or if none is counted: the caller holds
    /// one). Returns whether the channel still needs a `SUBSCRIBE`.
    fn add(&mut self, register: Register) -> bool {
        if register == Register::New || self.count == 0 {
            self.count += 1;
        }
        !self.is_confirmed()
    }

    /// Records the server's confirmation; true when the channel was not confirmed
    /// (lost with its connection, or asked for on a connection that then dropped):
    /// messages published meanwhile went unheard, so its head must retry.
    fn confirm(&mut self) -> bool {
        std::mem::replace(&mut self.state, SubState::Confirmed) != SubState::Confirmed
    }

    /// Records that the connection carrying the subscription dropped.
    fn lose(&mut self) {
        if self.state == SubState::Confirmed {
            self.state = SubState::Lost;
        }
    }

    /// Whether the server confirmed the subscription and it has not been lost since.
    fn is_confirmed(&self) -> bool {
        self.state == SubState::Confirmed
    }

    /// Whether the subscription was confirmed, then lost with its connection.
    fn is_lost(&self) -> bool {
        self.state == SubState::Lost
    }

    /// Drops one interest; true when none is left (the channel is to be unsubscribed).
    fn drop_one(&mut self) -> bool {
        self.count = self.count.saturating_sub(1);
        self.count == 0
    }
}

impl Subscriber {
    /// Wraps a RESP3 connection whose pushes go to a [`push_handler`] over `channels`;
    /// `generation` is the one the handler was made for.
    pub(crate) fn new(
        con: ConnectionManager,
        channels: Arc<Channels>,
        generation: u64,
        backend: &'static str,
    ) -> Self {
        Self {
            con,
            channels,
            generation,
            ops: Arc::new(ChannelLocks::default()),
            backend,
        }
    }

    /// Whether the server confirmed `key`'s channel on the current connection.
    pub(crate) fn listening(&self, key: &str) -> bool {
        self.channels.listening(key)
    }

    /// The number of channels with an interest (for tests of what is left behind).
    pub(crate) fn interests(&self) -> usize {
        self.channels.interests()
    }

    /// Adds one interest in `key` for `Register::New` (a caller retrying a subscription whose
    /// confirmation it never saw passes `Register::Again`), and subscribes unless the server
    /// already confirmed the channel (waiting for the reply).
    pub(crate) async fn subscribe(&self, key: &str, register: Register) -> Result<(), LockError> {
        if !self.register(key, register) {
            return Ok(());
        }
        self.send_subscribe(key).await
    }

    /// The synchronous half of [`subscribe`](Self::subscribe): counts the interest at
    /// once, so an [`unsubscribe`](Self::unsubscribe) decided from now on sees it,
    /// whatever the `SUBSCRIBE` then waits for. Returns whether the channel still needs
    /// a [`send_subscribe`](Self::send_subscribe) (it is not confirmed).
    pub(crate) fn register(&self, key: &str, register: Register) -> bool {
        self.channels.register(key, register)
    }

    /// Sends `SUBSCRIBE` for an interest [`register`](Self::register)ed in `key`, unless
    /// the channel was confirmed meanwhile, nobody wants it any more (its last interest
    /// was dropped while this waited for its turn) or this connection was retired (the
    /// caller subscribes on the new one), and waits for the reply.
    pub(crate) async fn send_subscribe(&self, key: &str) -> Result<(), LockError> {
        let _turn = self.ops.lock(key).await;
        let epoch = {
            let state = self.channels.state();
            match state.interest.get(key) {
                Some(entry) if !entry.is_confirmed() && state.generation == self.generation => {
                    state.epoch
                }
                _ => return Ok(()),
            }
        };
        self.con
            .clone()
            .subscribe(key)
            .await
            .map_err(LockError::backend("subscribe"))?;
        let mut state = self.channels.state();
        if state.epoch == epoch {
            if let Some(entry) = state.interest.get_mut(key) {
                entry.confirm();
            }
        }
        Ok(())
    }

    /// Drops one interest in `key`, at once (no timeout or cancellation can lose the
    /// decrement). The last one unsubscribes, confirmed or not, in a task of its own that
    /// takes its turn after the channel's (un)subscriptions already decided; it skips the
    /// `UNSUBSCRIBE` if an interest was registered again meanwhile (whose `SUBSCRIBE`
    /// then owns the channel).
    pub(crate) fn unsubscribe(&self, key: &str) {
        if !self.channels.drop_interest(key) {
            return;
        }
        let ops = self.ops.clone();
        let channels = self.channels.clone();
        let mut con = self.con.clone();
        let key = key.to_owned();
        let backend = self.backend;
        // Bounded by the connection's response timeout (and its retries).
        tokio::spawn(async move {
            let _turn = ops.lock(&key).await;
            if channels.wants(&key) {
                return;
            }
            if let Err(e) = con.unsubscribe(&key).await {
                tracing::debug!(target: "redlock", key, backend, error = %chain(&e), "unsubscribe failed");
            }
        });
    }
}

/// The push sender of a subscriber connection: turns each push into wake-ups (through
/// `wake`) where the connection manager hands it over (it only takes std mutexes and
/// notifies, so it never blocks the connection), and keeps `channels` up to date.
/// Reports [`ManagerGone`] once the manager is dropped. Once `channels` moved to a newer
/// connection than `generation` (see [`Channels::move_to`]), only messages still count
/// (a release heard late wakes a head to retry, which is harmless).
pub(crate) fn push_handler(
    wake: Wake,
    channels: Arc<Channels>,
    generation: u64,
    backend: &'static str,
) -> impl Fn(PushInfo) -> Result<(), ManagerGone> + Send + Sync + 'static {
    move |push| {
        if wake.is_gone() {
            return Err(ManagerGone);
        }
        let hearing = channels.hearing.get();
        let retired = || !channels.is_current(generation);
        match push.kind {
            PushKind::Disconnection | PushKind::Subscribe if retired() => {}
            PushKind::Disconnection => {
                tracing::debug!(
                    target: "redlock",
                    backend,
                    "subscriber reconnecting: polling until resubscribed"
                );
                let _decide = hearing.map(|h| h.decide());
                let lost: Vec<String> = {
                    let mut state = channels.state();
                    state.epoch += 1;
                    let confirmed = state.interest.iter().filter(|(_, i)| i.is_confirmed());
                    let lost = match hearing {
                        Some(_) => confirmed.map(|(c, _)| c.clone()).collect(),
                        None => Vec::new(),
                    };
                    state.interest.values_mut().for_each(Interest::lose);
                    lost
                };
                match hearing {
                    None => wake.wake_all(),
                    // Only the heads whose channel this leaves unheard: the others still
                    // hear every release (on the members that listen).
                    Some(h) => lost
                        .iter()
                        .filter(|c| h.listeners(c) + 1 == h.needed)
                        .for_each(|c| wake.wake(c)),
                }
            }
            PushKind::Message | PushKind::SMessage => wake_for_message(&wake, push),
            PushKind::Subscribe => {
                let Some(channel) = channel_of(&push) else {
                    return Ok(());
                };
                let _decide = hearing.map(|h| h.decide());
                let (unheard, resubscribed) =
                    channels
                        .state()
                        .interest
                        .get_mut(&channel)
                        .map_or((false, false), |i| {
                            let lost = i.is_lost();
                            (i.confirm(), lost)
                        });
                // Resubscribed after a lost connection: a release published on this node
                // meanwhile went unheard here, so the head tries again. With several
                // members, every member's resubscription wakes it, not only the one that
                // makes the channel heard again: a connection is known lost only once its
                // push arrives, so the count of listeners can stay at `needed` while every
                // connection is down. A first subscription's confirmation wakes only when
                // it makes the channel heard (a late member's costs no attempt). (A first
                // subscription's head is not waiting yet: it attempts once its
                // `subscribe` returns, which is after this push.)
                let heard_now = || hearing.is_none_or(|h| h.listeners(&channel) == h.needed);
                if unheard && (resubscribed || heard_now()) {
                    wake.wake(&channel);
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Wakes the head waiting for the channel of a (sharded) message push: a release.
pub(crate) fn wake_for_message(wake: &Wake, push: PushInfo) {
    if let Some(msg) = redis::Msg::from_push_info(push) {
        wake.wake_for(
            msg.get_channel_name(),
            Call::of_payload(msg.get_payload_bytes()),
        );
    }
}

/// The channel a subscription push is about (its first element).
pub(crate) fn channel_of(push: &PushInfo) -> Option<String> {
    match push.data.first()? {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// The manager that received a connection's pushes no longer exists.
#[derive(Debug)]
pub(crate) struct ManagerGone;

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::time::Duration;

    use super::*;
    use crate::waiters::Waiters;

    fn subscribed(channel: &str) -> PushInfo {
        PushInfo {
            kind: PushKind::Subscribe,
            data: vec![
                Value::BulkString(channel.as_bytes().to_vec()),
                Value::Int(1),
            ],
        }
    }

    fn disconnected() -> PushInfo {
        PushInfo {
            kind: PushKind::Disconnection,
            data: Vec::new(),
        }
    }

    /// CI run I (a Redlock `subscriber_reconnect_loses_no_wake_up`: 7 of 150 waiters
    /// slept through their release). Three nodes, two listening needed. Every node's
    /// subscriber connection is killed at once, but each loss is noticed (and each
    /// resubscription confirmed) one node after the other: at every moment the state
    /// counts two or three listeners, so no push crossed the line and nothing woke the
    /// head, yet a release published while all three connections were down went unheard.
    #[tokio::test]
    async fn resubscriptions_noticed_one_node_at_a_time_still_wake_the_head() {
        let waiters = Arc::new(Waiters::new(8, Box::new(|_| {})));
        let wake = Wake::new(&waiters);
        let nodes: Vec<Arc<Channels>> = (0..3).map(|_| Arc::new(Channels::default())).collect();
        Hearing::join_channels(&nodes.iter().collect::<Vec<_>>(), 2);
        let handlers: Vec<_> = nodes
            .iter()
            .map(|c| push_handler(wake.clone(), c.clone(), 0, "redlock"))
            .collect();
        for (node, handler) in nodes.iter().zip(&handlers) {
            node.state()
                .interest
                .entry("k".to_owned())
                .or_default()
                .add(Register::New);
            handler(subscribed("k")).unwrap();
        }
        let place = waiters.join("k").unwrap();
        let mut woken = pin!(place.queue.wake.notified());
        woken.as_mut().enable();
        for handler in &handlers {
            handler(disconnected()).unwrap();
            handler(subscribed("k")).unwrap();
        }
        assert!(
            tokio::time::timeout(Duration::from_millis(100), woken)
                .await
                .is_ok(),
            "the head slept through the resubscriptions"
        );
    }

    #[tokio::test]
    async fn channel_locks_order_one_channel_and_let_others_through() {
        let locks = Arc::new(ChannelLocks::default());
        let a = locks.lock("a").await;
        // Another channel is not held up by `a`.
        let b = tokio::time::timeout(Duration::from_secs(1), locks.lock("b"))
            .await
            .expect("a lock on another channel waited");
        // The same channel waits for its turn.
        let mut second = Box::pin(locks.lock("a"));
        assert!(
            tokio::time::timeout(Duration::from_millis(20), second.as_mut())
                .await
                .is_err(),
            "a second turn on the same channel did not wait"
        );
        assert_eq!(locks.len(), 2);
        drop(b);
        assert_eq!(locks.len(), 1);
        drop(a);
        let second = tokio::time::timeout(Duration::from_secs(1), second)
            .await
            .expect("the waiting turn never got the lock");
        assert_eq!(locks.len(), 1);
        drop(second);
        assert_eq!(locks.len(), 0, "an entry outlived its last turn");
    }

    #[tokio::test]
    async fn a_turn_cancelled_while_waiting_leaves_no_entry_behind() {
        let locks = Arc::new(ChannelLocks::default());
        let held = locks.lock("a").await;
        for _ in 0..3 {
            let waiting = tokio::time::timeout(Duration::from_millis(5), locks.lock("a")).await;
            assert!(waiting.is_err());
        }
        assert_eq!(locks.len(), 1);
        drop(held);
        assert_eq!(locks.len(), 0, "cancelled waiters left the entry behind");
        // And the channel can be locked again.
        let again = tokio::time::timeout(Duration::from_secs(1), locks.lock("a"))
            .await
            .expect("the channel stayed locked");
        drop(again);
        assert_eq!(locks.len(), 0);
    }
}
