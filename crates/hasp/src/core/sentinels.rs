//! The sentinels of a Sentinel service: where its master is now, and when
//! they announce it moved.
//!
//! hasp asks them itself (`SENTINEL GET-MASTER-ADDR-BY-NAME`, then `ROLE`
//! on the server named, which must answer `master`), over the same
//! connections as every other of a client ([`crate::transport`]), so a
//! master they name by an address its certificate does not carry is
//! verified by the client's [`Tls::with_server_name`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, ErrorKind, RedisError};
use redis::{IntoConnectionInfo, RedisResult};

use crate::error::{Error, Result};
use crate::tls::{Connectors, Tls};
use crate::transport;

/// The sentinels watching a service (see the module docs). Cloning gives
/// another handle on the same sentinels.
///
/// ```no_run
/// # async fn run() -> hasp::Result<()> {
/// let sentinels = hasp::sentinel::Sentinels::new(
///     &["redis://127.0.0.1:26379/", "redis://127.0.0.1:26380/"],
///     "shop",
///     None,
/// )?;
/// let master = sentinels.master().await?;
/// let conn = hasp::Connection::connect(
///     master,
///     None,
///     std::time::Duration::from_secs(2),
///     std::time::Duration::from_secs(2),
/// )
/// .await?;
/// # let _ = conn;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Sentinels {
    shared: Arc<Shared>,
    /// How long each question may wait to connect, and for its answer.
    timeout: Duration,
}

struct Shared {
    sentinels: Vec<ConnectionInfo>,
    /// A connection kept to each sentinel once one answered on it: every
    /// connection of a client asks where the master is when it connects,
    /// and each question on a new connection would cost a handshake (TLS
    /// too) to the sentinel.
    kept: Vec<Mutex<Option<MultiplexedConnection>>>,
    service: String,
    tls: Connectors,
    /// The sentinel that answered last: asked first next time.
    next: AtomicUsize,
}

impl std::fmt::Debug for Sentinels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sentinels")
            .field("service", &self.shared.service)
            .field("sentinels", &self.shared.sentinels.len())
            .finish()
    }
}

/// How long one question to a sentinel or the master may wait to connect
/// and for its answer, unless told otherwise.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

impl Sentinels {
    /// The sentinels at `urls` (`redis://`, or `rediss://`: TLS to them
    /// and to the master they name, with `tls`'s trust, the system's roots
    /// without it) watching `service`. Each question waits up to 5 s.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no sentinels, a malformed URL or an
    /// empty service name.
    pub fn new(urls: &[&str], service: &str, tls: Option<&Tls>) -> Result<Self> {
        if urls.is_empty() {
            return Err(Error::invalid(
                "sentinels",
                "needs at least one sentinel URL",
            ));
        }
        if service.is_empty() {
            return Err(Error::invalid("service", "must not be empty"));
        }
        let sentinels = urls
            .iter()
            .map(|u| {
                u.into_connection_info()
                    .map_err(|e| Error::invalid("sentinels", format!("{u:?}: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            shared: Arc::new(Shared {
                kept: sentinels.iter().map(|_| Mutex::new(None)).collect(),
                sentinels,
                service: service.to_owned(),
                tls: Connectors::new(tls),
                next: AtomicUsize::new(0),
            }),
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// The same sentinels, each question waiting up to `timeout` to
    /// connect and up to `timeout` for its answer. (A connection already
    /// kept to a sentinel keeps the timeout it was made with: set this
    /// before the first question.)
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The service's name.
    pub fn service(&self) -> &str {
        &self.shared.service
    }

    /// Where the service's master is now: its address (over TLS when the
    /// sentinels are), database 0 and no login. Each sentinel is asked in
    /// turn, from the one that answered last, until one names a server
    /// that says it is the master.
    ///
    /// # Errors
    /// [`Error::Redis`] with the last sentinel's or master's error if none
    /// does.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn master(&self) -> Result<ConnectionInfo> {
        Ok(self.resolve().await?)
    }

    /// The TLS of the connections to the sentinels and the master.
    pub(crate) fn tls(&self) -> &Connectors {
        &self.shared.tls
    }

    /// [`Sentinels::master`], with redis-rs's error.
    pub(crate) async fn resolve(&self) -> RedisResult<ConnectionInfo> {
        let shared = &self.shared;
        let count = shared.sentinels.len();
        let first = shared.next.load(Ordering::Relaxed);
        let mut last_error = None;
        for i in (first..first + count).map(|i| i % count) {
            match self.ask(i).await {
                Ok(master) => {
                    shared.next.store(i, Ordering::Relaxed);
                    return Ok(master);
                }
                Err(e) => {
                    tracing::debug!(sentinel = %shared.sentinels[i].addr(), error = %e, "no master from this sentinel");
                    last_error = Some(e);
                }
            }
        }
        Err(last_error.unwrap_or_else(|| RedisError::from((ErrorKind::Io, "no sentinel to ask"))))
    }

    /// The master sentinel `i` names, once it says it is the master.
    async fn ask(&self, i: usize) -> RedisResult<ConnectionInfo> {
        let shared = &self.shared;
        let sentinel = &shared.sentinels[i];
        let Some((host, port)) = self.named_master(i).await? else {
            return Err(RedisError::from((
                ErrorKind::Io,
                "the sentinel knows no master for the service",
                shared.service.clone(),
            )));
        };
        let addr = match sentinel.addr() {
            ConnectionAddr::TcpTls { insecure, .. } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: None,
            },
            _ => ConnectionAddr::Tcp(host, port),
        };
        let master = addr.into_connection_info()?;
        let mut conn = self.connect(&master).await?;
        let role: redis::Value = redis::cmd("ROLE").query_async(&mut conn).await?;
        let is_master = match &role {
            redis::Value::Array(parts) => match parts.first() {
                Some(redis::Value::BulkString(role)) => role == b"master",
                Some(redis::Value::SimpleString(role)) => role == "master",
                _ => false,
            },
            _ => false,
        };
        if !is_master {
            return Err(RedisError::from((
                ErrorKind::Io,
                "the server the sentinel names is not the master (a failover in progress?)",
                master.addr().to_string(),
            )));
        }
        Ok(master)
    }

    /// What sentinel `i` names as the service's master, asked on the
    /// connection kept to it; on a new one if there is none, or if the
    /// kept one turns out broken (the sentinel restarted since: the
    /// question is a read, so asking again is safe). A connection that
    /// failed in any way is not kept.
    async fn named_master(&self, i: usize) -> RedisResult<Option<(String, u16)>> {
        let shared = &self.shared;
        let mut question = redis::cmd("SENTINEL");
        question.arg("GET-MASTER-ADDR-BY-NAME").arg(&shared.service);
        let kept = lock(&shared.kept[i]).clone();
        if let Some(mut conn) = kept {
            match question.query_async(&mut conn).await {
                Ok(named) => return Ok(named),
                Err(e) => {
                    *lock(&shared.kept[i]) = None;
                    if !transport::broke(&e) {
                        return Err(e);
                    }
                }
            }
        }
        let mut conn = self.connect(&shared.sentinels[i]).await?;
        let named = question.query_async(&mut conn).await?;
        *lock(&shared.kept[i]) = Some(conn);
        Ok(named)
    }

    async fn connect(&self, info: &ConnectionInfo) -> RedisResult<MultiplexedConnection> {
        let timeout = self.timeout;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        transport::multiplexed(info, &self.shared.tls, config, timeout).await
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every update is one store: a panic cannot leave it half-done.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Listens to the sentinels' `+switch-master` announcements, on one
/// sentinel at a time (the next one when it fails), and calls `on_switch`
/// with what `owner` points to each time one names their service. Ends
/// when `owner` is gone.
///
/// hasp's Sentinel clients move their connections on it; an application
/// that keeps its own connection to the master of the same service can
/// move it by the same rule. Waiting for `READONLY` is not enough: a
/// sentinel reconfigures the old master only when it next polls it, and
/// until then the old master takes writes the new one never sees.
///
/// # Cancel safety
/// Cancel safe: it only listens; dropping it stops the listening.
pub async fn follow_master_switches<T>(
    owner: Weak<T>,
    sentinels: Sentinels,
    on_switch: impl Fn(&T),
) {
    let shared = &sentinels.shared;
    let mut next = 0;
    loop {
        let sentinel = &shared.sentinels[next % shared.sentinels.len()];
        next += 1;
        match transport::pubsub(sentinel, &shared.tls, sentinels.timeout).await {
            Ok(mut pubsub) => {
                if pubsub.subscribe("+switch-master").await.is_ok() {
                    let mut messages = pubsub.on_message();
                    loop {
                        let message = tokio::time::timeout(Duration::from_secs(1), messages.next());
                        match message.await {
                            Ok(Some(message)) => {
                                let payload: String = message.get_payload().unwrap_or_default();
                                // "<service> <old ip> <old port> <new ip> <new port>"
                                if payload.split(' ').next() == Some(shared.service.as_str()) {
                                    match owner.upgrade() {
                                        Some(owner) => on_switch(&owner),
                                        None => return,
                                    }
                                }
                            }
                            Ok(None) => break, // the sentinel went away: the next one
                            Err(_) if owner.strong_count() == 0 => return,
                            Err(_) => {}
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "sentinel unreachable for announcements"),
        }
        if owner.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
