//! Regression (issue 14, item 3): the `tls` feature installed ring as the process-wide
//! rustls provider at `build`, so an application installing its own provider afterwards
//! (say aws-lc-rs, `install_default().expect(..)`) panicked. redlock now installs none:
//! with no provider installed a TLS node is a clear error, and the application's own
//! `install_default` still succeeds afterwards. Its own test binary: the provider is
//! process-wide state.
#![cfg(feature = "tls")]

use redlock::{LockError, LockManager};
use rustls::crypto::CryptoProvider;

#[tokio::test]
async fn tls_build_installs_no_process_wide_provider() {
    assert!(CryptoProvider::get_default().is_none());
    let url = format!("rediss://127.0.0.1:{}", redlock_testkit::free_port());

    let err = LockManager::connect(&url).await.unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    assert!(err.to_string().contains("crypto provider"), "{err}");
    assert!(
        CryptoProvider::get_default().is_none(),
        "redlock installed a provider behind the application's back"
    );

    // The application installs its own afterwards: it succeeds...
    rustls::crypto::ring::default_provider()
        .install_default()
        .expect("the application's provider is installed");
    // ...and TLS nodes are accepted, connecting with it (nothing listens: a connect
    // error, not a configuration one).
    let err = LockManager::builder()
        .single(url.as_str())
        .connect_timeout(std::time::Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
}
