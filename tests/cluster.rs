//! Redis Cluster (3 masters + 3 replicas, real processes): the conformance suite,
//! mutual exclusion over every master, key placement, the redis-rs workarounds (stray
//! `sunsubscribe` after a slot migration, cross-slot resubscription, script reload on
//! the key's node only), `min_replicas`, and kill -9 of a master under load.
//!
//! A cluster takes ~2.2 s to start and 6 processes to run, so the tests that kill no
//! node share one, and the two cluster tests run one at a time.

mod conformance;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance::Harness;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncCommands, Value};
use redlock::{LockError, LockManager, LockManagerBuilder, LockOptions};
use redlock_testkit::{fence_key, key_slot, wait_until, RedisCluster};

/// One cluster test at a time: each runs 6 processes, and failover timings should not
/// depend on another cluster's load.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Cluster {
    cluster: RedisCluster,
    raw: ClusterConnection,
}

impl Cluster {
    async fn start() -> Self {
        let started = Instant::now();
        let cluster = tokio::task::spawn_blocking(RedisCluster::start_default)
            .await
            .expect("cluster starts");
        println!("cluster 3+3 ready in {:?}", started.elapsed());
        let raw = cluster
            .client()
            .get_async_connection()
            .await
            .expect("raw cluster connection");
        Self { cluster, raw }
    }

    fn raw(&self) -> ClusterConnection {
        self.raw.clone()
    }

    /// Runs one command on node `i` (blocking, short).
    fn on(&self, i: usize, args: &[&str]) -> Value {
        self.cluster
            .node(i)
            .cmd_sync(args)
            .unwrap_or_else(|e| panic!("{args:?} on node {i}: {e}"))
    }

    /// The master index serving `full_key`.
    fn master_of(&self, full_key: &str) -> usize {
        self.cluster.master_for_key(full_key)
    }

    /// `per_master` user keys (with their own hash tags) on every master.
    fn keys_on_every_master(&self, name: &str, per_master: usize) -> Vec<String> {
        let masters = self.cluster.master_indices();
        let mut by_master: HashMap<usize, Vec<String>> = HashMap::new();
        for i in 0..10_000 {
            let key = format!("{name}_{{{i}}}");
            let m = self.master_of(&format!("lock:{key}"));
            let keys = by_master.entry(m).or_default();
            if keys.len() < per_master {
                keys.push(key);
            }
            if masters
                .iter()
                .all(|m| by_master.get(m).is_some_and(|k| k.len() == per_master))
            {
                break;
            }
        }
        by_master.into_values().flatten().collect()
    }
}

impl Harness for Cluster {
    fn builder(&self) -> LockManagerBuilder {
        LockManager::builder().cluster(self.cluster.urls())
    }

    async fn delete(&self, full_key: &str) {
        let n: i64 = self.raw().del(full_key).await.unwrap();
        assert_eq!(n, 1);
    }

    async fn steal(&self, full_key: &str) {
        let _: () = self
            .raw()
            .set_ex(full_key, "someone-else", 60)
            .await
            .unwrap();
    }

    async fn exists(&self, full_key: &str) -> bool {
        self.raw().exists(full_key).await.unwrap()
    }
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        Value::BulkString(b) => String::from_utf8_lossy(b).parse().unwrap_or(0),
        _ => 0,
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::VerbatimString { text, .. } => text.clone(),
        other => format!("{other:?}"),
    }
}

/// Subscribers of a shard channel, as counted by the node serving it.
fn shard_subscribers(h: &Cluster, node: usize, channel: &str) -> i64 {
    match h.on(node, &["PUBSUB", "SHARDNUMSUB", channel]) {
        Value::Array(items) => items.get(1).map_or(0, int),
        Value::Map(pairs) => pairs.first().map_or(0, |(_, n)| int(n)),
        _ => 0,
    }
}

/// Subscribers of a shard channel on every node of the cluster.
fn subscribers_anywhere(h: &Cluster, channel: &str) -> i64 {
    (0..h.cluster.len())
        .map(|i| shard_subscribers(h, i, channel))
        .sum()
}

/// Everything that kills no node, on one shared cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_behaviour() {
    let _serial = SERIAL.lock().await;
    let mut h = Cluster::start().await;
    let step = |name: &str, started: Instant| println!("{name}: {:?}", started.elapsed());

    let t = Instant::now();
    stored_keys_share_one_slot(&h).await;
    step("stored keys", t);
    let t = Instant::now();
    require_noeviction_checks_every_master(&h).await;
    step("require_noeviction", t);
    let t = Instant::now();
    mutual_exclusion_over_every_master(&h).await;
    step("mutual exclusion over every master", t);
    let t = Instant::now();
    renewals_over_many_slots(&h).await;
    step("renewals over many slots", t);
    let t = Instant::now();
    cluster_renewals_one_pipeline_per_master(&h).await;
    step("renewals: one pipeline per master", t);
    let t = Instant::now();
    min_replicas_waits_on_the_keys_master(&h).await;
    step("min_replicas", t);
    let t = Instant::now();
    min_replicas_holds_for_every_expiry_setting_request(&mut h).await;
    step("min_replicas for extend, renewals and keep", t);
    let t = Instant::now();
    noscript_reloads_on_the_keys_node_only(&mut h).await;
    step("NOSCRIPT fallback", t);
    let t = Instant::now();
    frozen_master_bounds_each_attempt(&mut h).await;
    step("frozen master", t);
    let t = Instant::now();
    a_new_queue_subscribes_while_an_old_interest_is_being_dropped(&mut h).await;
    step("new queue while an old interest is dropped", t);
    let t = Instant::now();
    cross_slot_resubscription_after_reconnect(&h).await;
    step("cross-slot resubscription", t);

    macro_rules! conformance {
        ($($name:ident),* $(,)?) => {$(
            let t = Instant::now();
            let _ = conformance::$name(&h).await;
            step(concat!("conformance::", stringify!($name)), t);
        )*};
    }
    conformance!(
        mutual_exclusion,
        crashed_holder_frees_after_ttl,
        watchdog_keeps_the_lock,
        lost_when_deleted,
        lost_when_stolen,
        drop_releases,
        cancelled_lock_leaves_nothing,
        fencing_across_expiry,
        fencing_unique_under_concurrency,
        queue_full,
        notified_handoff_is_fast,
        one_attempt_apis,
        extend_sets_ttl,
        expiry_without_watchdog,
        guards_are_not_reentrant,
        local_waiters_are_fifo,
        bad_input_is_rejected,
        inspect_tells_who_holds_what,
        list_shows_held_locks_only,
        shutdown_frees_every_lock_at_once,
        force_unlock_spares_a_later_grant,
        a_kept_lock_is_shown_as_kept,
        each_shared_holder_is_listed,
    );
    conformance::static_send_sync_checks(&h.builder().build().await.unwrap());
    macro_rules! kinds {
        ($($name:ident),* $(,)?) => {$(
            let t = Instant::now();
            conformance::kinds::$name(&h).await;
            step(concat!("conformance::kinds::", stringify!($name)), t);
        )*};
    }
    kinds!(
        readers_share_writers_exclude,
        writer_not_starved_by_readers,
        write_release_wakes_every_reader,
        at_most_n_permit_holders,
        killed_permit_holder_frees_after_ttl,
        permit_release_wakes_a_waiter,
        watchdog_keeps_readers_and_permits,
        extending_one_reader_keeps_the_others,
        is_locked_sees_every_kind,
        lock_all_in_opposite_orders_finishes,
        lock_all_leaves_no_key_behind,
        hold_at_least_keeps_the_key,
        kinds_reject_bad_input,
        lock_all_miss_keeps_no_key_for_hold_at_least,
        cancelled_writer_keeps_no_reader_out,
        writer_waiting_behind_a_writer_keeps_new_readers_out,
        release_within_hold_at_least_wakes_waiters_at_its_end,
        permit_and_exclusive_or_read_holders_exclude_each_other,
    );
    macro_rules! rules {
        ($($name:ident),* $(,)?) => {$(
            let t = Instant::now();
            conformance::rules::$name(&h).await;
            step(concat!("conformance::rules::", stringify!($name)), t);
        )*};
    }
    rules!(
        kept_hold_is_renewed_by_nobody,
        every_shortened_hold_wakes_its_waiters,
        lock_all_holds_no_key_while_it_waits,
        kinds_exclude_each_other,
    );
    macro_rules! fair {
        ($($name:ident),* $(,)?) => {$(
            let t = Instant::now();
            conformance::fair::$name(&h).await;
            step(concat!("conformance::fair::", stringify!($name)), t);
        )*};
    }
    fair!(
        fair_grants_in_arrival_order,
        dead_fair_waiter_is_dropped_from_the_queue,
        cancelled_fair_waiter_leaves_no_place,
        a_full_fair_queue_refuses_with_queue_full,
    );

    macro_rules! leader {
        ($($name:ident),* $(,)?) => {$(
            let t = Instant::now();
            conformance::leader::$name(&h).await;
            step(concat!("conformance::leader::", stringify!($name)), t);
        )*};
    }
    leader!(
        elected_follower_waits_and_takes_over_on_resign,
        terms_strictly_increase,
        lead_aborts_its_body_on_loss_and_campaigns_again,
        a_watch_sees_every_change,
        a_cancelled_campaign_leaves_no_lock,
        leader_rejects_bad_input,
    );

    // Last: they move slots to other masters.
    let t = Instant::now();
    stray_sunsubscribe_after_slot_migration(&h).await;
    step("stray sunsubscribe after a slot migration", t);
    let t = Instant::now();
    renewals_follow_a_moved_slot(&h).await;
    step("renewals follow a moved slot", t);
}

/// The lock key and its slot's fencing counter share the slot and live on the master
/// that owns it; release deletes the lock and keeps the counter.
async fn stored_keys_share_one_slot(h: &Cluster) {
    let locks = h.builder().build().await.unwrap();
    assert_eq!(locks.backend_name(), "cluster");
    let guard = locks.lock("buy_{42}").await.unwrap();
    assert_eq!(guard.key(), "lock:buy_{42}");
    let counter = fence_key("lock:", "lock:buy_{42}");
    for key in ["lock:buy_{42}", counter.as_str()] {
        assert_eq!(int(&h.on(0, &["CLUSTER", "KEYSLOT", key])), 8000, "{key}");
        assert_eq!(key_slot(key.as_bytes()), 8000);
    }
    let master = h.master_of("lock:buy_{42}");
    assert_eq!(int(&h.on(master, &["EXISTS", "lock:buy_{42}"])), 1);
    let fence = int(&h.on(master, &["GET", &counter]));
    assert_eq!(u64::try_from(fence).unwrap(), guard.fencing_token());
    let pttl = int(&h.on(master, &["PTTL", "lock:buy_{42}"]));
    assert!(pttl > 25_000 && pttl <= 30_000, "{pttl}");
    guard.release().await.unwrap();
    assert_eq!(int(&h.on(master, &["EXISTS", "lock:buy_{42}"])), 0);
    assert_eq!(int(&h.on(master, &["EXISTS", &counter])), 1);
    // An untagged key: the counter of the whole key's slot.
    let guard = locks.lock("jobs").await.unwrap();
    let slot = key_slot(b"lock:jobs");
    let counter = fence_key("lock:", "lock:jobs");
    assert_eq!(key_slot(counter.as_bytes()), slot);
    let master = h.cluster.master_for_slot(slot);
    assert_eq!(int(&h.on(master, &["EXISTS", &counter])), 1);
    guard.release().await.unwrap();
}

/// Every master's `maxmemory-policy` is checked at build.
async fn require_noeviction_checks_every_master(h: &Cluster) {
    h.builder().require_noeviction(true).build().await.unwrap();
    let master = h.master_of("lock:buy_{42}");
    h.on(
        master,
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-random"],
    );
    let err = h
        .builder()
        .require_noeviction(true)
        .build()
        .await
        .map(drop)
        .unwrap_err();
    h.on(master, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err}");
    assert!(err.to_string().contains("allkeys-random"), "{err}");
}

/// Several managers and tasks over keys on all three masters: exact totals, never two
/// holders of a key, tokens strictly increasing per key.
async fn mutual_exclusion_over_every_master(h: &Cluster) {
    let keys = h.keys_on_every_master("acct", 4);
    assert_eq!(keys.len(), 12);
    let masters: std::collections::HashSet<usize> = keys
        .iter()
        .map(|k| h.master_of(&format!("lock:{k}")))
        .collect();
    assert_eq!(masters.len(), 3, "keys on every master");
    conformance::mutual_exclusion_over_keys(h, keys, 12).await;
}

/// The watchdog renews locks spread over many slots on every master (one script call
/// per slot): all stay held for several ttls.
async fn renewals_over_many_slots(h: &Cluster) {
    let (a, b) = (
        h.builder().build().await.unwrap(),
        h.builder().build().await.unwrap(),
    );
    let ttl = Duration::from_millis(600);
    let mut guards = Vec::new();
    for i in 0..150 {
        let g = a
            .lock_with(&format!("renew_{{{i}}}"), LockOptions::new().ttl(ttl))
            .await
            .unwrap();
        guards.push(g);
    }
    assert_eq!(a.watched_locks(), 150);
    tokio::time::sleep(ttl * 3).await;
    for g in &guards {
        assert!(g.is_held(), "{} lost", g.key());
    }
    for i in (0..150).step_by(30) {
        assert!(b
            .try_lock(&format!("renew_{{{i}}}"))
            .await
            .unwrap()
            .is_none());
    }
    for g in guards {
        g.release().await.unwrap();
    }
}

/// Calls of `command` (as `INFO commandstats` names it) on node `i` since its last
/// `CONFIG RESETSTAT`.
fn calls(h: &Cluster, i: usize, command: &str) -> u64 {
    let stats = text(&h.on(i, &["INFO", "commandstats"]));
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|l| l.trim().strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Issue 12, item 6: renewals were one script call per slot, 64 at a time, so a tick
/// over locks in many slots cost many round trips per master. Now each master gets one
/// pipeline per tick (led by a `SCRIPT LOAD`) carrying the calls of all its slots.
async fn cluster_renewals_one_pipeline_per_master(h: &Cluster) {
    let locks = h.builder().build().await.unwrap();
    let ttl = Duration::from_millis(900);
    let keys = h.keys_on_every_master("pipe", 60);
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(
            locks
                .lock_with(key, LockOptions::new().ttl(ttl))
                .await
                .unwrap(),
        );
    }
    let masters = h.cluster.master_indices();
    for &m in &masters {
        h.on(m, &["CONFIG", "RESETSTAT"]);
    }
    tokio::time::sleep(ttl * 3).await;
    let counts: Vec<(u64, u64)> = masters
        .iter()
        .map(|&m| (calls(h, m, "script|load"), calls(h, m, "evalsha")))
        .collect();
    println!("renewals per master over 3 ttls (pipelines, scripts): {counts:?}");
    for g in &guards {
        assert!(g.is_held(), "{} lost", g.key());
    }
    // 60 locks in ~60 slots per master, renewed every 150-300 ms: each pipeline
    // carries ~60 calls; sent one by one, the calls come without a SCRIPT LOAD.
    for &(pipelines, scripts) in &counts {
        assert!(
            pipelines >= 3 && scripts >= 20 * pipelines,
            "(renewal pipelines, renewal scripts) per master: {counts:?}"
        );
    }
    for g in guards {
        g.release().await.unwrap();
    }
}

/// A slot moved since the slot map was fetched fails its master's renewal pipeline
/// (redirected as a whole): its calls are sent slot by slot instead and the map is
/// fetched again, so every lock, the moved slot's included, stays held.
async fn renewals_follow_a_moved_slot(h: &Cluster) {
    let locks = h.builder().build().await.unwrap();
    let ttl = Duration::from_millis(1500);
    let keys = h.keys_on_every_master("moved", 20);
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(
            locks
                .lock_with(key, LockOptions::new().ttl(ttl))
                .await
                .unwrap(),
        );
    }
    // Let a renewal fetch the slot map, then move the first key's slot.
    tokio::time::sleep(ttl / 2).await;
    let full = guards[0].key().to_owned();
    let slot = key_slot(full.as_bytes()).to_string();
    let from = h.master_of(&full);
    let masters = h.cluster.master_indices();
    let to = masters.iter().copied().find(|&m| m != from).unwrap();
    let id = |i: usize| text(&h.on(i, &["CLUSTER", "MYID"]));
    let (from_id, to_id) = (id(from), id(to));
    let to_port = h.cluster.node(to).port().to_string();
    h.on(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]);
    h.on(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]);
    let in_slot = match h.on(from, &["CLUSTER", "GETKEYSINSLOT", &slot, "1000"]) {
        Value::Array(keys) => keys.iter().map(text).collect::<Vec<_>>(),
        other => panic!("GETKEYSINSLOT: {other:?}"),
    };
    let mut migrate = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS"];
    migrate.extend(in_slot.iter().map(String::as_str));
    h.on(from, &migrate);
    for &m in [to, from]
        .iter()
        .chain(masters.iter().filter(|&&m| m != from && m != to))
    {
        h.on(m, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
    }
    assert_eq!(h.master_of(&full), to, "the slot moved");
    tokio::time::sleep(ttl * 3).await;
    for g in &guards {
        assert!(g.is_held(), "{} lost after its slot moved", g.key());
    }
    let pttl = int(&h.on(to, &["PTTL", &full]));
    assert!(
        pttl > 0,
        "the moved lock is renewed on its new master ({pttl})"
    );
    for g in guards {
        g.release().await.unwrap();
    }
}

/// `min_replicas`: WAIT runs on the key's master, pipelined after the acquire (never a
/// bare WAIT to every primary), on its own connection so it blocks no other lock.
/// Issue 23, finding 1, on a cluster: `extend`, the watchdog's renewals and a keep of a
/// lock taken with `min_replicas(1)` count only once the replica of the key's master
/// acknowledged them (`WAIT` routed to that master). The replica is frozen after the
/// grants.
async fn min_replicas_holds_for_every_expiry_setting_request(h: &mut Cluster) {
    let locks = h.builder().build().await.unwrap();
    let opts = |ttl_ms| {
        LockOptions::new()
            .ttl(Duration::from_millis(ttl_ms))
            .min_replicas(1)
    };
    let extended = locks
        .lock_with("every_{rep}extend", opts(3_000).watchdog(false))
        .await
        .unwrap();
    let renewed = locks
        .lock_with("every_{rep}renew", opts(1_500))
        .await
        .unwrap();
    let kept = locks
        .lock_with(
            "every_{rep}keep",
            opts(3_000)
                .watchdog(false)
                .hold_at_least(Duration::from_secs(20)),
        )
        .await
        .unwrap();
    let granted = Instant::now();
    let master = h.master_of(extended.key());
    let port = h.cluster.node(master).port();
    let replica = (0..h.cluster.len())
        .find(|&i| match h.on(i, &["ROLE"]) {
            Value::Array(role) => role.get(2) == Some(&Value::Int(i64::from(port))),
            _ => false,
        })
        .expect("the key's master has a replica");
    h.cluster.node_mut(replica).pause();
    let unacknowledged =
        |e: &LockError| matches!(e, LockError::ReplicasUnavailable { acked: 0, .. });
    let err = extended.extend(Duration::from_secs(30)).await.unwrap_err();
    assert!(unacknowledged(&err), "{err}");
    assert!(extended.valid_until() <= granted + Duration::from_secs(3));
    let err = kept.release().await.unwrap_err();
    assert!(unacknowledged(&err), "{err}");
    let lost = tokio::time::timeout(Duration::from_secs(4), renewed.lost()).await;
    assert!(
        lost.is_ok(),
        "renewed without the replica for {:?}",
        granted.elapsed()
    );
    h.cluster.node_mut(replica).resume();
    extended.release().await.ok();
}

async fn min_replicas_waits_on_the_keys_master(h: &Cluster) {
    let locks = h.builder().build().await.unwrap();
    let opts = || LockOptions::new().ttl(Duration::from_secs(5));
    let g = locks
        .lock_with("rep_{1}", opts().min_replicas(1))
        .await
        .expect("one replica acknowledges");
    g.release().await.unwrap();

    // Two replicas wanted, one exists: WAIT blocks 500 ms (ttl/10), then the lock is
    // released again. Meanwhile other locks on the same master are not held up.
    let (l2, started) = (locks.clone(), Instant::now());
    let waiting = tokio::spawn(async move {
        l2.lock_with("rep_{1}", opts().min_replicas(2))
            .await
            .map(drop)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let quick = Instant::now();
    let other = locks.lock("rep_{1}x").await.unwrap();
    let quick = quick.elapsed();
    let err = waiting.await.unwrap().unwrap_err();
    let waited = started.elapsed();
    assert!(
        matches!(
            err,
            LockError::ReplicasUnavailable {
                acked: 1,
                wanted: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(waited >= Duration::from_millis(450), "{waited:?}");
    assert!(
        quick < Duration::from_millis(300),
        "a plain lock waited behind WAIT: {quick:?}"
    );
    assert!(!h.exists("lock:rep_{1}").await, "no key left behind");
    other.release().await.unwrap();

    // Concurrent WAITs do not queue behind each other (min_replicas_acquisitions_do_not_queue
    // on one server): four at once on one master all end after about one WAIT (500 ms).
    let master = h.master_of("lock:rep_{1}");
    let keys: Vec<String> = (0..10_000)
        .map(|i| format!("rep_{{q{i}}}"))
        .filter(|k| h.master_of(&format!("lock:{k}")) == master)
        .take(4)
        .collect();
    let started = Instant::now();
    let tasks: Vec<_> = keys
        .into_iter()
        .map(|key| {
            let locks = locks.clone();
            tokio::spawn(async move {
                let outcome = locks.lock_with(&key, opts().min_replicas(2)).await;
                (started.elapsed(), outcome.map(drop))
            })
        })
        .collect();
    let mut ended = Vec::new();
    for t in tasks {
        let (took, outcome) = t.await.unwrap();
        let err = outcome.unwrap_err();
        assert!(
            matches!(err, LockError::ReplicasUnavailable { .. }),
            "{err}"
        );
        ended.push(took);
    }
    ended.sort();
    println!("cluster min_replicas, 4 at once on one master, ended at {ended:?}");
    assert!(
        ended.iter().all(|&t| t < Duration::from_millis(1000)),
        "acquisitions queued behind each other's WAIT: {ended:?}"
    );
}

/// After SCRIPT FLUSH, an acquire falls back to EVAL on the key's own node: an
/// unrelated frozen master does not matter (redis-rs's own fallback would load the
/// script on every node and time out).
async fn noscript_reloads_on_the_keys_node_only(h: &mut Cluster) {
    let locks = h.builder().build().await.unwrap();
    let key = "script_{7}";
    let owner = h.master_of("lock:script_{7}");
    let unrelated = h
        .cluster
        .master_indices()
        .into_iter()
        .find(|&m| m != owner)
        .unwrap();
    for m in h.cluster.master_indices() {
        h.on(m, &["SCRIPT", "FLUSH"]);
    }
    h.cluster.node_mut(unrelated).pause();
    let start = Instant::now();
    let result = async {
        let g = locks.try_lock(key).await?.expect("free");
        g.extend(Duration::from_secs(10)).await?;
        g.release().await
    }
    .await;
    let took = start.elapsed();
    h.cluster.node_mut(unrelated).resume();
    result.expect("acquire, extend and release after SCRIPT FLUSH");
    assert!(took < Duration::from_millis(500), "took {took:?}");
}

/// The cluster client has no response timeout by default (a request to a frozen master
/// would wait for SIGCONT); the backend sets one, and an overall bound on retries, so an
/// attempt against a frozen master fails within about twice the response timeout. The
/// pause stays below the cluster's node timeout, so no failover starts.
async fn frozen_master_bounds_each_attempt(h: &mut Cluster) {
    let locks = h
        .builder()
        .response_timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let key = "frozen_{3}";
    let master = h.master_of("lock:frozen_{3}");
    locks.lock(key).await.unwrap().release().await.unwrap();
    h.cluster.node_mut(master).pause();
    let start = Instant::now();
    let outcome = locks.try_lock(key).await;
    let took = start.elapsed();
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.cluster.node_mut(master).resume();
    let err = outcome.map(drop).unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err}");
    assert!(took < Duration::from_millis(650), "took {took:?}");
    // Back to normal at once; whatever the late request did is released.
    let g = locks
        .lock_with(key, LockOptions::new().wait(Duration::from_secs(5)))
        .await
        .expect("works after SIGCONT");
    g.release().await.unwrap();
}

/// Regression (review of `liveness`, finding 2): a new local queue saw the key's channel
/// still listened to through an earlier queue's interest, whose unsubscribe was waiting
/// behind another key's `SSUBSCRIBE` to a frozen master, and registered no interest of
/// its own. That old interest was then dropped and the channel unsubscribed, so the
/// holder's release went unheard and the waiter slept until its wait ran out. The pause
/// stays below the cluster's node timeout.
async fn a_new_queue_subscribes_while_an_old_interest_is_being_dropped(h: &mut Cluster) {
    let waiter = h
        .builder()
        .response_timeout(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let holder = h.builder().build().await.unwrap();
    let key = "requeue_{0}";
    let key_master = h.master_of(&format!("lock:{key}"));
    let other = (1..1000)
        .map(|i| format!("requeue_{{{i}}}"))
        .find(|k| h.master_of(&format!("lock:{k}")) != key_master)
        .expect("a key on another master");
    let other_master = h.master_of(&format!("lock:{other}"));
    for k in [key, other.as_str()] {
        waiter.lock(k).await.unwrap().release().await.unwrap();
    }
    let held = holder.lock(key).await.unwrap();
    // Task A waits for the key; its queue's interest is confirmed.
    let a = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.lock(key).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A waiter on a key of a frozen master: its attempt fails after ~200 ms, then its
    // `SSUBSCRIBE` holds the subscriber's lock for ~200 ms more.
    h.cluster.node_mut(other_master).pause();
    let frozen = Instant::now();
    let w = {
        let waiter = waiter.clone();
        let other = other.clone();
        tokio::spawn(async move {
            waiter
                .lock_with(&other, LockOptions::new().wait(Duration::from_millis(300)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(250)).await;
    // A gets the key: its queue empties and its interest is to be dropped.
    held.release().await.unwrap();
    a.await
        .unwrap()
        .expect("A acquires")
        .release()
        .await
        .unwrap();
    // At once, the key is taken again and task B waits for it in a new queue.
    let held = holder.lock(key).await.unwrap();
    let b = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            waiter
                .lock_with(key, LockOptions::new().wait(Duration::from_secs(3)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(600).saturating_sub(frozen.elapsed())).await;
    h.cluster.node_mut(other_master).resume();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let guard = b.await.unwrap();
    let woken = released.elapsed();
    guard
        .expect("B acquires once the holder releases")
        .release()
        .await
        .unwrap();
    assert!(
        woken < Duration::from_millis(500),
        "B acquired {woken:?} after the release"
    );
    let _ = w.await.unwrap();
}

/// redis-rs re-sends all of a node's shard channels in one SSUBSCRIBE after a
/// reconnect, which fails with CROSSSLOT when they span slots. The subscriber
/// resubscribes each channel on its own: both waiters are still woken by releases.
async fn cross_slot_resubscription_after_reconnect(h: &Cluster) {
    let (a, b) = (
        h.builder().build().await.unwrap(),
        h.builder().build().await.unwrap(),
    );
    // Two keys in different slots of the same master.
    let first = "xs_{0}".to_owned();
    let master = h.master_of(&format!("lock:{first}"));
    let second = (1..1000)
        .map(|i| format!("xs_{{{i}}}"))
        .find(|k| {
            let full = format!("lock:{k}");
            h.master_of(&full) == master && key_slot(full.as_bytes()) != key_slot(b"lock:xs_{0}")
        })
        .unwrap();
    let opts = || {
        LockOptions::new()
            .ttl(Duration::from_secs(30))
            .watchdog(false)
    };
    let g1 = a.lock_with(&first, opts()).await.unwrap();
    let g2 = a.lock_with(&second, opts()).await.unwrap();
    let mut waiters = Vec::new();
    for key in [first.clone(), second.clone()] {
        let b = b.clone();
        waiters.push(tokio::spawn(async move {
            let g = b
                .lock_with(&key, LockOptions::new().wait(Duration::from_secs(20)))
                .await?;
            let at = Instant::now();
            g.release().await?;
            Ok::<_, LockError>(at)
        }));
    }
    let (c1, c2) = (format!("lock:{first}"), format!("lock:{second}"));
    assert!(
        wait_until(Duration::from_secs(3), Duration::from_millis(20), || {
            shard_subscribers(h, master, &c1) == 1 && shard_subscribers(h, master, &c2) == 1
        }),
        "waiters subscribed"
    );
    // CROSSSLOT rejections anywhere in the cluster (redis-rs may resubscribe through
    // the master or, while the master's connection is repaired, its replica).
    let crossslot = |h: &Cluster| -> u64 {
        (0..h.cluster.len())
            .map(|i| {
                let info = text(&h.on(i, &["INFO", "errorstats"]));
                info.lines()
                    .find_map(|l| l.strip_prefix("errorstat_CROSSSLOT:count="))
                    .and_then(|n| n.trim().parse::<u64>().ok())
                    .unwrap_or(0)
            })
            .sum()
    };
    let before = crossslot(h);
    let killed = int(&h.on(master, &["CLIENT", "KILL", "TYPE", "pubsub"]));
    assert!(killed >= 1, "the subscriber's connection was killed");
    // Back on the shard: the master or its replica (redis-rs may pick either for
    // SSUBSCRIBE; SPUBLISH reaches both).
    assert!(
        wait_until(Duration::from_secs(5), Duration::from_millis(20), || {
            subscribers_anywhere(h, &c1) == 1 && subscribers_anywhere(h, &c2) == 1
        }),
        "both shard channels subscribed again"
    );
    wait_until(Duration::from_secs(2), Duration::from_millis(20), || {
        crossslot(h) > before
    });
    let rejected = crossslot(h) - before;
    println!(
        "cross-slot resubscription: redis-rs's own SSUBSCRIBE rejected with CROSSSLOT \
         {rejected} time(s); both channels back"
    );
    assert!(
        rejected >= 1,
        "the test did not trigger redis-rs's cross-slot resubscription"
    );
    let released = Instant::now();
    g1.release().await.unwrap();
    g2.release().await.unwrap();
    for w in waiters {
        let acquired = w.await.unwrap().expect("waiter acquires");
        let handoff = acquired.saturating_duration_since(released);
        assert!(
            handoff < Duration::from_secs(2),
            "woken by the ttl, not a release: {handoff:?}"
        );
    }
}

/// Regression (issue 26, found by the s10 nemesis on Cluster: fencing-order violations,
/// plain `lock`, `write` and `read` grants with token 1 or 2 after higher ones, seeds
/// 1583473772394858614, 5888347487354771723, 2244018780533843421, 229626892938142020): a
/// waiter whose wait ran out withdrew its intent (or its fair place) with a pipeline of
/// four commands on the key's master, of which the cluster read 2 replies
/// (`route_pipeline(pipe, 0, 2, ..)`, written when the pipeline had two). Requests in
/// flight on that node's connection got the two left over as theirs: here `try_lock` of
/// a held key answered `Some` guard with token 1, or "fencing token 0 is not positive",
/// 22–29 times a run. A withdrawal is now one script call (`withdraw.lua`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawal_leaves_no_reply_behind() {
    let _serial = SERIAL.lock().await;
    let h = Cluster::start().await;
    let holder = h.builder().build().await.unwrap();
    let waiter = h.builder().build().await.unwrap();
    // One slot: the withdrawals and the other requests go to one master, on one
    // connection; a reply left over goes to a request in flight there.
    let (waited, other) = ("withdraw_{w}:a", "withdraw_{w}:b");
    let _a = holder.lock(waited).await.unwrap();
    let _b = holder.lock(other).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let wrong = Arc::new(AtomicUsize::new(0));
    let askers: Vec<_> = (0..4)
        .map(|_| {
            let (locks, stop, wrong) = (waiter.clone(), stop.clone(), wrong.clone());
            tokio::spawn(async move {
                // Bounded by `stop`, set after the rounds below.
                while !stop.load(Ordering::SeqCst) {
                    let got = locks.try_lock(other).await;
                    if !matches!(got, Ok(None)) && wrong.fetch_add(1, Ordering::SeqCst) < 3 {
                        println!(
                            "a key held by another manager: {:?}",
                            got.map(|g| g.map(|g| g.fencing_token()))
                        );
                    }
                }
            })
        })
        .collect();
    for round in 0..20 {
        let wait = LockOptions::new().wait(Duration::from_millis(50));
        let r = waiter.lock_with(waited, wait).await;
        assert!(
            matches!(r, Err(LockError::Timeout { .. })),
            "round {round}: {r:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, Ordering::SeqCst);
    for a in askers {
        a.await.unwrap();
    }
    assert_eq!(
        wrong.load(Ordering::SeqCst),
        0,
        "try_lock of a held key answered with something else than None"
    );
}

/// A release between the subscriber's disconnection and its resubscription still wakes
/// its waiter: the subscriber's connection to every node is killed at once (see the
/// conformance module).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriber_reconnect_loses_no_wake_up() {
    let _serial = SERIAL.lock().await;
    let h = Cluster::start().await;
    conformance::subscriber_reconnect_loses_no_wake_up(
        &h,
        |channels| {
            channels
                .iter()
                .filter(|c| subscribers_anywhere(&h, c) == 1)
                .count()
        },
        || {
            (0..h.cluster.len())
                .map(|i| int(&h.on(i, &["CLIENT", "KILL", "TYPE", "pubsub"])))
                .sum::<i64>()
                .try_into()
                .unwrap_or(0)
        },
    )
    .await;
}

/// When a slot moves to another master, the old owner sends an unsolicited
/// `sunsubscribe`; redis-rs mistakes it for a reply and forgets the subscription. The
/// subscriber wakes the waiter and subscribes again (following MOVED to the new owner),
/// so the release, now on the new owner, still wakes the waiter at once.
async fn stray_sunsubscribe_after_slot_migration(h: &Cluster) {
    let (a, b) = (
        h.builder().build().await.unwrap(),
        h.builder().build().await.unwrap(),
    );
    let key = "mig_{slot-migration}";
    let full = "lock:mig_{slot-migration}";
    let slot = key_slot(full.as_bytes()).to_string();
    let from = h.master_of(full);
    let masters = h.cluster.master_indices();
    let to = masters.iter().copied().find(|&m| m != from).unwrap();
    let guard = a
        .lock_with(
            key,
            LockOptions::new()
                .ttl(Duration::from_secs(30))
                .watchdog(false),
        )
        .await
        .unwrap();
    let b2 = b.clone();
    let waiter = tokio::spawn(async move {
        let g = b2
            .lock_with(key, LockOptions::new().wait(Duration::from_secs(25)))
            .await?;
        let at = Instant::now();
        g.release().await?;
        Ok::<_, LockError>(at)
    });
    assert!(
        wait_until(Duration::from_secs(3), Duration::from_millis(20), || {
            shard_subscribers(h, from, full) == 1
        }),
        "waiter subscribed on the old owner"
    );

    // Move the slot with its keys: IMPORTING / MIGRATING, MIGRATE, then SETSLOT NODE.
    let id = |i: usize| text(&h.on(i, &["CLUSTER", "MYID"]));
    let (from_id, to_id) = (id(from), id(to));
    let to_port = h.cluster.node(to).port().to_string();
    h.on(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]);
    h.on(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]);
    let in_slot = match h.on(from, &["CLUSTER", "GETKEYSINSLOT", &slot, "1000"]) {
        Value::Array(keys) => keys.iter().map(text).collect::<Vec<_>>(),
        other => panic!("GETKEYSINSLOT: {other:?}"),
    };
    assert!(in_slot.iter().any(|k| k == full), "{in_slot:?}");
    let mut migrate = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS"];
    migrate.extend(in_slot.iter().map(String::as_str));
    h.on(from, &migrate);
    for &m in [to, from]
        .iter()
        .chain(masters.iter().filter(|&&m| m != from && m != to))
    {
        h.on(m, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
    }
    assert_eq!(int(&h.on(to, &["EXISTS", full])), 1, "the lock moved");
    assert!(
        wait_until(Duration::from_secs(5), Duration::from_millis(20), || {
            shard_subscribers(h, from, full) == 0 && subscribers_anywhere(h, full) == 1
        }),
        "the waiter subscribed again, in the new owner's shard"
    );

    let released = Instant::now();
    guard.release().await.expect("release follows MOVED");
    let acquired = waiter.await.unwrap().expect("waiter acquires");
    let handoff = acquired.saturating_duration_since(released);
    println!("stray sunsubscribe: waiter woken {handoff:?} after the release on the new owner");
    assert!(
        handoff < Duration::from_secs(2),
        "woken by the 30 s ttl, not the release: {handoff:?}"
    );
}

/// kill -9 of a master while several managers lock keys on every master: the locks of
/// its slots work again once its replica is promoted (the recovery time is printed),
/// no single attempt hangs meanwhile, mutual exclusion holds throughout, and afterwards
/// every load task makes progress again and every key, the killed master's included,
/// can be locked and released by every load manager.
///
/// The verdicts after the failover are bounded by the load's own ttl and wait, never
/// counted in a fixed window: a load lock caught by the kill (its release failed) keeps
/// its key, on the promoted replica, until its ttl has passed since the kill, and each
/// task may be parked on such a key for a whole wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_failover_under_load() {
    /// The load locks' ttl: how long after the kill a lock caught by it may keep its key.
    const TTL: Duration = Duration::from_secs(5);
    /// The load's wait budget per lock call.
    const WAIT: Duration = Duration::from_secs(3);
    /// A request timeout (the builder's default response timeout) plus scheduling slack.
    const SLACK: Duration = Duration::from_secs(2);
    let _serial = SERIAL.lock().await;
    let mut h = Cluster::start().await;
    let keys = Arc::new(h.keys_on_every_master("load", 2));
    let victim = keys[0].clone();
    let stop = Arc::new(AtomicBool::new(false));
    let active: Arc<Vec<AtomicUsize>> =
        Arc::new((0..keys.len()).map(|_| AtomicUsize::new(0)).collect());
    // Per load task: lock+release cycles completed.
    let progress: Arc<Vec<AtomicUsize>> = Arc::new((0..6).map(|_| AtomicUsize::new(0)).collect());
    let failures = Arc::new(AtomicUsize::new(0));
    let failed_releases = Arc::new(AtomicUsize::new(0));
    let slowest_call_ms = Arc::new(AtomicU64::new(0));
    let mut managers = Vec::new();
    let mut tasks = Vec::new();
    for m in 0..2 {
        let locks = h.builder().build().await.unwrap();
        managers.push(locks.clone());
        for t in 0..3 {
            let id = m * 3 + t;
            let (locks, keys, stop) = (locks.clone(), keys.clone(), stop.clone());
            let (active, progress) = (active.clone(), progress.clone());
            let (failures, failed_releases) = (failures.clone(), failed_releases.clone());
            let slowest_call_ms = slowest_call_ms.clone();
            tasks.push(tokio::spawn(async move {
                let mut r = id;
                while !stop.load(Ordering::SeqCst) {
                    r += 1;
                    let k = r % keys.len();
                    let opts = LockOptions::new().ttl(TTL).wait(WAIT);
                    let started = Instant::now();
                    let outcome = locks.lock_with(&keys[k], opts).await;
                    let took = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                    slowest_call_ms.fetch_max(took, Ordering::SeqCst);
                    match outcome {
                        Ok(g) => {
                            assert_eq!(active[k].fetch_add(1, Ordering::SeqCst), 0, "two holders");
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            active[k].fetch_sub(1, Ordering::SeqCst);
                            if g.release().await.is_ok() {
                                progress[id].fetch_add(1, Ordering::SeqCst);
                            } else {
                                failed_releases.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        Err(_) => {
                            failures.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            }));
        }
    }
    let completed = |progress: &[AtomicUsize]| -> usize {
        progress.iter().map(|n| n.load(Ordering::SeqCst)).sum()
    };
    let probe = h.builder().build().await.unwrap();
    // A waiter parked on a key of the doomed master, held with a 30 s ttl: its
    // subscription dies with the master and must come back on the promoted replica.
    // Keys in the victim's slot that the load does not use: a load task's lock caught by
    // the kill (its release failed) legitimately blocks its key until the ttl.
    let tag = victim.split(['{', '}']).nth(1).unwrap_or("x").to_owned();
    let parked = format!("parked_{{{tag}}}");
    let probe_key = format!("probe_{{{tag}}}");
    let holder = h.builder().build().await.unwrap();
    let held = holder
        .lock_with(
            &parked,
            LockOptions::new()
                .ttl(Duration::from_secs(30))
                .watchdog(false),
        )
        .await
        .unwrap();
    let (waiter, p2) = (h.builder().build().await.unwrap(), parked.clone());
    let parked_waiter = tokio::spawn(async move {
        let g = waiter
            .lock_with(&p2, LockOptions::new().wait(Duration::from_secs(25)))
            .await?;
        let at = Instant::now();
        g.release().await.map(|()| at)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Before the kill, checked rather than assumed: every load task has completed a
    // lock+release (no key is blocked yet, so that takes well under a wait), and the
    // waiter is parked (subscribed on the master about to die).
    let victim_master = h.master_of(&format!("lock:{victim}"));
    let parked_full = format!("lock:{parked}");
    let ready = tokio::task::block_in_place(|| {
        wait_until(WAIT + SLACK, Duration::from_millis(10), || {
            progress.iter().all(|n| n.load(Ordering::SeqCst) > 0)
                && shard_subscribers(&h, victim_master, &parked_full) == 1
        })
    });
    let per_task: Vec<usize> = progress.iter().map(|n| n.load(Ordering::SeqCst)).collect();
    assert!(
        ready,
        "before the kill: lock+release per load task {per_task:?}, parked waiter's \
         subscribers on master {victim_master}: {}",
        shard_subscribers(&h, victim_master, &parked_full)
    );

    let killed = h.cluster.kill_master_for_key(&format!("lock:{victim}"));
    let killed_at = Instant::now();
    let (p2, v2) = (probe.clone(), probe_key.clone());
    let probing = tokio::spawn(async move {
        let mut slowest = Duration::ZERO;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let start = Instant::now();
            let outcome = p2.try_lock(&v2).await;
            slowest = slowest.max(start.elapsed());
            if let Ok(Some(g)) = outcome {
                if g.release().await.is_ok() {
                    return (killed_at.elapsed(), attempts, slowest);
                }
            }
            assert!(
                killed_at.elapsed() < Duration::from_secs(20),
                "no recovery within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    // The servers' view: a replica promoted and every live node agreeing.
    let promoted = tokio::task::block_in_place(|| {
        h.cluster
            .wait_failover(&format!("lock:{victim}"), Duration::from_secs(20))
    });
    let (recovered, attempts, slowest) = probing.await.expect("probe");
    // From here on every load task must complete a lock+release again.
    let recovered_at = Instant::now();
    let at_recovery: Vec<usize> = progress.iter().map(|n| n.load(Ordering::SeqCst)).collect();
    // The holder releases on the new master; the parked waiter is woken by that (or,
    // had the lock not been replicated before the kill, by its own retry after the
    // reconnect), not by the 30 s ttl.
    let released = Instant::now();
    let _ = held.release().await;
    let acquired = parked_waiter
        .await
        .unwrap()
        .expect("the parked waiter acquires");
    let parked_wait = acquired.saturating_duration_since(released);
    println!(
        "cluster failover: a waiter parked across it acquired {parked_wait:?} after the release"
    );
    assert!(parked_wait < Duration::from_secs(3), "{parked_wait:?}");
    println!(
        "cluster failover: kill -9 of master {killed}: replica promoted after {promoted:?}, \
         its slots' locks work again after {recovered:?} ({attempts} try_lock attempts, the \
         slowest took {slowest:?})"
    );
    assert!(recovered < Duration::from_secs(15), "{recovered:?}");
    assert!(
        slowest < Duration::from_secs(5),
        "an attempt hung for {slowest:?}"
    );

    // Every load task completes a lock+release after the recovery. Bound: a key blocked
    // by a lock caught by the kill is free TTL after the kill (before recovered_at +
    // TTL); a call in flight then ends within its WAIT (plus a request timeout), and the
    // next call finds its key free.
    let bound = TTL + WAIT + SLACK;
    let mut first_after: Vec<Option<Duration>> = vec![None; progress.len()];
    while recovered_at.elapsed() < bound
        && first_after.iter().any(Option::is_none)
        && !tasks.iter().any(tokio::task::JoinHandle::is_finished)
    {
        for (first, (n, &before)) in first_after
            .iter_mut()
            .zip(progress.iter().zip(&at_recovery))
        {
            if first.is_none() && n.load(Ordering::SeqCst) > before {
                *first = Some(recovered_at.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("load task");
    }
    let stalled: Vec<usize> = (0..first_after.len())
        .filter(|&i| first_after[i].is_none())
        .collect();
    assert!(
        stalled.is_empty(),
        "load tasks {stalled:?} completed no lock+release within {bound:?} of the recovery"
    );
    let last_resumed = first_after
        .iter()
        .flatten()
        .max()
        .copied()
        .unwrap_or_default();
    let slowest_call = Duration::from_millis(slowest_call_ms.load(Ordering::SeqCst));
    println!(
        "cluster failover: every load task locked and released again within {last_resumed:?} \
         of the recovery; {} load releases failed (a lock caught by the kill keeps its key \
         until its ttl); the slowest load lock call took {slowest_call:?}",
        failed_releases.load(Ordering::SeqCst)
    );
    assert!(
        slowest_call < WAIT + SLACK,
        "a load lock call hung for {slowest_call:?} (wait {WAIT:?})"
    );
    // Every key, the victim's included, works for every load manager. A lock caught by
    // the kill may still hold its key for up to TTL: the wait covers it.
    for (m, locks) in managers.iter().enumerate() {
        for key in keys.iter() {
            let g = locks
                .lock_with(key, LockOptions::new().wait(TTL + SLACK))
                .await
                .unwrap_or_else(|e| {
                    panic!("manager {m} cannot lock {key} after the failover: {e}")
                });
            g.release()
                .await
                .unwrap_or_else(|e| panic!("manager {m} cannot release {key}: {e}"));
        }
    }
    println!(
        "cluster failover: {} lock+release under load, {} attempts failed during the failover",
        completed(&progress),
        failures.load(Ordering::SeqCst)
    );
}

/// Building checks the seeds at once: a bad URL or an empty list is an InvalidOption,
/// an unreachable seed or a server that is not a cluster is a Backend error within the
/// connect timeout. Needs no cluster.
#[tokio::test]
async fn build_checks_the_seeds() {
    let none: Vec<String> = Vec::new();
    let err = LockManager::builder()
        .cluster(none)
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err}");
    let err = LockManager::builder()
        .cluster(["not a url"])
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err}");

    let dead = format!("redis://127.0.0.1:{}", redlock_testkit::free_port());
    let standalone = redlock_testkit::RedisServer::start();
    for url in [dead, standalone.url()] {
        let start = Instant::now();
        let err = LockManager::builder()
            .cluster([url.as_str()])
            .connect_timeout(Duration::from_millis(500))
            .build()
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Backend { .. }), "{url}: {err}");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{url}: {:?}",
            start.elapsed()
        );
    }
}
