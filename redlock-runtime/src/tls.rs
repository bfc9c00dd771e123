//! TLS for `rediss://` URLs (the `tls` feature): rustls with the ring provider.

/// Makes ring the process's rustls provider unless the application chose one already.
pub(crate) fn install_crypto_provider() {
    // An error means a provider is installed already: keep the application's choice.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
