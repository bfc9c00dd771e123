//! `rediss://` against a real redis-server serving TLS with a throwaway CA (needs the
//! `tls` feature and the `openssl` command to make certificates).
#![cfg(feature = "tls")]

use std::path::Path;
use std::process::Command;

use redlock::{LockError, LockManager};
use redlock_testkit::{free_port, RedisServer};

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl runs");
    assert!(status.success(), "openssl {args:?}");
}

/// A CA, a server certificate for 127.0.0.1 it signed, and an unrelated CA.
fn make_certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "1",
            "-subj",
            "/CN=redlock test CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "other.key",
            "-out",
            "other.crt",
            "-days",
            "1",
            "-subj",
            "/CN=some other CA",
        ],
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "1",
            "-extfile",
            "san.ext",
        ],
    );
}

#[tokio::test]
async fn rediss_urls_lock_over_tls_and_check_the_certificate() {
    if Command::new("openssl").arg("version").output().is_err() {
        eprintln!("skipped: no openssl command to make certificates");
        return;
    }
    let certs = tempfile::tempdir().unwrap();
    make_certificates(certs.path());
    let path = |f: &str| certs.path().join(f).display().to_string();
    let tls_port = free_port();
    let server = RedisServer::builder()
        .args([
            "--tls-port".to_owned(),
            tls_port.to_string(),
            "--tls-cert-file".to_owned(),
            path("server.crt"),
            "--tls-key-file".to_owned(),
            path("server.key"),
            "--tls-ca-cert-file".to_owned(),
            path("ca.crt"),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ])
        .start();
    let url = format!("rediss://127.0.0.1:{tls_port}");
    // The application's provider (redlock installs none): see tests/tls_provider.rs.
    let _ = rustls::crypto::ring::default_provider().install_default();

    // Trusting only another CA, the server's certificate is refused.
    std::env::set_var("SSL_CERT_FILE", path("other.crt"));
    let err = LockManager::connect(&url).await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err}");

    // Trusting the CA (rustls-native-certs reads SSL_CERT_FILE), locks work over TLS.
    std::env::set_var("SSL_CERT_FILE", path("ca.crt"));
    let locks = LockManager::connect(&url).await.expect("TLS connect");
    let guard = locks.lock("tls_{1}").await.unwrap();
    assert_eq!(guard.fencing_token(), 1);
    let exists = server.cmd_sync(&["EXISTS", "lock:tls_{1}"]).unwrap();
    assert_eq!(exists, redis::Value::Int(1));
    guard.release().await.unwrap();

    // A configured client with the CA given in code (no SSL_CERT_FILE): custom roots.
    std::env::set_var("SSL_CERT_FILE", path("other.crt"));
    let ca = std::fs::read(certs.path().join("ca.crt")).unwrap();
    let client = redis::Client::build_with_tls(
        url.as_str(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca),
        },
    )
    .unwrap();
    let locks = LockManager::builder()
        .single_client(client)
        .build()
        .await
        .expect("TLS with the client's own CA");
    let guard = locks.lock("tls_{2}").await.unwrap();
    guard.release().await.unwrap();
    drop(server);
}
