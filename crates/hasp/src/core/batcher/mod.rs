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
//!
//! **Rooms.** `queue` (what a caller hands in: [`Queue`], a request and
//! its completion), `call` (a batch split between the function and native
//! commands), `lane` (a lane's task: gathering, sending, settling),
//! `replies` (completing requests, and what a call leaves behind),
//! `connection` and `socket` (one server's connection, driven by its
//! lane), `resp` (RESP2 on that connection: commands packed straight into
//! its buffer, replies read out of what it received), `slots` (a cluster's
//! map), `repoll` (the lane's wake-ups). What an operation sends and what
//! its reply means live in `wire`.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Notify};

use super::keys;
use super::scripts::BATCH;
#[cfg(feature = "cluster")]
use super::scripts::BATCH_SHARDED;
use super::wire::Nonces;
use crate::config::Settings;

mod call;
mod connection;
mod lane;
mod queue;
mod replies;
mod repoll;
mod resp;
#[cfg(feature = "cluster")]
mod slots;
mod socket;

pub(crate) use queue::{Completion, Queue, WAIT_ENDS};

use connection::{Connection, Link};
use lane::Task;
use repoll::Repoll;
#[cfg(feature = "cluster")]
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
/// function rather than as its acquisition script (`wire::native`): from
/// here the function's cost, paid once per call, costs Redis less than a
/// script run per acquisition (W1 at 64 tasks in `benches/README.md`).
const CROWDED: usize = 8;
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
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
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
            #[cfg(feature = "cluster")]
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
                #[cfg(feature = "cluster")]
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
