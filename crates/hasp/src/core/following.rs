//! A connection that follows the master of a Sentinel service: when it
//! asks the sentinels again, and why a command that found the master gone
//! is not sent again, are on [`MasterConnection`]. hasp's read-only
//! queries go over one (`commands`), without the switch hook; an
//! application's own commands over [`MasterConnection`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use redis::aio::ConnectionLike;
use redis::{
    Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
};

use super::endpoint::Endpoint;
use super::sentinels::Sentinels;
use crate::error::{Error, Result};
use crate::shared_attempt::SharedAttempt;
use crate::transport::Connection;

/// What runs when a [`MasterConnection`] has found a master, before any
/// command goes to it: given the master it left (`None` the first time,
/// or when the sentinels named the same server again) and the new one. An
/// error fails the commands that were waiting for the master, and the next
/// command asks the sentinels again (and runs the hook again).
pub type OnSwitch = Arc<
    dyn Fn(Option<Connection>, Connection) -> BoxFuture<'static, RedisResult<()>> + Send + Sync,
>;

/// A cloneable, multiplexed connection to the current master of a Sentinel
/// service, for an application's own commands beside hasp's locks.
///
/// It asks the sentinels where the master is when it connects, and again
/// when a sentinel announces that the master moved, or when a command
/// finds its server gone (refused, dropped, timed out), demoted
/// (`READONLY`) or without the scripts it was given (`NOSCRIPT`: it
/// restarted, or was made to forget them). A command that failed so is
/// not sent again (a write's outcome is unknown; only its caller knows
/// whether sending it twice is safe): it fails, and the next command goes
/// to the master the sentinels name then. While they have not yet
/// promoted a replica that is still the old master, and commands keep
/// failing fast until they have.
///
/// ```no_run
/// # async fn run() -> hasp::Result<()> {
/// use std::time::Duration;
///
/// let sentinels = hasp::sentinel::Sentinels::new(
///     &["redis://127.0.0.1:26379/", "redis://127.0.0.1:26380/"],
///     "shop",
///     None,
/// )?;
/// let mut conn = hasp::sentinel::MasterConnection::connect(
///     sentinels,
///     Duration::from_secs(2),
///     Duration::from_secs(2),
/// )
/// .await?;
/// let _: () = redis::cmd("SET").arg("greeting").arg("hello").query_async(&mut conn).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MasterConnection {
    following: Arc<Following>,
}

impl std::fmt::Debug for MasterConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterConnection")
    }
}

impl MasterConnection {
    /// Connects to the master `sentinels` name now, and follows it; each
    /// connection to a master waits up to `connection_timeout` to connect
    /// and `response_timeout` for each answer (the sentinels' own timeout
    /// is theirs: [`Sentinels::with_timeout`]). Connections to the masters
    /// speak TLS as the sentinels do, with the same trust.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero timeout; [`Error::Redis`] when
    /// no sentinel names a master that answers.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped, it leaves nothing behind.
    pub async fn connect(
        sentinels: Sentinels,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Self> {
        for (name, timeout) in [
            ("connection_timeout", connection_timeout),
            ("response_timeout", response_timeout),
        ] {
            if timeout.is_zero() {
                return Err(Error::invalid(name, "must be more than zero"));
            }
        }
        let mut following = Following::new(
            Endpoint::sentinel(sentinels),
            connection_timeout,
            response_timeout,
        );
        following.switches = Some(Switches::default());
        let (_, conn) = following.connection().await?;
        conn.ready().await?;
        Ok(Self {
            following: Arc::new(following),
        })
    }

    /// Runs `hook` on every master found from now on, before any command
    /// goes to it (see [`OnSwitch`]); replaces the hook set before. The
    /// next command asks the sentinels again, so the current master is
    /// checked too.
    pub fn on_switch(&self, hook: OnSwitch) {
        if let Some(switches) = &self.following.switches {
            *lock(&switches.hook) = Some(hook);
        }
        self.following.forget();
    }

    /// The master this connection left at its last switch, unless taken
    /// since: the last writes acknowledged there may be on it alone (a
    /// replica promoted before they reached it).
    pub fn take_left_master(&self) -> Option<Connection> {
        self.following
            .switches
            .as_ref()
            .and_then(|s| lock(&s.left).take())
    }
}

impl ConnectionLike for MasterConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (made, mut conn) = self.following.connection().await?;
            let result = conn.req_packed_command(cmd).await;
            self.following.after(made, result)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (made, mut conn) = self.following.connection().await?;
            let result = conn.req_packed_commands(cmd, offset, count).await;
            self.following.after(made, result)
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// A connection that follows the master (see the module docs): hasp's
/// query connection is one, without [`Switches`].
pub(crate) struct Following {
    endpoint: Arc<Endpoint>,
    connection_timeout: Duration,
    response_timeout: Duration,
    /// The connection to the master as last found.
    live: Mutex<Option<Live>>,
    /// Numbers each connection made, so that a command's error drops the
    /// live connection only if it is still the one the command used.
    made: AtomicU64,
    /// One search for the master at a time; the commands that waited for
    /// one that failed fail with it.
    resolving: SharedAttempt,
    switches: Option<Switches>,
}

struct Live {
    /// The endpoint's generation when the master was asked for.
    generation: u64,
    made: u64,
    conn: Connection,
}

/// What a [`MasterConnection`] keeps of the masters it moves between.
#[derive(Default)]
struct Switches {
    /// The address and connection of the last master found; kept when the
    /// live connection is dropped, so that the next one compares with it.
    last: Mutex<Option<(String, Connection)>>,
    /// The master left at the last switch, until taken.
    left: Mutex<Option<Connection>>,
    hook: Mutex<Option<OnSwitch>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update is one store: a panic cannot leave one half-done.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Following {
    pub(crate) fn new(
        endpoint: Arc<Endpoint>,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        Self {
            endpoint,
            connection_timeout,
            response_timeout,
            live: Mutex::new(None),
            made: AtomicU64::new(0),
            resolving: SharedAttempt::default(),
            switches: None,
        }
    }

    /// The connection to the current master and its number, found afresh
    /// when the master may have changed since the last one.
    ///
    /// # Cancel safety
    /// Cancel safe: a search dropped halfway leaves no connection behind,
    /// and the next command searches again.
    pub(crate) async fn connection(&self) -> RedisResult<(u64, Connection)> {
        if let Some(current) = self.current() {
            return Ok(current);
        }
        self.resolving.run(|| self.current(), self.resolve()).await
    }

    /// Asks where the master is and makes a connection to it (connected
    /// by its first command, the hook's if there is one).
    async fn resolve(&self) -> RedisResult<(u64, Connection)> {
        let generation = self.endpoint.generation();
        let info = self.endpoint.resolve().await?;
        let address = info.addr().to_string();
        let conn = Connection::new(
            info,
            self.endpoint.tls().clone(),
            self.connection_timeout,
            self.response_timeout,
        );
        if let Some(switches) = &self.switches {
            switches.arrive(address, &conn).await?;
        }
        let made = self.made.fetch_add(1, Ordering::Relaxed) + 1;
        *lock(&self.live) = Some(Live {
            generation,
            made,
            conn: conn.clone(),
        });
        Ok((made, conn))
    }

    /// The live connection, if it was found in the endpoint's current
    /// generation.
    fn current(&self) -> Option<(u64, Connection)> {
        let generation = self.endpoint.generation();
        lock(&self.live)
            .as_ref()
            .filter(|live| live.generation == generation)
            .map(|live| (live.made, live.conn.clone()))
    }

    /// The next command asks where the master is.
    fn forget(&self) {
        *lock(&self.live) = None;
    }

    /// A command's `result` on connection `made`: an error that says the
    /// master may have changed drops that connection, so the next command
    /// asks again.
    pub(crate) fn after<T>(&self, made: u64, result: RedisResult<T>) -> RedisResult<T> {
        if let Err(e) = &result {
            if master_may_have_changed(e) {
                let mut live = lock(&self.live);
                if live.as_ref().is_some_and(|live| live.made == made) {
                    *live = None;
                    tracing::info!(error = %e, "the Redis master may have changed: asking the sentinels again");
                }
            }
        }
        result
    }
}

impl Switches {
    /// Runs the hook on the master at `address`, then remembers it (and
    /// the master it replaces, if another).
    async fn arrive(&self, address: String, conn: &Connection) -> RedisResult<()> {
        let left = lock(&self.last)
            .as_ref()
            .filter(|(last, _)| *last != address)
            .map(|(_, conn)| conn.clone());
        let hook = lock(&self.hook).clone();
        if let Some(hook) = hook {
            hook(left.clone(), conn.clone()).await?;
        }
        if left.is_some() {
            tracing::info!(master = %address, "the Redis master moved");
            *lock(&self.left) = left;
        }
        *lock(&self.last) = Some((address, conn.clone()));
        Ok(())
    }
}

/// Whether a command's error says its server may no longer be the master.
fn master_may_have_changed(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
        || e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}
