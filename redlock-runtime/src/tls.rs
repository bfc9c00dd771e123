//! TLS for `rediss://` nodes (the `tls` feature): redis-rs over rustls, with the crypto
//! provider the application installed.

use crate::LockError;

/// `Ok` when the application installed a process-wide rustls crypto provider, which
/// every TLS connection then uses; otherwise an error saying how to install one.
///
/// A library installing one itself would break the application: rustls keeps the first
/// provider installed, so the application's own `install_default()` (say, of aws-lc-rs)
/// would fail afterwards.
pub(crate) fn check_provider() -> Result<(), LockError> {
    match rustls::crypto::CryptoProvider::get_default() {
        Some(_) => Ok(()),
        None => Err(LockError::invalid_option(
            "a TLS node (rediss://) needs a rustls crypto provider, and redlock never \
             installs one behind the application's back: call e.g. \
             `rustls::crypto::ring::default_provider().install_default()` (or aws_lc_rs) \
             once at start-up, before build",
        )),
    }
}
