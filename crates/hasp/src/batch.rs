//! Group commit of acquire and release operations.
//!
//! Every acquire and release of a client goes through one queue. A
//! background task takes whatever is queued — one operation when the client
//! is idle, dozens when many tasks lock at once — and sends it as one
//! `batch.lua` call, which applies each operation on its own, in order.
//! Nothing waits for a batch to fill: an operation is sent as soon as one of
//! the [`MAX_IN_FLIGHT`] call slots is free, and batches form only from what
//! queued up while those calls were on the wire. Under load this replaces N
//! script calls by one, saving Redis its per-command dispatch and the client
//! its per-request syscalls and wake-ups (Redisson batches its renewals the
//! same way).
//!
//! The task, not the caller, owns each operation once queued, which is what
//! makes the lock API cancel safe: a release always reaches Redis, and an
//! acquisition whose caller went away is released again here.
//!
//! All keys of one call must live in one Redis Cluster slot; the client is
//! for a standalone server (or one shard), where that always holds.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::aio::ConnectionManager;
use redis::RedisError;
use tokio::sync::{mpsc, oneshot};

use crate::keys::LockKeys;
use crate::owner::Owner;
use crate::pubsub::PubSub;
use crate::scripts::{self, BATCH};

/// Operations per script call. A call holds Redis for a few microseconds
/// per operation, so this bounds it to well under a millisecond.
const MAX_BATCH: usize = 100;
/// Script calls on the wire at once. One leaves the pipe idle while a reply
/// travels back; more than two spreads the load over smaller batches (both
/// measured slower in W1 of the lock benchmark).
const MAX_IN_FLIGHT: usize = 2;

type Reply = Result<i64, RedisError>;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Acquire { lease_ms: u64, will_wait: bool },
    Release { holds: u32 },
}

#[derive(Debug)]
struct Op {
    keys: Arc<LockKeys>,
    owner: Owner,
    kind: Kind,
    reply: Option<oneshot::Sender<Reply>>,
}

/// The queue of a client's lock operations.
#[derive(Debug)]
pub(crate) struct Batcher {
    queue: mpsc::UnboundedSender<Op>,
}

impl Batcher {
    /// Starts the batching task; it ends once this value is dropped and the
    /// queue is drained.
    pub(crate) fn start(
        conn: ConnectionManager,
        client_id: Arc<str>,
        pubsub: Arc<PubSub>,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        runtime.spawn(run(
            rx,
            BatchContext {
                conn,
                client_id,
                pubsub,
            },
        ));
        Self { queue }
    }

    /// Queues one acquire attempt. The reply is the script's result for it
    /// (see `batch.lua`). Dropping the reply before it resolves undoes a
    /// successful acquisition.
    pub(crate) fn acquire(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Owner,
        lease_ms: u64,
        will_wait: bool,
    ) -> AcquireReply {
        let (tx, rx) = oneshot::channel();
        let op = Op {
            keys: keys.clone(),
            owner: owner.clone(),
            kind: Kind::Acquire {
                lease_ms,
                will_wait,
            },
            reply: Some(tx),
        };
        let undo = UndoInfo {
            keys: keys.clone(),
            owner: owner.clone(),
            queue: self.queue.clone(),
        };
        let rx = match self.queue.send(op) {
            Ok(()) => Some(rx),
            Err(_) => None, // the task is gone: the client is shutting down
        };
        AcquireReply {
            rx,
            undo: Some(undo),
        }
    }

    /// Queues the release of `holds` holds. Runs whether or not the returned
    /// future is awaited; on a full release one local waiter is woken.
    pub(crate) fn release(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Owner,
        holds: u32,
    ) -> impl Future<Output = Reply> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        let queued = self
            .queue
            .send(Op {
                keys: keys.clone(),
                owner: owner.clone(),
                kind: Kind::Release { holds },
                reply: Some(tx),
            })
            .is_ok();
        async move {
            if !queued {
                return Err(closed());
            }
            rx.await.unwrap_or_else(|_| Err(closed()))
        }
    }
}

impl Batcher {
    /// Queues the release of `holds` holds without waiting for the result
    /// (a dropped guard); a failure is logged.
    pub(crate) fn release_detached(&self, keys: &Arc<LockKeys>, owner: &Owner, holds: u32) {
        let _ = self.queue.send(Op {
            keys: keys.clone(),
            owner: owner.clone(),
            kind: Kind::Release { holds },
            reply: None,
        });
    }
}

fn closed() -> RedisError {
    RedisError::from((redis::ErrorKind::Client, "hasp client is shut down"))
}

/// What undoing an abandoned acquisition needs.
#[derive(Debug)]
struct UndoInfo {
    keys: Arc<LockKeys>,
    owner: Owner,
    queue: mpsc::UnboundedSender<Op>,
}

impl UndoInfo {
    fn release(self) {
        let _ = self.queue.send(Op {
            keys: self.keys,
            owner: self.owner,
            kind: Kind::Release { holds: 1 },
            reply: None,
        });
    }
}

/// The pending result of an acquire. Cancel safe: if dropped before it
/// resolves, an acquisition that happens anyway is released.
#[derive(Debug)]
pub(crate) struct AcquireReply {
    rx: Option<oneshot::Receiver<Reply>>,
    undo: Option<UndoInfo>,
}

impl Future for AcquireReply {
    type Output = Reply;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Reply> {
        let Some(rx) = self.rx.as_mut() else {
            return Poll::Ready(Err(closed()));
        };
        let reply = match Pin::new(rx).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(reply) => reply.unwrap_or_else(|_| Err(closed())),
        };
        self.rx = None;
        self.undo = None; // delivered: the caller owns the result now
        Poll::Ready(reply)
    }
}

impl Drop for AcquireReply {
    fn drop(&mut self) {
        let (Some(mut rx), Some(undo)) = (self.rx.take(), self.undo.take()) else {
            return;
        };
        // After close() the task's send fails and the task undoes; a reply
        // that arrived before it is undone here.
        rx.close();
        if let Ok(Ok(token)) = rx.try_recv() {
            if token > 0 {
                undo.release();
            }
        }
    }
}

#[derive(Clone)]
struct BatchContext {
    conn: ConnectionManager,
    client_id: Arc<str>,
    pubsub: Arc<PubSub>,
}

async fn run(mut queue: mpsc::UnboundedReceiver<Op>, ctx: BatchContext) {
    // The batches on the wire are driven by this task itself: no task is
    // spawned per batch, so a reply costs one wake-up, not two.
    let mut in_flight = FuturesUnordered::new();
    loop {
        tokio::select! {
            // Take new operations only while a call slot is free: those
            // arriving meanwhile accumulate and leave together.
            first = queue.recv(), if in_flight.len() < MAX_IN_FLIGHT => {
                let Some(first) = first else { break };
                let mut batch = Vec::with_capacity(8);
                batch.push(first);
                while batch.len() < MAX_BATCH {
                    match queue.try_recv() {
                        Ok(op) => batch.push(op),
                        Err(_) => break,
                    }
                }
                in_flight.push(execute(&ctx, batch));
            }
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
        }
    }
    // The client is gone: finish what is on the wire.
    while in_flight.next().await.is_some() {}
}

async fn execute(ctx: &BatchContext, batch: Vec<Op>) {
    // Keys and arguments as batch.lua lays them out; the owner id is the
    // only long argument (and the lease, up to 20 digits).
    let (mut keys, mut args, mut bytes) = (0, 1, ctx.client_id.len());
    for op in &batch {
        let lock = op.keys.lock.len() + op.owner.id().len() + 4;
        (keys, args, bytes) = match op.kind {
            Kind::Acquire { .. } => (keys + 2, args + 3, bytes + 2 * lock + 28),
            Kind::Release { .. } => (keys + 1, args + 2, bytes + lock + 10),
        };
    }
    let mut cmd = scripts::evalsha(&BATCH, keys, keys + args, bytes);
    for op in &batch {
        cmd.arg(&*op.keys.lock);
        if let Kind::Acquire { .. } = op.kind {
            cmd.arg(&op.keys.fence);
        }
    }
    cmd.arg(&*ctx.client_id);
    for op in &batch {
        match op.kind {
            Kind::Acquire {
                lease_ms,
                will_wait,
            } => {
                let kind = if will_wait { "w" } else { "a" };
                cmd.arg(kind).arg(op.owner.id()).arg(lease_ms);
            }
            Kind::Release { holds } => {
                cmd.arg(holds).arg(op.owner.id());
            }
        }
    }
    let replies: Result<Vec<i64>, RedisError> =
        scripts::run::<Vec<i64>>(&BATCH, &cmd, &mut ctx.conn.clone())
            .await
            .and_then(|r| {
                if r.len() == batch.len() {
                    Ok(r)
                } else {
                    Err(RedisError::from((
                        redis::ErrorKind::Parse,
                        "batch reply has the wrong length",
                    )))
                }
            });
    let mut undo = Vec::new();
    for (i, op) in batch.into_iter().enumerate() {
        let reply = match &replies {
            Ok(r) => Ok(r[i]),
            Err(e) => Err(e.clone()),
        };
        if let (Kind::Release { .. }, Ok(0)) = (op.kind, &reply) {
            ctx.pubsub.wake_one(&op.keys.channel);
        }
        let acquired = matches!((op.kind, &reply), (Kind::Acquire { .. }, Ok(t)) if *t > 0);
        let delivered = match op.reply {
            Some(tx) => tx.send(reply).is_ok(),
            None => {
                if let Err(e) = reply {
                    tracing::warn!(error = %e, lock = %op.keys.name, "background release failed");
                }
                true
            }
        };
        if acquired && !delivered {
            undo.push(Op {
                kind: Kind::Release { holds: 1 },
                reply: None,
                ..op
            });
        }
    }
    if !undo.is_empty() {
        Box::pin(execute(ctx, undo)).await;
    }
}
