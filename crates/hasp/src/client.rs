//! The client: a cheap, cloneable handle on one Redis deployment.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::watch;

use crate::batch::Batcher;
use crate::config::{lease_millis, Settings};
use crate::error::{Error, Result};
use crate::holds::Holds;
use crate::lock::Lock;
use crate::pubsub::PubSub;

/// A handle on one Redis server, shared by every lock made from it.
///
/// A client owns three connections, each reconnected when it breaks: one
/// multiplexed for commands (pipelined by all tasks), one for lock and
/// unlock calls, driven by the task that batches the operations pending at
/// the same moment into one script call, and one pub/sub connection for
/// release notifications; and one watchdog task that renews the leases of
/// every lock it holds in watchdog mode. Clone it freely: clones share all
/// of that.
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
    pub(crate) shared: Arc<Shared>,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) conn: ConnectionManager,
    pub(crate) settings: Settings,
    pub(crate) id: Arc<str>,
    pub(crate) holds: Holds,
    pub(crate) pubsub: Arc<PubSub>,
    pub(crate) batcher: Batcher,
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) stats: Counters,
    pub(crate) watchdog_lease_ms: u64,
    _shutdown: watch::Sender<()>,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) renew_calls: AtomicU64,
}

/// Counters of a client's activity, for tests and monitoring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Renewal script calls made by the watchdog since the client started.
    pub renew_calls: u64,
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
    /// [`Error::InvalidArgument`] for a malformed URL, [`Error::Redis`] if
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
    /// As [`open`](Self::open), and [`Error::InvalidArgument`] for invalid
    /// settings.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn open_with(url: &str, settings: Settings) -> Result<Self> {
        settings.validate()?;
        let invalid_url = |e: redis::RedisError| Error::invalid("url", format!("{url:?}: {e}"));
        let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(invalid_url)?;
        // Lock calls are small and latency-bound: Nagle's algorithm must not
        // hold one back while an earlier call is unacknowledged (redis-rs
        // leaves TCP_NODELAY off by default).
        let info = info.set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        let redis = redis::Client::open(info).map_err(invalid_url)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(settings.response_timeout))
            .set_connection_timeout(Some(settings.connection_timeout))
            .set_number_of_retries(2)
            .set_max_delay(std::time::Duration::from_millis(500));
        let mut conn = ConnectionManager::new_with_config(redis.clone(), config).await?;
        crate::scripts::preload(&mut conn).await?;
        let id: Arc<str> = format!("c:{}", uuid::Uuid::new_v4()).into();
        let runtime = tokio::runtime::Handle::current();
        let pubsub = PubSub::start(
            redis.clone(),
            settings.connection_timeout,
            id.clone(),
            &runtime,
        );
        let batcher = Batcher::start(redis, &settings, id.clone(), pubsub.clone(), &runtime);
        let (shutdown, shutdown_rx) = watch::channel(());
        let watchdog_lease_ms = lease_millis(settings.watchdog_timeout)
            .ok_or_else(|| Error::invalid("watchdog_timeout", "too large"))?;
        let shared = Arc::new(Shared {
            conn,
            settings,
            id,
            holds: Holds::default(),
            pubsub,
            batcher,
            runtime,
            stats: Counters::default(),
            watchdog_lease_ms,
            _shutdown: shutdown,
        });
        shared
            .runtime
            .spawn(crate::watchdog::run(Arc::downgrade(&shared), shutdown_rx));
        Ok(Self { shared })
    }

    /// A handle on the lock called `name`. Names are opaque UTF-8 (braces,
    /// colons and spaces included) of 1 to `max_name_len` bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty or over-long name; no Redis
    /// call is made.
    pub fn lock(&self, name: &str) -> Result<Lock> {
        Lock::new(self.clone(), name)
    }

    /// This client's id (a UUID), the prefix of its default owner ids.
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// The settings this client was opened with.
    pub fn settings(&self) -> &Settings {
        &self.shared.settings
    }

    /// A snapshot of this client's counters.
    pub fn stats(&self) -> Stats {
        Stats {
            renew_calls: self.shared.stats.renew_calls.load(Ordering::Relaxed),
            held_locks: self.shared.holds.len(),
            subscribed_channels: self.shared.pubsub.channel_count(),
        }
    }
}
