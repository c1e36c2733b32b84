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

use futures_util::future::BoxFuture;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{Cmd, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, Value};

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
    dyn Fn(
            Option<ConnectionManager>,
            ConnectionManager,
        ) -> BoxFuture<'static, redis::RedisResult<()>>
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
    sentinel: tokio::sync::Mutex<SentinelClient>,
    config: ConnectionManagerConfig,
    /// The connection to the master as last resolved, and its generation.
    current: Mutex<Option<(u64, ConnectionManager)>>,
    /// Bumped each time the master may have changed.
    generation: AtomicU64,
    /// The address and connection of the last master resolved, kept when
    /// `current` is cleared: the next resolution compares with it.
    last: Mutex<Option<(String, ConnectionManager)>>,
    /// The master this connection left at its last switch, until taken.
    left: Mutex<Option<ConnectionManager>>,
    on_switch: Mutex<Option<OnSwitch>>,
}

impl SentinelConn {
    /// Connects to the master the sentinels at `sentinels` name for
    /// `service`, with `config`'s timeouts, and follows it.
    ///
    /// # Errors
    /// [`Error::Redis`](crate::Error::Redis) if no sentinel names a master
    /// or it cannot be reached.
    pub async fn connect(
        sentinels: &[String],
        service: &str,
        config: ConnectionManagerConfig,
        tls: &super::tls::RedisTls,
    ) -> Result<Self> {
        let infos = sentinels
            .iter()
            .map(|s| s.as_str().into_connection_info())
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let announcers = sentinels
            .iter()
            .map(|s| tls.client(s))
            .collect::<Result<Vec<_>>>()?;
        let secure = sentinels.iter().any(|s| s.starts_with("rediss://"));
        let client = match secure {
            false => SentinelClient::build(
                infos,
                String::from(service),
                None,
                SentinelServerType::Master,
            )?,
            true => {
                let addrs = infos.into_iter().map(|i| i.addr().clone());
                let mut builder = redis::sentinel::SentinelClientBuilder::new(
                    addrs,
                    service,
                    SentinelServerType::Master,
                )?
                .set_client_to_sentinel_tls_mode(tls.mode())
                .set_client_to_redis_tls_mode(tls.mode());
                if let (Some(certificates), false) = (tls.certificates()?, tls.insecure) {
                    builder = builder
                        .set_client_to_sentinel_certificates(certificates.clone())
                        .set_client_to_redis_certificates(certificates);
                }
                builder.build()?
            }
        };
        let conn = Self {
            inner: Arc::new(Inner {
                sentinel: tokio::sync::Mutex::new(client),
                config,
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
            announcers,
            service.to_owned(),
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
    pub fn take_left_master(&self) -> Option<ConnectionManager> {
        lock(&self.inner.left).take()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    /// The connection to the current master, resolved afresh when the
    /// master may have changed since the last one.
    async fn connection(&self) -> redis::RedisResult<(u64, ConnectionManager)> {
        if let Some(current) = self.current() {
            return Ok(current);
        }
        // One resolution at a time; a task that waited finds it done.
        let mut sentinel = self.sentinel.lock().await;
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let generation = self.generation.load(Ordering::Acquire);
        let client = sentinel.async_get_client().await?;
        let address = client.get_connection_info().addr().to_string();
        let manager = ConnectionManager::new_with_config(client, self.config.clone()).await?;
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

    fn current(&self) -> Option<(u64, ConnectionManager)> {
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
