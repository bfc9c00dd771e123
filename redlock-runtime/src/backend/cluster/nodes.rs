//! Where a cluster backend's connections come from ([`ClusterNodes`]), and the cluster
//! client settings the library uses.

use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::{ConnectionInfo, ProtocolVersion, PushInfo};
use tokio::sync::mpsc;

use super::super::server::Timeouts;

/// Retries of one request inside the cluster client (redirects, `TRYAGAIN`,
/// `CLUSTERDOWN`, reconnects), each after 50-500 ms.
pub(super) const CLIENT_RETRIES: u32 = 3;

/// Where a cluster backend's connections come from: seed nodes, with the library's
/// client settings, or a client the application configured.
#[derive(Clone)]
pub(crate) enum ClusterNodes {
    Infos(Vec<ConnectionInfo>),
    Client(Box<ClusterClient>),
}

impl ClusterNodes {
    /// A connection whose requests are bounded by `response` (the library's client
    /// settings, or the application's client with the library's timeouts), delivering
    /// pushes to `pushes` when given (RESP3).
    pub(super) async fn connection(
        &self,
        timeouts: Timeouts,
        response: Duration,
        pushes: Option<mpsc::UnboundedSender<PushInfo>>,
    ) -> Result<ClusterConnection, redis::RedisError> {
        match self {
            Self::Infos(infos) => {
                let mut builder = builder(infos, timeouts)
                    .response_timeout(response)
                    .overall_response_timeout(Some(response * 2));
                if let Some(tx) = pushes {
                    builder = builder.use_protocol(ProtocolVersion::RESP3).push_sender(tx);
                }
                builder.build()?.get_async_connection().await
            }
            Self::Client(client) => {
                let mut config = ClusterConfig::new()
                    .set_connection_timeout(timeouts.connect)
                    .set_response_timeout(response);
                if let Some(tx) = pushes {
                    config = config.set_push_sender(tx);
                }
                client.get_async_connection_with_config(config).await
            }
        }
    }
}

impl ClusterNodes {
    /// The seed nodes, for errors: `host:port, host:port`, or `the application's
    /// cluster client`.
    pub(super) fn seeds(&self) -> String {
        match self {
            Self::Infos(infos) => infos
                .iter()
                .map(|i| i.addr().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            Self::Client(_) => "the application's cluster client".to_owned(),
        }
    }
}

#[cfg(test)]
impl ClusterNodes {
    pub(super) fn urls(urls: &[String]) -> Self {
        use redis::IntoConnectionInfo;
        Self::Infos(
            urls.iter()
                .map(|u| u.as_str().into_connection_info().unwrap())
                .collect(),
        )
    }
}

/// A cluster client builder with the library's timeouts and bounded retries.
fn builder(infos: &[ConnectionInfo], timeouts: Timeouts) -> ClusterClientBuilder {
    ClusterClientBuilder::new(infos.to_vec())
        .tcp_settings(TcpSettings::default().set_nodelay(true))
        .connection_timeout(timeouts.connect)
        .response_timeout(timeouts.response)
        .overall_response_timeout(Some(timeouts.response * 2))
        .retries(CLIENT_RETRIES)
        .min_retry_wait(50)
        .max_retry_wait(500)
}
