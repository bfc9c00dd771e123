//! The fault-injecting proxy.

use std::io::ErrorKind;
use std::time::{Duration, Instant};

use redlock_testkit::{redis_available, ChaosProxy, Direction, Fault, RedisServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

fn skip() -> bool {
    if redis_available() {
        return false;
    }
    eprintln!("redis-server not found (REDLOCK_REDIS_SERVER / PATH): skipping");
    true
}

const PONG: &[u8] = b"+PONG\r\n";

/// Sends `PING` and reads the 7-byte reply, or times out.
async fn ping(s: &mut TcpStream, limit: Duration) -> std::io::Result<Vec<u8>> {
    s.write_all(b"PING\r\n").await?;
    read_reply(s, limit).await
}

/// A server, a proxy in front of it, and a client connection through the proxy that has
/// answered a PING (the server must outlive the connection: keep it bound).
async fn through_proxy() -> (RedisServer, ChaosProxy, TcpStream) {
    let server = RedisServer::start();
    let proxy = ChaosProxy::start(server.addr()).await.expect("proxy");
    let mut s = TcpStream::connect(proxy.addr()).await.expect("connect");
    assert_eq!(
        ping(&mut s, Duration::from_secs(2)).await.expect("ping"),
        PONG
    );
    (server, proxy, s)
}

async fn read_reply(s: &mut TcpStream, limit: Duration) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; PONG.len()];
    match timeout(limit, s.read_exact(&mut buf)).await {
        Ok(Ok(_)) => Ok(buf),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ErrorKind::TimedOut.into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_and_delay() {
    if skip() {
        return;
    }
    let server = RedisServer::start();
    let proxy = ChaosProxy::start(server.addr()).await.expect("proxy");
    assert_eq!(proxy.upstream(), server.addr());
    assert_eq!(proxy.fault(), Fault::Pass);

    let mut s = TcpStream::connect(proxy.addr()).await.expect("connect");
    let t = Instant::now();
    assert_eq!(
        ping(&mut s, Duration::from_secs(2)).await.expect("ping"),
        PONG
    );
    eprintln!("PING through the proxy: {:?}", t.elapsed());
    assert_eq!(proxy.connections(), 1);

    // A redis-rs client through the proxy.
    let client = redis::Client::open(proxy.url()).expect("client");
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query_async(&mut c)
        .await
        .expect("SET");
    let v: String = redis::cmd("GET")
        .arg("k")
        .query_async(&mut c)
        .await
        .expect("GET");
    assert_eq!(v, "v");

    proxy.set(Fault::Delay(Duration::from_millis(150)));
    let t = Instant::now();
    assert_eq!(
        ping(&mut s, Duration::from_secs(3)).await.expect("ping"),
        PONG
    );
    let rtt = t.elapsed();
    eprintln!("PING with Delay(150ms): {rtt:?}");
    assert!(rtt >= Duration::from_millis(290), "{rtt:?}");
    assert!(rtt < Duration::from_millis(1500), "{rtt:?}");

    proxy.heal();
    let t = Instant::now();
    assert_eq!(
        ping(&mut s, Duration::from_secs(2)).await.expect("ping"),
        PONG
    );
    assert!(t.elapsed() < Duration::from_millis(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_holds_bytes_until_healed() {
    if skip() {
        return;
    }
    let (_server, proxy, mut live) = through_proxy().await;

    proxy.set(Fault::Blackhole);
    // Existing connection: no answer.
    let e = ping(&mut live, Duration::from_millis(300))
        .await
        .expect_err("held");
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    // New connection: connect succeeds, no answer.
    let mut fresh = TcpStream::connect(proxy.addr()).await.expect("connect");
    let e = ping(&mut fresh, Duration::from_millis(300))
        .await
        .expect_err("held");
    assert_eq!(e.kind(), ErrorKind::TimedOut);

    // Healing delivers the held requests and their replies.
    proxy.set(Fault::Pass);
    assert_eq!(
        read_reply(&mut live, Duration::from_secs(2))
            .await
            .expect("reply"),
        PONG
    );
    assert_eq!(
        read_reply(&mut fresh, Duration::from_secs(2))
            .await
            .expect("reply"),
        PONG
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuse_closes_new_and_live_connections() {
    if skip() {
        return;
    }
    let (_server, proxy, mut live) = through_proxy().await;

    proxy.set(Fault::Refuse);
    let t = Instant::now();
    assert!(ping(&mut live, Duration::from_secs(2)).await.is_err());
    // A new connection is reset at once (the reset may even beat connect() itself).
    let fresh_failed = match TcpStream::connect(proxy.addr()).await {
        Err(_) => true,
        Ok(mut fresh) => ping(&mut fresh, Duration::from_secs(2)).await.is_err(),
    };
    assert!(fresh_failed);
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());

    // redis-rs sees an error, not a hang.
    let client = redis::Client::open(proxy.url()).expect("client");
    let r = timeout(
        Duration::from_secs(3),
        client.get_multiplexed_async_connection(),
    )
    .await
    .expect("no hang");
    assert!(r.is_err());

    proxy.set(Fault::Pass);
    let mut again = TcpStream::connect(proxy.addr()).await.expect("connect");
    assert_eq!(
        ping(&mut again, Duration::from_secs(2))
            .await
            .expect("ping"),
        PONG
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_all_drops_live_connections() {
    if skip() {
        return;
    }
    let server = RedisServer::start();
    let proxy = ChaosProxy::start(server.addr()).await.expect("proxy");
    let mut a = TcpStream::connect(proxy.addr()).await.expect("connect");
    let mut b = TcpStream::connect(proxy.addr()).await.expect("connect");
    assert_eq!(
        ping(&mut a, Duration::from_secs(2)).await.expect("ping"),
        PONG
    );
    assert_eq!(
        ping(&mut b, Duration::from_secs(2)).await.expect("ping"),
        PONG
    );
    assert_eq!(proxy.connections(), 2);

    proxy.reset_all();
    let mut buf = [0u8; 16];
    for s in [&mut a, &mut b] {
        let r = timeout(Duration::from_secs(2), s.read(&mut buf))
            .await
            .expect("reset arrives promptly");
        match r {
            Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset),
            Ok(n) => panic!("expected a reset, read {n} bytes"),
        }
    }
    let gone =
        redlock_testkit::wait_until(Duration::from_secs(2), Duration::from_millis(5), || {
            proxy.connections() == 0
        });
    assert!(gone);

    // New connections work.
    let mut c = TcpStream::connect(proxy.addr()).await.expect("connect");
    assert_eq!(
        ping(&mut c, Duration::from_secs(2)).await.expect("ping"),
        PONG
    );

    // Dropping the proxy closes everything.
    let addr = proxy.addr();
    drop(proxy);
    let r = timeout(Duration::from_secs(2), c.read(&mut buf))
        .await
        .expect("closed promptly");
    assert!(matches!(r, Ok(0) | Err(_)));
    let refused =
        redlock_testkit::wait_until(Duration::from_secs(2), Duration::from_millis(10), || {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err()
        });
    assert!(refused, "listener closed after drop");
}

/// Sends `SET k v` (RESP) on a raw connection, without reading the reply.
async fn send_set(s: &mut TcpStream, key: &str) {
    let cmd = format!("*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n$1\r\nv\r\n", key.len());
    s.write_all(cmd.as_bytes()).await.expect("write SET");
}

/// `GET key` straight on the server (not through the proxy).
fn get_direct(server: &RedisServer, key: &str) -> Option<String> {
    match server.cmd_sync(&["GET", key]).expect("GET") {
        redis::Value::BulkString(b) => Some(String::from_utf8(b).expect("utf8")),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_one_direction() {
    if skip() {
        return;
    }
    let (_server, proxy, mut s) = through_proxy().await;
    let one_way = Duration::from_millis(400);
    for direction in [Direction::ToServer, Direction::ToClient] {
        proxy.set_direction(direction, Fault::Delay(one_way));
        assert_eq!(proxy.fault_of(direction), Fault::Delay(one_way));
        let t = Instant::now();
        assert_eq!(
            ping(&mut s, Duration::from_secs(3)).await.expect("ping"),
            PONG
        );
        let rtt = t.elapsed();
        eprintln!("PING with {direction:?} delayed by {one_way:?}: {rtt:?}");
        // One delay, not two.
        assert!(rtt >= one_way - Duration::from_millis(10), "{rtt:?}");
        assert!(rtt < 2 * one_way - Duration::from_millis(10), "{rtt:?}");
        proxy.heal();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_to_server_holds_requests() {
    if skip() {
        return;
    }
    let (server, proxy, mut s) = through_proxy().await;
    proxy.set_direction(Direction::ToServer, Fault::Blackhole);
    assert_eq!(proxy.fault_of(Direction::ToClient), Fault::Pass);
    send_set(&mut s, "held").await;
    let e = read_reply(&mut s, Duration::from_millis(300))
        .await
        .expect_err("no reply");
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    assert_eq!(get_direct(&server, "held"), None, "the request was held");

    proxy.heal();
    let mut ok = vec![0u8; 5];
    timeout(Duration::from_secs(2), s.read_exact(&mut ok))
        .await
        .expect("reply after heal")
        .expect("read");
    assert_eq!(ok, b"+OK\r\n");
    assert_eq!(get_direct(&server, "held").as_deref(), Some("v"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_to_client_then_cut_loses_the_reply_of_an_applied_request() {
    if skip() {
        return;
    }
    let (server, proxy, mut s) = through_proxy().await;
    proxy.set_direction(Direction::ToClient, Fault::Blackhole);
    assert_eq!(proxy.fault(), Fault::Pass);
    send_set(&mut s, "applied").await;
    let applied =
        redlock_testkit::wait_until(Duration::from_secs(2), Duration::from_millis(5), || {
            get_direct(&server, "applied").is_some()
        });
    assert!(applied, "the request reached the server");
    let e = read_reply(&mut s, Duration::from_millis(300))
        .await
        .expect_err("reply held");
    assert_eq!(e.kind(), ErrorKind::TimedOut);

    // Cut: the held reply is discarded, the client gets a reset instead.
    proxy.reset_all();
    let mut buf = [0u8; 16];
    let r = timeout(Duration::from_secs(2), s.read(&mut buf))
        .await
        .expect("reset arrives promptly");
    match r {
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset),
        Ok(n) => panic!("expected a reset, read {n} bytes"),
    }
    proxy.heal();
    assert_eq!(get_direct(&server, "applied").as_deref(), Some("v"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuse_in_one_direction_refuses_the_connection() {
    if skip() {
        return;
    }
    let (_server, proxy, mut live) = through_proxy().await;
    proxy.set_direction(Direction::ToClient, Fault::Refuse);
    assert!(ping(&mut live, Duration::from_secs(2)).await.is_err());
    let fresh_failed = match TcpStream::connect(proxy.addr()).await {
        Err(_) => true,
        Ok(mut fresh) => ping(&mut fresh, Duration::from_secs(2)).await.is_err(),
    };
    assert!(fresh_failed);
    proxy.heal();
    let mut again = TcpStream::connect(proxy.addr()).await.expect("connect");
    assert_eq!(
        ping(&mut again, Duration::from_secs(2))
            .await
            .expect("ping"),
        PONG
    );
}
