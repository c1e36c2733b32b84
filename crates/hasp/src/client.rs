//! The client: a cheap, cloneable handle on one Redis deployment.

use std::sync::Arc;

use crate::config::Settings;
use crate::core::lease::LearnedLease;
use crate::core::Core;
use crate::error::Result;
use crate::fair_lock::FairLock;
use crate::latch::CountDownLatch;
use crate::lock::Lock;
use crate::plain_lock::PlainLock;
use crate::rw_lock::RwLock;
use crate::semaphore::Semaphore;

/// A handle on one Redis server, shared by every lock made from it.
///
/// A client owns these connections, each reconnected when it breaks: one
/// multiplexed for read-only commands (pipelined by all tasks); one per
/// lane (4 by default, [`Settings::set_lanes`]) for every change to its
/// locks (acquire, release, renewal), each driven by a task that batches the
/// operations pending at the same moment into one script call (a lock's
/// operations always take the same lane); and one pub/sub connection for
/// release notifications, kept open so
/// that a Redis that went away and came back is noticed (every hold is then
/// checked at once); and one watchdog task that renews the leases of every
/// lock it holds in watchdog mode. Clone it freely: clones share all of
/// that.
/// When the last clone and the last guard are dropped, the background tasks
/// stop and locks still held expire after their lease.
///
/// # Examples
///
/// Two clients (think: two service instances) contending for one lock:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> hasp::Result<()> {
/// # let server = testkit::RedisServer::start();
/// # let url = server.url(); // e.g. "redis://127.0.0.1:6379/"
/// let instance_a = hasp::Client::open(&url).await?;
/// let instance_b = hasp::Client::open(&url).await?;
///
/// let guard = instance_a.lock("inventory:sku-42")?.lock().await?;
/// // Held by A: B's attempt fails at once.
/// assert!(instance_b.lock("inventory:sku-42")?.try_lock().await?.is_none());
/// guard.unlock().await?;
/// let guard = instance_b.lock("inventory:sku-42")?.try_lock().await?.expect("free now");
/// guard.unlock().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Client {
    core: Arc<Core>,
}

/// Counters of a client's activity, for tests and monitoring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Calls that carried lease renewals since the client started: calls of
    /// the batch function, or pipelines of native conditional `SET`s on a
    /// server that has them (renewals share the calls of the client's
    /// other lock operations).
    pub renew_calls: u64,
    /// Operations applied by one native command instead of the batch
    /// function (a plain lock's acquisition on any server; on a server with
    /// conditional commands, Valkey 9, a last release and a plain lock's
    /// renewal). See [`PlainLock`].
    pub native_ops: u64,
    /// Native commands that found the lock otherwise and changed nothing:
    /// their operation then went through the function.
    pub native_fallbacks: u64,
    /// Holds currently registered by this client (all names and owners).
    pub held_locks: usize,
    /// Release channels this client is subscribed to right now.
    pub subscribed_channels: usize,
}

impl Client {
    /// Connects with default [`Settings`].
    ///
    /// `url` is a Redis URL: `redis://[:password@]host[:port][/db]`,
    /// `redis+unix:///path/to/socket[?db=N&pass=P]` or `unix:///path`.
    ///
    /// Must be called within a tokio runtime; the client's background tasks
    /// run on it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::error::Error::InvalidArgument) for a malformed URL, [`Error::Redis`](crate::error::Error::Redis) if
    /// the server cannot be reached or refuses the credentials.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves nothing behind.
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_with(url, Settings::default()).await
    }

    /// Connects with the given settings (validated first).
    ///
    /// # Errors
    /// As [`open`](Self::open), and [`Error::InvalidArgument`](crate::error::Error::InvalidArgument) for invalid
    /// settings.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn open_with(url: &str, settings: Settings) -> Result<Self> {
        Ok(Self {
            core: Core::open(url, settings).await?,
        })
    }

    /// Connects to a Redis Cluster through any of its nodes (`seeds`:
    /// `redis://host:port` URLs).
    ///
    /// Every key of a lock shares one slot (its name is the hash tag), so a
    /// lock lives on one shard: operations pending at the same moment are
    /// sent as one script call per node, all at once; an operation that
    /// reaches a node that no longer serves its slot (a migration, a
    /// failover) applied nothing and is sent again shortly after, once the
    /// client's map of the slots is refreshed. Release
    /// messages use sharded pub/sub (`SPUBLISH`/`SSUBSCRIBE`, Redis 7.0+), so
    /// each reaches only the shard of its lock. After a failover inside the
    /// cluster, every hold is re-checked on the new master.
    /// [`Settings::set_replica_ack`] is not supported on a cluster client yet.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::error::Error::InvalidArgument) for no
    /// seeds, a malformed URL or replica acknowledgement;
    /// [`Error::Redis`](crate::error::Error::Redis) if no seed answers as a node of
    /// a cluster.
    ///
    /// # Cancel safety
    /// Cancel safe.
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub async fn open_cluster(seeds: &[&str], settings: Settings) -> Result<Self> {
        Ok(Self {
            core: Core::open_cluster(seeds, settings).await?,
        })
    }

    /// Connects through Redis Sentinel to the current master of `service`,
    /// and follows it across failovers.
    ///
    /// `sentinels` are the URLs of the sentinels to ask (any that answers
    /// will do). Every connection of the client asks them for the master
    /// each time it connects; when a connection finds its server demoted to
    /// a replica (a write refused with `READONLY`) every connection moves to
    /// the new master, and the client re-checks each hold it has there (a
    /// failover can lose the last writes, and so locks: those holds are
    /// reported lost, see [`Guard::lost`](crate::guard::Guard::lost)). Operations
    /// in flight during a failover fail with a retryable error and are never
    /// reported as acquired. The master is reached with database 0 and no
    /// password.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::error::Error::InvalidArgument) for no
    /// sentinels, an empty service name or a malformed URL;
    /// [`Error::Redis`](crate::error::Error::Redis) if no sentinel knows a master
    /// for `service` or the master cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe.
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub async fn open_sentinel(
        sentinels: &[&str],
        service: &str,
        settings: Settings,
    ) -> Result<Self> {
        Ok(Self {
            core: Core::open_sentinel(sentinels, service, settings).await?,
        })
    }

    /// A handle on the lock called `name`. Names are opaque UTF-8 (braces,
    /// colons and spaces included) of 1 to `max_name_len` bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::error::Error::InvalidArgument) for an empty or over-long name; no Redis
    /// call is made.
    pub fn lock(&self, name: &str) -> Result<Lock> {
        Lock::new(self.core.clone(), name)
    }

    /// A handle on the plain lock called `name`: a lock without fencing
    /// tokens (names as for [`lock`](Self::lock); a plain lock and a lock
    /// of one name are distinct locks).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::error::Error::InvalidArgument) for an
    /// empty or over-long name; no Redis call is made.
    pub fn plain_lock(&self, name: &str) -> Result<PlainLock> {
        Ok(PlainLock::new(Lock::new_plain(self.core.clone(), name)?))
    }

    /// A handle on the fair lock called `name` (names as for
    /// [`lock`](Self::lock); a fair lock and a lock of one name are distinct
    /// locks).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::error::Error::InvalidArgument) for an
    /// empty or over-long name; no Redis call is made.
    pub fn fair_lock(&self, name: &str) -> Result<FairLock> {
        Ok(FairLock::new(Lock::new_fair(self.core.clone(), name)?))
    }

    /// A handle on the read-write lock called `name` (names as for
    /// [`lock`](Self::lock); distinct from a lock of that name).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::error::Error::InvalidArgument) for an
    /// empty or over-long name; no Redis call is made.
    pub fn rw_lock(&self, name: &str) -> Result<RwLock> {
        RwLock::new(self.core.clone(), name)
    }

    /// A handle on the semaphore called `name` (names as for
    /// [`lock`](Self::lock); a semaphore and a lock of one name are
    /// distinct objects).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::error::Error::InvalidArgument) for an
    /// empty or over-long name; no Redis call is made.
    pub fn semaphore(&self, name: &str) -> Result<Semaphore> {
        Semaphore::new(self.core.clone(), name)
    }

    /// A handle on the count-down latch called `name` (names as for
    /// [`lock`](Self::lock)).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::error::Error::InvalidArgument) for an
    /// empty or over-long name; no Redis call is made.
    pub fn latch(&self, name: &str) -> Result<CountDownLatch> {
        CountDownLatch::new(self.core.clone(), name)
    }

    /// What the adaptive locks of `class` have learned (see
    /// [`Lock::with_adaptive_lease`]): this client's samples are merged into
    /// the history shared in Redis first (one round trip), so the figures
    /// are every client's. The same fields are in the hash
    /// `P:{class}:lease` (`srtt`, `rttvar` in ms, `samples`, `updated_at`
    /// in server ms).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::error::Error::InvalidArgument) for an
    /// empty or over-long class; [`Error::Redis`](crate::error::Error::Redis) if
    /// Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn learned_lease(&self, class: &str) -> Result<LearnedLease> {
        self.core.learned(class).await
    }

    /// This client's id (a UUID), the prefix of its default owner ids.
    pub fn id(&self) -> &str {
        self.core.id()
    }

    /// The settings this client was opened with.
    pub fn settings(&self) -> &Settings {
        self.core.settings()
    }

    /// A snapshot of this client's counters.
    pub fn stats(&self) -> Stats {
        let counts = self.core.counts();
        Stats {
            renew_calls: counts.renew_calls,
            native_ops: counts.native_ops,
            native_fallbacks: counts.native_fallbacks,
            held_locks: counts.held_locks,
            subscribed_channels: counts.subscribed_channels,
        }
    }
}
