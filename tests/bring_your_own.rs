//! Regression (issue 14, item 3): only URL strings were accepted. Nodes are now `&str`,
//! `&String`, `String` or a `redis::ConnectionInfo` (credentials from a secret store),
//! and configured clients come in through `single_client` / `cluster_client`; the
//! `redis` crate is re-exported as `redlock::redis`. Real servers throughout.

use std::time::Duration;

use redlock::{redis, LockError, LockManager};
use redlock_testkit::{RedisCluster, RedisServer, RedisSet};

const PASSWORD: &str = "from-the-vault";

/// A server where `alice` (password [`PASSWORD`]) may do everything.
fn server_with_acl_user() -> RedisServer {
    RedisServer::builder()
        .args([
            "--user",
            "alice",
            "on",
            &format!(">{PASSWORD}"),
            "~*",
            "&*",
            "+@all",
        ])
        .start()
}

/// Host and port from a URL, credentials set apart, as a secret store would hand them.
fn info_with(server: &RedisServer, password: &str) -> redis::ConnectionInfo {
    let info: redis::ConnectionInfo = server.url().parse().unwrap();
    let settings = info
        .redis_settings()
        .clone()
        .set_username("alice")
        .set_password(password);
    info.set_redis_settings(settings)
}

/// Locks as `alice` on the server: proves the credentials were used (`ACL WHOAMI` is
/// not reachable through the manager, so check the lock key's presence instead).
async fn lock_once(locks: &LockManager, server: &RedisServer, key: &str) {
    let guard = locks.lock(key).await.unwrap();
    assert!(server.exists(&format!("lock:{key}")));
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_connection_info_with_credentials_from_a_secret_store_connects() {
    let server = server_with_acl_user();
    let locks = LockManager::builder()
        .single(info_with(&server, PASSWORD))
        .build()
        .await
        .expect("ConnectionInfo with ACL credentials");
    lock_once(&locks, &server, "byo_{info}").await;

    // The credentials are really sent: a wrong password fails, as a Backend error whose
    // source is a type the application names through `redlock::redis`.
    let err = LockManager::builder()
        .single(info_with(&server, "wrong"))
        .build()
        .await
        .unwrap_err();
    let LockError::Backend { source, .. } = &err else {
        panic!("{err:?}")
    };
    let source: &redis::RedisError = source;
    assert!(
        source.to_string().to_lowercase().contains("wrongpass")
            || source.to_string().to_lowercase().contains("auth"),
        "{source}"
    );
}

#[tokio::test]
async fn single_client_uses_the_configured_client() {
    let server = server_with_acl_user();
    let client = redis::Client::open(info_with(&server, PASSWORD)).unwrap();
    let locks = LockManager::builder()
        .single_client(client)
        .build()
        .await
        .expect("configured client");
    assert_eq!(locks.backend_name(), "single");
    lock_once(&locks, &server, "byo_{client}").await;
}

#[tokio::test]
async fn url_strings_in_every_form_connect() {
    let server = server_with_acl_user();
    let url = format!("redis://alice:{PASSWORD}@127.0.0.1:{}", server.port());
    // &str, &String, String; `connect` keeps taking &str.
    for locks in [
        LockManager::builder().single(url.as_str()).build().await,
        LockManager::builder().single(&url).build().await,
        LockManager::builder().single(url.clone()).build().await,
        LockManager::connect(&url).await,
    ] {
        lock_once(&locks.unwrap(), &server, "byo_{url}").await;
    }
    // Password only (the default user's password is not set: AUTH <pw> would fail), so
    // check `redis://:pw@` reaches the server and is refused for that reason only.
    let err = LockManager::connect(&format!("redis://:{PASSWORD}@127.0.0.1:{}", server.port()))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
}

#[tokio::test]
async fn a_unix_socket_url_connects() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("redis.sock");
    let server = RedisServer::builder()
        .args([
            "--unixsocket",
            socket.to_str().unwrap(),
            "--unixsocketperm",
            "700",
        ])
        .args([
            "--user",
            "alice",
            "on",
            &format!(">{PASSWORD}"),
            "~*",
            "&*",
            "+@all",
        ])
        .start();
    let url = format!(
        "redis+unix://{}?user=alice&pass={PASSWORD}",
        socket.display()
    );
    let locks = LockManager::connect(&url).await.expect("unix socket");
    lock_once(&locks, &server, "byo_{unix}").await;
}

#[tokio::test]
async fn redlock_takes_strings_and_connection_infos() {
    let set = tokio::task::spawn_blocking(|| RedisSet::start(3))
        .await
        .unwrap();
    let urls: Vec<String> = set.urls();
    let infos: Vec<redis::ConnectionInfo> = urls.iter().map(|u| u.parse().unwrap()).collect();
    let by_ref = LockManager::builder().redlock(&urls).build().await.unwrap();
    let by_info = LockManager::builder().redlock(infos).build().await.unwrap();
    let strs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let by_str = LockManager::builder().redlock(&strs).build().await.unwrap();
    let a = by_ref.lock("byo_{redlock}").await.unwrap();
    assert!(by_info.try_lock("byo_{redlock}").await.unwrap().is_none());
    a.release().await.unwrap();
    let b = by_str.lock("byo_{redlock}").await.unwrap();
    b.release().await.unwrap();
}

/// A configured `ClusterClient` speaking RESP3 works, wake-ups included; one speaking
/// RESP2 (which cannot carry sharded pub/sub) is refused at `build` with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_client_is_used_and_must_speak_resp3() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0))
        .await
        .unwrap();
    let resp3 = redis::cluster::ClusterClientBuilder::new(cluster.urls())
        .use_protocol(redis::ProtocolVersion::RESP3)
        .build()
        .unwrap();
    let locks = LockManager::builder()
        .cluster_client(resp3)
        .build()
        .await
        .expect("RESP3 cluster client");
    assert_eq!(locks.backend_name(), "cluster");
    let held = locks.lock("byo_{cluster}").await.unwrap();
    let other = locks.clone();
    let waiter = tokio::spawn(async move {
        other
            .lock_with(
                "byo_{cluster}",
                redlock::LockOptions::new()
                    .ttl(Duration::from_secs(30))
                    .wait(Duration::from_secs(20)),
            )
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = std::time::Instant::now();
    held.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    // Woken by the release's notification, well before the 30 s ttl fallback.
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "{:?}",
        released.elapsed()
    );
    next.release().await.unwrap();

    let err = LockManager::builder()
        .cluster_client(cluster.client())
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    assert!(err.to_string().contains("RESP3"), "{err}");
}
