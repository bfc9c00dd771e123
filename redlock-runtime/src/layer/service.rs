use std::fmt;
use std::future;
use std::mem;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::future::{Acquire, ResponseFuture};
use super::KeyFn;
use crate::error::chain;
use crate::{LockError, LockManager, LockOptions};

/// The service of a [`LockLayer`](super::LockLayer): calls the inner service while
/// holding the lock its [`KeyFn`] derives from the request.
///
/// A request the key function rejects is answered with the error's response (`400 Bad
/// Request` for a value that does not parse) without calling the inner service.
///
/// `poll_ready` is the inner service's. A request with a key moves the inner service
/// (the one made ready) into the response future, leaving a clone behind, and calls it
/// once the lock is held; the future owns the lock's guard until the inner future
/// resolves or is dropped. A request without a key calls the inner service at once.
#[derive(Clone)]
pub struct LockService<S, K> {
    inner: S,
    manager: LockManager,
    key: K,
    options: LockOptions,
}

impl<S, K> LockService<S, K> {
    pub(super) fn new(inner: S, manager: LockManager, key: K, options: LockOptions) -> Self {
        Self {
            inner,
            manager,
            key,
            options,
        }
    }

    /// The inner service.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::tower::{key, LockLayer};
    /// use redlock::LockManager;
    /// use tower::{service_fn, Layer};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let inner = service_fn(|_: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// let layer = LockLayer::new(locks, key::path_segment::<u64>(1, "goods_{}"));
    /// let svc = layer.layer(inner);
    /// let _inner = svc.get_ref();
    /// # Ok(()) }
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::tower::{key, LockLayer};
    /// use redlock::LockManager;
    /// use tower::{service_fn, Layer};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let inner = service_fn(|_: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// let layer = LockLayer::new(locks, key::path_segment::<u64>(1, "goods_{}"));
    /// let mut svc = layer.layer(inner);
    /// let _inner = svc.get_mut();
    /// # Ok(()) }
    /// ```
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming the lock service.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redlock::LockError> {
    /// use redlock::tower::{key, LockLayer};
    /// use redlock::LockManager;
    /// use tower::{service_fn, Layer};
    ///
    /// let locks = LockManager::builder().in_memory().build().await?;
    /// let inner = service_fn(|_: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// let layer = LockLayer::new(locks, key::path_segment::<u64>(1, "goods_{}"));
    /// let svc = layer.layer(inner);
    /// let _inner = svc.into_inner();
    /// # Ok(()) }
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, K, ReqBody, ResBody> Service<Request<ReqBody>> for LockService<S, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyFn<ReqBody>,
    ResBody: From<String>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let acquire: Acquire = match self.key.key(&request) {
            Ok(None) => return ResponseFuture::unlocked(self.inner.call(request)),
            Ok(Some(key)) => {
                let manager = self.manager.clone();
                let options = self.options.clone();
                Box::pin(async move {
                    let acquired = manager.lock_with(&key, options).await;
                    if let Err(error) = &acquired {
                        let full = format!("{}{key}", manager.prefix());
                        rejected(Some(&full), manager.backend_name(), error);
                    }
                    acquired
                })
            }
            // Answered with the error's response; the inner service is never called.
            Err(error) => {
                rejected(None, self.manager.backend_name(), &error);
                Box::pin(future::ready(Err(error)))
            }
        };
        // The service polled ready goes with the request; its clone stays for the next.
        let clone = self.inner.clone();
        let ready = mem::replace(&mut self.inner, clone);
        ResponseFuture::acquiring(acquire, ready, request)
    }
}

/// Logs a request answered with `error` instead of being served: at `DEBUG` when busy
/// locks or malformed requests (the clients' business), else at `WARN`. `key` is what
/// the full key, when the key function returned one.
fn rejected(key: Option<&str>, backend: &'static str, error: &LockError) {
    let status = error.status_code().as_u16();
    if error.is_retryable() || matches!(error, LockError::InvalidKey { .. }) {
        tracing::debug!(target: "redlock", key, backend, error = %chain(error), status, "request rejected: lock not acquired");
    } else {
        tracing::warn!(target: "redlock", key, backend, error = %chain(error), status, "request rejected: lock not acquired");
    }
}

impl<S: fmt::Debug, K> fmt::Debug for LockService<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockService")
            .field("inner", &self.inner)
            .field("manager", &self.manager)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}
