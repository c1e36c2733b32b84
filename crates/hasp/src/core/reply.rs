//! Replies that may carry a hold, received cancel-safely.
//!
//! An acquisition (or a hand-off) can succeed in Redis after the task that
//! asked for it stopped waiting: cancelled, timed out, or served another
//! way. The reply then carries a hold nobody will release, so whichever side
//! sees it last releases it: the batcher when it cannot deliver the reply
//! (`Queue::call`), or the dropped [`HoldReply`] when it finds the reply
//! delivered but unread.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use super::batcher::Queue;
use super::keys::LockKeys;
use super::wire::lock::LockOp;
use super::wire::Op;
use hasp_owner::Owner;

/// What gives back a grant (a hold, permits) whose recipient is gone, to
/// queue then.
#[derive(Debug)]
pub(crate) struct Undo {
    give_back: Option<Op>,
    queue: Queue,
}

impl Undo {
    /// The release of one hold of `owner` on a lock.
    pub(crate) fn lock(keys: &Arc<LockKeys>, owner: &Owner, queue: &Queue) -> Self {
        let op = Op::Lock(LockOp::Release {
            keys: keys.clone(),
            owner: owner.clone(),
            holds: 1,
            nonce: queue.nonce(),
            written: None,
        });
        Self::of_release(op, queue)
    }

    /// What gives back what `op` grants (nothing if it grants nothing).
    pub(crate) fn of(op: &Op, queue: &Queue) -> Self {
        Self {
            give_back: op.give_back(queue.nonce()),
            queue: queue.clone(),
        }
    }

    fn of_release(op: Op, queue: &Queue) -> Self {
        Self {
            give_back: Some(op),
            queue: queue.clone(),
        }
    }

    /// Queues the release (in the background; a failure is logged).
    pub(crate) fn release(self) {
        if let Some(op) = self.give_back {
            self.queue.detach(op);
        }
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
    pub(crate) fn new(rx: oneshot::Receiver<T>, undo: Undo, holds: fn(&T) -> bool) -> Self {
        Self {
            rx: Some(rx),
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
        // After close() the sender's send fails and the sender undoes; a
        // reply that arrived before it is undone here.
        rx.close();
        if let Ok(reply) = rx.try_recv() {
            if (self.holds)(&reply) {
                undo.release();
            }
        }
    }
}
