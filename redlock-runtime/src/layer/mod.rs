//! Web integration (feature `tower`): [`LockLayer`] serialises requests per lock key,
//! and [`error_response`] maps a [`LockError`](crate::LockError) to an HTTP response.
//!
//! Many locks guard an HTTP endpoint: "one purchase of goods 42 at a time". The layer
//! derives an optional key from each request with a [`KeyFn`] — a closure over
//! `&http::Request<B>`, or a ready-made typed extractor from [`key`] — and
//!
//! - **a rejected request** (the key's value does not parse): answers `400 Bad Request`
//!   without calling the inner service;
//! - **no key**: calls the inner service at once, without locking;
//! - **a key**: acquires the lock (with the layer's ttl and wait, through the manager's
//!   prefix, local FIFO queue and wake-ups), then calls the inner service and holds the
//!   lock until the inner service's future resolves; it releases the lock (one round
//!   trip) before handing the response on, so a client that sends its next request on
//!   receiving the response finds the lock free. The guard is owned by the response
//!   future, so the lock is also released when that future is dropped — when the client
//!   disconnects, or a timeout layer gives up on the request. A handler reads the lock
//!   from the request extensions as a [`HeldLock`] (key, fencing token, `lost()`);
//! - **no lock to be had**: answers without calling the inner service, see the table.
//!
//! # Status codes
//!
//! | [`LockError`](crate::LockError) | status | `Retry-After` |
//! |---|---|---|
//! | `Timeout` (the wait ran out) | `423 Locked` | `1` |
//! | `QueueFull`, `QuorumUnavailable`, `ReplicasUnavailable`, `Backend` | `503 Service Unavailable` | `1` |
//! | `InvalidKey` (the request's key value does not parse, or the key is too long or malformed) | `400 Bad Request` | — |
//! | `Lost` (only from [`error_response`] / `IntoResponse`, never from the layer) | `409 Conflict` | — |
//! | `NotHeld`, `NoManager`, `InvalidOption`, anything else | `500 Internal Server Error` | — |
//!
//! `Retry-After` is [`LockError::retry_after`](crate::LockError::retry_after) rounded up
//! to whole seconds, at least 1. The body is JSON,
//! `{"error": "<kind>", "key": "<full key>"}`, where `error` is
//! [`LockError::kind`](crate::LockError::kind) (`timeout`, `queue_full`, ...) and `key` the
//! full key, prefix included (`null` for errors about no key). With the `axum` feature
//! `LockError` implements `axum::response::IntoResponse` with the same mapping, so an
//! annotated handler can return `Result<_, LockError>` (or an error type wrapping it).
//!
//! # The key is the parsed value
//!
//! The key must name the resource the handler works on, and the handler finds it from
//! the *parsed* value: axum's `Path<u64>` gives `42` for `/goods/42`, `/goods/042`,
//! `/goods/+42` and `/goods/%34%32` alike. Locking the raw text would take four locks for
//! one goods, and purchases spelled differently would run at once and lose updates. The
//! extractors of [`key`] are therefore typed — `key::path_segment::<u64>(1, "goods_{}")`
//! — decoding and parsing as the handler's extractor does and building the key from the
//! value's `Display`, so every spelling locks `goods_{42}`, the key
//! `#[distributed_lock(key = "goods_<id>")]` takes for `id: u64`. A closure key
//! function must do the same: parse, then format.
//!
//! # Fine points
//! - The lock covers the inner service's future, i.e. until the response *head* exists;
//!   a streaming response body is sent after the release.
//! - A lock lost while the inner service runs (renewal failed, lease expired) is logged
//!   at `warn` and the response is still returned; a handler that must stop on loss
//!   selects on [`HeldLock::lost`], or better, hands [`HeldLock::fencing_token`] to the
//!   resource it writes.
//! - `poll_ready` is the inner service's; `call` moves the service it made ready into the
//!   response future (leaving a clone behind) and calls it once the lock is held, as
//!   `tower::filter::AsyncFilter` does.
//! - The rejection body needs a response body type that is `From<String>`: axum's
//!   `Body`, `String`, `Bytes`, `http_body_util::Full<Bytes>`.
//!
//! # Examples
//!
//! With axum (feature `axum`), per-goods serialisation of purchases:
//!
//! ```
//! # #[cfg(feature = "axum")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use axum::{body::Body, http::{Request, StatusCode}, routing::post, Router};
//! use redlock::tower::{key, LockLayer};
//! use redlock::LockManager;
//! use tower::ServiceExt;
//!
//! let locks = LockManager::builder().in_memory().build().await?;
//! // "/goods/42/buy" (or "/goods/042/buy") is locked as "lock:goods_{42}".
//! let layer = LockLayer::new(locks.clone(), key::path_segment::<u64>(1, "goods_{}"))
//!     .ttl(Duration::from_secs(10))
//!     .wait(Duration::from_millis(500));
//! let app = Router::new()
//!     .route("/goods/{id}/buy", post(|| async { "bought" }))
//!     .route_layer(layer);
//!
//! let request = Request::post("/goods/42/buy").body(Body::empty())?;
//! assert_eq!(app.clone().oneshot(request).await?.status(), StatusCode::OK);
//! // Not a goods id: 400 Bad Request, the handler is not called.
//! let request = Request::post("/goods/abc/buy").body(Body::empty())?;
//! assert_eq!(app.clone().oneshot(request).await?.status(), StatusCode::BAD_REQUEST);
//!
//! // While someone else holds goods 42, a purchase waits 500 ms, then gets 423 Locked,
//! // however it spells 42.
//! let held = locks.lock("goods_{42}").await?;
//! let request = Request::post("/goods/042/buy").body(Body::empty())?;
//! assert_eq!(app.oneshot(request).await?.status(), StatusCode::LOCKED);
//! # drop(held);
//! # Ok(()) }
//! # #[cfg(not(feature = "axum"))]
//! # fn main() {}
//! ```
//!
//! With any tower service over `http` types, and a closure as the key function:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use http::{Request, Response};
//! use redlock::tower::LockLayer;
//! use redlock::LockManager;
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! let locks = LockManager::builder().in_memory().build().await?;
//! // Parse, then format: "7" and "007" are one account.
//! let layer = LockLayer::new(locks.clone(), |req: &Request<String>| {
//!     let account: u64 = req.headers().get("x-account")?.to_str().ok()?.parse().ok()?;
//!     Some(format!("account_{{{account}}}"))
//! });
//! let svc = layer.layer(service_fn(|req: Request<String>| async move {
//!     Ok::<_, std::convert::Infallible>(Response::new(format!("got {}", req.body())))
//! }));
//!
//! let req = Request::builder().header("x-account", "007").body("hello".to_owned())?;
//! let res = svc.oneshot(req).await?;
//! assert_eq!(res.body(), "got hello");
//! assert!(!locks.is_locked("account_{7}").await?, "released when the response is ready");
//! # Ok(()) }
//! ```

pub mod future;
pub mod key;
#[allow(clippy::module_inception)] // layer/layer.rs, as tower's limit/concurrency/layer.rs
mod layer;
mod response;
mod service;

pub use self::key::KeyFn;
pub use self::layer::LockLayer;
pub use self::response::{error_response, HeldLock};
pub use self::service::LockService;
