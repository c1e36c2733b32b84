//! The batcher's own connection to Redis, driven by the batching task.
//!
//! To one server, the batcher writes and reads its socket itself
//! (`socket`), right after queuing a call, so the call is on the wire at
//! once and Redis works on it while the client is still busy with the
//! previous replies. (A connection run from a task of its own, as redis-rs's
//! multiplexed connection is, writes a call when that task next runs, which
//! under load is after every task the last replies woke.)
//!
//! The connection is made on first use and again after it breaks; calls in
//! flight when it breaks fail with the error (their effect in Redis is
//! unknown, as with any connection loss). A broken connection is made
//! again without waiting for a call ([`Connection::reconnect_at`]): every
//! [`RECONNECT_EVERY`] for a while, then every [`RECONNECT_LATER`], so that
//! a server restarted without its data is seen within milliseconds of
//! answering again and the client's holds are checked at once (its holders
//! learn of the loss before another client can have used the lock long).
//!
//! To a Redis Cluster, the batcher sends on redis-rs's cluster connection
//! instead, which routes each call by its keys' slot to the node's own
//! multiplexed connection and drives them from its own task. It never
//! retries a call (a script call sent twice could apply twice): redirects
//! come back to the batcher, which sends the operations again.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};

#[cfg(feature = "cluster")]
use super::slots::SlotMap;
/// A build without cluster support has no slot map.
#[cfg(not(feature = "cluster"))]
pub(super) enum SlotMap {}
use super::socket::{Handle, Socket};
use crate::core::endpoint::Endpoint;
use crate::core::wire::native::Native;

/// How often a broken connection to one server is tried again, during
/// [`RECONNECT_QUICKLY_FOR`] after it broke (a refused connection costs
/// microseconds; a restarting server is seen this soon after it answers).
pub(crate) const RECONNECT_EVERY: Duration = Duration::from_millis(2);

/// How long after a break the connection is tried every
/// [`RECONNECT_EVERY`].
pub(crate) const RECONNECT_QUICKLY_FOR: Duration = Duration::from_secs(2);

/// How often it is tried after that (and always through Sentinel, where
/// each try asks the sentinels for the master).
pub(crate) const RECONNECT_LATER: Duration = Duration::from_millis(100);

/// What a call is sent on.
#[derive(Clone)]
pub(crate) enum Conn {
    /// One server's connection, driven by the batcher.
    Node(Handle),
    /// A Redis Cluster, routed by slot.
    #[cfg(feature = "cluster")]
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Node(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Node(c) => c.req_packed_commands(cmd, offset, count),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Node(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The batcher's way to Redis: its own connection to one server, or a
/// cluster connection.
pub(super) enum Link {
    Node(Box<Connection>),
    #[cfg(feature = "cluster")]
    Cluster {
        conn: ClusterConnection,
        /// A call failed with a broken connection since the last success:
        /// the next call is (as far as we can tell) a reconnect.
        broken: bool,
        /// Which node serves which slot.
        slots: Box<SlotMap>,
    },
}

impl Link {
    pub(super) fn was_broken(&self) -> bool {
        match self {
            Link::Node(c) => c.was_broken(),
            #[cfg(feature = "cluster")]
            Link::Cluster { broken, .. } => *broken,
        }
    }

    pub(super) async fn get(&mut self) -> RedisResult<Conn> {
        match self {
            Link::Node(c) => c.get().await.map(Conn::Node),
            #[cfg(feature = "cluster")]
            Link::Cluster {
                conn,
                broken,
                slots,
            } => {
                slots.refresh(conn).await;
                *broken = false;
                Ok(Conn::Cluster(conn.clone()))
            }
        }
    }

    pub(super) fn failed(&mut self, error: &RedisError) {
        match self {
            Link::Node(c) => c.failed(error),
            #[cfg(feature = "cluster")]
            Link::Cluster { broken, .. } => {
                *broken |=
                    (error.is_connection_dropped() || error.is_io_error()) && !error.is_timeout();
            }
        }
    }

    pub(super) fn stale(&mut self) {
        match self {
            Link::Node(c) => c.stale(),
            #[cfg(feature = "cluster")]
            Link::Cluster { .. } => {}
        }
    }

    /// The server lost the native scripts (`SCRIPT FLUSH`): they are
    /// loaded again before the next call.
    pub(super) fn scripts_lost(&mut self) {
        match self {
            Link::Node(c) => c.reload = true,
            #[cfg(feature = "cluster")]
            Link::Cluster { .. } => {}
        }
    }

    /// An operation reached a cluster node that does not serve its slot.
    pub(super) fn misrouted(&mut self) {
        match self {
            Link::Node(_) => {}
            #[cfg(feature = "cluster")]
            Link::Cluster { slots, .. } => slots.mark_stale(),
        }
    }

    /// What the server of the live connection offers beyond Redis 7.0
    /// (nothing for a cluster: its calls go out per node).
    pub(super) fn native(&self) -> Native {
        match self {
            Link::Node(c) => c.native,
            #[cfg(feature = "cluster")]
            Link::Cluster { .. } => Native::default(),
        }
    }

    /// The cluster's slot map (`None` for one server).
    pub(super) fn slots(&self) -> Option<&SlotMap> {
        match self {
            Link::Node(_) => None,
            #[cfg(feature = "cluster")]
            Link::Cluster { slots, .. } => Some(slots),
        }
    }

    pub(super) fn poll_drive(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match self {
            Link::Node(c) => c.poll_drive(cx),
            #[cfg(feature = "cluster")]
            Link::Cluster { .. } => Poll::Pending, // driven by redis-rs's task
        }
    }

    /// When to make a broken connection again without waiting for a call
    /// (`None`: not broken, or a cluster, whose connections redis-rs makes).
    pub(super) fn reconnect_at(&self) -> Option<Instant> {
        match self {
            Link::Node(c) => c.reconnect_at(),
            #[cfg(feature = "cluster")]
            Link::Cluster { .. } => None,
        }
    }

    /// A try to reconnect failed: the next one is scheduled.
    pub(super) fn reconnect_failed(&mut self) {
        match self {
            Link::Node(c) => c.reconnect_failed(),
            #[cfg(feature = "cluster")]
            Link::Cluster { .. } => {}
        }
    }
}

/// A connection that is (re)made when needed.
pub(super) struct Connection {
    endpoint: Arc<Endpoint>,
    /// The endpoint's generation when the live connection was made.
    generation: u64,
    connect_timeout: Duration,
    response_timeout: Duration,
    live: Option<Socket>,
    /// What the live connection's server offers (asked at each connect).
    native: Native,
    /// Ask again (load the scripts) before the next call.
    reload: bool,
    /// What [`probe`] sends `DELIFEQ` on (`keys::probe_key`).
    probe_key: Arc<str>,
    /// True from the moment a live connection breaks until one is made again.
    broken: bool,
    /// When the connection broke, and when to try it again without a call.
    broken_at: Instant,
    retry_at: Option<Instant>,
}

impl Connection {
    /// Connects lazily: nothing happens until the first [`get`](Self::get).
    pub(super) fn new(
        endpoint: Arc<Endpoint>,
        connect_timeout: Duration,
        response_timeout: Duration,
        probe_key: Arc<str>,
    ) -> Self {
        Self {
            endpoint,
            probe_key,
            generation: 0,
            connect_timeout,
            response_timeout,
            live: None,
            native: Native::default(),
            reload: false,
            broken: false,
            broken_at: Instant::now(),
            retry_at: None,
        }
    }

    /// When to try a broken connection again (see the module docs).
    fn reconnect_at(&self) -> Option<Instant> {
        self.retry_at.filter(|_| self.broken && self.live.is_none())
    }

    fn reconnect_failed(&mut self) {
        let quickly =
            !self.endpoint.is_sentinel() && self.broken_at.elapsed() < RECONNECT_QUICKLY_FOR;
        let pause = if quickly {
            RECONNECT_EVERY
        } else {
            RECONNECT_LATER
        };
        self.retry_at = Some(Instant::now() + pause);
    }

    /// The live connection is gone: remembers when, and tries again soon.
    fn broke(&mut self) {
        if !self.broken {
            self.broken_at = Instant::now();
        }
        self.broken = true;
        self.retry_at = Some(Instant::now() + RECONNECT_EVERY);
    }

    /// True if the last connection broke and none was made since: the next
    /// [`get`](Self::get) that succeeds is a reconnect.
    pub(super) fn was_broken(&self) -> bool {
        self.broken
    }

    /// A handle to send calls on, connecting first if there is none.
    pub(super) async fn get(&mut self) -> RedisResult<Handle> {
        let generation = self.endpoint.generation();
        if let Some(socket) = &mut self.live {
            if generation == self.generation {
                if std::mem::take(&mut self.reload) {
                    // Until the scripts are back, their operations go
                    // through the function.
                    let asked =
                        tokio::time::timeout(self.response_timeout, probe(socket, &self.probe_key));
                    self.native = match asked.await {
                        Ok(Ok(native)) => native,
                        _ => Native::default(),
                    };
                }
                return Ok(socket.handle());
            }
            // The master changed: this server is no longer the one.
            self.live = None;
            self.broke();
        }
        let connect = async {
            let info = self.endpoint.resolve().await?;
            let tls = self.endpoint.tls();
            Socket::connect(
                info.addr(),
                info.redis_settings(),
                self.response_timeout,
                tls,
            )
            .await
        };
        let (socket, native) = tokio::time::timeout(self.connect_timeout, async {
            let mut socket = connect.await?;
            let native = probe(&mut socket, &self.probe_key).await?;
            Ok::<_, RedisError>((socket, native))
        })
        .await
        .map_err(|_| RedisError::from((ErrorKind::Io, "connect timed out")))??;
        if native != self.native {
            tracing::debug!(?native, "the server's native commands");
        }
        self.native = native;
        let conn = socket.handle();
        self.live = Some(socket);
        self.generation = generation;
        self.broken = false;
        self.retry_at = None;
        Ok(conn)
    }

    /// Forgets a connection that failed a call, so that the next call
    /// reconnects (the driver going away fails whatever else was on it).
    /// A time-out keeps the connection: what is sent next on it (the
    /// settlement of the call that timed out) reaches Redis after that call,
    /// which a new connection would not guarantee.
    pub(super) fn failed(&mut self, error: &RedisError) {
        if (error.is_connection_dropped() || error.is_io_error())
            && !error.is_timeout()
            && self.live.take().is_some()
        {
            self.broke();
        }
        if is_read_only(error) {
            self.stale();
        }
    }

    /// The server refused a write as a replica (a demoted master): every
    /// connection of the client finds the master again.
    pub(super) fn stale(&mut self) {
        if self.live.take().is_some() {
            self.broke();
        }
        self.endpoint.stale();
    }

    /// Does the connection's reading and writing; resolves only when the
    /// connection has closed (and is then forgotten). Pending while there
    /// is none.
    pub(super) fn poll_drive(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(socket) = &mut self.live else {
            return Poll::Pending;
        };
        if socket.poll_drive(cx).is_pending() {
            return Poll::Pending;
        }
        tracing::debug!("batch connection closed");
        self.live = None;
        self.broke();
        Poll::Ready(())
    }
}

/// A write refused by a replica.
pub(crate) fn is_read_only(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
}

/// Asks the server what it offers (`Native::probe`), on a socket nobody
/// else drives yet. A server that refuses the question (an ACL without
/// `COMMAND`) offers nothing as far as hasp uses, and neither does one
/// whose conditional commands the user may not send (an ACL written for
/// Redis 7.0): a `DELIFEQ` on `probe_key`, which is never written, says.
async fn probe(socket: &mut Socket, probe_key: &str) -> RedisResult<Native> {
    let mut native = match socket.ask(&Native::probe()).await {
        Ok(value) => Native::from_probe(&value),
        Err(e) if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() => return Err(e),
        Err(_) => Native::default(),
    };
    if native.conditional {
        native.conditional = load(socket, &Native::probe_permission(probe_key)).await?;
    }
    if !native.conditional {
        native.script = load(socket, &Native::load_script()).await?;
    }
    native.acquire = load(socket, &Native::load_acquire()).await?;
    Ok(native)
}

/// Loads a script (`SCRIPT LOAD`), or tries a command: whether the server
/// took it. A server that refuses (an ACL without `SCRIPT`) leaves the
/// operation to the function.
async fn load(socket: &mut Socket, cmd: &Cmd) -> RedisResult<bool> {
    match socket.ask(cmd).await {
        Ok(_) => Ok(true),
        Err(e) if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() => Err(e),
        Err(_) => Ok(false),
    }
}
