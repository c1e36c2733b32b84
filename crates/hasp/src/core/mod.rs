//! The floor: everything that talks to one Redis deployment.
//!
//! [`Core`] owns a client's connections and background tasks and offers the
//! kinds of lock above it a handful of operations on holds that name no
//! kind: a call through the batcher, re-entry, taking a hold from an
//! acquisition's reply, waiting in a line, release, renewal, read-only
//! queries. Each kind's module here (`lock`, `fair_lock`, `rw_lock`,
//! `semaphore`, `latch`) composes them into the kind's operations, as
//! functions over a `&Core`; the public handles (`Lock`, `Semaphore`, …)
//! are thin types over an `Arc<Core>` that call them.
//!
//! | module | concept |
//! |---|---|
//! | `keys` | the key layout of one object (lock, fair lock, read-write lock, semaphore, latch), and its cluster slot |
//! | `nonce` | operation ids: what settles a lost reply, and what a hold's value in Redis carries |
//! | `wire` | the batch script's operations and replies, one submodule per kind, and `wire::hold`, the hold lifecycle the queued kinds share (release, renewal, undo, settlement, leaving the line); `wire::native`, the operations that go as one native command (`SET NX PX`, `DELIFEQ`, `SET IFEQ`) where the server has it and no branch is needed |
//! | `scripts` | the batch function (a function library: one `.lua` file per kind, and its cluster form), loaded once, re-loaded when a server lost it |
//! | `endpoint` | where the server is: an address, or a Sentinel service's current master |
//! | `sentinels` | asking a Sentinel service's sentinels for its master, and hearing them announce a switch |
//! | `following` | a connection that follows a Sentinel service's master (the queries', and an application's own: `sentinel::MasterConnection`) |
//! | `commands` | the connection for read-only queries |
//! | `batcher` | group commit of every change (one function call and the native commands, packed, per call), settling calls whose replies were lost; each connection learns what its server offers, and speaks RESP2 itself (`batcher::resp`) |
//! | `reply` | replies that carry a hold, received cancel-safely |
//! | `waiters` | this client's tasks waiting per lock: FIFO, hand-off, wake-ups, grace |
//! | `pubsub` | the pub/sub connection: subscriptions, messages, reconnects |
//! | `holds` | the registry of held locks, re-entry counts, belief ends |
//! | `watchdog` | lease renewal, and the check of every hold after a reconnect |
//! | `line` | waiting in a line kept in Redis (fair lock, read-write lock, semaphore) |
//! | `lease`, `adaptive` | learned leases: what the adaptive locks of a class learned, shared through Redis, and its estimator |
//! | `lock`, `fair_lock`, `rw_lock`, `semaphore`, `latch` | each kind's operations on the floor (`lock` serves the plain lock too: the same operations without the fencing counter) |
//!
//! A kind has one name at every layer: its public handle
//! (`crate::fair_lock`, …), its operations here, its wire format
//! (`wire::fair_lock`, …) and its script (`scripts/fair_lock.lua`, …), whose
//! opcodes `dispatch.lua` finds in one table. The plain lock shares the
//! reentrant lock's floor and wire modules (`lock`), with a script of its
//! own.
//!
//! Imports run one way: the kinds' modules (`lock`, `fair_lock`, `rw_lock`,
//! `semaphore`, `latch`) → `mod.rs`, `lease`, `line` → `watchdog`, `waiters` → `batcher`,
//! `reply`, `pubsub`, `holds`, `commands` → `following` → `endpoint` → `sentinels`,
//! `wire` → `keys`, `scripts`. Every connection's bytes come from
//! `crate::transport`, below the floor.
//!
//! **Deployments.** One server, a Sentinel service and a Redis Cluster
//! share everything above the connections. A Sentinel service differs only
//! in its `endpoint` (every connection asks for the current master when it
//! connects, and all move when the master changes). A cluster differs in
//! the batcher (one script call per node, misrouted operations sent again), the
//! pub/sub transport (sharded channels) and the script (`SPUBLISH`); every
//! lock's keys share one slot, so no operation spans two shards.
//!
//! **Growing.** A kind adds its operations to `wire` (a submodule) and the
//! batch script (a `.lua` file), and a module here whose functions run its
//! attempts through the engine: a lock-like kind registers its holds (so that the
//! watchdog renews them, `Op::extend` picks its renewal, reconnects check
//! them, and `Op::release` its release); a kind whose waiters of every
//! client must be served in order waits in `line` (its keys say so,
//! `LockKeys::has_line`, and its releases then wake the line from the
//! script instead of this client's waiters), and then its wire module
//! is an `Acquisition` (`wire::hold`): its opcodes and its acquisition, the
//! rest of its holds' lifecycle shared. The kinds made of
//! several locks (`multi`) use `lock::try_once`, [`Core::watch`] and
//! [`Core::extend`].

use std::sync::{Arc, Weak};
use std::time::Instant;

use tokio::sync::{oneshot, watch, Notify};

use crate::config::{lease_millis, Settings};
use crate::error::{Error, Result};
use hasp_owner::Owner;

mod adaptive;
mod batcher;
mod commands;
pub(crate) mod endpoint;
pub(crate) mod fair_lock;
#[cfg(feature = "sentinel")]
pub(crate) mod following;
pub(crate) mod holds;
pub(crate) mod keys;
pub(crate) mod latch;
pub(crate) mod lease;
mod line;
pub(crate) mod lock;
mod nonce;
mod pubsub;
mod reply;
pub(crate) mod rw_lock;
pub(crate) mod scripts;
pub(crate) mod semaphore;
#[cfg(feature = "sentinel")]
pub(crate) mod sentinels;
mod waiters;
mod watchdog;
pub(crate) mod wire;

use batcher::{Batcher, CallStats, Queue, Target};
use commands::Commands;
use endpoint::Endpoint;
use holds::{Claim, Found, HoldState, Holds, Lease, ReleaseStep, Written};
use keys::LockKeys;
use pubsub::{Listener, PubSub};
use reply::{HoldReply, Undo};
#[cfg(feature = "sentinel")]
use sentinels::Sentinels;
use waiters::Waiters;
use watchdog::Watchdog;
use wire::lock::LockOp;
use wire::{Op, Reply};

pub(crate) use waiters::{deadline_after, remaining, Attempt, Watch};

/// One client's connections, tasks and registries (see the module docs).
#[derive(Debug)]
pub(crate) struct Core {
    id: Arc<str>,
    /// The address this client was opened with (no credentials): how the
    /// kinds that span servers name this one.
    server: Arc<str>,
    settings: Settings,
    watchdog_lease_ms: u64,
    /// Read-only queries (`EXISTS`, `PTTL`, ...), pipelined by all tasks.
    commands: Commands,
    queue: Queue,
    waiters: Arc<Waiters>,
    holds: Arc<Holds>,
    /// The classes of locks with learned leases.
    classes: Arc<adaptive::Classes>,
    calls: Arc<CallStats>,
    _shutdown: watch::Sender<()>,
}

/// A snapshot of a client's counters.
pub(crate) struct Counts {
    pub(crate) renew_calls: u64,
    pub(crate) native_ops: u64,
    pub(crate) native_fallbacks: u64,
    pub(crate) held_locks: usize,
    pub(crate) subscribed_channels: usize,
}

impl Core {
    /// Connects to `url` and starts the background tasks on the current
    /// tokio runtime.
    pub(crate) async fn open(url: &str, settings: Settings) -> Result<Arc<Self>> {
        settings.validate()?;
        let invalid_url = |e: redis::RedisError| Error::invalid("url", format!("{url:?}: {e}"));
        let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(invalid_url)?;
        // Lock calls are small and latency-bound: Nagle's algorithm must not
        // hold one back while an earlier call is unacknowledged.
        let info = info.set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        let server: Arc<str> = match info.redis_settings().db() {
            0 => info.addr().to_string(),
            db => format!("{}/{db}", info.addr()),
        }
        .into();
        let plain_tcp = matches!(info.addr(), redis::ConnectionAddr::Tcp(..));
        let endpoint = Endpoint::direct(info, crate::tls::Connectors::new(settings.tls.as_ref()));
        // The first connection, its TLS handshake included, within the
        // connection timeout: a TLS client at a plain port gets no answer
        // to its hello, and must hear that, not hang.
        let first = Commands::fixed(&endpoint, &settings);
        let commands = match tokio::time::timeout(settings.connection_timeout, first).await {
            Ok(Ok(commands)) => commands,
            Ok(Err(Error::Redis(e))) if plain_tcp => {
                return Err(Error::Redis(crate::tls::explain_plain(e)))
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(Error::Redis(crate::tls::no_answer(plain_tcp, &server))),
        };
        let target = Target::Server(endpoint.clone());
        let pubsub = pubsub::Target::Server(endpoint);
        Self::start(server, target, pubsub, commands, settings).await
    }

    /// Connects to the Redis Cluster that `seeds` belong to.
    #[cfg(feature = "cluster")]
    pub(crate) async fn open_cluster(seeds: &[&str], settings: Settings) -> Result<Arc<Self>> {
        settings.validate()?;
        if seeds.is_empty() {
            return Err(Error::invalid("seeds", "needs at least one node URL"));
        }
        if settings
            .tls
            .as_ref()
            .is_some_and(|t| t.server_name.is_some())
        {
            return Err(Error::invalid(
                "server_name",
                "a Redis Cluster's nodes are verified by the names they announce \
                 (cluster-announce-hostname), not by one name: set none for a cluster",
            ));
        }
        if settings.replica_ack.is_some() {
            return Err(Error::invalid(
                "replica_ack",
                "not supported on a Redis Cluster client yet",
            ));
        }
        let (pushes, push_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut builder = redis::cluster::ClusterClientBuilder::new(seeds.to_vec());
        if seeds.iter().any(|s| s.starts_with("rediss://")) {
            // TLS to every node, with the client's trust.
            let insecure = settings.tls.as_ref().is_some_and(|t| t.insecure)
                || seeds.iter().any(|s| s.ends_with("#insecure"));
            builder = builder.tls(match insecure {
                true => redis::TlsMode::Insecure,
                false => redis::TlsMode::Secure,
            });
            if let (Some(tls), false) = (&settings.tls, insecure) {
                builder = builder.certs(tls.redis_certificates());
            }
        }
        let cluster = builder
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(pushes)
            // A script call sent twice could apply twice: redirects and
            // lost replies are the batcher's business.
            .retries(0)
            .connection_timeout(settings.connection_timeout)
            .response_timeout(settings.response_timeout)
            .tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true))
            .build()
            .map_err(|e| Error::invalid("seeds", e.to_string()))?;
        let conn = cluster.get_async_connection().await?;
        let commands = Commands::cluster(conn.clone()).await?;
        let server: Arc<str> = format!("cluster:{}", seeds[0]).into();
        let target = Target::Cluster(conn.clone());
        let pubsub = pubsub::Target::Cluster(conn, push_rx);
        Self::start(server, target, pubsub, commands, settings).await
    }

    /// Connects to the current master of `service`, as the sentinels at
    /// `sentinels` report it, and follows it across failovers.
    #[cfg(feature = "sentinel")]
    pub(crate) async fn open_sentinel(
        sentinels: &[&str],
        service: &str,
        settings: Settings,
    ) -> Result<Arc<Self>> {
        settings.validate()?;
        let sentinels = Sentinels::new(sentinels, service, settings.tls.as_ref())?
            .with_timeout(settings.connection_timeout);
        let endpoint = Endpoint::sentinel(sentinels);
        let commands = Commands::following(endpoint.clone(), &settings).await?;
        let target = Target::Server(endpoint.clone());
        let pubsub = pubsub::Target::Server(endpoint);
        let server = format!("sentinel:{service}").into();
        Self::start(server, target, pubsub, commands, settings).await
    }

    /// Starts the background tasks on the current tokio runtime and waits
    /// until the batcher's lanes have connected (or failed to).
    async fn start(
        server: Arc<str>,
        target: Target,
        pubsub: pubsub::Target,
        commands: Commands,
        settings: Settings,
    ) -> Result<Arc<Self>> {
        let watchdog_lease_ms = lease_millis(settings.watchdog_timeout)
            .ok_or_else(|| Error::invalid("watchdog_timeout", "too large"))?;
        let learning = settings
            .adaptive
            .resolve(settings.watchdog_timeout, settings.max_lease)?;
        let classes = Arc::new(adaptive::Classes::new(learning, &settings.prefix));

        let id: Arc<str> = format!("c:{}", uuid::Uuid::new_v4()).into();
        let runtime = tokio::runtime::Handle::current();
        let recheck = Arc::new(Notify::new());
        let calls = Arc::new(CallStats::default());
        let (queue, lanes) = Batcher::start(
            target,
            id.clone(),
            &settings,
            recheck.clone(),
            calls.clone(),
            &runtime,
        );
        let waiters = Arc::new_cyclic(|waiters| {
            let events = Arc::new(Events {
                waiters: waiters.clone(),
                recheck: recheck.clone(),
            });
            let pubsub = PubSub::start(pubsub, settings.connection_timeout, events, &runtime);
            Waiters::new(id.clone(), pubsub, settings.replica_ack.is_none())
        });
        let holds = Arc::new(Holds::default());
        holds.set_renew_floor(learning.renew_floor);
        let (shutdown, shutdown_rx) = watch::channel(());
        let watchdog = Watchdog {
            holds: holds.clone(),
            queue: queue.clone(),
            lease_ms: watchdog_lease_ms,
            period: settings.renew_period(),
            recheck,
            shutdown: shutdown_rx,
            classes: classes.clone(),
        };
        runtime.spawn(watchdog.run());
        let core = Arc::new(Self {
            id,
            server,
            settings,
            watchdog_lease_ms,
            commands,
            queue,
            waiters,
            holds,
            classes,
            calls,
            _shutdown: shutdown,
        });
        lanes.wait().await;
        Ok(core)
    }

    pub(crate) fn id(&self) -> &Arc<str> {
        &self.id
    }

    pub(crate) fn server(&self) -> &Arc<str> {
        &self.server
    }

    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Checks `name`, the name of an object of any kind (or of a class of
    /// adaptive leases).
    pub(crate) fn check_name(&self, name: &str) -> Result<()> {
        if name.is_empty() {
            return Err(Error::invalid("name", "must not be empty"));
        }
        let max = self.settings.max_name_len;
        if name.len() > max {
            return Err(Error::invalid(
                "name",
                format!("{} bytes exceeds the limit of {max}", name.len()),
            ));
        }
        Ok(())
    }

    /// The keys `layout` gives the object called `name` under the client's
    /// prefix, after checking the name.
    pub(crate) fn keys(
        &self,
        name: &str,
        layout: fn(&str, &str) -> LockKeys,
    ) -> Result<Arc<LockKeys>> {
        self.check_name(name)?;
        Ok(Arc::new(layout(&self.settings.prefix, name)))
    }

    /// Sends `op` through the batcher (grouped with whatever else is
    /// pending) and waits for its reply.
    async fn call(&self, op: Op) -> Result<Reply> {
        self.queue.call(op).await.map_err(|_| closed())?
    }

    fn lease_ms(&self, lease: Lease) -> u64 {
        match lease {
            Lease::Fixed(ms) => ms,
            Lease::Watchdog => self.watchdog_lease_ms,
            Lease::Adaptive(class) => self.classes.lease_ms(class),
        }
    }

    /// Subscribes to the release messages of `keys`' lock without queuing
    /// for it.
    pub(crate) fn watch(&self, keys: &Arc<LockKeys>) -> Watch {
        self.waiters.watch(keys)
    }

    /// Sets the lease of `hold` to `lease_ms` if its owner still holds the
    /// lock (true); otherwise marks it gone (false). The belief end moves
    /// to the send time plus the lease.
    pub(crate) async fn extend(&self, hold: &HoldState, lease_ms: u64) -> Result<bool> {
        let sent_at = Instant::now();
        match self.call(Op::extend(hold, Some(lease_ms))).await? {
            Reply::Extended => {
                hold.confirm(sent_at, lease_ms);
                Ok(true)
            }
            _ => {
                hold.mark_gone();
                Ok(false)
            }
        }
    }

    /// Re-enters a hold this client already has for the claim's owner.
    async fn reenter(&self, claim: Claim<'_>) -> Result<Option<Arc<HoldState>>> {
        let (keys, owner) = (claim.keys, claim.owner);
        let state = match self.holds.find(keys, owner) {
            Found::Live(state) => state,
            Found::None => return Ok(None),
            Found::Stale { redis_holds } => {
                // Its belief ran out, but Redis may still count it: release
                // it before this owner asks again (the queue keeps the order).
                self.release_in_background(keys, owner, redis_holds, None);
                return Ok(None);
            }
        };
        // A re-entry keeps the hold's lease mode; a fixed lease is re-armed
        // (with this handle's lease if it sets one).
        if let Lease::Fixed(held_ms) = state.lease {
            let ms = match claim.lease {
                Lease::Fixed(ms) => ms,
                Lease::Watchdog | Lease::Adaptive(_) => held_ms,
            };
            let sent_at = Instant::now();
            match self.call(Op::extend(&state, Some(ms))).await? {
                Reply::Extended => state.confirm(sent_at, ms),
                _ => {
                    state.mark_gone();
                    return Ok(None);
                }
            }
        }
        Ok(self.holds.reenter(&state).then_some(state))
    }

    /// Sends `op`, an acquisition of a lock-like kind (lock, fair lock, a
    /// side of a read-write lock) for the claim with a lease of `lease_ms`,
    /// cancel-safely; registers the hold it grants.
    async fn take_hold(
        &self,
        claim: Claim<'_>,
        lease_ms: u64,
        op: Op,
    ) -> Result<Attempt<Arc<HoldState>>> {
        let sent_at = Instant::now();
        // An acquisition of a lock writes its value whole when it takes it
        // free (the other kinds keep theirs in hashes).
        let written = match &op {
            Op::Lock(LockOp::Acquire { nonce, .. }) => Some(*nonce),
            _ => None,
        };
        let undo = Undo::of(&op, &self.queue);
        let reply = HoldReply::new(self.queue.call(op), undo, |reply| {
            matches!(reply, Ok(Reply::Acquired { .. }))
        });
        match reply.await.ok_or_else(closed)?? {
            Reply::Acquired { token } => {
                let confirmed = (sent_at, lease_ms);
                let written = written.map(|nonce| Written { nonce, token });
                let hold = self.holds.insert(claim, token, confirmed, written);
                Ok(Attempt::Done(hold))
            }
            Reply::Busy { ttl } => Ok(Attempt::Busy(ttl)),
            other => Err(unexpected(claim.keys, other)),
        }
    }

    /// Gives back one hold (one guard). The last local hold releases the
    /// lock in Redis, handing it to this client's first waiter if any.
    pub(crate) async fn release(&self, hold: &Arc<HoldState>) -> Result<()> {
        let redis_holds = match self.holds.release(hold) {
            ReleaseStep::Local if !hold.is_lost() => return Ok(()),
            ReleaseStep::Local | ReleaseStep::NotHeld => return Err(not_held(hold)),
            ReleaseStep::Final { redis_holds } => redis_holds,
        };
        if hold.is_lost() {
            // Its belief ended: report it, and give back what Redis may
            // still count (owner-checked: nobody else's hold is touched).
            if !hold.is_gone() {
                self.release_in_background(&hold.keys, &hold.owner, redis_holds, hold.written);
            }
            return Err(not_held(hold));
        }
        if let Lease::Adaptive(class) = hold.lease {
            self.learn(class, hold);
        }
        let (tx, rx) = oneshot::channel();
        let then = Box::new(move |reply| {
            let _ = tx.send(reply);
        });
        let (op, done) = self.release_op(&hold.keys, &hold.owner, redis_holds, hold.written, then);
        self.queue.send(op, done);
        match rx.await.map_err(|_| closed())?? {
            Reply::Released | Reply::StillHeld => Ok(()),
            Reply::NotHeld => Err(not_held(hold)),
            other => Err(unexpected(&hold.keys, other)),
        }
    }

    /// Gives back one hold without waiting for Redis (a dropped guard).
    pub(crate) fn release_detached(&self, hold: &Arc<HoldState>) {
        if let ReleaseStep::Final { redis_holds } = self.holds.release(hold) {
            if !hold.is_gone() {
                self.release_in_background(&hold.keys, &hold.owner, redis_holds, hold.written);
            }
        }
    }

    fn release_in_background(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Owner,
        holds: u32,
        written: Option<Written>,
    ) {
        let name = keys.name.clone();
        let log = Box::new(move |reply: Result<Reply>| {
            if let Err(e) = reply {
                tracing::warn!(error = %e, lock = %name, "background release failed");
            }
        });
        let (op, done) = self.release_op(keys, owner, holds, written, log);
        self.queue.send(op, done);
    }

    /// The operation that gives back `holds` holds of `owner`, and its
    /// completion: handed to the next waiter in this client first if the
    /// kind's waiters wait here (`waiters`); a kind with a line in Redis
    /// wakes its head from the script.
    fn release_op(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Owner,
        holds: u32,
        written: Option<Written>,
        then: batcher::Completion,
    ) -> (Op, batcher::Completion) {
        match keys.has_line() {
            true => (Op::release(keys, owner, holds, self.queue.nonce()), then),
            false => self
                .waiters
                .release(&self.queue, keys, owner, holds, written, then),
        }
    }

    /// A read-only command on the command connection. Sent again once if
    /// the connection turns out broken (the server restarted, say: redis-rs
    /// fails the first command and reconnects), which a read allows.
    pub(crate) async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T> {
        self.commands.query(cmd).await
    }

    /// Local holds of `owner` on the lock (0 if none or lost).
    pub(crate) fn hold_count(&self, keys: &LockKeys, owner: &Owner) -> u32 {
        self.holds.count(keys, owner)
    }

    pub(crate) fn counts(&self) -> Counts {
        Counts {
            renew_calls: self
                .calls
                .renew_calls
                .load(std::sync::atomic::Ordering::Relaxed),
            native_ops: self
                .calls
                .native_ops
                .load(std::sync::atomic::Ordering::Relaxed),
            native_fallbacks: self
                .calls
                .native_fallbacks
                .load(std::sync::atomic::Ordering::Relaxed),
            held_locks: self.holds.len(),
            subscribed_channels: self.waiters.channel_count(),
        }
    }
}

/// Passes what the pub/sub transport reports to the waiters, and asks the
/// watchdog to check every hold after a reconnect.
struct Events {
    waiters: Weak<Waiters>,
    recheck: Arc<Notify>,
}

impl Listener for Events {
    fn subscribed(&self, channel: &str) {
        if let Some(waiters) = self.waiters.upgrade() {
            waiters.subscribed(channel);
        }
    }

    fn message(&self, channel: &str, payload: &[u8]) {
        if let Some(waiters) = self.waiters.upgrade() {
            waiters.message(channel, payload);
        }
    }

    fn disconnected(&self) {
        if let Some(waiters) = self.waiters.upgrade() {
            waiters.disconnected();
        }
    }

    fn connected(&self, again: bool) {
        if let Some(waiters) = self.waiters.upgrade() {
            waiters.connected();
        }
        if again {
            self.recheck.notify_one();
        }
    }
}

fn closed() -> Error {
    Error::Redis(redis::RedisError::from((
        redis::ErrorKind::Client,
        "hasp client is shut down",
    )))
}

fn not_held(hold: &HoldState) -> Error {
    Error::NotHeld {
        name: hold.keys.name.to_string(),
    }
}

fn unexpected(keys: &LockKeys, reply: Reply) -> Error {
    Error::Protocol(format!("lock {:?}: unexpected reply {reply:?}", keys.name))
}
