//! The [`Future`] of a [`LockService`](super::LockService) call.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::Service;

use super::response::{error_response, HeldLock};
use crate::error::chain;
use crate::{LockError, LockGuard};

pub(super) type Acquire = Pin<Box<dyn Future<Output = Result<LockGuard, LockError>> + Send>>;
type Release = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Releases the request's lock now; a lost lock or a failed release is logged, as the
/// response goes out all the same.
fn release(guard: LockGuard) -> Release {
    Box::pin(async move {
        let key = guard.key().to_owned();
        let fencing_token = guard.fencing_token();
        let backend = guard.backend();
        match guard.release().await {
            Ok(()) => {}
            Err(LockError::Lost { .. }) => tracing::warn!(
                target: "redlock",
                key,
                backend,
                fencing_token,
                "lock lost while the request was handled; response returned"
            ),
            // The ttl frees the lock.
            Err(error) => tracing::warn!(
                target: "redlock",
                key,
                backend,
                fencing_token,
                error = %chain(&error),
                "releasing the request's lock failed; response returned"
            ),
        }
    })
}

pin_project! {
    /// The response future of [`LockService`](super::LockService): acquires the lock,
    /// calls the inner service, and once the inner future resolves releases the lock
    /// (one round trip) before it returns the response, so a client that sends its next
    /// request on receiving the response finds the lock free. It owns the lock's guard
    /// throughout: dropping it at any point releases the lock in the background (or
    /// abandons the attempt to acquire it).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B, S::Future, Result<S::Response, S::Error>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B, F, O> {
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
        // Releasing the lock, with the inner service's output.
        Releasing {
            release: Release,
            output: Option<O>,
        },
        // The output was returned.
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
                        // Logged where the key and backend are known (`LockService::call`).
                        this.state.set(State::Done);
                        return Poll::Ready(Ok(response));
                    }
                },
                StateProj::Running { future, guard } => {
                    let output = ready!(future.poll(cx));
                    let Some(guard) = guard.take() else {
                        this.state.set(State::Done);
                        return Poll::Ready(output);
                    };
                    this.state.set(State::Releasing {
                        release: release(guard),
                        output: Some(output),
                    });
                }
                StateProj::Releasing { release, output } => {
                    ready!(release.as_mut().poll(cx));
                    let Some(output) = output.take() else {
                        unreachable!("the output is taken only here")
                    };
                    this.state.set(State::Done);
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
            State::Releasing { .. } => "releasing",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
