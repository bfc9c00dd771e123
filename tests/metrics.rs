//! The `metrics` feature (issue 14, item 5): every counter, histogram and gauge of
//! DESIGN.md "Metrics", observed with `metrics-util`'s debugging recorder after the
//! operations that must produce it, with their labels.
//!
//! One recorder is global to this binary, so the tests take turns ([`SERIAL`]) and each
//! looks only at what changed since it started ([`Seen`]).

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use redlock::{distributed_lock, LockError, LockManager, LockOptions};
use redlock_testkit::RedisServer;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        snapshotter
    })
}

type Id = (MetricKind, String, Vec<(String, String)>);

/// What was recorded since [`Seen::start`]: a snapshot drains counters and histograms
/// and resets gauges, so gauges here are net changes.
#[derive(Default)]
struct Seen {
    counters: HashMap<Id, u64>,
    gauges: HashMap<Id, f64>,
    histograms: HashMap<Id, Vec<f64>>,
}

impl Seen {
    fn start() -> Self {
        snapshotter().snapshot();
        Self::default()
    }

    fn update(&mut self) {
        for (key, _, _, value) in snapshotter().snapshot().into_vec() {
            let (kind, key) = key.into_parts();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let id = (kind, key.name().to_owned(), labels);
            match value {
                DebugValue::Counter(n) => *self.counters.entry(id).or_default() += n,
                DebugValue::Gauge(g) => *self.gauges.entry(id).or_default() += g.into_inner(),
                DebugValue::Histogram(h) => self
                    .histograms
                    .entry(id)
                    .or_default()
                    .extend(h.into_iter().map(|v| v.into_inner())),
            }
        }
    }

    fn matching<'a, V>(
        map: &'a HashMap<Id, V>,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = (&'a Id, &'a V)> + 'a {
        map.iter().filter(move |((_, n, l), _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
        })
    }

    /// The sum of the counters `name` with (at least) these labels.
    fn counter(&mut self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.update();
        Self::matching(&self.counters, name, labels)
            .map(|(_, n)| n)
            .sum()
    }

    /// The net change of the gauges `name` with these labels.
    fn gauge(&mut self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.update();
        Self::matching(&self.gauges, name, labels)
            .map(|(_, g)| g)
            .sum()
    }

    /// The samples of the histograms `name` with these labels.
    fn samples(&mut self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.update();
        Self::matching(&self.histograms, name, labels)
            .flat_map(|(_, h)| h.iter().copied())
            .collect()
    }

    /// The label names a metric was recorded with.
    fn label_names(&mut self, name: &str) -> Vec<Vec<String>> {
        self.update();
        let ids = self
            .counters
            .keys()
            .chain(self.gauges.keys())
            .chain(self.histograms.keys());
        let mut names: Vec<Vec<String>> = ids
            .filter(|(_, n, _)| n == name)
            .map(|(_, _, l)| l.iter().map(|(k, _)| k.clone()).collect())
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

/// Polls `done` every 20 ms for up to 5 s.
async fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    done()
}

const ACQUIRE: &str = "redlock_acquire_total";

#[tokio::test]
async fn acquire_wait_hold_release_and_gauges_in_memory() {
    let _turn = SERIAL.lock().await;
    let mut seen = Seen::start();
    let locks = LockManager::builder()
        .in_memory()
        .max_waiters_per_key(1)
        .build()
        .await
        .unwrap();
    let orders = || LockOptions::new().name("orders");

    let guard = locks.lock_with("m_{1}", orders()).await.unwrap();
    let acquired = [
        ("outcome", "acquired"),
        ("kind", "exclusive"),
        ("backend", "memory"),
        ("name", "orders"),
    ];
    assert_eq!(seen.counter(ACQUIRE, &acquired), 1);
    assert_eq!(
        seen.label_names(ACQUIRE),
        [["backend", "kind", "name", "outcome"]]
    );
    let wait = [("kind", "exclusive"), ("name", "orders")];
    assert_eq!(seen.samples("redlock_wait_seconds", &wait).len(), 1);
    assert_eq!(seen.gauge("redlock_held", &[("kind", "exclusive")]), 1.0);

    // Single attempts on a held key are `busy` (issue 24, item 3: a skip is not a
    // timeout), with no wait sample; a wait that runs out is a timeout, with one.
    assert!(locks
        .lock_with("m_{1}", orders().wait(Duration::ZERO))
        .await
        .is_err());
    assert!(locks
        .try_lock_with("m_{1}", orders())
        .await
        .unwrap()
        .is_none());
    assert!(locks
        .try_write_with("m_{1}", orders())
        .await
        .unwrap()
        .is_none());
    assert!(locks
        .try_read_with("m_{1}", orders())
        .await
        .unwrap()
        .is_none());
    assert!(locks
        .try_lock_all_with(["m_{1}", "m_{2}"], orders())
        .await
        .unwrap()
        .is_none());
    let busy = [
        ("outcome", "busy"),
        ("backend", "memory"),
        ("name", "orders"),
    ];
    assert_eq!(seen.counter(ACQUIRE, &busy), 5);
    let err = locks
        .lock_with("m_{1}", orders().wait(Duration::from_millis(50)))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    let timeout = [
        ("outcome", "timeout"),
        ("backend", "memory"),
        ("name", "orders"),
    ];
    assert_eq!(seen.counter(ACQUIRE, &timeout), 1);
    assert_eq!(seen.samples("redlock_wait_seconds", &wait).len(), 2);

    // A waiter fills the queue (redlock_waiters); the next caller is turned away.
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .lock_with("m_{1}", LockOptions::new().wait(Duration::from_secs(10)))
                .await
        })
    };
    assert!(eventually(|| seen.gauge("redlock_waiters", &[]) == 1.0).await);
    let err = locks.lock("m_{1}").await.unwrap_err();
    assert!(matches!(err, LockError::QueueFull { .. }), "{err}");
    assert_eq!(
        seen.counter(ACQUIRE, &[("outcome", "queue_full"), ("name", "")]),
        1
    );
    // Not a wait sample: only grants and timeouts record one.
    assert_eq!(
        seen.samples("redlock_wait_seconds", &[("name", "")]).len(),
        0
    );

    guard.release().await.unwrap();
    assert_eq!(
        seen.counter("redlock_release_total", &[("outcome", "released")]),
        1
    );
    assert_eq!(seen.samples("redlock_hold_seconds", &wait).len(), 1);
    // The waiter got it (unnamed), and left the queue.
    let second = waiter.await.unwrap().unwrap();
    assert_eq!(seen.gauge("redlock_waiters", &[]), 0.0);
    assert_eq!(
        seen.counter(ACQUIRE, &[("outcome", "acquired"), ("name", "")]),
        1
    );
    assert_eq!(seen.gauge("redlock_held", &[("kind", "exclusive")]), 1.0);
    // Dropped: released in the background, counted all the same.
    drop(second);
    assert!(
        eventually(|| seen.counter("redlock_release_total", &[("outcome", "released")]) == 2).await
    );
    assert_eq!(seen.gauge("redlock_held", &[("kind", "exclusive")]), 0.0);
    assert_eq!(
        seen.samples("redlock_hold_seconds", &[("kind", "exclusive")])
            .len(),
        2
    );

    // The other kinds.
    let reader = locks.read_with("r_{1}", orders()).await.unwrap();
    let permit = locks.permit_with("p_{1}", 2, orders()).await.unwrap();
    let fair = locks.fair_with("f_{1}", orders()).await.unwrap();
    for kind in ["read", "permit", "fair"] {
        let labels = [("outcome", "acquired"), ("kind", kind), ("name", "orders")];
        assert_eq!(seen.counter(ACQUIRE, &labels), 1, "{kind}");
        assert_eq!(seen.gauge("redlock_held", &[("kind", kind)]), 1.0, "{kind}");
    }
    reader.release().await.unwrap();
    permit.release().await.unwrap();
    fair.release().await.unwrap();
    for kind in ["read", "permit", "fair"] {
        let labels = [("kind", kind), ("name", "orders")];
        assert_eq!(
            seen.samples("redlock_hold_seconds", &labels).len(),
            1,
            "{kind}"
        );
        assert_eq!(seen.gauge("redlock_held", &[("kind", kind)]), 0.0, "{kind}");
    }
    // A full permit turns a single attempt away as `busy`.
    let place = locks
        .try_permit_with("skip_{1}", 1, orders())
        .await
        .unwrap();
    assert!(place.is_some());
    assert!(locks
        .try_permit_with("skip_{1}", 1, orders())
        .await
        .unwrap()
        .is_none());
    let busy_permit = [("outcome", "busy"), ("kind", "permit"), ("name", "orders")];
    assert_eq!(seen.counter(ACQUIRE, &busy_permit), 1);
}

#[tokio::test]
async fn renewals_and_losses_in_memory() {
    let _turn = SERIAL.lock().await;
    let mut seen = Seen::start();
    let locks = LockManager::builder().in_memory().build().await.unwrap();
    let short = LockOptions::new()
        .ttl(Duration::from_millis(300))
        .name("short");

    // Renewed by the watchdog (every ttl/3), then taken away: the next renewal finds
    // the token gone.
    let guard = locks.lock_with("renewed_{1}", short.clone()).await.unwrap();
    assert!(
        eventually(|| seen.counter("redlock_renewals_total", &[("outcome", "renewed")]) >= 2).await
    );
    assert!(locks.force_unlock("renewed_{1}").await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the loss was never noticed");
    assert_eq!(
        seen.counter("redlock_renewals_total", &[("outcome", "lost")]),
        1
    );
    assert_eq!(
        seen.counter("redlock_lost_total", &[("reason", "taken")]),
        1
    );
    let hold = [("kind", "exclusive"), ("name", "short")];
    assert_eq!(seen.samples("redlock_hold_seconds", &hold).len(), 1);
    // Releasing a lost lock: a release that finds it gone, no second loss or hold sample.
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    assert_eq!(
        seen.counter("redlock_release_total", &[("outcome", "lost")]),
        1
    );
    assert_eq!(seen.counter("redlock_lost_total", &[]), 1);
    assert_eq!(seen.samples("redlock_hold_seconds", &hold).len(), 1);

    // Without the watchdog the lease runs out.
    let guard = locks
        .lock_with(
            "expired_{1}",
            short.ttl(Duration::from_millis(50)).watchdog(false),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!guard.is_held());
    assert_eq!(
        seen.counter("redlock_lost_total", &[("reason", "expired")]),
        1
    );
    assert_eq!(seen.samples("redlock_hold_seconds", &hold).len(), 2);
    assert_eq!(seen.gauge("redlock_held", &[("kind", "exclusive")]), 0.0);
    drop(guard);
}

#[distributed_lock(key = "buy_<goods_id>", manager = locks)]
async fn buy(locks: &LockManager, goods_id: u64) -> Result<u64, LockError> {
    Ok(goods_id)
}

#[distributed_lock(keys = ["account_<from>", "account_<to>"], manager = locks)]
async fn transfer(locks: &LockManager, from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

/// The macro names its locks after the key template, never the concrete key.
#[tokio::test]
async fn the_macro_sets_name_to_the_key_template() {
    let _turn = SERIAL.lock().await;
    let mut seen = Seen::start();
    let locks = LockManager::builder().in_memory().build().await.unwrap();
    assert_eq!(buy(&locks, 42).await.unwrap(), 42);
    assert_eq!(buy(&locks, 43).await.unwrap(), 43);
    let name = [("name", "buy_<goods_id>")];
    assert_eq!(seen.counter(ACQUIRE, &name), 2);
    assert_eq!(seen.samples("redlock_wait_seconds", &name).len(), 2);
    assert_eq!(seen.samples("redlock_hold_seconds", &name).len(), 2);
    assert_eq!(transfer(&locks, 1, 2).await.unwrap(), 3);
    let name = [("name", "account_<from>, account_<to>")];
    assert_eq!(seen.counter(ACQUIRE, &name), 2, "one per key");
    assert_eq!(seen.samples("redlock_hold_seconds", &name).len(), 2);
}

/// On a real server: the `single` backend label, and failed requests as `error`.
#[tokio::test]
async fn single_server_backend_label_and_errors() {
    let _turn = SERIAL.lock().await;
    let mut seen = Seen::start();
    let mut server = RedisServer::start();
    let locks = LockManager::builder()
        .single(server.url())
        .build()
        .await
        .unwrap();
    let opts = || LockOptions::new().name("jobs");
    let guard = locks.lock_with("job_{1}", opts()).await.unwrap();
    let labels = [
        ("outcome", "acquired"),
        ("backend", "single"),
        ("name", "jobs"),
    ];
    assert_eq!(seen.counter(ACQUIRE, &labels), 1);
    guard.release().await.unwrap();
    assert_eq!(
        seen.counter("redlock_release_total", &[("outcome", "released")]),
        1
    );
    // A lock renewed every 100 ms when the server goes away.
    let held = locks
        .lock_with("job_{2}", opts().ttl(Duration::from_millis(300)))
        .await
        .unwrap();
    server.kill9();
    let err = locks
        .lock_with("job_{3}", opts().wait(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err}");
    let labels = [
        ("outcome", "error"),
        ("backend", "single"),
        ("name", "jobs"),
    ];
    assert_eq!(seen.counter(ACQUIRE, &labels), 1);
    tokio::time::timeout(Duration::from_secs(5), held.lost())
        .await
        .expect("the loss was never noticed");
    assert_eq!(
        seen.counter("redlock_lost_total", &[("reason", "expired")]),
        1
    );
    // The renewal in flight fails once its reply is overdue (the response timeout).
    assert!(
        eventually(|| seen.counter("redlock_renewals_total", &[("outcome", "error")]) >= 1).await
    );
    drop(held);
}
