//! Running a Redis call to completion even when its caller goes away.
//!
//! Dropping an async fn mid-call must not leave state behind: an acquire
//! script already sent may still take the lock, and a release already
//! decided locally must still reach Redis. [`Detachable`] wraps such a call;
//! if it is dropped before it finishes, the call is moved to a background
//! task and `on_abandon` gets its result there (to undo an acquisition).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

pub(crate) struct Detachable<T, F>
where
    T: Send + 'static,
    F: FnOnce(T) -> BoxFuture<()> + Send + 'static,
{
    call: Option<BoxFuture<T>>,
    on_abandon: Option<F>,
    runtime: tokio::runtime::Handle,
}

impl<T, F> Detachable<T, F>
where
    T: Send + 'static,
    F: FnOnce(T) -> BoxFuture<()> + Send + 'static,
{
    pub(crate) fn new(
        call: impl Future<Output = T> + Send + 'static,
        runtime: &tokio::runtime::Handle,
        on_abandon: F,
    ) -> Self {
        Self {
            call: Some(Box::pin(call)),
            on_abandon: Some(on_abandon),
            runtime: runtime.clone(),
        }
    }
}

impl<T, F> Future for Detachable<T, F>
where
    T: Send + 'static,
    F: FnOnce(T) -> BoxFuture<()> + Send + 'static + Unpin,
{
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let Some(call) = self.call.as_mut() else {
            return Poll::Pending; // polled after completion: never resolves again
        };
        match call.as_mut().poll(cx) {
            Poll::Ready(v) => {
                self.call = None;
                Poll::Ready(v)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T, F> Drop for Detachable<T, F>
where
    T: Send + 'static,
    F: FnOnce(T) -> BoxFuture<()> + Send + 'static,
{
    fn drop(&mut self) {
        if let (Some(call), Some(on_abandon)) = (self.call.take(), self.on_abandon.take()) {
            self.runtime
                .spawn(async move { on_abandon(call.await).await });
        }
    }
}

/// Boxes a future for [`Detachable`]'s `on_abandon`.
pub(crate) fn boxed<Fut>(f: Fut) -> BoxFuture<()>
where
    Fut: Future<Output = ()> + Send + 'static,
{
    Box::pin(f)
}
