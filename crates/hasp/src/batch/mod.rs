//! Group commit of acquire and release operations.
//!
//! Every acquire and release of a client goes through one queue. A
//! background task takes whatever is queued — one operation when the client
//! is idle, dozens when many tasks lock at once — and sends it as one
//! `batch.lua` call, which applies each operation on its own, in order.
//! Under load this replaces N script calls by one, saving Redis its
//! per-command dispatch and the client its per-request syscalls and
//! wake-ups (Redisson batches its renewals the same way).
//!
//! A batch never waits on a timer. It takes what is queued and, if that is
//! fewer than [`GATHER`] operations, lets the tasks already woken run once
//! first (they are typically the holders of the last replies, about to
//! queue their next operation). The call goes on the wire at once, on a
//! connection this task drives itself (see `connection`), so that Redis
//! works on one batch while the client gathers the next: up to
//! [`MAX_IN_FLIGHT`] calls overlap. Before, each call reached the socket
//! only after every task the last replies woke had run, so client and Redis
//! took turns; on a 2-core machine with 64 tasks locking and unlocking this
//! took a client from 73,000–76,000 to 94,000–100,000 lock/unlock pairs a
//! second (three interleaved runs of the lock benchmark, W1).
//!
//! A release of a lock that tasks of this client wait for is sent as a
//! hand-off to the first of them (see `handoff`).
//!
//! The task, not the caller, owns each operation once queued, which is what
//! makes the lock API cancel safe: a release always reaches Redis, and an
//! acquisition whose caller went away is released again here.
//!
//! All keys of one call must live in one Redis Cluster slot; the client is
//! for a standalone server (or one shard), where that always holds.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::aio::MultiplexedConnection;
use redis::RedisError;
use tokio::sync::{mpsc, oneshot};

use crate::config::Settings;
use crate::handoff::{Grant, Offer};
use crate::keys::LockKeys;
use crate::owner::Owner;
use crate::pubsub::PubSub;
use crate::scripts::{self, BATCH};

mod connection;
mod undo;

use connection::Connection;
pub(crate) use undo::{HoldReply, Undo};

/// Operations per script call. A call holds Redis for a few microseconds
/// per operation, so this bounds it to well under a millisecond.
const MAX_BATCH: usize = 100;
/// A batch with this many operations leaves without letting woken tasks add
/// theirs: big enough to amortise a call, small enough that Redis gets work
/// while the client is still busy (16 and 8 measured alike, W1).
const GATHER: usize = 16;
/// Script calls on the wire at once.
const MAX_IN_FLIGHT: usize = 8;
/// `batch.lua`'s answer to a hand-off it declined because another client
/// waits: the lock was freed and published.
const YIELDED: i64 = -2;
/// How long a client holds its own waiters back after it freed a lock for
/// another client's waiter: ample for that client to hear of it and ask
/// (a round trip or two), short enough not to matter if it went away.
const YIELD_GRACE: std::time::Duration = std::time::Duration::from_millis(10);

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
    /// Starts the batching task, with a connection of its own to the
    /// server `client` points at (made on first use); the task ends once
    /// this value is dropped and the queue is drained.
    pub(crate) fn start(
        client: redis::Client,
        settings: &Settings,
        client_id: Arc<str>,
        pubsub: Arc<PubSub>,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        let connection = Connection::new(
            client,
            settings.connection_timeout,
            settings.response_timeout,
        );
        let ctx = BatchContext { client_id, pubsub };
        runtime.spawn(run(rx, ctx, connection));
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
    ) -> impl Future<Output = Reply> + Send + 'static {
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
        let undo = self.undo(keys, owner);
        let rx = match self.queue.send(op) {
            Ok(()) => Some(rx),
            Err(_) => None, // the task is gone: the client is shutting down
        };
        let reply = HoldReply::new(rx, undo, |reply: &Reply| matches!(reply, Ok(t) if *t > 0));
        async move { reply.await.unwrap_or_else(|| Err(closed())) }
    }

    /// Queues the release of `holds` holds. Runs whether or not the returned
    /// future is awaited; a full release hands the lock to
    /// this client's first waiter, or wakes one (see `execute`).
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

impl Batcher {
    /// What releasing a hold of `owner` on this lock takes, for a caller
    /// that may vanish before it learns it holds the lock.
    pub(crate) fn undo(&self, keys: &Arc<LockKeys>, owner: &Owner) -> Undo {
        Undo {
            keys: keys.clone(),
            owner: owner.clone(),
            queue: self.queue.clone(),
        }
    }
}

fn closed() -> RedisError {
    RedisError::from((redis::ErrorKind::Client, "hasp client is shut down"))
}

struct BatchContext {
    client_id: Arc<str>,
    pubsub: Arc<PubSub>,
}

async fn run(
    mut queue: mpsc::UnboundedReceiver<Op>,
    ctx: BatchContext,
    mut connection: Connection,
) {
    // The calls on the wire are driven by this task itself: no task is
    // spawned per call, so a reply costs one wake-up, not two.
    let mut in_flight = FuturesUnordered::new();
    loop {
        tokio::select! {
            first = queue.recv(), if in_flight.len() < MAX_IN_FLIGHT => {
                let Some(first) = first else { break };
                let batch = gather(first, &mut queue).await;
                match connection.get().await {
                    Ok(conn) => {
                        in_flight.push(execute(&ctx, conn, batch));
                        // On the wire now: the call queues itself on the
                        // connection when first polled, the driver writes.
                        std::future::poll_fn(|cx| {
                            if let Poll::Ready(Some(Some(e))) = in_flight.poll_next_unpin(cx) {
                                connection.failed(&e);
                            }
                            let _ = connection.poll_drive(cx);
                            Poll::Ready(())
                        })
                        .await;
                    }
                    Err(e) => fail(batch, &e),
                }
            }
            Some(failure) = in_flight.next(), if !in_flight.is_empty() => {
                if let Some(e) = failure {
                    connection.failed(&e);
                }
            }
            () = std::future::poll_fn(|cx| connection.poll_drive(cx)) => {}
        }
    }
    // The client is gone: finish what is on the wire.
    while !in_flight.is_empty() {
        tokio::select! {
            _ = in_flight.next() => {}
            () = std::future::poll_fn(|cx| connection.poll_drive(cx)) => {}
        }
    }
}

/// `first` and whatever else is queued. If that is fewer than [`GATHER`]
/// operations, the tasks already woken run once first and what they queue
/// joins too (one `yield_now`: no timer, no wait when nothing else runs).
/// tokio resumes a yielded task only after the worker has polled its I/O
/// driver, so replies that arrived meanwhile wake their tasks in time to
/// join as well: waking itself instead measured 77,000–80,000 pairs/s in W1
/// at C = 64 against 90,000–100,000. Skipping the yield while no call is in
/// flight (an idle client) measured no better in W1 or W2.
async fn gather(first: Op, queue: &mut mpsc::UnboundedReceiver<Op>) -> Vec<Op> {
    let mut batch = Vec::with_capacity(GATHER);
    batch.push(first);
    let take = |batch: &mut Vec<Op>, queue: &mut mpsc::UnboundedReceiver<Op>| {
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
    };
    take(&mut batch, queue);
    if batch.len() < GATHER {
        tokio::task::yield_now().await;
        take(&mut batch, queue);
    }
    batch
}

/// Answers every operation of a batch that could not be sent with `error`.
fn fail(batch: Vec<Op>, error: &RedisError) {
    for op in batch {
        match op.reply {
            Some(tx) => {
                let _ = tx.send(Err(error.clone()));
            }
            None => {
                tracing::warn!(error = %error, lock = %op.keys.name, "background release failed");
            }
        }
    }
}

/// Sends one batch and answers its operations; returns the call's error, if
/// it failed.
async fn execute(
    ctx: &BatchContext,
    mut conn: MultiplexedConnection,
    batch: Vec<Op>,
) -> Option<RedisError> {
    // A release whose lock has local waiters hands it to the first of them.
    let offers: Vec<Option<Offer>> = batch
        .iter()
        .map(|op| match op.kind {
            Kind::Release { .. } => ctx.pubsub.take_offer(&op.keys.channel),
            Kind::Acquire { .. } => None,
        })
        .collect();
    // Keys and arguments as batch.lua lays them out; the owner ids are the
    // only long arguments (and the lease, up to 20 digits).
    let (mut keys, mut args, mut bytes) = (0, 1, ctx.client_id.len());
    for (op, offer) in batch.iter().zip(&offers) {
        let lock = op.keys.lock.len() + op.owner.id().len() + 4;
        (keys, args, bytes) = match (op.kind, offer) {
            (Kind::Acquire { .. }, _) => (keys + 2, args + 3, bytes + 2 * lock + 28),
            (Kind::Release { .. }, None) => (keys + 1, args + 2, bytes + lock + 10),
            (Kind::Release { .. }, Some(heir)) => (
                keys + 2,
                args + 5,
                bytes + 2 * lock + heir.owner.id().len() + 40,
            ),
        };
    }
    let mut cmd = scripts::evalsha(&BATCH, keys, keys + args, bytes);
    for (op, offer) in batch.iter().zip(&offers) {
        cmd.arg(&*op.keys.lock);
        if matches!(op.kind, Kind::Acquire { .. }) || offer.is_some() {
            cmd.arg(&op.keys.fence);
        }
    }
    cmd.arg(&*ctx.client_id);
    for (op, offer) in batch.iter().zip(&offers) {
        match (op.kind, offer) {
            (
                Kind::Acquire {
                    lease_ms,
                    will_wait,
                },
                _,
            ) => {
                let kind = if will_wait { "w" } else { "a" };
                cmd.arg(kind).arg(op.owner.id()).arg(lease_ms);
            }
            (Kind::Release { holds }, None) => {
                cmd.arg(holds).arg(op.owner.id());
            }
            (Kind::Release { holds }, Some(heir)) => {
                cmd.arg("h")
                    .arg(op.owner.id())
                    .arg(holds)
                    .arg(heir.owner.id())
                    .arg(heir.lease_ms);
            }
        }
    }
    let sent_at = Instant::now();
    let replies: Result<Vec<i64>, RedisError> = scripts::run::<Vec<i64>>(&BATCH, &cmd, &mut conn)
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
    for ((i, op), offer) in batch.into_iter().enumerate().zip(offers) {
        let mut reply = match &replies {
            Ok(r) => Ok(r[i]),
            Err(e) => Err(e.clone()),
        };
        let mut handed = None;
        match (offer, &reply) {
            (Some(heir), Ok(token)) if *token > 0 => {
                let grant = Grant {
                    token: token.unsigned_abs(),
                    sent_at,
                };
                handed = Some((heir, grant));
                reply = Ok(0); // for the releaser, a release
            }
            (Some(heir), Ok(YIELDED)) => {
                // Freed for another client that waits: it gets a head start
                // before this client's first waiter tries (it would win
                // every race, being told first), then this one's waiter
                // tries in case the other went away.
                ctx.pubsub.return_offer(&op.keys.channel, heir);
                let (pubsub, channel) = (ctx.pubsub.clone(), op.keys.channel.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(YIELD_GRACE).await;
                    pubsub.wake_one(&channel);
                });
                reply = Ok(0);
            }
            // Not handed over, still held: not by this owner, or with holds
            // left.
            (Some(heir), _) => ctx.pubsub.return_offer(&op.keys.channel, heir),
            (None, Ok(0)) if matches!(op.kind, Kind::Release { .. }) => {
                ctx.pubsub.wake_one(&op.keys.channel);
            }
            (None, _) => {}
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
        // After the releaser's reply, so that the heir is the task this
        // worker runs next (tokio runs the last task woken first).
        if let Some((heir, grant)) = handed {
            if let Err(owner) = heir.grant(grant) {
                undo.push(Op {
                    keys: op.keys.clone(),
                    owner,
                    kind: Kind::Release { holds: 1 },
                    reply: None,
                });
            }
        }
        if acquired && !delivered {
            undo.push(Op {
                kind: Kind::Release { holds: 1 },
                reply: None,
                ..op
            });
        }
    }
    let failure = replies.err();
    if !undo.is_empty() {
        if let Some(e) = Box::pin(execute(ctx, conn, undo)).await {
            tracing::warn!(error = %e, "releasing abandoned acquisitions failed");
        }
    }
    failure
}

#[cfg(test)]
mod tests {
    use super::*;

    fn undo_queue(owner: &Owner) -> (Undo, mpsc::UnboundedReceiver<Op>) {
        let (queue, rx) = mpsc::unbounded_channel();
        let undo = Undo {
            keys: Arc::new(LockKeys::new("hasp", "handed")),
            owner: owner.clone(),
            queue,
        };
        (undo, rx)
    }

    fn grant() -> Grant {
        Grant {
            token: 7,
            sent_at: Instant::now(),
        }
    }

    #[test]
    fn a_grant_that_reached_a_waiter_who_left_is_released_by_the_waiter_side() {
        let owner = Owner::from_id("heir").unwrap();
        let (undo, mut queue) = undo_queue(&owner);
        let (offer, pending) = Offer::new(owner.clone(), 1000, undo);
        offer.grant(grant()).unwrap();
        drop(pending); // the waiter stopped before it looked
        let op = queue.try_recv().expect("a release was queued");
        assert!(matches!(op.kind, Kind::Release { holds: 1 }));
        assert_eq!(op.owner, owner);
        assert!(op.reply.is_none());
    }

    #[test]
    fn a_grant_for_a_waiter_already_gone_comes_back_to_the_batcher() {
        let owner = Owner::from_id("heir").unwrap();
        let (undo, mut queue) = undo_queue(&owner);
        let (offer, pending) = Offer::new(owner.clone(), 1000, undo);
        drop(pending);
        assert!(!offer.is_live());
        assert_eq!(offer.grant(grant()).unwrap_err(), owner);
        assert!(queue.try_recv().is_err(), "the batcher releases it, once");
    }

    #[tokio::test]
    async fn a_grant_the_waiter_took_is_its_own() {
        let owner = Owner::from_id("heir").unwrap();
        let (undo, mut queue) = undo_queue(&owner);
        let (offer, mut pending) = Offer::new(owner, 1000, undo);
        offer.grant(grant()).unwrap();
        assert_eq!((&mut pending).await.map(|g| g.token), Some(7));
        assert!(pending.is_done());
        drop(pending);
        assert!(queue.try_recv().is_err(), "nothing to undo");
    }
}
