//! The [`Future`] of a [`LockService`](super::LockService) call.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::Service;

use super::response::{error_response, HeldLock};
use crate::{LockError, LockGuard};

type Acquire = Pin<Box<dyn Future<Output = Result<LockGuard, LockError>> + Send>>;

pin_project! {
    /// The response future of [`LockService`](super::LockService): acquires the lock,
    /// then calls the inner service and owns the lock's guard until the inner future
    /// resolves. Dropping it at any point releases the lock (or abandons the attempt).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B, S::Future>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B, F> {
        // Waiting for the lock, with the ready inner service and the request.
        Acquiring {
            acquire: Acquire,
            service: Option<S>,
            request: Option<Request<B>>,
        },
        // The inner service's future, with the guard when the request has a key.
        Running {
            #[pin]
            future: F,
            guard: Option<LockGuard>,
        },
        // The rejection was returned.
        Done,
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    pub(super) fn acquiring(acquire: Acquire, service: S, request: Request<B>) -> Self {
        Self {
            state: State::Acquiring {
                acquire,
                service: Some(service),
                request: Some(request),
            },
        }
    }

    pub(super) fn unlocked(future: S::Future) -> Self {
        Self {
            state: State::Running {
                future,
                guard: None,
            },
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    ResBody: From<String>,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Acquiring {
                    acquire,
                    service,
                    request,
                } => match ready!(acquire.as_mut().poll(cx)) {
                    Ok(guard) => {
                        let (Some(mut service), Some(mut request)) =
                            (service.take(), request.take())
                        else {
                            unreachable!("the service and request are taken only here")
                        };
                        request.extensions_mut().insert(HeldLock::new(&guard));
                        let future = service.call(request);
                        this.state.set(State::Running {
                            future,
                            guard: Some(guard),
                        });
                    }
                    Err(error) => {
                        let response = error_response(&error);
                        if error.is_retryable() {
                            tracing::debug!(
                                key = error.key(),
                                error = %error,
                                status = response.status().as_u16(),
                                "request rejected: lock not acquired"
                            );
                        } else {
                            tracing::warn!(
                                key = error.key(),
                                error = %error,
                                status = response.status().as_u16(),
                                "request rejected: lock not acquired"
                            );
                        }
                        this.state.set(State::Done);
                        return Poll::Ready(Ok(response));
                    }
                },
                StateProj::Running { future, guard } => {
                    let output = ready!(future.poll(cx));
                    if let Some(guard) = guard.take() {
                        if !guard.is_held() {
                            tracing::warn!(
                                key = guard.key(),
                                fencing_token = guard.fencing_token(),
                                "lock lost while the request was handled; response returned"
                            );
                        }
                        // Released in the background: the response is not delayed.
                        drop(guard);
                    }
                    return Poll::Ready(output);
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Acquiring { .. } => "acquiring",
            State::Running { guard: Some(_), .. } => "running",
            State::Running { guard: None, .. } => "running unlocked",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
