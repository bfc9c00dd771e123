//! Lock metrics in Prometheus's text format (feature `metrics`).
//!
//! ```text
//! cargo run --example prometheus --features metrics
//! ```
//!
//! Takes and releases a few locks on the in-memory backend (`REDIS_URL` for a server),
//! then prints what a scrape of `/metrics` would return. A service would install the
//! exporter with `.with_http_listener(([0, 0, 0, 0], 9000)).install()` instead and let
//! Prometheus scrape it.

use metrics_exporter_prometheus::PrometheusBuilder;
use redlock::{LockManager, LockOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    let locks = match std::env::var("REDIS_URL") {
        Ok(url) => LockManager::connect(&url).await?,
        Err(_) => LockManager::builder().in_memory().build().await?,
    };
    for goods_id in [42, 43, 42] {
        let opts = LockOptions::new().name("buy_<goods_id>");
        let guard = locks.lock_with(&format!("buy_{goods_id}"), opts).await?;
        guard.release().await?;
    }
    print!("{}", prometheus.render());
    Ok(())
}
