//! Regression (issue 14, item 2): `format!("{:?}", builder)` printed
//! `redis://user:s3cret@…` (a derived `Debug`). Every public type's `Debug` (and every
//! error's `Display`) keeps passwords and lock tokens out, whatever form the node took.

use redlock::{redis, LockManager, LockOptions};
use redlock_testkit::RedisServer;

const SECRET: &str = "s3cretPw";

/// Every way a node can be written, each with the password in it.
fn url_forms() -> Vec<String> {
    vec![
        format!("redis://alice:{SECRET}@127.0.0.1:6379"),
        format!("redis://alice:{SECRET}@127.0.0.1:6379/3"),
        format!("redis://:{SECRET}@127.0.0.1:6379"),
        format!("redis://:{SECRET}@localhost/1?protocol=resp3"),
        format!("redis://alice:{SECRET}@[::1]:6379"),
        format!("redis+unix:///tmp/redis.sock?db=2&user=alice&pass={SECRET}"),
        format!("unix:///tmp/redis.sock?pass={SECRET}"),
        format!("valkey://alice:{SECRET}@127.0.0.1:6379"),
        #[cfg(feature = "tls")]
        format!("rediss://alice:{SECRET}@127.0.0.1:6380"),
        #[cfg(feature = "tls")]
        format!("rediss://:{SECRET}@127.0.0.1:6380/#insecure"),
    ]
}

/// Forms that do not parse (or need a feature that is off): the error must not echo them.
fn bad_forms() -> Vec<String> {
    vec![
        format!("redis://alice:{SECRET}@"),
        format!("redis://alice:{SECRET}@127.0.0.1:6379/notadb"),
        format!("http://alice:{SECRET}@127.0.0.1:6379"),
        format!("redis://alice:{SECRET}@0.0.0.0:6379"),
        format!("redis://alice:{SECRET}@127.0.0.1:6379/?protocol=9"),
        format!("alice:{SECRET}@127.0.0.1:6379"),
        #[cfg(not(feature = "tls"))]
        format!("rediss://alice:{SECRET}@127.0.0.1:6380"),
    ]
}

fn assert_clean(what: &str, shown: &str) {
    assert!(
        !shown.contains(SECRET),
        "{what} shows the password: {shown}"
    );
}

#[test]
fn builder_debug_redacts_the_password_of_every_url_form() {
    for url in url_forms() {
        let shown = format!("{:?}", LockManager::builder().single(url.as_str()));
        assert_clean(&url, &shown);
        assert!(shown.contains("<redacted>"), "{url}: {shown}");
        // &String, String, and lists for a cluster and Redlock.
        assert_clean(&url, &format!("{:?}", LockManager::builder().single(&url)));
        assert_clean(
            &url,
            &format!("{:#?}", LockManager::builder().single(url.clone())),
        );
        let list = [url.clone(), url.clone(), url.clone()];
        assert_clean(
            &url,
            &format!("{:?}", LockManager::builder().cluster(&list)),
        );
        assert_clean(
            &url,
            &format!("{:?}", LockManager::builder().sentinel("mymaster", &list)),
        );
        assert_clean(&url, &format!("{:?}", LockManager::builder().redlock(list)));
    }
    // The whole list together, as a Redlock deployment would mix them.
    let shown = format!("{:?}", LockManager::builder().redlock(url_forms()));
    assert_clean("redlock list", &shown);
}

#[test]
fn builder_debug_redacts_configured_clients_and_connection_infos() {
    let info: redis::ConnectionInfo = "redis://127.0.0.1:6379".parse().unwrap();
    let info = info.clone().set_redis_settings(
        info.redis_settings()
            .clone()
            .set_username("alice")
            .set_password(SECRET),
    );
    let shown = format!("{:?}", LockManager::builder().single(info.clone()));
    assert_clean("ConnectionInfo", &shown);
    assert!(shown.contains("alice:<redacted>@127.0.0.1:6379"), "{shown}");
    assert_clean(
        "&ConnectionInfo list",
        &format!(
            "{:?}",
            LockManager::builder().redlock([&info, &info, &info])
        ),
    );

    let url = format!("redis://alice:{SECRET}@127.0.0.1:6379");
    let client = redis::Client::open(url.as_str()).unwrap();
    assert_clean(
        "single_client",
        &format!("{:?}", LockManager::builder().single_client(client)),
    );
    let cluster = redis::cluster::ClusterClientBuilder::new([url.as_str()])
        .password(SECRET)
        .build()
        .unwrap();
    assert_clean(
        "cluster_client",
        &format!("{:?}", LockManager::builder().cluster_client(cluster)),
    );
}

#[tokio::test]
async fn invalid_urls_are_errors_that_do_not_echo_them() {
    for url in bad_forms() {
        let builder = LockManager::builder().single(url.as_str());
        assert_clean(&url, &format!("{builder:?}"));
        let err = builder.build().await.unwrap_err();
        assert!(
            matches!(err, redlock::LockError::InvalidOption { .. }),
            "{url}: {err:?}"
        );
        assert_clean(&url, &format!("{err} / {err:?}"));
        // In a list, the error names the node by its place.
        let list = ["redis://127.0.0.1:1".to_owned(), url.clone()];
        let err = LockManager::builder()
            .redlock(&list)
            .build()
            .await
            .unwrap_err();
        assert_clean(&url, &format!("{err} / {err:?}"));
        assert!(err.to_string().contains("#2"), "{err}");
        let err = LockManager::builder()
            .cluster(&list)
            .build()
            .await
            .unwrap_err();
        assert_clean(&url, &format!("{err} / {err:?}"));
    }
}

/// A real server with an ACL user: the manager, guards, options and errors (a wrong
/// password, a connect failure) show neither the password nor the lock's token.
#[tokio::test]
async fn managers_guards_and_errors_show_no_password_and_no_token() {
    let server = RedisServer::builder()
        .args([
            "--user",
            "alice",
            "on",
            &format!(">{SECRET}"),
            "~*",
            "&*",
            "+@all",
        ])
        .start();
    let url = format!("redis://alice:{SECRET}@127.0.0.1:{}", server.port());
    let locks = LockManager::connect(&url).await.expect("ACL user connects");
    assert_clean("LockManager", &format!("{locks:?}"));

    let guard = locks.lock("debug_{1}").await.unwrap();
    let token = match server.cmd_sync(&["GET", "lock:debug_{1}"]).unwrap() {
        redis::Value::BulkString(bytes) => bytes,
        other => panic!("lock value: {other:?}"),
    };
    let hex: String = token.iter().map(|b| format!("{b:02x}")).collect();
    let shown = format!("{guard:?} {guard:#?}");
    assert_clean("LockGuard", &shown);
    assert!(!shown.contains(&hex), "{shown}");
    assert!(!shown.contains(&format!("{token:?}")), "{shown}");
    assert!(!shown.contains(&String::from_utf8_lossy(&token).into_owned()));
    guard.release().await.unwrap();

    let all = locks.lock_all(["debug_{a}", "debug_{b}"]).await.unwrap();
    assert_clean("MultiGuard", &format!("{all:?}"));
    all.release().await.unwrap();
    assert_clean("LockOptions", &format!("{:?}", LockOptions::new()));

    let wrong = format!("redis://alice:{SECRET}x@127.0.0.1:{}", server.port());
    let err = LockManager::connect(&wrong).await.unwrap_err();
    assert!(matches!(err, redlock::LockError::Backend { .. }), "{err:?}");
    assert_clean("auth error", &format!("{err} / {err:?}"));

    let closed = format!(
        "redis://alice:{SECRET}@127.0.0.1:{}",
        redlock_testkit::free_port()
    );
    let err = LockManager::builder()
        .redlock([closed.clone(), closed.clone(), closed])
        .connect_timeout(std::time::Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    assert_clean("connect error", &format!("{err} / {err:?}"));
}
