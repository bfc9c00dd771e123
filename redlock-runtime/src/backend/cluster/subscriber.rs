//! The cluster's wake-ups: sharded pub/sub on one connection to every node
//! ([`ShardSubscriber`]), its interests kept in `notify`'s [`Channels`] and its commands
//! ordered per channel by `notify`'s [`ChannelLocks`], like every other backend's
//! subscriber. What differs is the command (`SSUBSCRIBE`, one slot per command) and the
//! recovery: redis-rs's cluster connection cannot be trusted to resubscribe, so the
//! subscriber does it itself (see `recovery`).

use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind};
use tokio::sync::mpsc;

use super::recovery::{auditor, resubscriber};
use crate::notify::{channel_of, wake_for_message, ChannelLocks, Channels, Register};
use crate::waiters::Wake;
use crate::LockError;

/// Sharded pub/sub wake-ups for the whole cluster: one RESP3 [`ClusterConnection`] (one
/// socket per node) that carries nothing but `SSUBSCRIBE`/`SUNSUBSCRIBE`, shared by all
/// keys with a reference count per channel.
///
/// Two tasks serve it: the dispatcher turns `smessage` pushes into wake-ups, and on a
/// `Disconnection` push, or a `sunsubscribe` push for a channel still wanted (redis-rs
/// loses those subscriptions), marks the channels lost (not
/// [`listening`](Self::listening): their heads poll), wakes the waiters at once and hands
/// the channels to the resubscriber, which subscribes each one on its own (never several
/// slots in one command), retrying with backoff while the slot has no reachable owner,
/// and confirms the channel and wakes its waiters again once it is back.
///
/// Not every loss is announced. redis-rs may replace a node's connection without a
/// `Disconnection` push (a failed health check during a slot refresh, a node that left
/// the slot map while frozen), and its own resubscription of that node's channels, one
/// `SSUBSCRIBE` across slots, fails with `CROSSSLOT`; a server's `sunsubscribe` push
/// that arrives while an `SSUBSCRIBE` is in flight is taken for that command's reply
/// (issue 23: Cluster waiters in a calm spell slept 1.3-2.0 s past a release). So a
/// third task, the auditor, asks every [`AUDIT_EVERY`](super::recovery::AUDIT_EVERY) each master that should serve a
/// confirmed channel how many shard channels the subscriber's connection to it holds
/// (`CLIENT INFO`'s `ssub`, one request per master); fewer than the subscriber believes
/// confirmed there marks that master's channels lost, wakes their heads and hands them to
/// the resubscriber (`SSUBSCRIBE` is idempotent, so one lost channel costs the others of
/// its master nothing but a repeated request). The tasks end with the subscriber.
pub(crate) struct ShardSubscriber {
    inner: Arc<SubInner>,
}

/// What the subscriber shares with its tasks.
pub(super) struct SubInner {
    /// The subscriber's own connection (no lock command shares it).
    pub(super) con: ClusterConnection,
    /// Wanted channels, the interests in each and where its subscription stands (this
    /// connection alone: no generations, no hearing together).
    pub(super) channels: Channels,
    /// Serialises each channel's (un)subscribe commands so the server sees them in
    /// decision order; different channels (whatever their shard) do not wait for each
    /// other, so a frozen master holds up only the subscriptions of its own channels.
    pub(super) ops: Arc<ChannelLocks>,
    /// Hands lost channels to the resubscriber.
    pub(super) resubscribe: mpsc::UnboundedSender<String>,
    /// One (un)subscription's bound.
    pub(super) timeout: Duration,
}

impl ShardSubscriber {
    /// Serves `con`, whose pushes arrive on `pushes`, waking through `wake`; each
    /// request bounded by `timeout`. Starts the dispatcher, the auditor and the
    /// resubscriber.
    pub(super) fn new(
        con: ClusterConnection,
        pushes: mpsc::UnboundedReceiver<PushInfo>,
        wake: Wake,
        timeout: Duration,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let inner = Arc::new(SubInner {
            con,
            channels: Channels::default(),
            ops: Arc::new(ChannelLocks::default()),
            resubscribe: tx,
            timeout,
        });
        tokio::spawn(dispatch(pushes, Arc::downgrade(&inner), wake.clone()));
        tokio::spawn(auditor(Arc::downgrade(&inner), wake.clone()));
        tokio::spawn(resubscriber(rx, Arc::downgrade(&inner), wake));
        Self { inner }
    }

    /// Adds one interest in `key`'s channel for `Register::New`, and subscribes unless the
    /// server already confirmed it (as [`Subscriber::subscribe`](crate::notify)).
    ///
    /// A channel lost with its connection (or dropped by the server) is left to the
    /// resubscriber, which asks for it again until it is back and then wakes its head:
    /// this returns at once without a request, and the head, not
    /// [`listening`](Self::listening), polls meanwhile. (A burst of `SSUBSCRIBE`s sent
    /// while the connection is being re-established hangs until the timeout, and a head
    /// makes no attempt while its subscription is in flight; the resubscriber sends them
    /// one at a time.)
    ///
    /// The interest is counted at once, before anything is awaited (as for the other
    /// backends): a caller cut short while this waits for the channel's turn or for the
    /// reply still owns an interest, which its queue's [`unsubscribe`](Self::unsubscribe)
    /// drops. The `SSUBSCRIBE` is skipped if the channel was confirmed meanwhile or
    /// nobody wants it any more.
    pub(crate) async fn subscribe(&self, key: &str, register: Register) -> Result<(), LockError> {
        let inner = &self.inner;
        if !inner.channels.register(key, register) {
            return Ok(());
        }
        if inner.channels.is_lost(key) {
            return Ok(());
        }
        let _turn = inner.ops.lock(key).await;
        // Confirmed meanwhile, or nobody wants it any more, or lost meanwhile.
        if !inner.channels.pending(key) {
            return Ok(());
        }
        inner.ssubscribe(key).await?;
        inner.channels.confirm(key);
        Ok(())
    }

    /// The number of channels with an interest (for tests of what is left behind).
    pub(crate) fn interests(&self) -> usize {
        self.inner.channels.interests()
    }

    /// Whether the server confirmed `key`'s channel and it has not been lost since.
    pub(crate) fn listening(&self, key: &str) -> bool {
        self.inner.channels.listening(key)
    }

    /// Drops one interest in `key`'s channel at once (before anything is awaited); the
    /// last one unsubscribes when the channel's earlier (un)subscriptions are done,
    /// unless an interest was registered again meanwhile (whose `SSUBSCRIBE` then owns
    /// the channel).
    pub(crate) async fn unsubscribe(&self, key: &str) -> Result<(), LockError> {
        let inner = &self.inner;
        if !inner.channels.drop_interest(key) {
            return Ok(());
        }
        let _turn = inner.ops.lock(key).await;
        if inner.channels.wants(key) {
            return Ok(());
        }
        let mut con = inner.con.clone();
        tokio::time::timeout(inner.timeout, con.sunsubscribe(key))
            .await
            .map_err(|_| LockError::timed_out("unsubscribe", inner.timeout))?
            .map_err(LockError::backend("unsubscribe"))
    }
}

impl SubInner {
    /// One `SSUBSCRIBE` for one channel, bounded by the timeout.
    pub(super) async fn ssubscribe(&self, channel: &str) -> Result<(), LockError> {
        let mut con = self.con.clone();
        tokio::time::timeout(self.timeout, con.ssubscribe(channel))
            .await
            .map_err(|_| LockError::timed_out("subscribe", self.timeout))?
            .map_err(LockError::backend("subscribe"))
    }

    /// The connection dropped (or a push said something unreadable): marks every
    /// channel lost, wakes every waiter at once and hands every wanted channel to the
    /// resubscriber.
    fn lose_everything(&self, wake: &Wake) {
        self.channels.lose_all();
        wake.wake_all();
        for channel in self.channels.wanted() {
            let _ = self.resubscribe.send(channel);
        }
    }

    /// `channel` was unsubscribed on the server: if it is still wanted, marks it lost,
    /// wakes its head and hands it to the resubscriber.
    fn lose_one(&self, channel: String, wake: &Wake) {
        if self.channels.lose(&channel) {
            tracing::debug!(
                target: "redlock",
                key = channel,
                backend = "cluster",
                "shard channel unsubscribed by the server; resubscribing"
            );
            wake.wake(&channel);
            let _ = self.resubscribe.send(channel);
        }
    }
}

/// The dispatcher: turns each push into wake-ups and keeps the channels' state up to
/// date; a loss goes to the resubscriber.
async fn dispatch(
    mut pushes: mpsc::UnboundedReceiver<PushInfo>,
    inner: Weak<SubInner>,
    wake: Wake,
) {
    // Ends when the subscriber's connection is dropped (the sender goes with it).
    while let Some(push) = pushes.recv().await {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if wake.is_gone() {
            return;
        }
        match push.kind {
            PushKind::SMessage | PushKind::Message => wake_for_message(&wake, push),
            PushKind::Disconnection => {
                tracing::debug!(
                    target: "redlock",
                    backend = "cluster",
                    "cluster subscriber reconnecting: waking every waiter and resubscribing"
                );
                inner.lose_everything(&wake);
            }
            PushKind::SUnsubscribe => match channel_of(&push) {
                // Ours (after the last interest left) or the server's, when the slot moved.
                Some(channel) => inner.lose_one(channel, &wake),
                // Not the documented shape: assume the worst for every channel.
                None => inner.lose_everything(&wake),
            },
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use futures_util::future::join_all;
    use redlock_testkit::RedisCluster;

    use super::super::{ClusterBackend, ClusterNodes};
    use super::*;
    use crate::backend::server::Timeouts;
    use crate::waiters::Waiters;

    /// A 3-master cluster and a backend on it, with the waiters its wake-ups go to (kept
    /// alive: the subscriber's tasks end with them).
    async fn cluster_backend() -> (RedisCluster, Arc<Waiters>, ClusterBackend) {
        let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0))
            .await
            .unwrap();
        let waiters = Arc::new(Waiters::new(16, Box::new(|_| {})));
        let timeouts = Timeouts {
            connect: Duration::from_secs(3),
            response: Duration::from_secs(1),
        };
        let backend = ClusterBackend::connect(
            ClusterNodes::urls(&cluster.urls()),
            timeouts,
            Wake::new(&waiters),
        )
        .await
        .unwrap();
        (cluster, waiters, backend)
    }

    /// How many connections the master of `channel`'s slot has subscribed to it.
    async fn shard_numsub(cluster: &RedisCluster, channel: &str) -> i64 {
        let node = cluster.node(cluster.master_for_key(channel));
        let mut con = redis::Client::open(node.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let (_, n): (String, i64) = redis::cmd("PUBSUB")
            .arg("SHARDNUMSUB")
            .arg(channel)
            .query_async(&mut con)
            .await
            .unwrap();
        n
    }

    /// review2, smaller defect 6: the shard subscriber counted a head's interest only
    /// once the head held the (un)subscription lock. A head cut at its deadline while
    /// waiting for it left its queue `Asked` with nothing counted, and that queue's
    /// `Unsubscribe`, reaching the subscriber after a newer queue of the same key had
    /// asked (the watchdog task picks the job up after the new head's request), dropped
    /// the newer queue's interest: the channel was unsubscribed under a head that believed
    /// it listened (it polled, and asked again only a second later).
    ///
    /// Deterministic: the test holds the channel's turn itself (as an earlier
    /// (un)subscription of the channel still in flight would) and issues the requests in
    /// the order of that interleaving.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn subscription_cut_while_waiting_for_its_turn_still_counts_its_interest() {
        let (cluster, _waiters, backend) = cluster_backend().await;
        let sub = backend.subscriber();
        let key = "lock:cut_while_waiting_{1}";

        let turn = sub.inner.ops.lock(key).await;
        // The old queue's head gives up (its deadline) while waiting for its turn.
        let cut =
            tokio::time::timeout(Duration::from_millis(50), sub.subscribe(key, Register::New))
                .await;
        assert!(cut.is_err(), "the subscription did not wait for its turn");
        assert_eq!(
            sub.inner.channels.interests(),
            1,
            "a head cut short while waiting for its turn left its queue asked with no interest counted"
        );
        // A newer queue's head asks, then the old queue's `Unsubscribe` arrives; the
        // earlier (un)subscription finishes.
        let newer = sub.subscribe(key, Register::New);
        let old_unsubscribe = sub.unsubscribe(key);
        let earlier_done = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(turn);
        };
        let (newer, old_unsubscribe, ()) = tokio::join!(newer, old_unsubscribe, earlier_done);
        newer.unwrap();
        old_unsubscribe.unwrap();
        assert!(
            sub.listening(key),
            "the old queue's unsubscribe dropped the newer queue's interest"
        );
        assert_eq!(shard_numsub(&cluster, key).await, 1);
        // The newer queue empties: nothing is left behind.
        sub.unsubscribe(key).await.unwrap();
        assert_eq!(sub.inner.channels.interests(), 0);
        assert_eq!(shard_numsub(&cluster, key).await, 0);
        assert_eq!(sub.inner.ops.len(), 0);
    }

    /// Issue 23's missed wake-ups on Cluster (soak seed 16583615571038614529: waiters in
    /// a calm spell slept 1.3-2.0 s past a release): the subscriber believed channels
    /// confirmed that the server no longer served on its connection, lost without a
    /// word (a connection redis-rs replaced with no `Disconnection` push and whose
    /// resubscription failed with `CROSSSLOT`, or a `sunsubscribe` push taken for an
    /// `SSUBSCRIBE`'s reply), and their heads slept until the expiry they were told. The
    /// test leaves that state behind directly, whatever made it, beside a channel that
    /// is really subscribed on the same master: the auditor must find the master's
    /// connection holding fewer channels than believed, and subscribe both again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_channel_lost_without_a_word_is_subscribed_again_by_the_audit() {
        let (cluster, _waiters, backend) = cluster_backend().await;
        let sub = backend.subscriber();
        // Two channels in two slots of one master.
        let master = cluster.master_for_key("lock:audited_{0}");
        let keys: Vec<String> = (0..200)
            .map(|i| format!("lock:audited_{{{i}}}"))
            .filter(|k| cluster.master_for_key(k) == master)
            .take(2)
            .collect();
        let (heard, unheard) = (&keys[0], &keys[1]);
        sub.subscribe(heard, Register::New).await.unwrap();
        assert_eq!(shard_numsub(&cluster, heard).await, 1);
        sub.inner.channels.register(unheard, Register::New);
        sub.inner.channels.confirm(unheard);
        assert!(sub.listening(unheard));
        assert_eq!(shard_numsub(&cluster, unheard).await, 0);

        let since = Instant::now();
        while shard_numsub(&cluster, unheard).await == 0 && since.elapsed() < Duration::from_secs(3)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            shard_numsub(&cluster, unheard).await,
            1,
            "a channel believed confirmed but not subscribed on the server stayed unheard for {:?}",
            since.elapsed()
        );
        let back = Instant::now();
        while !keys.iter().all(|k| sub.listening(k)) && back.elapsed() < Duration::from_secs(3) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(keys.iter().all(|k| sub.listening(k)), "not confirmed again");
        assert_eq!(shard_numsub(&cluster, heard).await, 1);
        // Dropping the interests leaves nothing behind.
        for k in &keys {
            sub.unsubscribe(k).await.unwrap();
            assert_eq!(shard_numsub(&cluster, k).await, 0);
        }
        assert_eq!(sub.interests(), 0);
    }

    /// With (un)subscriptions no longer serialised per connection, every head whose
    /// channel was lost with the subscriber connection asked for it again at once, all
    /// concurrently with the resubscriber: that burst of `SSUBSCRIBE`s, sent while the
    /// connection was being re-established, hung until the 2 s timeout (146 of 150 failed
    /// after 4 s and only 4 channels were back 3 s later), and a head makes no attempt
    /// while its subscription is in flight. A lost channel is the resubscriber's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn heads_asking_again_for_lost_channels_leave_them_to_the_resubscriber() {
        let (cluster, _waiters, backend) = cluster_backend().await;
        let sub = backend.subscriber();
        let keys: Vec<String> = (0..150).map(|i| format!("lock:lost_{{{i}}}")).collect();
        for r in join_all(keys.iter().map(|k| sub.subscribe(k, Register::New))).await {
            r.unwrap();
        }
        assert!(keys.iter().all(|k| sub.listening(k)));
        // The window is a few milliseconds wide: several rounds, at several offsets.
        for round in 0..8u64 {
            for i in 0..cluster.len() {
                let mut con = redis::Client::open(cluster.node(i).url())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                let _: redis::Value = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg("pubsub")
                    .query_async(&mut con)
                    .await
                    .unwrap();
            }
            // The heads hear of it (the `Disconnection` pushes) and ask again, all at
            // once, while the connections are being re-established.
            tokio::time::sleep(Duration::from_millis(round % 4)).await;
            let asked = Instant::now();
            let answers = join_all(keys.iter().map(|k| sub.subscribe(k, Register::Again))).await;
            let took = asked.elapsed();
            let failed = answers.iter().filter(|r| r.is_err()).count();
            assert!(
                failed == 0 && took < Duration::from_millis(500),
                "round {round}: {failed} of 150 re-asks failed, after {took:?}"
            );
            let back = Instant::now();
            while !keys.iter().all(|k| sub.listening(k)) && back.elapsed() < Duration::from_secs(3)
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let listening = keys.iter().filter(|k| sub.listening(k)).count();
            assert_eq!(
                listening,
                150,
                "round {round}: channels back {:?} after the re-asks",
                back.elapsed()
            );
        }
    }
}
