//! A connection that follows the master of a Sentinel service.
//!
//! `redis+sentinel://host:port,host:port/<service>` names the sentinels
//! (any of them; each is asked in turn) and the service they watch. The
//! connection asks them for the current master when it first connects and
//! again whenever the master may have changed: a sentinel announced
//! `+switch-master` for the service, a command found its server gone
//! (connection refused, dropped, timed out) or demoted (`READONLY`). A
//! command that fails so is not sent again (a purchase sent twice could buy
//! twice): it fails, the service answers 503, and the next command goes to
//! the master the sentinels name then. While the sentinels have not yet
//! promoted a replica, that is still the old master, and commands keep
//! failing fast until they have.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;

use hasp::sentinel::Sentinels;
use hasp::Connection;
use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};

use crate::error::{Error, Result};

/// The scheme of a Sentinel service's address.
pub const SENTINEL_SCHEME: &str = "redis+sentinel://";

/// The scheme of a Sentinel service's address over TLS (to the sentinels
/// and to the master they name).
pub const SENTINEL_TLS_SCHEME: &str = "rediss+sentinel://";

/// The sentinels' URLs and the service name of a `redis+sentinel://` URL,
/// or `None` for another one.
///
/// # Errors
/// [`Error::Invalid`] for a Sentinel URL without sentinels or service.
pub fn sentinel_service(redis_url: &str) -> Result<Option<(Vec<String>, String)>> {
    let (rest, scheme) = match redis_url.strip_prefix(SENTINEL_SCHEME) {
        Some(rest) => (rest, "redis"),
        None => match redis_url.strip_prefix(SENTINEL_TLS_SCHEME) {
            Some(rest) => (rest, "rediss"),
            None => return Ok(None),
        },
    };
    let invalid = |reason: &str| Error::Invalid {
        field: "redis_url",
        reason: format!("{redis_url:?}: {reason} (redis+sentinel://host:port,host:port/service)"),
    };
    let (hosts, service) = rest.split_once('/').ok_or_else(|| invalid("no service"))?;
    let service = service.trim_end_matches('/');
    if service.is_empty() || service.contains('/') {
        return Err(invalid("no service"));
    }
    let sentinels: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("{scheme}://{h}/"))
        .collect();
    if sentinels.is_empty() {
        return Err(invalid("no sentinel"));
    }
    Ok(Some((sentinels, service.to_owned())))
}

/// What runs when a [`SentinelConn`] has resolved a master, before any
/// command goes to it: given the master it leaves (`None` on the first
/// resolution, or when the sentinels named the same server again) and the
/// new one. An error fails the command that resolved (a 503), and the next
/// command resolves again.
pub type OnSwitch = Arc<
    dyn Fn(Option<Connection>, Connection) -> BoxFuture<'static, redis::RedisResult<()>>
        + Send
        + Sync,
>;

/// A cloneable, multiplexed connection to the current master of a Sentinel
/// service (see the module docs).
#[derive(Clone)]
pub struct SentinelConn {
    inner: Arc<Inner>,
}

struct Inner {
    sentinels: Sentinels,
    /// Held while the master is resolved: one resolution at a time.
    /// When the last resolution failed, and why: the commands that waited
    /// for it fail with it instead of each asking again (with the
    /// sentinels silent, each would wait their timeouts, one after the
    /// other).
    resolving: tokio::sync::Mutex<Option<(tokio::time::Instant, RedisError)>>,
    tls: hasp::Tls,
    connection_timeout: Duration,
    response_timeout: Duration,
    /// The connection to the master as last resolved, and its generation.
    current: Mutex<Option<(u64, Connection)>>,
    /// Bumped each time the master may have changed.
    generation: AtomicU64,
    /// The address and connection of the last master resolved, kept when
    /// `current` is cleared: the next resolution compares with it.
    last: Mutex<Option<(String, Connection)>>,
    /// The master this connection left at its last switch, until taken.
    left: Mutex<Option<Connection>>,
    on_switch: Mutex<Option<OnSwitch>>,
}

impl SentinelConn {
    /// Connects to the master the sentinels at `sentinels` name for
    /// `service`, and follows it; each connection waits up to
    /// `connection_timeout` to connect (each question to the sentinels
    /// too) and `response_timeout` for an answer.
    ///
    /// # Errors
    /// [`Error::Redis`](crate::Error::Redis) if no sentinel names a master
    /// or it cannot be reached; [`Error::Invalid`] for a bad URL or TLS
    /// setting.
    pub async fn connect(
        sentinels: &[String],
        service: &str,
        tls: &super::tls::RedisTls,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Self> {
        let tls = tls.hasp()?;
        let urls: Vec<&str> = sentinels.iter().map(String::as_str).collect();
        let sentinels = Sentinels::new(&urls, service, Some(&tls))
            .map_err(Error::from_connection)?
            .with_timeout(connection_timeout);
        let conn = Self {
            inner: Arc::new(Inner {
                sentinels: sentinels.clone(),
                resolving: tokio::sync::Mutex::new(None),
                tls,
                connection_timeout,
                response_timeout,
                current: Mutex::new(None),
                generation: AtomicU64::new(0),
                last: Mutex::new(None),
                left: Mutex::new(None),
                on_switch: Mutex::new(None),
            }),
        };
        conn.inner.connection().await?;
        tokio::spawn(hasp::sentinel::follow_master_switches(
            Arc::downgrade(&conn.inner),
            sentinels,
            |inner: &Inner| inner.stale(inner.generation.load(Ordering::Acquire)),
        ));
        Ok(conn)
    }

    /// Runs `hook` on every master resolved from now on, before any command
    /// goes to it (see [`OnSwitch`]); replaces the hook set before. The
    /// master resolved next is checked too, even if it is the current one.
    pub fn on_switch(&self, hook: OnSwitch) {
        *lock(&self.inner.on_switch) = Some(hook);
        let generation = self.inner.generation.load(Ordering::Acquire);
        self.inner.stale(generation);
    }

    /// The master this connection left at its last switch, if not taken
    /// since: its last writes may be on it alone.
    pub fn take_left_master(&self) -> Option<Connection> {
        lock(&self.inner.left).take()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    /// The connection to the current master, resolved afresh when the
    /// master may have changed since the last one.
    async fn connection(&self) -> redis::RedisResult<(u64, Connection)> {
        if let Some(current) = self.current() {
            return Ok(current);
        }
        // One resolution at a time; a task that waited finds it done, or
        // failed.
        let asked = tokio::time::Instant::now();
        let mut failed = self.resolving.lock().await;
        if let Some(current) = self.current() {
            return Ok(current);
        }
        if let Some((at, error)) = &*failed {
            if *at >= asked {
                return Err(error.clone());
            }
        }
        let result = self.resolve().await;
        *failed = match &result {
            Ok(_) => None,
            Err(e) => Some((tokio::time::Instant::now(), e.clone())),
        };
        result
    }

    /// Asks the sentinels for the master and connects to it (see
    /// [`Inner::connection`]).
    async fn resolve(&self) -> redis::RedisResult<(u64, Connection)> {
        let generation = self.generation.load(Ordering::Acquire);
        let master = self.sentinels.master().await.map_err(redis_error)?;
        let address = master.addr().to_string();
        let manager = Connection::connect(
            master,
            Some(&self.tls),
            self.connection_timeout,
            self.response_timeout,
        )
        .await
        .map_err(redis_error)?;
        let left = lock(&self.last)
            .as_ref()
            .filter(|(last, _)| *last != address)
            .map(|(_, conn)| conn.clone());
        let hook = lock(&self.on_switch).clone();
        if let Some(hook) = hook {
            hook(left.clone(), manager.clone()).await?;
        }
        if left.is_some() {
            tracing::info!(master = %address, "the Redis master moved");
            *lock(&self.left) = left;
        }
        *lock(&self.last) = Some((address, manager.clone()));
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if self.generation.load(Ordering::Acquire) == generation {
            *current = Some((generation, manager.clone()));
        }
        Ok((generation, manager))
    }

    fn current(&self) -> Option<(u64, Connection)> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The master may have changed since `generation`'s connection was
    /// made: the next command asks the sentinels again.
    fn stale(&self, generation: u64) {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if self.generation.load(Ordering::Acquire) == generation {
            self.generation.fetch_add(1, Ordering::AcqRel);
            *current = None;
            tracing::info!("the Redis master may have changed: asking the sentinels again");
        }
    }

    /// A command's error that says its server is gone, no longer the
    /// master, or lost its scripts marks the connection stale.
    fn after<T>(&self, generation: u64, result: redis::RedisResult<T>) -> redis::RedisResult<T> {
        if let Err(e) = &result {
            if master_may_have_changed(e) {
                self.stale(generation);
            }
        }
        result
    }
}

/// hasp's error as redis-rs's: a connection's errors are Redis's.
fn redis_error(e: hasp::Error) -> RedisError {
    match e {
        hasp::Error::Redis(e) => e,
        other => RedisError::from((
            ErrorKind::InvalidClientConfig,
            "the Redis connection's settings",
            other.to_string(),
        )),
    }
}

fn master_may_have_changed(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.kind() == ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        // A server without the service's scripts restarted, or was left by
        // a switch (`fast_path`): the sentinels may name another master.
        || e.kind() == ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut conn) = self.inner.connection().await?;
            let result = conn.req_packed_command(cmd).await;
            self.inner.after(generation, result)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut conn) = self.inner.connection().await?;
            let result = conn.req_packed_commands(cmd, offset, count).await;
            self.inner.after(generation, result)
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls_name_sentinels_and_a_service() {
        let (sentinels, service) =
            sentinel_service("redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/shop")
                .unwrap()
                .unwrap();
        assert_eq!(
            sentinels,
            ["redis://127.0.0.1:26379/", "redis://127.0.0.1:26380/"]
        );
        assert_eq!(service, "shop");
        assert!(sentinel_service("redis://127.0.0.1/").unwrap().is_none());
        for bad in [
            "redis+sentinel://127.0.0.1:26379",
            "redis+sentinel://127.0.0.1:26379/",
            "redis+sentinel:///shop",
            "redis+sentinel://a:1/b/c",
        ] {
            assert!(sentinel_service(bad).is_err(), "{bad}");
        }
    }
}
