//! Releasing holds whose recipient went away.
//!
//! An acquisition (or a hand-off) can succeed in Redis after the task that
//! asked for it stopped waiting: cancelled, timed out, or served another
//! way. The reply then carries a hold nobody will release, so whichever
//! side sees it last — the batcher failing to deliver it, or the dropped
//! [`HoldReply`] finding it delivered — queues its release.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::{mpsc, oneshot};

use super::{Kind, Op};
use crate::keys::LockKeys;
use crate::owner::Owner;

/// The release of one hold of `owner` on a lock, to queue if its recipient
/// is gone.
#[derive(Debug)]
pub(crate) struct Undo {
    pub(super) keys: Arc<LockKeys>,
    pub(super) owner: Owner,
    pub(super) queue: mpsc::UnboundedSender<Op>,
}

impl Undo {
    /// An undo whose release goes nowhere (for tests of its holders).
    #[cfg(test)]
    pub(crate) fn detached() -> Self {
        Self {
            keys: Arc::new(LockKeys::new("hasp", "detached")),
            owner: Owner::from_id("nobody").expect("a valid owner id"),
            queue: mpsc::unbounded_channel().0,
        }
    }

    /// Queues the release (in the background; a failure is logged).
    pub(crate) fn release(self) {
        let _ = self.queue.send(Op {
            keys: self.keys,
            owner: self.owner,
            kind: Kind::Release { holds: 1 },
            reply: None,
        });
    }
}

/// The receiving end of a reply that may give its receiver a hold. Resolves
/// to the reply, or `None` if the sender went away without one. Cancel safe:
/// dropped before the reply is taken, it releases the hold a delivered reply
/// carries.
#[derive(Debug)]
pub(crate) struct HoldReply<T> {
    rx: Option<oneshot::Receiver<T>>,
    undo: Option<Undo>,
    /// Whether a reply gives the receiver a hold.
    holds: fn(&T) -> bool,
}

impl<T> HoldReply<T> {
    /// `rx` is `None` when the request could not even be queued.
    pub(crate) fn new(rx: Option<oneshot::Receiver<T>>, undo: Undo, holds: fn(&T) -> bool) -> Self {
        Self {
            rx,
            undo: Some(undo),
            holds,
        }
    }

    /// True once this resolved (polling it again would return `None`).
    pub(crate) fn is_done(&self) -> bool {
        self.rx.is_none()
    }
}

impl<T> Future for HoldReply<T> {
    type Output = Option<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let Some(rx) = self.rx.as_mut() else {
            return Poll::Ready(None);
        };
        let reply = match Pin::new(rx).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(reply) => reply.ok(),
        };
        self.rx = None;
        self.undo = None; // delivered: the receiver owns any hold now
        Poll::Ready(reply)
    }
}

impl<T> Drop for HoldReply<T> {
    fn drop(&mut self) {
        let (Some(mut rx), Some(undo)) = (self.rx.take(), self.undo.take()) else {
            return;
        };
        // After close() the sender's send fails and the batcher undoes; a
        // reply that arrived before it is undone here.
        rx.close();
        if let Ok(reply) = rx.try_recv() {
            if (self.holds)(&reply) {
                undo.release();
            }
        }
    }
}
