//! Who leads now: [`LeaderInfo`], what [`leader_info`](LockManager::leader_info) reads
//! of a leader's lock, and [`LeaderWatch`], told when the leader changes.
//!
//! A watch hears the leader's resignation as a waiting follower does (the release
//! notification of the leader's key, through this process's queue for the key, without
//! contending), and re-reads at the leader's remaining ttl (an expiry publishes
//! nothing), at most a second apart, and shortly after a change while nobody leads (an
//! election publishes nothing either).

use std::pin::pin;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::Notify;

use super::leader::leader_key;
use super::LockManager;
use crate::error::chain;
use crate::key::LockKey;
use crate::notify::Register;
use crate::waiters::{KeyQueue, Subscription};
use crate::{LockError, LockInfo};

/// The longest a watch goes without reading the leader again.
const MAX_PAUSE: Duration = Duration::from_secs(1);
/// The first re-read after finding nobody leading; doubled up to [`MAX_PAUSE`].
const FIRST_VACANT_PAUSE: Duration = Duration::from_millis(10);
/// The longest pause while the key's channel is not listened to (a release would go
/// unheard).
const UNHEARD_PAUSE: Duration = Duration::from_millis(100);
/// How long a subscription request may take.
const SUBSCRIBE_WITHIN: Duration = Duration::from_secs(1);
/// How long a channel may go unheard before a watch asks for it again.
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(1);

/// Who leads a name now, as [`leader_info`](LockManager::leader_info) and
/// [`LeaderWatch`] tell it: read from the leader's lock, so it names the process that
/// holds it (never its token).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), redlock::LockError> {
/// let locks = redlock::LockManager::builder().in_memory().build().await?;
/// let leadership = locks.leader("scheduler").await?;
/// let info = locks.leader_info("scheduler").await?.expect("elected");
/// assert_eq!(info.term, leadership.fencing_token());
/// assert_eq!(info.pid, Some(std::process::id()));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderInfo {
    /// The name led.
    pub name: String,
    /// The leader's term: its lock's fencing token, as
    /// [`LockInfo::fencing_token`] shows it (0 only for a lock written without one,
    /// which this library never does). On Redlock it is at least the leader's term: the
    /// node read may have counted higher than the quorum that elected it.
    pub term: u64,
    /// The leader's host name.
    pub host: Option<String>,
    /// The leader's process id.
    pub pid: Option<u32>,
    /// When it was elected (by the leader's clock).
    pub since: Option<SystemTime>,
    /// The time left on its lease (renewed by its watchdog at a third of its ttl).
    pub ttl: Option<Duration>,
    /// 16 hex digits naming the leader's lock holder (see [`LockInfo::holder`]).
    pub holder: String,
}

impl LeaderInfo {
    fn new(name: &str, info: LockInfo) -> Self {
        Self {
            name: name.to_owned(),
            term: info.fencing_token.unwrap_or(0),
            host: info.host,
            pid: info.pid,
            since: info.acquired_at,
            ttl: info.ttl,
            holder: info.holder,
        }
    }

    /// Whether two readings are of the same leadership: the same holder (a digest of
    /// the grant's random token, new at every election). Not the term: on Redlock two
    /// readings of one leadership may read different nodes' counters.
    fn same_term(&self, other: &Self) -> bool {
        self.holder == other.holder
    }
}

/// Whether a reading of who leads differs from the last one (another leadership,
/// someone elected, or the leader gone).
fn differs(now: Option<&LeaderInfo>, last: Option<&LeaderInfo>) -> bool {
    match (now, last) {
        (Some(now), Some(last)) => !now.same_term(last),
        (None, None) => false,
        _ => true,
    }
}

impl LockManager {
    /// Who leads `name` now: host, process id, since when, the term; `None` while
    /// nobody does (between a resignation and the next election, or when nobody
    /// campaigns).
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] for an empty or too long name, [`LockError::Backend`]
    /// (or [`LockError::QuorumUnavailable`] on Redlock).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// assert!(locks.leader_info("scheduler").await?.is_none());
    /// let leadership = locks.leader("scheduler").await?;
    /// let info = locks.leader_info("scheduler").await?.expect("elected");
    /// assert_eq!(info.term, leadership.fencing_token());
    /// println!("term {} led by {:?} pid {:?}", info.term, info.host, info.pid);
    /// # Ok(()) }
    /// ```
    pub async fn leader_info(&self, name: &str) -> Result<Option<LeaderInfo>, LockError> {
        let key = leader_key(&self.0.prefix, name)?;
        self.read_leader(name, &key).await
    }

    /// Watches who leads `name`: the returned [`LeaderWatch`] holds the current
    /// leader (read now), and its [`changed`](LeaderWatch::changed) waits for the next
    /// one.
    ///
    /// # Errors
    /// As [`leader_info`](Self::leader_info).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let mut watch = locks.watch_leader("scheduler").await?;
    /// assert!(watch.current().is_none());
    /// let leadership = locks.leader("scheduler").await?;
    /// let now = watch.changed().await?.expect("elected");
    /// assert_eq!(now.term, leadership.fencing_token());
    /// leadership.resign().await?;
    /// assert!(watch.changed().await?.is_none()); // heard at once
    /// # Ok(()) }
    /// ```
    pub async fn watch_leader(&self, name: &str) -> Result<LeaderWatch, LockError> {
        let key = leader_key(&self.0.prefix, name)?;
        let last = self.read_leader(name, &key).await?;
        Ok(LeaderWatch {
            manager: self.clone(),
            name: name.to_owned(),
            key,
            last,
        })
    }

    async fn read_leader(
        &self,
        name: &str,
        key: &LockKey,
    ) -> Result<Option<LeaderInfo>, LockError> {
        self.check_runtime()?;
        let info = self.0.shared.backend.inspect(key).await?;
        Ok(info.map(|info| LeaderInfo::new(name, info)))
    }
}

/// Tells who leads a name, and when that changes: made by
/// [`watch_leader`](LockManager::watch_leader).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), redlock::LockError> {
/// let locks = redlock::LockManager::builder().in_memory().build().await?;
/// let _leadership = locks.leader("scheduler").await?;
/// let watch = locks.watch_leader("scheduler").await?;
/// assert_eq!(watch.name(), "scheduler");
/// assert!(watch.current().is_some());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LeaderWatch {
    manager: LockManager,
    name: String,
    key: LockKey,
    last: Option<LeaderInfo>,
}

impl LeaderWatch {
    /// The name watched.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// let locks = redlock::LockManager::builder().in_memory().build().await?;
    /// let watch = locks.watch_leader("scheduler").await?;
    /// assert_eq!(watch.name(), "scheduler");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The leader as last read (by [`watch_leader`](LockManager::watch_leader) or
    /// [`changed`](Self::changed)); `None`: nobody led then.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// let locks = redlock::LockManager::builder().in_memory().build().await?;
    /// let watch = locks.watch_leader("scheduler").await?;
    /// assert!(watch.current().is_none());
    /// # Ok(()) }
    /// ```
    pub fn current(&self) -> Option<&LeaderInfo> {
        self.last.as_ref()
    }

    /// Waits until the leader differs from [`current`](Self::current): another
    /// leadership (another holder: each election's is new), someone elected, or the leader gone (resigned: heard at once; expired:
    /// seen at its ttl). Returns the new leader (`None`: nobody leads now), which becomes
    /// `current`. Changes in between two calls are not queued: the next call compares
    /// with the last one returned.
    ///
    /// Each round reads the leader's lock, then waits for the key's release notification
    /// (this process queues for the key without contending, so a watch takes a place in
    /// the key's local queue while it waits) or a fallback timer: the leader's remaining
    /// ttl, at most a second; while nobody leads, 10 ms doubling up to a second.
    ///
    /// # Errors
    /// [`LockError::Backend`] (or [`LockError::QuorumUnavailable`]) when a read failed;
    /// [`current`](Self::current) is unchanged, and the watch can be used again.
    /// [`LockError::ShutDown`] once the manager shut down.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves `current` unchanged and the queue.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::LockManager;
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let first = locks.leader("scheduler").await?;
    /// let mut watch = locks.watch_leader("scheduler").await?;
    /// let observer = tokio::spawn(async move {
    ///     // Told of each change: the resignation, then the next election.
    ///     let gone = watch.changed().await?;
    ///     let next = watch.changed().await?;
    ///     Ok::<_, redlock::LockError>((gone, next.map(|l| l.term)))
    /// });
    /// let term = first.fencing_token();
    /// first.resign().await?;
    /// tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    /// let second = locks.leader("scheduler").await?;
    /// let (gone, next) = observer.await.unwrap()?;
    /// assert!(gone.is_none());
    /// assert_eq!(next, Some(second.fencing_token()));
    /// assert!(second.fencing_token() > term);
    /// # Ok(()) }
    /// ```
    pub async fn changed(&mut self) -> Result<Option<LeaderInfo>, LockError> {
        let manager = &self.manager;
        manager.check_runtime()?;
        let waiters = &manager.0.shared.waiters;
        let key = self.key.full();
        // A watch that finds the queue full polls at the fallback timer only.
        let place = waiters.join(key);
        let silent = Notify::new();
        let wake = place.as_ref().map_or(&silent, |p| &p.queue.wake);
        let mut listen = Listen::default();
        let mut vacant_pause = FIRST_VACANT_PAUSE;
        loop {
            if let Some(place) = &place {
                listen.keep(manager, key, &place.queue).await;
            }
            // Enabled before the read: a release after it is not missed.
            let mut notified = pin!(wake.notified());
            notified.as_mut().enable();
            let now = manager.read_leader(&self.name, &self.key).await?;
            if differs(now.as_ref(), self.last.as_ref()) {
                self.last.clone_from(&now);
                return Ok(now);
            }
            let mut pause = match &now {
                Some(leader) => leader
                    .ttl
                    .map_or(MAX_PAUSE, |left| left + Duration::from_millis(1)),
                None => {
                    let next = (vacant_pause * 2).min(MAX_PAUSE);
                    std::mem::replace(&mut vacant_pause, next)
                }
            }
            .min(MAX_PAUSE);
            if !manager.0.shared.backend.listening(key) {
                pause = pause.min(UNHEARD_PAUSE);
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep(pause) => {}
            }
        }
    }
}

/// A watch's subscription to the key's channel, kept as a waiting head keeps its own.
#[derive(Default)]
struct Listen {
    /// When this watch last asked for the channel.
    asked: Option<Instant>,
}

impl Listen {
    /// Subscribes to the key's channel when the queue holds no interest in it yet, or
    /// when it has been unheard for a while, unless a waiting head (which subscribes
    /// itself) holds the queue's turn. Bounded in time; a failure leaves the watch
    /// polling.
    async fn keep(&mut self, manager: &LockManager, key: &str, queue: &KeyQueue) {
        let backend = &manager.0.shared.backend;
        if !backend.has_channels() {
            return;
        }
        let unregistered = queue.subscription() == Subscription::None;
        let stale = !backend.listening(key)
            && self
                .asked
                .is_none_or(|at| at.elapsed() >= RESUBSCRIBE_AFTER);
        if !(unregistered || stale) {
            return;
        }
        // Only the queue's head records where the queue stands: be it for the request.
        let Ok(_turn) = queue.turn.try_acquire() else {
            return;
        };
        // Fair waiters of the key do not take the turn: the interest is claimed.
        let register = if unregistered && queue.claim_subscription() {
            Register::New
        } else {
            Register::Again
        };
        self.asked = Some(Instant::now());
        queue.set_subscription(Subscription::Asked);
        match tokio::time::timeout(SUBSCRIBE_WITHIN, backend.subscribe(key, register)).await {
            Ok(Ok(())) => queue.set_subscription(Subscription::Confirmed),
            Ok(Err(e)) => tracing::debug!(
                target: "redlock",
                key,
                backend = manager.backend_name(),
                error = %chain(&e),
                "a leader watch could not subscribe; polling"
            ),
            Err(_) => tracing::debug!(
                target: "redlock",
                key,
                backend = manager.backend_name(),
                "a leader watch's subscription timed out; polling"
            ),
        }
    }
}
