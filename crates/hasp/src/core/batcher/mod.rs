//! Group commit of a client's lock operations.
//!
//! Every change a client makes to its locks — acquire, release, hand-off,
//! renewal, force — goes through one queue. A background task takes
//! whatever is queued (one operation when the client is idle, dozens when
//! many tasks lock at once) and sends it as one call of the batch function
//! (`wire`),
//! which applies each operation on its own, in order. Under load this
//! replaces N script calls by one, saving Redis its per-command dispatch and
//! the client its per-request syscalls and wake-ups.
//!
//! A batch never waits on a timer. It takes what is queued and, if that is
//! fewer than [`GATHER`] operations while other tasks are locking too, lets
//! the tasks already woken run once first (they are typically the holders
//! of the last replies, about to queue their next operation). The call goes on the wire at once, on a
//! connection this task drives itself (`connection`), so that Redis works on
//! one batch while the client gathers the next: up to [`MAX_IN_FLIGHT`]
//! calls overlap. (Measurements: `benches/README.md`.)
//!
//! The batcher knows operations and replies, nothing of what they are for:
//! each queued [`Request`] carries its own completion, which the batcher
//! calls with the operation's reply. The task, not the caller, owns an
//! operation once queued, which is what makes the lock API cancel safe: a
//! release always reaches Redis, and a reply that gives a hold to a caller
//! who left is released again ([`Queue::call`]).
//!
//! **Lanes.** A client has several batching tasks (lanes, 4 by default,
//! `Settings::set_lanes`), each with its own connection; a lock's
//! operations always take the lane its name hashes to, so they stay in
//! order, and everything below holds per lane. One lane runs in lock step
//! at moderate concurrency: its tasks' operations leave together, Redis
//! runs them while the client waits, the replies wake the tasks together,
//! and the client works while Redis waits. Lanes fall out of step with
//! each other, so Redis and the client both stay busy (figures in
//! `benches/README.md`).
//!
//! **Lost replies.** When a call fails after it may have reached Redis
//! (connection dropped, time-out), its callers get the error, and each of
//! its operations leaves a settlement (`wire::Op::settlement`): an undo for
//! an acquisition, a redo for a release. Settlements go first in the next
//! call, ahead of anything queued later, and until one gets an answer; they
//! are no-ops where there is nothing to undo or redo. So an error means "not
//! held", and a hold Redis applied but nobody learnt of is freed as soon as
//! Redis can be reached again.
//!
//! **Reconnects.** A broken connection is made again within milliseconds of
//! the server answering, without waiting for a call (`connection`), and the
//! batcher says so ([`Batcher::start`]'s `reconnected`), so that the holds
//! are checked at once (faults 5).
//!
//! **Redis Cluster.** To a cluster the batcher splits what it gathered by
//! node (`slots`: its map of which node serves which slot) and sends one
//! call per node, all at once, over redis-rs's connections to the nodes;
//! the keys go as arguments, since a call's declared keys must share a
//! slot. An operation that reaches a node that no longer serves its slot
//! (a migration, a failover) fails alone without effect; it is sent again
//! after a short pause, and the map is fetched afresh. A whole call turned
//! away (`TRYAGAIN`, `CLUSTERDOWN`, or `READONLY` from a demoted master,
//! which redirects nothing to a call that declares no keys) is sent again
//! the same way. redis-rs
//! itself never resends a call: a function call sent twice could apply
//! twice.
//! Nothing above this module changes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::{RedisError, Value};
use tokio::sync::{mpsc, oneshot, Notify};

use super::keys;
use super::scripts::{self, Library, BATCH, BATCH_SHARDED};
use super::wire::lock::LockOp;
use super::wire::native::{Native, NativeCommand};
use super::wire::{self, Nonces, Op, Reply};
use crate::config::{ReplicaAck, Settings};
use crate::error::{is_redirect, Error};
use hasp_owner::Owner;

mod connection;
mod repoll;
mod slots;
mod socket;

use connection::{Conn, Connection, Link};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use repoll::{Repoll, Wakes};
use slots::SlotMap;

/// Locks per script call. A call holds Redis for a few microseconds per
/// lock, so this bounds it to well under a millisecond.
const MAX_BATCH: usize = 100;
/// A batch with this many operations leaves without letting woken tasks add
/// theirs: big enough to amortise a call, small enough that Redis gets work
/// while the client is still busy.
const GATHER: usize = 16;
/// Script calls on the wire at once.
const MAX_IN_FLIGHT: usize = 8;
/// A call of this many operations sends a lock's acquisitions through the
/// function rather than as its acquisition script (`wire::native`).
const CROWDED: usize = 16;
/// Settlements kept while Redis cannot be reached; past this the oldest
/// are dropped (their holds expire with their leases).
const MAX_SETTLEMENTS: usize = 10_000;
/// When nothing else goes out, settlements are sent on their own after
/// this pause, doubled after each failure up to [`SETTLE_LAST`].
const SETTLE_FIRST: Duration = Duration::from_millis(20);
const SETTLE_LAST: Duration = Duration::from_secs(1);
/// Times an operation is sent again after its call was redirected, at
/// [`REDIRECT_PAUSE`] intervals (a slot migration or a failover in a
/// cluster): then its caller gets the error.
const MAX_REDIRECTS: u8 = 50;
const REDIRECT_PAUSE: Duration = Duration::from_millis(20);

/// Where the batcher sends its calls.
pub(crate) enum Target {
    /// One server (or a Sentinel service's current master).
    Server(Arc<super::endpoint::Endpoint>),
    /// A Redis Cluster.
    Cluster(redis::cluster_async::ClusterConnection),
}

/// A call on the wire: its future, boxed (see [`Task::execute`]).
type InFlight = std::pin::Pin<Box<dyn std::future::Future<Output = Sent> + Send>>;

/// What the batcher calls with an operation's reply.
pub(crate) type Completion = Box<dyn FnOnce(Result<Reply, Error>) + Send>;

/// One queued operation and what to do with its reply.
pub(crate) struct Request {
    op: Op,
    done: Completion,
    /// Sent once already, in a call whose connection broke.
    retried: bool,
    /// Times sent again after a redirect.
    redirects: u8,
    /// Its native command found the lock otherwise: it goes through the
    /// function (`wire::native`).
    scripted: bool,
    /// The end of the wait it was sent for ([`WAIT_ENDS`]): with replica
    /// acknowledgement its call's `WAIT` lasts no longer.
    wait_ends: Option<Instant>,
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
    fn native_command(&self, native: Native, crowded: bool) -> Option<NativeCommand<'_>> {
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
    fn after_broken_call(self, retry: bool, nonces: &Nonces) -> (Vec<Op>, Option<Request>) {
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
                // Nothing to redo: the release was applied, or the hold
                // is gone; either way it is released.
                done: Box::new(move |reply| {
                    done(reply.map(|r| match r {
                        Reply::NotHeld => Reply::Released,
                        other => other,
                    }))
                }),
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

/// Counters of the batcher's calls.
#[derive(Debug, Default)]
pub(crate) struct CallStats {
    /// Script calls that carried lease renewals.
    pub(crate) renew_calls: AtomicU64,
    /// Operations a native command applied (`wire::native`).
    pub(crate) native_ops: AtomicU64,
    /// Native commands that found the lock otherwise (the operation then
    /// went through the function).
    pub(crate) native_fallbacks: AtomicU64,
}

/// A cloneable handle on the queue of a client's lock operations.
#[derive(Clone)]
pub(crate) struct Queue {
    /// One queue per lane; a lock's operations all take the same lane.
    lanes: Arc<[mpsc::UnboundedSender<Request>]>,
    nonces: Arc<Nonces>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").finish_non_exhaustive()
    }
}

/// The batching task's handle: queues operations; the task ends once every
/// handle is dropped and the queue is drained.
#[derive(Debug)]
pub(crate) struct Batcher;

impl Batcher {
    /// Starts the batching tasks, one per lane (`settings.lanes`; one for a
    /// cluster), each with a connection of its own to the server `target`
    /// names, with `settings`' timeouts, renewals per
    /// call and replica acknowledgement. `reconnected` is notified when a
    /// connection is made again after it broke. The lanes start connecting
    /// at once; [`Connecting::wait`] waits for them.
    pub(crate) fn start(
        target: Target,
        client_id: Arc<str>,
        settings: &Settings,
        reconnected: Arc<Notify>,
        stats: Arc<CallStats>,
        runtime: &tokio::runtime::Handle,
    ) -> (Queue, Connecting) {
        let nonces = Arc::new(Nonces::new());
        let probe_key: Arc<str> = keys::probe_key(&settings.prefix).into();
        // A cluster gets one lane: its calls already go out per node, and
        // a lane per node would be the same.
        let targets: Vec<Target> = match target {
            Target::Server(endpoint) => (0..settings.lanes)
                .map(|_| Target::Server(endpoint.clone()))
                .collect(),
            cluster @ Target::Cluster(_) => vec![cluster],
        };
        let mut lanes = Vec::with_capacity(targets.len());
        let mut connecting = Vec::with_capacity(targets.len());
        for target in targets {
            let (requests, rx) = mpsc::unbounded_channel();
            let (connection, script) = match target {
                Target::Server(endpoint) => (
                    Link::Node(Box::new(Connection::new(
                        endpoint,
                        settings.connection_timeout,
                        settings.response_timeout,
                        probe_key.clone(),
                    ))),
                    &*BATCH,
                ),
                Target::Cluster(conn) => (
                    Link::Cluster {
                        conn,
                        broken: false,
                        slots: Box::new(SlotMap::empty()),
                    },
                    &*BATCH_SHARDED,
                ),
            };
            let task = Task {
                client_id: client_id.clone(),
                script,
                requeue: requests.downgrade(),
                replica_ack: settings.replica_ack,
                max_extends: settings.renew_batch,
                connection,
                settlements: Vec::new(),
                settle_at: None,
                settle_backoff: SETTLE_FIRST,
                retries: Vec::new(),
                nonces: nonces.clone(),
                reconnected: reconnected.clone(),
                stats: stats.clone(),
            };
            let (connected, done) = oneshot::channel();
            // The task polls its connection and its calls itself: see `repoll`.
            runtime.spawn(Repoll::with(|wakes| task.run(rx, connected, wakes)));
            lanes.push(requests);
            connecting.push(done);
        }
        let queue = Queue {
            lanes: lanes.into(),
            nonces,
        };
        (queue, Connecting(connecting))
    }
}

/// The lanes' first connections, being made (see [`Batcher::start`]).
pub(crate) struct Connecting(Vec<oneshot::Receiver<()>>);

impl Connecting {
    /// Waits until every lane has connected or failed to (each within the
    /// connection timeout).
    pub(crate) async fn wait(self) {
        for lane in self.0 {
            let _ = lane.await;
        }
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
    pub(crate) fn release_one(&self, keys: Arc<super::keys::LockKeys>, owner: Owner) {
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

fn closed() -> Error {
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

/// An error after which a call may or may not have been applied.
fn outcome_unknown(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout()
}

struct Task {
    client_id: Arc<str>,
    /// The batch function, or its cluster form.
    script: &'static Library,
    /// The queue, to send redirected operations again (weak: the task ends
    /// when every handle is gone).
    requeue: mpsc::WeakUnboundedSender<Request>,
    replica_ack: Option<ReplicaAck>,
    max_extends: usize,
    connection: Link,
    /// Operations to send first, to settle calls whose replies were lost.
    settlements: Vec<Op>,
    /// When to send the settlements on their own if nothing else goes out
    /// first, and the pause before the next such try.
    settle_at: Option<Instant>,
    settle_backoff: Duration,
    /// Requests to send again (once) after their call's connection broke.
    retries: Vec<Request>,
    nonces: Arc<Nonces>,
    reconnected: Arc<Notify>,
    stats: Arc<CallStats>,
}

/// What one call carries: settlements and requests for the function, and
/// requests sent as native commands.
struct Call {
    settle: Vec<Op>,
    batch: Vec<Request>,
    native: Natives,
}

/// Requests sent as native commands, and those commands packed in the
/// requests' order (`resp::Packer`), ready for the connection's buffer.
#[derive(Default)]
struct Natives {
    requests: Vec<Request>,
    packed: Vec<u8>,
}

impl Call {
    /// Everything through the function.
    fn scripted(settle: Vec<Op>, batch: Vec<Request>) -> Self {
        Self {
            settle,
            batch,
            native: Natives::default(),
        }
    }

    /// Each request whose operation has a native command on a server
    /// offering `offer` goes as that command, unless another operation of
    /// the call touches the same lock (the function's operations and the
    /// commands are not ordered among themselves) or its command already
    /// found the lock otherwise.
    fn split(settle: Vec<Op>, mut batch: Vec<Request>, offer: Native) -> Self {
        // Scripts pay Redis's per-command cost each; in a call that
        // carries many operations the function's share per operation is
        // lower (`wire::native`).
        let crowded = batch.len() >= CROWDED;
        if !batch
            .iter()
            .any(|r| r.native_command(offer, crowded).is_some())
        {
            return Self::scripted(settle, batch);
        }
        // Alone in its call (the common case of an idle client), a request
        // shares its lock with nothing.
        let alone = if settle.is_empty() && batch.len() == 1 {
            Alone::Few(1)
        } else {
            Alone::of(&settle, &batch)
        };
        // Room for the commands of every request (a command is about 100
        // bytes and a lock's name), so packing them does not grow it.
        let mut packed = Vec::with_capacity(batch.len() * 128);
        let mut i = 0;
        // The requests that go as commands stay in `batch`, in order.
        let scripted = batch
            .extract_if(.., |request| {
                let alone = alone.get(i);
                i += 1;
                match request.native_command(offer, crowded).filter(|_| alone) {
                    Some(command) => {
                        command.write(&mut packed);
                        false
                    }
                    None => true,
                }
            })
            .collect();
        Self {
            settle,
            batch: scripted,
            native: Natives {
                requests: batch,
                packed,
            },
        }
    }
}

/// The replies a call's native commands are waiting for: one command's,
/// several commands', or none (sent through the function instead).
enum Replies<One, Many> {
    One(One),
    Many(Many),
    Scripted,
}

/// Which requests of a call share their lock with no other operation of
/// the call (settlements included).
enum Alone {
    /// Of a call of at most [`CROWDED`] operations: bit `i` for request `i`.
    Few(u32),
    Many(Vec<bool>),
}

impl Alone {
    fn of(settle: &[Op], batch: &[Request]) -> Self {
        let ops = || settle.iter().chain(batch.iter().map(|r| &r.op));
        // A call carries a few operations unless the client is busy:
        // comparing each with each is then cheaper than hashing.
        if settle.len() + batch.len() <= CROWDED {
            let mut alone = 0;
            for (i, request) in batch.iter().enumerate() {
                let mine = &*request.op.keys().lock;
                if ops().filter(|op| &*op.keys().lock == mine).count() == 1 {
                    alone |= 1 << i;
                }
            }
            return Alone::Few(alone);
        }
        let mut uses = std::collections::HashMap::<&str, u32>::with_capacity(CROWDED * 2);
        for op in ops() {
            *uses.entry(&*op.keys().lock).or_default() += 1;
        }
        Alone::Many(
            batch
                .iter()
                .map(|r| uses[&*r.op.keys().lock] == 1)
                .collect(),
        )
    }

    fn get(&self, i: usize) -> bool {
        match self {
            Alone::Few(bits) => bits & (1 << i) != 0,
            Alone::Many(each) => each[i],
        }
    }
}

/// The result of one call: the error that broke it, the settlements it
/// leaves (if its reply was lost) and the requests to send again.
#[derive(Default)]
struct Sent {
    error: Option<RedisError>,
    unsettled: Vec<Op>,
    retries: Vec<Request>,
    /// Some operation was refused by a replica: the server is no longer the
    /// master.
    stale: bool,
    /// Some operation reached a cluster node that does not serve its slot.
    misrouted: bool,
    /// The server answered `NOSCRIPT` to a native script.
    scripts_lost: bool,
}

impl Task {
    async fn run(
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
                Some(slots) => {
                    for (route, settle, batch) in by_node(slots, settle, batch) {
                        let call = Call::scripted(settle, batch);
                        in_flight.push(self.execute(conn.clone(), Some(route), call));
                    }
                }
                None => {
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
    fn execute(&self, conn: Conn, route: Option<RoutingInfo>, call: Call) -> InFlight {
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
        route: Option<RoutingInfo>,
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

impl Sent {
    /// Adds what another part of the same call left.
    fn merge(&mut self, other: Sent) {
        if self.error.is_none() {
            self.error = other.error;
        }
        self.unsettled.extend(other.unsettled);
        self.retries.extend(other.retries);
        self.stale |= other.stale;
        self.misrouted |= other.misrouted;
        self.scripts_lost |= other.scripts_lost;
    }
}

/// Completes a request sent as a native command. A command that found the
/// lock otherwise changed nothing: the request goes through the function,
/// first in the next call (with the retries). A failure is the function's
/// failure (the settlement is the same).
fn native_answered(
    mut request: Request,
    reply: redis::RedisResult<Value>,
    stats: &CallStats,
    nonces: &Nonces,
    requeue: &mpsc::WeakUnboundedSender<Request>,
) -> Sent {
    // A server's error may come as a value (`-LOADING` while it loads).
    match reply.and_then(Value::extract_error) {
        Ok(value) => match request.op.decode_native(&value) {
            Ok(Some(reply)) => {
                stats.native_ops.fetch_add(1, Ordering::Relaxed);
                (request.done)(Ok(reply));
                Sent::default()
            }
            Ok(None) => {
                stats.native_fallbacks.fetch_add(1, Ordering::Relaxed);
                request.scripted = true;
                Sent {
                    retries: vec![request],
                    ..Sent::default()
                }
            }
            Err(e) => {
                (request.done)(Err(e));
                Sent::default()
            }
        },
        Err(e) if is_redirect(&e) || connection::is_read_only(&e) => {
            redirected(e, Vec::new(), vec![request], requeue.clone())
        }
        // The server lost the script (`SCRIPT FLUSH`): nothing was applied;
        // the scripts are loaded again before the next call.
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            stats.native_fallbacks.fetch_add(1, Ordering::Relaxed);
            request.scripted = true;
            Sent {
                retries: vec![request],
                scripts_lost: true,
                ..Sent::default()
            }
        }
        Err(e) => failed(&Error::Redis(e), Vec::new(), vec![request], nonces),
    }
}

/// Completes a call Redis answered. With replica acknowledgement, `acks`
/// is (acknowledged, wanted): an acquisition fewer confirmed is undone (by
/// its nonce) and answered `NotReplicated`; a renewal just does not count.
/// Returns the requests whose operation reached a cluster node that does
/// not serve its slot (applied nothing: to send again) apart.
fn answered(
    settle: Vec<Op>,
    batch: Vec<Request>,
    values: Vec<Value>,
    acks: Option<(u32, u32)>,
) -> (Sent, Vec<Request>) {
    let mut values = values.into_iter();
    let mut unsettled = Vec::new();
    let mut misrouted = Vec::new();
    let mut settle_misrouted = false;
    let mut stale = false;
    for (op, value) in settle.into_iter().zip(values.by_ref()) {
        match op.decode(&value) {
            Err(Error::Redis(e)) if is_redirect(&e) || connection::is_read_only(&e) => {
                settle_misrouted = true;
                stale |= connection::is_read_only(&e);
                unsettled.push(op);
            }
            Err(e) => tracing::warn!(error = %e, "settling a lost reply failed"),
            Ok(_) => {}
        }
    }
    let short = acks.filter(|(acked, wanted)| acked < wanted);
    for (request, value) in batch.into_iter().zip(values) {
        let mut reply = request.op.decode(&value);
        // Reached a node that does not serve the slot, or a replica (a
        // demoted master): applied nothing (every operation reads before
        // it writes), so it goes again, to the right node.
        if let Err(Error::Redis(e)) = &reply {
            if is_redirect(e) || connection::is_read_only(e) {
                stale |= connection::is_read_only(e);
                misrouted.push(request);
                continue;
            }
        }
        if let Some((acked, wanted)) = short {
            if request.op.needs_replicas() && reply.is_ok() {
                if reply.as_ref().is_ok_and(Reply::grants) {
                    unsettled.extend(request.op.settlement().into_iter().take(1));
                }
                reply = Err(Error::NotReplicated { acked, wanted });
            }
        }
        (request.done)(reply);
    }
    let sent = Sent {
        error: None,
        misrouted: settle_misrouted || !misrouted.is_empty(),
        unsettled,
        retries: Vec::new(),
        stale,
        scripts_lost: false,
    };
    (sent, misrouted)
}

/// Completes a call that failed with `error`. Its settlements were not
/// confirmed, whatever the error: they go again. A lost reply leaves each
/// request's settlement, and a broken connection (not a slow one) one more
/// try on a new connection after them; a refused call (Redis loading its
/// data, out of memory, ...) applied nothing, but a release must still
/// happen.
fn failed(error: &Error, settle: Vec<Op>, batch: Vec<Request>, nonces: &Nonces) -> Sent {
    let redis = match error {
        Error::Redis(r) => Some(r.clone()),
        _ => None,
    };
    let unknown = redis.as_ref().is_some_and(outcome_unknown);
    let retry = redis
        .as_ref()
        .is_some_and(|r| outcome_unknown(r) && !r.is_timeout());
    let mut sent = Sent {
        error: redis,
        unsettled: settle,
        retries: Vec::new(),
        stale: false,
        misrouted: false,
        scripts_lost: false,
    };
    for request in batch {
        if unknown {
            let (settle, again) = request.after_broken_call(retry, nonces);
            sent.unsettled.extend(settle);
            sent.retries.extend(again);
        } else {
            sent.unsettled.extend(request.op.unfinished());
            (request.done)(Err(error.clone()));
        }
    }
    sent
}

/// Completes a redirected call, or one a replica refused: nothing was
/// applied, so each request goes again after a pause (see
/// [`send_again_later`]) once the slot map, or for one server the
/// master's address, is found afresh; its settlements stay pending.
fn redirected(
    error: RedisError,
    settle: Vec<Op>,
    batch: Vec<Request>,
    requeue: mpsc::WeakUnboundedSender<Request>,
) -> Sent {
    tracing::debug!(error = %error, operations = batch.len(), "call redirected; sending again");
    send_again_later(batch, requeue);
    Sent {
        error: None,
        unsettled: settle,
        retries: Vec::new(),
        stale: connection::is_read_only(&error),
        misrouted: true,
        scripts_lost: false,
    }
}

/// Queues `requests` again after [`REDIRECT_PAUSE`] (by then the slot map
/// is refreshed, or the migration or failover further along); one sent
/// again [`MAX_REDIRECTS`] times already gets the error instead.
fn send_again_later(requests: Vec<Request>, requeue: mpsc::WeakUnboundedSender<Request>) {
    let mut again = Vec::new();
    for mut request in requests {
        if request.redirects >= MAX_REDIRECTS {
            let error = RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain),
                "no master took the operation in time (a slot migration or failover outlasted the retries)",
            ));
            (request.done)(Err(Error::Redis(error)));
        } else {
            request.redirects += 1;
            again.push(request);
        }
    }
    if again.is_empty() {
        return;
    }
    tokio::spawn(async move {
        tokio::time::sleep(REDIRECT_PAUSE).await;
        for request in again {
            match requeue.upgrade() {
                Some(queue) => {
                    if let Err(mpsc::error::SendError(request)) = queue.send(request) {
                        (request.done)(Err(closed()));
                    }
                }
                None => (request.done)(Err(closed())),
            }
        }
    });
}

/// Splits settlements and requests by the cluster node that serves their
/// keys' slot (any master when the map does not say), keeping their order
/// within each node.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_errors_after_sending_leave_the_outcome_unknown() {
        let dropped = RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(outcome_unknown(&dropped));
        let refused = RedisError::from((redis::ErrorKind::Client, "hasp client is shut down"));
        assert!(!outcome_unknown(&refused));
    }

    #[test]
    fn a_closed_queue_is_an_error_not_a_panic() {
        assert!(matches!(closed(), Error::Redis(_)));
    }

    #[test]
    fn only_requests_alone_on_their_lock_in_a_call_go_as_native_commands() {
        use crate::core::keys::LockKeys;
        let nonces = Nonces::new();
        let owner = Owner::from_id("o1").unwrap();
        let keys = |name: &str| Arc::new(LockKeys::plain("hasp", name));
        let acquire = |name: &str| Request {
            op: Op::Lock(LockOp::Acquire {
                keys: keys(name),
                owner: owner.clone(),
                lease_ms: 500,
                flag_waiting: false,
                nonce: nonces.next(),
            }),
            done: Box::new(|_| {}),
            retried: false,
            redirects: 0,
            scripted: false,
            wait_ends: None,
        };
        // "b" is settled in the same call, "c" acquired twice, "d" found
        // held by its native command already: all through the function,
        // in order.
        let settle = vec![Op::Lock(LockOp::Undo {
            keys: keys("b"),
            owner: owner.clone(),
            nonce: nonces.next(),
        })];
        let mut refused = acquire("d");
        refused.scripted = true;
        let batch = vec![
            acquire("c"),
            acquire("a"),
            acquire("b"),
            acquire("c"),
            refused,
            acquire("e"),
        ];
        let call = Call::split(settle, batch, Native::default());
        let names = |requests: &[Request]| -> Vec<String> {
            requests
                .iter()
                .map(|r| r.op.keys().name.to_string())
                .collect()
        };
        assert_eq!(call.settle.len(), 1);
        assert_eq!(names(&call.batch), ["c", "b", "c", "d"]);
        assert_eq!(names(&call.native.requests), ["a", "e"]);
        // Their commands, packed one after the other in the same order.
        let packed = &call.native.packed;
        let mut at = 0;
        for name in ["a", "e"] {
            let (value, used) = crate::core::resp::read(&packed[at..])
                .unwrap()
                .expect("whole");
            let Value::Array(args) = value else {
                panic!("a command: {value:?}")
            };
            assert_eq!(args[0], Value::BulkString(b"SET".to_vec()));
            assert_eq!(
                args[1],
                Value::BulkString(format!("hasp:{{{name}}}:plain").into_bytes())
            );
            at += used;
        }
        assert_eq!(at, packed.len(), "nothing else packed");
    }
}
