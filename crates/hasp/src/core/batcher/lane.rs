//! A lane's batching task: it gathers what is queued, sends it as calls
//! (up to [`MAX_IN_FLIGHT`] on the wire), drives its connection, and keeps
//! what lost replies leave to settle.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
#[cfg(feature = "cluster")]
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{RedisError, Value};
use tokio::sync::{mpsc, oneshot, Notify};

use super::call::{Call, Natives};
use super::connection::{self, Conn, Link};
use super::queue::Request;
use super::replies::{answered, failed, native_answered, redirected, send_again_later, Sent};
use super::repoll::Wakes;
#[cfg(feature = "cluster")]
use super::slots::{self, SlotMap};
use super::{
    CallStats, GATHER, MAX_BATCH, MAX_IN_FLIGHT, MAX_SETTLEMENTS, SETTLE_FIRST, SETTLE_LAST,
};
use crate::config::ReplicaAck;
use crate::core::scripts::{self, Library};
use crate::core::wire::native::Native;
use crate::core::wire::{self, Nonces, Op};
use crate::error::{is_redirect, Error};

/// A call on the wire: its future, boxed (see [`Task::execute`]).
type InFlight = std::pin::Pin<Box<dyn std::future::Future<Output = Sent> + Send>>;

/// Where a call goes in a cluster (which node); nothing without one.
#[cfg(feature = "cluster")]
type Route = RoutingInfo;
#[cfg(not(feature = "cluster"))]
type Route = std::convert::Infallible;

pub(super) struct Task {
    pub(super) client_id: Arc<str>,
    /// The batch function, or its cluster form.
    pub(super) script: &'static Library,
    /// The queue, to send redirected operations again (weak: the task ends
    /// when every handle is gone).
    pub(super) requeue: mpsc::WeakUnboundedSender<Request>,
    pub(super) replica_ack: Option<ReplicaAck>,
    pub(super) max_extends: usize,
    pub(super) connection: Link,
    /// Operations to send first, to settle calls whose replies were lost.
    pub(super) settlements: Vec<Op>,
    /// When to send the settlements on their own if nothing else goes out
    /// first, and the pause before the next such try.
    pub(super) settle_at: Option<Instant>,
    pub(super) settle_backoff: Duration,
    /// Requests to send again (once) after their call's connection broke.
    pub(super) retries: Vec<Request>,
    pub(super) nonces: Arc<Nonces>,
    pub(super) reconnected: Arc<Notify>,
    pub(super) stats: Arc<CallStats>,
}

/// The replies a call's native commands are waiting for: one command's,
/// several commands', or none (sent through the function instead).
enum Replies<One, Many> {
    One(One),
    Many(Many),
    #[cfg(feature = "cluster")]
    Scripted,
}

impl Task {
    pub(super) async fn run(
        mut self,
        mut queue: mpsc::UnboundedReceiver<Request>,
        connected: oneshot::Sender<()>,
        wakes: Wakes,
    ) {
        // Connect now rather than on the first call: that call would wait
        // for the connection, and the client's opening waits for it instead.
        // A failure here is met again (and reported) by the first call.
        let _ = self.connection.get().await;
        let _ = connected.send(());
        // The calls on the wire are driven by this task itself: no task is
        // spawned per call, so a reply costs one wake-up, not two.
        let mut in_flight = FuturesUnordered::<InFlight>::new();
        // Operations in the last batch: more than one means other tasks are
        // locking too, and a batch is worth gathering.
        let mut last_batch = 0;
        loop {
            // The `select!` below polls everything this task waits on:
            // whatever woke it so far is answered there, and polling it
            // all once more for those wakes would find nothing new.
            wakes.forget();
            let room = in_flight.len() < MAX_IN_FLIGHT;
            let reconnect_at = self.connection.reconnect_at();
            // In this order, every time: the connection first (it reads
            // the replies that complete calls), then the calls it completed,
            // then what to send. A reply is then handled in the poll that
            // read it, not in one more.
            let batch = tokio::select! {
                biased;
                () = std::future::poll_fn(|cx| self.connection.poll_drive(cx)) => continue,
                Some(sent) = in_flight.next(), if !in_flight.is_empty() => {
                    self.after(sent);
                    continue;
                }
                // Retries go out first, on their own if nothing else comes.
                () = std::future::ready(()), if room && !self.retries.is_empty() => {
                    std::mem::take(&mut self.retries)
                }
                // A broken connection is made again without waiting for a
                // call: the reconnect checks the holds (faults 5).
                () = sleep_until(reconnect_at), if reconnect_at.is_some() => {
                    match self.connection.get().await {
                        Ok(_) => self.reconnected.notify_one(),
                        Err(_) => self.connection.reconnect_failed(),
                    }
                    continue;
                }
                // Settlements go out on their own if nothing else does.
                () = sleep_until(self.settle_at), if room && self.settle_at.is_some() => {
                    self.settle_at = None;
                    Vec::new()
                }
                first = queue.recv(), if room => {
                    let Some(first) = first else { break };
                    let busy = last_batch > 1 || !in_flight.is_empty();
                    let gathered = gather(first, &mut queue, self.max_extends, busy).await;
                    let batch = if self.retries.is_empty() {
                        gathered
                    } else {
                        let mut batch = std::mem::take(&mut self.retries);
                        batch.extend(gathered);
                        batch
                    };
                    last_batch = batch.len();
                    batch
                }
            };
            let was_broken = self.connection.was_broken();
            let conn = match self.connection.get().await {
                Ok(conn) => conn,
                Err(e) => {
                    let pending = fail(batch, &Error::Redis(e));
                    self.settlements.extend(pending);
                    self.schedule_settlements(false);
                    continue;
                }
            };
            if was_broken {
                self.reconnected.notify_one();
            }
            let settle = std::mem::take(&mut self.settlements);
            match self.connection.slots() {
                #[cfg(feature = "cluster")]
                Some(slots) => {
                    for (route, settle, batch) in by_node(slots, settle, batch) {
                        let call = Call::scripted(settle, batch);
                        in_flight.push(self.execute(conn.clone(), Some(route), call));
                    }
                }
                _ => {
                    // Replica acknowledgement waits for the function's
                    // writes only: with it on, everything goes through it.
                    let native = match self.replica_ack {
                        None => self.connection.native(),
                        Some(_) => Native::default(),
                    };
                    let call = Call::split(settle, batch, native);
                    in_flight.push(self.execute(conn, None, call));
                }
            }
            // On the wire now: the call queues itself on the connection when
            // first polled, the driver writes.
            let mut sent = None;
            std::future::poll_fn(|cx| {
                if let Poll::Ready(Some(done)) = in_flight.poll_next_unpin(cx) {
                    sent = Some(done);
                }
                let _ = self.connection.poll_drive(cx);
                Poll::Ready(())
            })
            .await;
            if let Some(sent) = sent {
                self.after(sent);
            }
        }
        // The client is gone: finish what is on the wire.
        while !in_flight.is_empty() {
            tokio::select! {
                _ = in_flight.next() => {}
                () = std::future::poll_fn(|cx| self.connection.poll_drive(cx)) => {}
            }
        }
    }

    /// Sends `call`: its settlements and scripted requests as one call of
    /// the function (to the cluster node `route` names, if any), then its
    /// native commands, all at once; completes each request.
    fn execute(&self, conn: Conn, route: Option<Route>, call: Call) -> InFlight {
        let Call {
            settle,
            batch,
            native,
        } = call;
        // A call that carries renewals counts once, whether they go
        // through the function or as native commands.
        let renews = settle.iter().any(Op::is_extend)
            || batch.iter().any(|r| r.op.is_extend())
            || native.requests.iter().any(|r| r.op.is_extend());
        if renews {
            self.stats.renew_calls.fetch_add(1, Ordering::Relaxed);
        }
        // Boxed: the call's state is a few kilobytes, which the set of
        // calls in flight would otherwise copy in on every push.
        if native.requests.is_empty() {
            return Box::pin(self.call_script(conn, route, settle, batch));
        }
        if settle.is_empty() && batch.is_empty() {
            return Box::pin(self.call_native(conn, native));
        }
        let natives = self.call_native(conn.clone(), native);
        let scripted = self.call_script(conn, route, settle, batch);
        Box::pin(async move {
            let (mut sent, natives) = futures_util::future::join(scripted, natives).await;
            sent.merge(natives);
            sent
        })
    }

    /// Sends `native`'s commands (packed already: one write, as the
    /// function's call is) and completes each request.
    fn call_native(
        &self,
        conn: Conn,
        native: Natives,
    ) -> impl std::future::Future<Output = Sent> + Send + 'static {
        let stats = self.stats.clone();
        let nonces = self.nonces.clone();
        let requeue = self.requeue.clone();
        let Natives {
            mut requests,
            packed,
        } = native;
        let count = requests.len();
        // Queued now: on the wire before the call's function call, which
        // touches none of their locks.
        let replies = match &conn {
            Conn::Node(handle) if count == 1 => Replies::One(handle.send_packed_one(&packed)),
            Conn::Node(handle) => Replies::Many(handle.send_packed(count, &packed)),
            // Native commands are only split off on one server's connection.
            #[cfg(feature = "cluster")]
            Conn::Cluster(_) => Replies::Scripted,
        };
        async move {
            let values = match replies {
                Replies::One(reply) => {
                    let reply = reply.await;
                    return match requests.pop() {
                        Some(request) => native_answered(request, reply, &stats, &nonces, &requeue),
                        None => Sent::default(),
                    };
                }
                Replies::Many(replies) => replies.await.and_then(|values| {
                    if values.len() == count {
                        Ok(values)
                    } else {
                        Err(RedisError::from((
                            redis::ErrorKind::Client,
                            "pipeline reply of the wrong length",
                            format!("{} replies for {count} commands", values.len()),
                        )))
                    }
                }),
                #[cfg(feature = "cluster")]
                Replies::Scripted => {
                    for request in &mut requests {
                        request.scripted = true;
                    }
                    return Sent {
                        retries: requests,
                        ..Sent::default()
                    };
                }
            };
            let mut sent = Sent::default();
            match values {
                Ok(values) => {
                    for (request, value) in requests.into_iter().zip(values) {
                        let answered =
                            native_answered(request, Ok(value), &stats, &nonces, &requeue);
                        sent.merge(answered);
                    }
                }
                Err(e) => {
                    for request in requests {
                        let answered =
                            native_answered(request, Err(e.clone()), &stats, &nonces, &requeue);
                        sent.merge(answered);
                    }
                }
            }
            sent
        }
    }

    /// Sends `settle` and then `batch` as one call of the function (to the
    /// cluster node `route` names, if any) and completes each request of
    /// `batch`.
    fn call_script(
        &self,
        mut conn: Conn,
        route: Option<Route>,
        settle: Vec<Op>,
        batch: Vec<Request>,
    ) -> impl std::future::Future<Output = Sent> + Send + 'static {
        let ops = || settle.iter().chain(batch.iter().map(|r| &r.op));
        let script = self.script;
        // Nothing for the function (a call of native commands only): no
        // call is built.
        let cmd = (!settle.is_empty() || !batch.is_empty()).then(|| match route {
            Some(_) => wire::encode_spread(script, &self.client_id, ops()),
            None => wire::encode(script, &self.client_id, ops()),
        });
        let ack = self
            .replica_ack
            .filter(|_| ops().any(Op::needs_replicas))
            .map(|ack| {
                // No longer than the earliest wait it serves has left (at
                // least a millisecond: `WAIT 0` would wait forever).
                let ends = batch
                    .iter()
                    .filter(|r| r.op.needs_replicas())
                    .filter_map(|r| r.wait_ends)
                    .min();
                let left = ends.map_or(ack.timeout, |ends| {
                    ends.saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(1))
                });
                ReplicaAck {
                    timeout: ack.timeout.min(left),
                    ..ack
                }
            });
        let nonces = self.nonces.clone();
        let requeue = self.requeue.clone();
        async move {
            let Some(cmd) = cmd else {
                return Sent::default();
            };
            let count = settle.len() + batch.len();
            let reply = match (ack, route, &mut conn) {
                #[cfg(feature = "cluster")]
                (_, Some(route), Conn::Cluster(cluster)) => {
                    scripts::run_routed(script, &cmd, cluster, route)
                        .await
                        .map(|value| (value, None))
                }
                (None, _, _) => scripts::run::<Value>(script, &cmd, &mut conn)
                    .await
                    .map(|value| (value, None)),
                (Some(ack), _, _) => scripts::run_then_wait(script, &cmd, ack, &mut conn)
                    .await
                    .map(|(value, acked)| (value, Some((acked, ack.replicas)))),
            };
            let reply = reply
                .map_err(Error::Redis)
                .and_then(|(value, acks)| Ok((wire::split(value, count)?, acks)));
            match reply {
                Ok((values, acks)) => {
                    let (sent, misrouted) = answered(settle, batch, values, acks);
                    send_again_later(misrouted, requeue);
                    sent
                }
                // A demoted master refuses the whole call up front (the
                // functions are not flagged `no-writes`); in a cluster it
                // does so without a redirect when the call declares no
                // keys (several slots), so only a fresh map moves it on.
                Err(Error::Redis(e)) if is_redirect(&e) || connection::is_read_only(&e) => {
                    redirected(e, settle, batch, requeue)
                }
                Err(e) => failed(&e, settle, batch, &nonces),
            }
        }
    }

    fn after(&mut self, sent: Sent) {
        if let Some(e) = &sent.error {
            self.connection.failed(e);
        }
        if sent.stale {
            self.connection.stale();
        }
        if sent.misrouted {
            self.connection.misrouted();
        }
        if sent.scripts_lost {
            self.connection.scripts_lost();
        }
        self.retries.extend(sent.retries);
        self.schedule_settlements(sent.error.is_none());
        if !sent.unsettled.is_empty() {
            tracing::debug!(
                operations = sent.unsettled.len(),
                "a call's reply was lost; settling it on the next call"
            );
            self.settlements.extend(sent.unsettled);
            if self.settlements.len() > MAX_SETTLEMENTS {
                let excess = self.settlements.len() - MAX_SETTLEMENTS;
                tracing::warn!(dropped = excess, "too many lost replies to settle");
                self.settlements.drain(..excess);
            }
            self.schedule_settlements(false);
        }
    }

    /// Arms the timer that sends pending settlements on their own; after a
    /// success the pause starts short again.
    fn schedule_settlements(&mut self, succeeded: bool) {
        if succeeded {
            self.settle_backoff = SETTLE_FIRST;
        }
        if self.settlements.is_empty() {
            self.settle_at = None;
        } else if self.settle_at.is_none() {
            self.settle_at = Some(Instant::now() + self.settle_backoff);
            self.settle_backoff = (self.settle_backoff * 2).min(SETTLE_LAST);
        }
    }
}

#[cfg(feature = "cluster")]
/// Splits settlements and requests by the cluster node that serves their
/// keys' slot (any master when the map does not say), keeping their order
/// within each node.
#[cfg(feature = "cluster")]
fn by_node<'s>(
    slots: &'s SlotMap,
    settle: Vec<Op>,
    batch: Vec<Request>,
) -> Vec<(RoutingInfo, Vec<Op>, Vec<Request>)> {
    let mut groups: Vec<(Option<&'s slots::Node>, Vec<Op>, Vec<Request>)> = Vec::new();
    let mut group = |node: Option<&'s slots::Node>| -> usize {
        match groups.iter().position(|(n, _, _)| *n == node) {
            Some(i) => i,
            None => {
                groups.push((node, Vec::new(), Vec::new()));
                groups.len() - 1
            }
        }
    };
    let mut placed = Vec::new();
    for op in settle {
        placed.push((group(slots.node(op.keys().slot)), Some(op), None));
    }
    for request in batch {
        placed.push((
            group(slots.node(request.op.keys().slot)),
            None,
            Some(request),
        ));
    }
    for (i, op, request) in placed {
        groups[i].1.extend(op);
        groups[i].2.extend(request);
    }
    groups
        .into_iter()
        .map(|(node, settle, batch)| {
            let route = match node {
                Some(node) => node.route(),
                None => RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary),
            };
            (route, settle, batch)
        })
        .collect()
}

/// Resolves at `at` (never without one).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// `first` and whatever else is queued, up to [`MAX_BATCH`] operations of
/// which at most `max_extends` renewals. If that is fewer than [`GATHER`]
/// operations and the lane is `busy` (its last batch had several
/// operations, or a call is on the wire) or this one has several already,
/// the tasks already woken run once first and what they queue joins too
/// (one `yield_now`: no timer, no wait when nothing else runs). tokio
/// resumes a yielded task only after the worker has polled its I/O driver,
/// so replies that arrived meanwhile wake their tasks in time to join as
/// well. A lone operation on an idle lane leaves at once: the yield would
/// find nothing to add and cost a pass of the I/O driver and a wake-up of
/// the other worker (system calls per pair: `benches/README.md`).
async fn gather(
    first: Request,
    queue: &mut mpsc::UnboundedReceiver<Request>,
    max_extends: usize,
    busy: bool,
) -> Vec<Request> {
    let mut extends = usize::from(first.op.is_extend());
    // Room for a few: a batch is mostly small, and an allocation over
    // about a kilobyte misses the allocator's per-thread cache.
    let mut batch = Vec::with_capacity(GATHER / 2);
    batch.push(first);
    let mut take = |batch: &mut Vec<Request>, queue: &mut mpsc::UnboundedReceiver<Request>| {
        while batch.len() < MAX_BATCH && extends < max_extends {
            match queue.try_recv() {
                Ok(request) => {
                    extends += usize::from(request.op.is_extend());
                    batch.push(request);
                }
                Err(_) => break,
            }
        }
    };
    take(&mut batch, queue);
    if batch.len() < GATHER && (busy || batch.len() > 1) {
        tokio::task::yield_now().await;
        take(&mut batch, queue);
    }
    batch
}

/// Answers every request of a batch that could not be sent; returns what
/// must still reach Redis (see `Op::unfinished`).
fn fail(batch: Vec<Request>, error: &Error) -> Vec<Op> {
    let mut pending = Vec::new();
    for request in batch {
        pending.extend(request.op.unfinished());
        (request.done)(Err(error.clone()));
    }
    pending
}
