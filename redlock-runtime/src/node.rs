//! Naming a Redis node: [`IntoNode`] turns a URL or a [`redis::ConnectionInfo`] into the
//! settings the backends connect with, and [`Redacted`] shows them without the password.

use std::fmt;

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisResult};

/// What names one Redis node for [`single`](crate::LockManagerBuilder::single),
/// [`cluster`](crate::LockManagerBuilder::cluster) and
/// [`redlock`](crate::LockManagerBuilder::redlock): a URL (`&str`, `&String`, `String`)
/// or a configured [`redis::ConnectionInfo`] (credentials from a secret store, TLS
/// settings).
///
/// URLs have the forms `redis://[user][:password@]host[:port][/db]`, `rediss://…` (TLS,
/// with the `tls` feature) and `redis+unix:///path?db=0&user=u&pass=p` (also `unix://`).
/// Implement it for a configuration type of your own to hand it to the builder directly.
///
/// ```
/// use redlock::{redis, IntoNode};
///
/// // From a secret store rather than a URL:
/// let info: redis::ConnectionInfo = "redis://127.0.0.1:6379".into_node()?;
/// let info = info.clone().set_redis_settings(
///     info.redis_settings().clone().set_username("locks").set_password("s3cret"),
/// );
/// let builder = redlock::LockManager::builder().single(info);
/// assert!(!format!("{builder:?}").contains("s3cret"));
/// # Ok::<(), redis::RedisError>(())
/// ```
pub trait IntoNode {
    /// The node's connection settings.
    ///
    /// # Errors
    /// A URL that does not parse (the error never repeats the URL: it may hold a
    /// password), or a `rediss://` URL without the `tls` feature.
    fn into_node(self) -> RedisResult<ConnectionInfo>;
}

impl IntoNode for &str {
    fn into_node(self) -> RedisResult<ConnectionInfo> {
        let scheme = self.trim_start().split(':').next().unwrap_or_default();
        let tls = ["rediss", "valkeys"]
            .iter()
            .any(|s| scheme.eq_ignore_ascii_case(s));
        if tls && !cfg!(feature = "tls") {
            return Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "a rediss:// URL needs the `tls` feature of redlock",
            )));
        }
        self.into_connection_info()
    }
}

impl IntoNode for &String {
    fn into_node(self) -> RedisResult<ConnectionInfo> {
        self.as_str().into_node()
    }
}

impl IntoNode for String {
    fn into_node(self) -> RedisResult<ConnectionInfo> {
        self.as_str().into_node()
    }
}

impl IntoNode for &&str {
    fn into_node(self) -> RedisResult<ConnectionInfo> {
        (*self).into_node()
    }
}

impl IntoNode for ConnectionInfo {
    fn into_node(self) -> RedisResult<ConnectionInfo> {
        Ok(self)
    }
}

impl IntoNode for &ConnectionInfo {
    fn into_node(self) -> RedisResult<ConnectionInfo> {
        Ok(self.clone())
    }
}

/// Whether connecting to the node uses TLS.
pub(crate) fn is_tls(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), ConnectionAddr::TcpTls { .. })
}

/// Shows a node as a URL with its password replaced by `<redacted>`, e.g.
/// `redis://alice:<redacted>@127.0.0.1:6379/0`.
pub(crate) struct Redacted<'a>(pub(crate) &'a ConnectionInfo);

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let settings = self.0.redis_settings();
        let (user, password) = (
            settings.username(),
            settings.password().map(|_| "<redacted>"),
        );
        let (scheme, host) = match self.0.addr() {
            ConnectionAddr::Tcp(..) => ("redis", true),
            ConnectionAddr::TcpTls { .. } => ("rediss", true),
            _ => ("redis+unix", false),
        };
        write!(f, "\"{scheme}://")?;
        if host {
            match (user, password) {
                (None, None) => {}
                (user, password) => {
                    f.write_str(user.unwrap_or_default())?;
                    if let Some(password) = password {
                        write!(f, ":{password}")?;
                    }
                    f.write_str("@")?;
                }
            }
            write!(f, "{}/{}\"", self.0.addr(), settings.db())
        } else {
            write!(f, "{}?db={}", self.0.addr(), settings.db())?;
            if let Some(user) = user {
                write!(f, "&user={user}")?;
            }
            if let Some(password) = password {
                write!(f, "&pass={password}")?;
            }
            f.write_str("\"")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(url: &str) -> String {
        format!("{:?}", Redacted(&url.into_node().unwrap()))
    }

    #[test]
    fn urls_are_shown_without_their_password() {
        assert_eq!(
            shown("redis://alice:s3cret@127.0.0.1:6380/2"),
            "\"redis://alice:<redacted>@127.0.0.1:6380/2\""
        );
        assert_eq!(
            shown("redis://:s3cret@h:1"),
            "\"redis://:<redacted>@h:1/0\""
        );
        assert_eq!(shown("redis://alice@h:1"), "\"redis://alice@h:1/0\"");
        assert_eq!(shown("redis://h"), "\"redis://h:6379/0\"");
        assert_eq!(
            shown("redis+unix:///tmp/r.sock?db=3&user=bob&pass=s3cret"),
            "\"redis+unix:///tmp/r.sock?db=3&user=bob&pass=<redacted>\""
        );
        assert_eq!(
            shown("unix:///tmp/r.sock?pass=s3cret"),
            "\"redis+unix:///tmp/r.sock?db=0&pass=<redacted>\""
        );
    }

    #[test]
    fn a_url_that_does_not_parse_is_an_error_that_does_not_repeat_it() {
        for url in [
            "redis://alice:s3cret@",
            "redis://alice:s3cret@h:1/notadb",
            "http://alice:s3cret@h:1",
            "redis://alice:s3cret@h:1/?protocol=s3cret9",
            "",
        ] {
            let e = url.into_node().unwrap_err();
            assert!(!format!("{e} {e:?}").contains("s3cret@"), "{url}: {e:?}");
        }
    }
}
