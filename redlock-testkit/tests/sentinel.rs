//! Master + replica + 3 sentinels: failover and the lost-write recipe.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::Value;
use redlock_testkit::{redis_available, Sentinels};

/// Sentinel timers are timing-sensitive on a 2-core machine: one setup at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn skip() -> bool {
    if redis_available() {
        return false;
    }
    eprintln!("redis-server not found (REDLOCK_REDIS_SERVER / PATH): skipping");
    true
}

/// `SET key val NX PX 30000` then `WAIT 1 100` on one connection; returns the WAIT count.
fn set_and_wait(url: &str, key: &str, val: &str) -> i64 {
    let client = redis::Client::open(url).expect("client");
    let mut c = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .expect("connect");
    let ok: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(val)
        .arg("NX")
        .arg("PX")
        .arg(30000)
        .query(&mut c)
        .expect("SET");
    assert_eq!(ok.as_deref(), Some("OK"));
    redis::cmd("WAIT")
        .arg(1)
        .arg(100)
        .query(&mut c)
        .expect("WAIT")
}

#[test]
fn sentinel_failover() {
    if skip() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let mut set = Sentinels::start();
    eprintln!(
        "master + replica + 3 sentinels ready in {:?}",
        started.elapsed()
    );
    assert_eq!(set.master_name(), "mymaster");
    assert_eq!(set.sentinel_urls().len(), 3);
    assert_eq!(
        set.current_master_addr(),
        ("127.0.0.1".to_owned(), set.master().port())
    );
    assert_eq!(set.current_master_url(), set.master_url());
    assert_eq!(set_and_wait(&set.master_url(), "lock:a", "tokA"), 1);

    set.kill_master();
    let took = set.wait_failover(Duration::from_secs(10));
    eprintln!("sentinel failover (kill -9 master, down-after 1000 ms) took {took:?}");
    assert_eq!(set.current_master_addr().1, set.replica().port());
    assert_eq!(
        set.replica().cmd_sync(&["GET", "lock:a"]).expect("GET"),
        Value::BulkString(b"tokA".to_vec()),
        "an acknowledged write survives"
    );
}

#[test]
fn partitioned_replica_loses_the_lock_on_failover() {
    if skip() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut set = Sentinels::start();
    set.partition_replica();
    assert!(set.replica().is_paused());
    assert_eq!(
        set_and_wait(&set.master_url(), "lock:b", "tokB"),
        0,
        "no replica acknowledges"
    );

    set.kill_master();
    std::thread::sleep(Duration::from_millis(100));
    set.heal_replica();
    assert!(!set.replica().is_paused());
    let took = set.wait_failover(Duration::from_secs(10));
    eprintln!("sentinel failover after partition took {took:?}");

    let new_master = set.current_master_url();
    assert_eq!(new_master, set.replica_url());
    // The lock is lost: a second client acquires it.
    assert_eq!(
        set.replica().cmd_sync(&["GET", "lock:b"]).expect("GET"),
        Value::Nil
    );
    let r = set
        .replica()
        .cmd_sync(&["SET", "lock:b", "tokC", "NX", "PX", "30000"])
        .expect("SET");
    assert_eq!(r, Value::Okay);
}
