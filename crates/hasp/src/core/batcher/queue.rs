//! The queue of a client's lock operations: what a caller hands the
//! batcher ([`Request`], with its completion), and the handle that queues
//! it on the lane its lock's name hashes to.

use std::sync::Arc;
use std::time::Instant;

use redis::RedisError;
use tokio::sync::{mpsc, oneshot};

use crate::core::keys::LockKeys;
use crate::core::wire::lock::LockOp;
use crate::core::wire::native::{Native, NativeCommand};
use crate::core::wire::{self, Nonces, Op, Reply};
use crate::error::Error;
use hasp_owner::Owner;

/// What the batcher calls with an operation's reply.
pub(crate) type Completion = Box<dyn FnOnce(Result<Reply, Error>) + Send>;

/// One queued operation and what to do with its reply.
pub(crate) struct Request {
    pub(super) op: Op,
    pub(super) done: Completion,
    /// Sent once already, in a call whose connection broke.
    pub(super) retried: bool,
    /// Times sent again after a redirect.
    pub(super) redirects: u8,
    /// Its native command found the lock otherwise: it goes through the
    /// function (`wire::native`).
    pub(super) scripted: bool,
    /// The end of the wait it was sent for ([`WAIT_ENDS`]): with replica
    /// acknowledgement its call's `WAIT` lasts no longer.
    pub(super) wait_ends: Option<Instant>,
}

tokio::task_local! {
    /// The end of the wait the operations queued in this scope are sent
    /// for (a caller's `lock_within`, ...). With replica acknowledgement a
    /// try's `WAIT` then ends by it, so that a wait does not outlast its
    /// bound by an acknowledgement's time-out (and a try never has to be
    /// given up half way, which would let the next one overlap it).
    pub(crate) static WAIT_ENDS: Option<Instant>;
}

impl Request {
    /// The native command for this request's operation on a server
    /// offering `native` (in a call `crowded` with operations), unless its
    /// command already found the lock otherwise.
    pub(super) fn native_command(
        &self,
        native: Native,
        crowded: bool,
    ) -> Option<NativeCommand<'_>> {
        if self.scripted {
            return None;
        }
        self.op.native(native, crowded)
    }

    /// What to send again after this request went out in a call whose
    /// connection broke: settlements first (whatever the call may have
    /// done is undone, or a release completed), then, once, the request
    /// itself (an acquisition with a new nonce; a release is carried by its
    /// settlement, whose reply it gets). `None` for the request when it was
    /// retried already: its caller then gets the error.
    pub(super) fn after_broken_call(
        self,
        retry: bool,
        nonces: &Nonces,
    ) -> (Vec<Op>, Option<Request>) {
        let mut settle = self.op.settlement();
        if !retry || self.retried {
            (self.done)(Err(broken()));
            return (settle, None);
        }
        if self.op.is_release() {
            // A release's settlement ends with the release it redoes.
            let Some(carrier) = settle.pop() else {
                (self.done)(Err(broken()));
                return (settle, None);
            };
            let done = self.done;
            let retry = Request {
                redirects: 0,
                scripted: self.scripted,
                wait_ends: self.wait_ends,
                op: carrier,
                done: Box::new(move |reply| done(reply.map(Reply::of_redone_release))),
                retried: true,
            };
            return (settle, Some(retry));
        }
        // An acquisition goes again under a new nonce (its settlement
        // undoes the first by the old one).
        let op = self.op.renonced(nonces.next()).unwrap_or(self.op);
        let retry = Request {
            op,
            done: self.done,
            retried: true,
            redirects: 0,
            scripted: self.scripted,
            wait_ends: self.wait_ends,
        };
        (settle, Some(retry))
    }
}

/// A cloneable handle on the queue of a client's lock operations.
#[derive(Clone)]
pub(crate) struct Queue {
    /// One queue per lane; a lock's operations all take the same lane.
    pub(super) lanes: Arc<[mpsc::UnboundedSender<Request>]>,
    pub(super) nonces: Arc<Nonces>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").finish_non_exhaustive()
    }
}

impl Queue {
    /// A fresh operation id.
    pub(crate) fn nonce(&self) -> wire::Nonce {
        self.nonces.next()
    }

    /// Queues `op`; `done` gets its reply, or the error that kept it from
    /// Redis (called at once if the client is shut down).
    pub(crate) fn send(&self, op: Op, done: Completion) {
        let request = Request {
            op,
            done,
            retried: false,
            redirects: 0,
            scripted: false,
            wait_ends: WAIT_ENDS.try_with(|ends| *ends).ok().flatten(),
        };
        // By name: every operation on a lock takes one lane, in order.
        let lane = &self.lanes[request.op.keys().shard % self.lanes.len()];
        if let Err(mpsc::error::SendError(request)) = lane.send(request) {
            (request.done)(Err(closed()));
        }
    }

    /// Queues `op` and returns its reply. The operation runs whether or not
    /// the receiver is kept; if it is gone when a reply that grants
    /// something arrives (a hold, permits), that is given back again (the
    /// caller left).
    pub(crate) fn call(&self, op: Op) -> oneshot::Receiver<Result<Reply, Error>> {
        let (tx, rx) = oneshot::channel();
        let undo = op.give_back(self.nonce());
        let queue = self.clone();
        self.send(
            op,
            Box::new(move |reply| {
                if let Err(Ok(reply)) = tx.send(reply) {
                    if let Some(undo) = undo.filter(|_| reply.grants()) {
                        queue.detach(undo);
                    }
                }
            }),
        );
        rx
    }

    /// Queues `op` and logs a failure: nobody waits for the reply.
    pub(crate) fn detach(&self, op: Op) {
        let name = op.keys().name.clone();
        self.send(
            op,
            Box::new(move |reply| {
                if let Err(e) = reply {
                    tracing::warn!(error = %e, lock = %name, "background lock operation failed");
                }
            }),
        );
    }

    /// Queues the release of one hold of `owner` (a hold that nobody will
    /// use: its recipient went away).
    pub(crate) fn release_one(&self, keys: Arc<LockKeys>, owner: Owner) {
        let nonce = self.nonce();
        self.detach(Op::Lock(LockOp::Release {
            keys,
            owner,
            holds: 1,
            nonce,
            written: None,
        }));
    }
}

pub(super) fn closed() -> Error {
    Error::Redis(RedisError::from((
        redis::ErrorKind::Client,
        "hasp client is shut down",
    )))
}

fn broken() -> Error {
    Error::Redis(RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "the connection to Redis broke during the call",
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_queue_is_an_error_not_a_panic() {
        assert!(matches!(closed(), Error::Redis(_)));
    }
}
