//! Standalone servers and sets of servers.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use redis::Value;
use redlock_testkit::{redis_available, RedisServer, RedisSet};

fn skip() -> bool {
    if redis_available() {
        return false;
    }
    eprintln!("redis-server not found (REDLOCK_REDIS_SERVER / PATH): skipping");
    true
}

fn ping(server: &RedisServer) -> bool {
    matches!(server.cmd_sync(&["PING"]), Ok(Value::SimpleString(s)) if s == "PONG")
}

/// A connection whose reads time out after `timeout`.
fn conn_with_timeout(server: &RedisServer, timeout: Duration) -> redis::Connection {
    let c = server
        .client()
        .get_connection_with_timeout(timeout)
        .expect("connect");
    c.set_read_timeout(Some(timeout)).expect("read timeout");
    c
}

#[test]
fn start_answers_and_drop_frees_the_port() {
    if skip() {
        return;
    }
    let started = Instant::now();
    let server = RedisServer::start();
    eprintln!("server ready in {:?}", started.elapsed());
    assert!(ping(&server));
    assert!(server.url().starts_with("redis://127.0.0.1:"));
    assert_eq!(server.addr().port(), server.port());
    assert!(server.pid() > 0);
    assert!(server.log_tail(50).contains("Ready to accept connections"));
    // DEBUG is enabled for local connections.
    assert!(server.cmd_sync(&["DEBUG", "SLEEP", "0"]).is_ok());

    let addr = server.addr();
    drop(server);
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err(),
        "nothing listens on {addr} after drop"
    );
}

#[test]
fn restart_on_the_same_port_keeps_accepting() {
    if skip() {
        return;
    }
    let mut server = RedisServer::start();
    let port = server.port();
    server.cmd_sync(&["SET", "k", "v"]).expect("SET");
    let old_pid = server.pid();

    server.kill9();
    assert!(!server.is_running());
    assert!(server.cmd_sync(&["PING"]).is_err());

    let t = Instant::now();
    server.restart();
    eprintln!("restart-to-PING {:?}", t.elapsed());
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), old_pid);
    assert!(server.is_running());
    assert!(ping(&server));
    // No persistence by default: the key is gone.
    assert_eq!(server.cmd_sync(&["GET", "k"]).expect("GET"), Value::Nil);

    // Restarting a running server works too.
    server.restart();
    assert!(ping(&server));
}

#[test]
fn aof_keeps_data_across_kill9() {
    if skip() {
        return;
    }
    let mut server = RedisServer::builder().aof(true).start();
    server
        .cmd_sync(&["SET", "lock:p", "tok", "PX", "60000"])
        .expect("SET");
    server.kill9();
    server.restart();
    assert_eq!(
        server.cmd_sync(&["GET", "lock:p"]).expect("GET"),
        Value::BulkString(b"tok".to_vec())
    );
}

#[test]
fn pause_times_out_and_resume_answers() {
    if skip() {
        return;
    }
    let mut server = RedisServer::start();
    let mut old = conn_with_timeout(&server, Duration::from_secs(5));
    assert!(ping(&server));

    server.pause();
    assert!(server.is_paused());
    assert!(server.is_running());
    // redis-rs handshakes on connect, so with a short timeout either the connect or the PING
    // times out; a plain TCP connect still succeeds (the kernel completes it).
    let t = Instant::now();
    let short = Duration::from_millis(300);
    let err = server
        .client()
        .get_connection_with_timeout(short)
        .and_then(|mut c| {
            c.set_read_timeout(Some(short))?;
            redis::cmd("PING").query::<String>(&mut c)
        })
        .expect_err("a paused server does not answer");
    assert!(err.is_timeout(), "{err:?}");
    assert!(t.elapsed() >= Duration::from_millis(250));
    assert!(TcpStream::connect_timeout(&server.addr(), short).is_ok());

    // A command sent on an old connection while paused is answered after resume.
    let pending = std::thread::spawn(move || redis::cmd("PING").query::<String>(&mut old));
    std::thread::sleep(Duration::from_millis(100));
    server.resume();
    assert!(!server.is_paused());
    assert_eq!(pending.join().expect("join").expect("PING"), "PONG");
    assert!(ping(&server));
}

#[test]
fn builder_arguments_and_replication() {
    if skip() {
        return;
    }
    let master = RedisServer::builder()
        .arg("--maxmemory")
        .arg("10mb")
        .start();
    let v = master
        .cmd_sync(&["CONFIG", "GET", "maxmemory"])
        .expect("CONFIG GET");
    assert_eq!(
        v,
        Value::Array(vec![
            Value::BulkString(b"maxmemory".to_vec()),
            Value::BulkString(b"10485760".to_vec()),
        ])
    );
    let replica = RedisServer::builder().replica_of(master.port()).start();
    master.cmd_sync(&["SET", "r", "1"]).expect("SET");
    let replicated = redlock_testkit::wait_until(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || matches!(replica.cmd_sync(&["GET", "r"]), Ok(Value::BulkString(b)) if b == b"1"),
    );
    assert!(replicated, "replica never saw the write");
}

#[test]
fn set_of_five_independent_servers() {
    if skip() {
        return;
    }
    let started = Instant::now();
    let mut set = RedisSet::start(5);
    eprintln!("5 servers ready in {:?}", started.elapsed());
    assert_eq!(set.len(), 5);
    let urls = set.urls();
    let mut unique = urls.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 5, "{urls:?}");
    for (i, node) in set.nodes().iter().enumerate() {
        assert!(ping(node), "node {i}");
        node.cmd_sync(&["SET", "who", &i.to_string()]).expect("SET");
    }
    // Independent: each has its own value.
    for i in 0..5 {
        assert_eq!(
            set.node(i).cmd_sync(&["GET", "who"]).expect("GET"),
            Value::BulkString(i.to_string().into_bytes())
        );
    }
    set.node_mut(2).kill9();
    assert!(set.node(2).cmd_sync(&["PING"]).is_err());
    assert!(ping(set.node(3)));
}
