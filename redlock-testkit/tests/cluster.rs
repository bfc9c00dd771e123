//! A real 3+3 Redis Cluster: readiness, slot agreement, failover.

use std::time::{Duration, Instant};

use redis::Value;
use redlock_testkit::{key_slot, redis_available, RedisCluster};

fn skip() -> bool {
    if redis_available() {
        return false;
    }
    eprintln!("redis-server not found (REDLOCK_REDIS_SERVER / PATH): skipping");
    true
}

const KEYS: &[&str] = &[
    "foo",
    "lock:orders",
    "buy_42",
    "buy_43",
    "buy_{42}",
    "buy_{42}:fence",
    "{user1000}.following",
    "{user1000}.followers",
    "foo{}{bar}",
    "foo{{bar}}zap",
    "foo{bar}{zap}",
    "{",
    "}{",
    "",
    "ünïcödé{é}",
];

#[test]
fn cluster_slots_and_failover() {
    if skip() {
        return;
    }
    let started = Instant::now();
    let mut cluster = RedisCluster::start_default();
    eprintln!("cluster 3+3 ready in {:?}", started.elapsed());
    assert_eq!(cluster.len(), 6);
    assert_eq!(cluster.urls().len(), 6);
    assert_eq!(cluster.master_indices().len(), 3);

    // The pure-Rust slot agrees with CLUSTER KEYSLOT.
    for key in KEYS {
        let server = cluster
            .node(0)
            .cmd_sync(&["CLUSTER", "KEYSLOT", key])
            .expect("CLUSTER KEYSLOT");
        assert_eq!(
            server,
            Value::Int(i64::from(key_slot(key.as_bytes()))),
            "key {key:?}"
        );
        assert_eq!(cluster.keyslot(key), key_slot(key.as_bytes()));
    }
    assert_eq!(
        cluster.keyslot("buy_{42}"),
        cluster.keyslot("buy_{42}:fence")
    );

    // master_for_key names the node that accepts the key (others answer MOVED).
    let key = "lock:{failover}";
    let owner = cluster.master_for_key(key);
    assert!(cluster.master_indices().contains(&owner));
    for (i, node) in cluster.nodes().iter().enumerate() {
        let r = node.cmd_sync(&["SET", key, "tok", "PX", "60000"]);
        if i == owner {
            assert!(r.is_ok(), "owner {i}: {r:?}");
        } else {
            let e = r.expect_err("non-owner redirects");
            assert!(
                e.to_string().to_uppercase().contains("MOVED"),
                "node {i}: {e}"
            );
        }
    }
    // Make sure the replica has the lock before the master dies.
    let mut c = cluster
        .node(owner)
        .client()
        .get_connection()
        .expect("connect");
    let () = redis::cmd("SET")
        .arg(key)
        .arg("tok")
        .arg("PX")
        .arg(60000)
        .query(&mut c)
        .expect("SET");
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(1000)
        .query(&mut c)
        .expect("WAIT");
    assert_eq!(acked, 1);
    drop(c);

    let killed = cluster.kill_master_for_key(key);
    assert_eq!(killed, owner);
    let took = cluster.wait_failover(key, Duration::from_secs(10));
    eprintln!("cluster failover (kill -9 master, node-timeout 1000 ms) took {took:?}");

    let new_owner = cluster.master_for_key(key);
    assert_ne!(new_owner, killed);
    assert_eq!(
        cluster
            .node(new_owner)
            .cmd_sync(&["GET", key])
            .expect("GET"),
        Value::BulkString(b"tok".to_vec()),
        "the replicated lock survives the failover"
    );
    // The old master comes back as a replica of the new one.
    cluster.node_mut(killed).restart();
    let rejoined = redlock_testkit::wait_until(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || {
            matches!(cluster.node(killed).cmd_sync(&["ROLE"]),
                Ok(Value::Array(items)) if items.first() == Some(&Value::BulkString(b"slave".to_vec())))
        },
    );
    assert!(rejoined, "old master rejoined as a replica");
    assert_eq!(cluster.master_for_key(key), new_owner);
}
