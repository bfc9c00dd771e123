//! `LockError` as an HTTP response, and the lock a request holds ([`HeldLock`]).

use std::fmt;
use std::fmt::Write as _;
use std::time::Duration;

use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};

use crate::{LockError, LockGuard};

impl LockError {
    /// The HTTP status for this error (feature `tower`): `Timeout` → `423 Locked`;
    /// `QueueFull`, `QuorumUnavailable`, `ReplicasUnavailable`, `Backend` →
    /// `503 Service Unavailable`; `Lost` → `409 Conflict`; `InvalidKey` →
    /// `400 Bad Request` (keys are derived from requests); the rest →
    /// `500 Internal Server Error`.
    ///
    /// ```
    /// use http::StatusCode;
    /// use redlock::LockError;
    ///
    /// let err = LockError::Timeout { key: "lock:goods_{42}".into() };
    /// assert_eq!(err.status_code(), StatusCode::LOCKED);
    /// ```
    pub fn status_code(&self) -> StatusCode {
        match self {
            Self::Timeout { .. } => StatusCode::LOCKED,
            Self::QueueFull { .. }
            | Self::QuorumUnavailable { .. }
            | Self::ReplicasUnavailable { .. }
            | Self::ShutDown
            | Self::Backend { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Lost { .. } => StatusCode::CONFLICT,
            Self::InvalidKey { .. } => StatusCode::BAD_REQUEST,
            Self::NotHeld { .. }
            | Self::NoManager
            | Self::InvalidOption { .. }
            | Self::WrongRuntime { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// The HTTP response for `error` (feature `tower`): the status of
/// [`LockError::status_code`], a `Retry-After` in whole seconds (at least 1) for the
/// retryable errors, and the JSON body `{"error": "<kind>", "key": "<full key>"}`
/// (`"key": null` for errors about no particular key).
///
/// This is what [`LockLayer`](super::LockLayer) answers when it cannot get the lock, and,
/// with the `axum` feature, what `LockError`'s `IntoResponse` returns.
///
/// ```
/// use http::{header, StatusCode};
/// use redlock::tower::error_response;
/// use redlock::LockError;
///
/// let res = error_response::<String>(&LockError::QueueFull { key: "lock:goods_{42}".into() });
/// assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
/// assert_eq!(res.headers()[header::RETRY_AFTER], "1");
/// assert_eq!(res.headers()[header::CONTENT_TYPE], "application/json");
/// assert_eq!(res.body(), r#"{"error":"queue_full","key":"lock:goods_{42}"}"#);
/// ```
pub fn error_response<B: From<String>>(error: &LockError) -> Response<B> {
    let mut response = Response::new(B::from(json_body(error)));
    *response.status_mut() = error.status_code();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(after) = error.retry_after() {
        headers.insert(RETRY_AFTER, HeaderValue::from(whole_seconds(after)));
    }
    response
}

/// `d` rounded up to whole seconds, at least 1.
fn whole_seconds(d: Duration) -> u64 {
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
}

/// `{"error":"<kind>","key":"<key>"}`, or `"key":null`.
fn json_body(error: &LockError) -> String {
    let mut body = String::with_capacity(32 + error.key().map_or(0, str::len));
    body.push_str(r#"{"error":"#);
    json_string(&mut body, error.kind());
    body.push_str(r#","key":"#);
    match error.key() {
        Some(key) => json_string(&mut body, key),
        None => body.push_str("null"),
    }
    body.push('}');
    body
}

/// Appends `s` as a JSON string literal (RFC 8259 escapes).
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl axum::response::IntoResponse for LockError {
    /// The response of [`error_response`] (feature `axum`).
    ///
    /// ```
    /// use axum::response::IntoResponse;
    /// use http::StatusCode;
    /// use redlock::LockError;
    ///
    /// let res = LockError::Lost { key: "lock:goods_{42}".into() }.into_response();
    /// assert_eq!(res.status(), StatusCode::CONFLICT);
    /// ```
    fn into_response(self) -> axum::response::Response {
        error_response(&self)
    }
}

/// The lock a [`LockLayer`](super::LockLayer) holds for a request, put in the request's
/// extensions before the inner service is called (axum: `Extension<HeldLock>`).
///
/// A view: cloning or dropping it never releases the lock — the layer does, when the
/// inner service's future resolves.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use http::{Request, Response};
/// use redlock::tower::{key, HeldLock, LockLayer};
/// use redlock::LockManager;
/// use tower::{service_fn, Layer, ServiceExt};
///
/// let locks = LockManager::builder().in_memory().build().await?;
/// let svc = LockLayer::new(locks, key::path_segment::<u64>(1, "goods_{}")).layer(service_fn(
///     |req: Request<String>| async move {
///         let lock = req.extensions().get::<HeldLock>().cloned();
///         // Pass the fencing token to the storage, which rejects stale writers.
///         let token = lock.map(|l| l.fencing_token()).unwrap_or_default();
///         Ok::<_, std::convert::Infallible>(Response::new(token.to_string()))
///     },
/// ));
/// let res = svc.oneshot(Request::post("/goods/42/buy").body(String::new())?).await?;
/// assert!(res.body().parse::<u64>()? >= 1);
/// # Ok(()) }
/// ```
pub struct HeldLock(LockGuard);

impl HeldLock {
    pub(super) fn new(guard: &LockGuard) -> Self {
        Self(guard.view())
    }

    /// The full key, prefix included.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use http::{Request, Response};
    /// use redlock::tower::{key, HeldLock, LockLayer};
    /// use redlock::LockManager;
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let layer = LockLayer::new(locks, key::path_segment::<u64>(1, "goods_{}"));
    /// let svc = layer.layer(service_fn(|req: Request<String>| async move {
    ///     let lock = req.extensions().get::<HeldLock>().expect("held while the request runs");
    ///     assert_eq!(lock.key(), "lock:goods_{42}");
    ///     Ok::<_, std::convert::Infallible>(Response::new(String::new()))
    /// }));
    /// svc.oneshot(Request::post("/goods/42/buy").body(String::new())?).await?;
    /// # Ok(()) }
    /// ```
    pub fn key(&self) -> &str {
        self.0.key()
    }

    /// The lock's fencing token; see [`LockGuard::fencing_token`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use http::{Request, Response};
    /// use redlock::tower::{key, HeldLock, LockLayer};
    /// use redlock::LockManager;
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let layer = LockLayer::new(locks, key::path_segment::<u64>(1, "goods_{}"));
    /// let svc = layer.layer(service_fn(|req: Request<String>| async move {
    ///     let lock = req.extensions().get::<HeldLock>().expect("held while the request runs");
    ///     assert!(lock.fencing_token() >= 1); // pass it to the storage with the write
    ///     Ok::<_, std::convert::Infallible>(Response::new(String::new()))
    /// }));
    /// svc.oneshot(Request::post("/goods/42/buy").body(String::new())?).await?;
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> u64 {
        self.0.fencing_token()
    }

    /// Whether the lock is still held; see [`LockGuard::is_held`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use http::{Request, Response};
    /// use redlock::tower::{key, HeldLock, LockLayer};
    /// use redlock::LockManager;
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let layer = LockLayer::new(locks, key::path_segment::<u64>(1, "goods_{}"));
    /// let svc = layer.layer(service_fn(|req: Request<String>| async move {
    ///     let lock = req.extensions().get::<HeldLock>().expect("held while the request runs");
    ///     assert!(lock.is_held());
    ///     Ok::<_, std::convert::Infallible>(Response::new(String::new()))
    /// }));
    /// svc.oneshot(Request::post("/goods/42/buy").body(String::new())?).await?;
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        self.0.is_held()
    }

    /// Resolves when the lock is lost; see [`LockGuard::lost`].
    ///
    /// # Cancel safety
    /// Cancel safe.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    ///
    /// use http::{Request, Response};
    /// use redlock::tower::{key, HeldLock, LockLayer};
    /// use redlock::LockManager;
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let svc = LockLayer::new(locks, key::path_segment::<u64>(1, "goods_{}")).layer(service_fn(
    ///     |req: Request<String>| async move {
    ///         let lock = req.extensions().get::<HeldLock>().cloned().expect("set by the layer");
    ///         let work = tokio::time::sleep(Duration::from_millis(10)); // the handler's work
    ///         let body = tokio::select! {
    ///             _ = work => "done",
    ///             _ = lock.lost() => "lock lost: stopped before writing",
    ///         };
    ///         Ok::<_, std::convert::Infallible>(Response::new(body.to_string()))
    ///     },
    /// ));
    /// let res = svc.oneshot(Request::post("/goods/42/buy").body(String::new())?).await?;
    /// assert_eq!(res.body(), "done");
    /// # Ok(()) }
    /// ```
    pub async fn lost(&self) {
        self.0.lost().await;
    }
}

impl Clone for HeldLock {
    fn clone(&self) -> Self {
        Self(self.0.view())
    }
}

impl fmt::Debug for HeldLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HeldLock").field(&self.0).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_variant() -> Vec<LockError> {
        let key = || "lock:k_{1}".to_owned();
        vec![
            LockError::Timeout { key: key() },
            LockError::ShutDown,
            LockError::QueueFull { key: key() },
            LockError::Lost { key: key() },
            LockError::NotHeld { key: key() },
            LockError::QuorumUnavailable {
                key: key(),
                reached: 1,
                needed: 2,
            },
            LockError::ReplicasUnavailable {
                key: key(),
                acked: 0,
                wanted: 1,
            },
            LockError::NoManager,
            LockError::InvalidKey {
                reason: "empty".into(),
            },
            LockError::InvalidOption {
                reason: "ttl".into(),
            },
            LockError::Backend {
                operation: "acquire",
                node: None,
                source: redis::RedisError::from((redis::ErrorKind::Io, "connection refused")),
            },
        ]
    }

    #[test]
    fn status_codes_and_retry_after() {
        for err in every_variant() {
            let res = error_response::<String>(&err);
            let expected = match err.kind() {
                "timeout" => 423,
                "queue_full"
                | "quorum_unavailable"
                | "replicas_unavailable"
                | "shut_down"
                | "backend" => 503,
                "lost" => 409,
                "invalid_key" => 400,
                _ => 500,
            };
            assert_eq!(res.status().as_u16(), expected, "{err:?}");
            let retry = res.headers().get(RETRY_AFTER).map(|v| v.to_str().unwrap());
            assert_eq!(retry, err.is_retryable().then_some("1"), "{err:?}");
            let body: serde_json::Value = serde_json::from_str(res.body()).unwrap();
            assert_eq!(body["error"], err.kind());
            assert_eq!(body["key"].as_str(), err.key());
        }
    }

    #[test]
    fn json_escapes_any_key() {
        let key = "lock:\"q\"\\ \n\r\t\u{1}\u{1f} é {x}".to_owned();
        let err = LockError::Timeout { key: key.clone() };
        let body: serde_json::Value = serde_json::from_str(&json_body(&err)).unwrap();
        assert_eq!(body["key"], key);
        let body: serde_json::Value =
            serde_json::from_str(&json_body(&LockError::NoManager)).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": "no_manager", "key": null})
        );
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(whole_seconds(Duration::ZERO), 1);
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(1)), 1);
        assert_eq!(whole_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(whole_seconds(Duration::from_secs(7)), 7);
    }
}
