//! The bytes to one server: a TCP connection, TLS over one (`rediss://`),
//! or a unix socket, opened by hasp itself for every connection a client
//! makes to one server or to a Sentinel service (its batching lanes, its
//! pub/sub and query connections, the sentinels'), so that each verifies
//! the server the same way ([`Tls`](crate::Tls): the trust, a client
//! certificate, the server name).
//!
//! [`Connection`] is the query connection: redis-rs's multiplexed
//! connection over such a stream, made again when it breaks. An
//! application's own connections beside hasp's can use it, and so reach
//! the server as hasp does.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, Pipeline, RedisError,
    RedisFuture, RedisResult, Value,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::error::{Error, Result};
use crate::shared_attempt::SharedAttempt;
use crate::tls::{Connectors, Tls};

/// A connection's bytes (see the module docs).
pub(crate) enum Stream {
    Tcp(tokio::net::TcpStream),
    /// TLS over TCP (`rediss://`).
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
    #[cfg(unix)]
    Unix(tokio::net::UnixStream),
}

impl Stream {
    /// Connects to `addr`, over TLS with `tls`'s connectors for a
    /// `rediss://` address. Only the connection: no login, no command.
    pub(crate) async fn open(addr: &ConnectionAddr, tls: &Connectors) -> RedisResult<Stream> {
        Ok(match addr {
            ConnectionAddr::Tcp(host, port) => Stream::Tcp(tcp(host, *port).await?),
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                ..
            } => {
                let connector = tls.get(*insecure)?;
                let name = tls.server_name(host)?;
                let tcp = tcp(host, *port).await?;
                let stream = connector.connect(name, tcp).await.map_err(|e| {
                    RedisError::from((
                        ErrorKind::Io,
                        "TLS handshake failed",
                        format!("{host}:{port}: {e}"),
                    ))
                })?;
                Stream::Tls(Box::new(stream))
            }
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => {
                Stream::Unix(tokio::net::UnixStream::connect(path).await?)
            }
            other => {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "unsupported address",
                    format!("{other}"),
                )))
            }
        })
    }
}

/// A TCP connection to `host:port`, never held back by Nagle (small,
/// latency-bound calls).
async fn tcp(host: &str, port: u16) -> RedisResult<tokio::net::TcpStream> {
    let stream = tokio::net::TcpStream::connect((host, port)).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            #[cfg(unix)]
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            #[cfg(unix)]
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    /// Sends what a TLS session still holds of earlier writes (a TCP or
    /// unix socket holds nothing back).
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            #[cfg(unix)]
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            #[cfg(unix)]
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// redis-rs's multiplexed connection to `info` over a [`Stream`], logged
/// in and with its database selected, all within `timeout`.
pub(crate) async fn multiplexed(
    info: &ConnectionInfo,
    tls: &Connectors,
    config: AsyncConnectionConfig,
    timeout: Duration,
) -> RedisResult<MultiplexedConnection> {
    let connect = async {
        let stream = Stream::open(info.addr(), tls).await?;
        let (conn, driver) =
            MultiplexedConnection::new_with_config(info.redis_settings(), stream, config).await?;
        tokio::spawn(driver);
        Ok(conn)
    };
    within(timeout, info.addr(), connect).await
}

/// redis-rs's pub/sub connection to `info` over a [`Stream`], within
/// `timeout`.
pub(crate) async fn pubsub(
    info: &ConnectionInfo,
    tls: &Connectors,
    timeout: Duration,
) -> RedisResult<redis::aio::PubSub> {
    let connect = async {
        let stream = Stream::open(info.addr(), tls).await?;
        redis::aio::PubSub::new(info.redis_settings(), stream).await
    };
    within(timeout, info.addr(), connect).await
}

/// `connect`'s result, or a time-out error that says the likely cause (see
/// [`crate::tls::no_answer`]).
async fn within<T>(
    timeout: Duration,
    addr: &ConnectionAddr,
    connect: impl std::future::Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    let plain_tcp = !matches!(addr, ConnectionAddr::TcpTls { .. });
    tokio::time::timeout(timeout, connect)
        .await
        .unwrap_or_else(|_| Err(crate::tls::no_answer(plain_tcp, &addr.to_string())))
}

/// A multiplexed connection to one server, reached as hasp reaches it (see
/// the module docs) and made again, on the next command, once it broke. A
/// command that fails because the connection broke is not sent again (it
/// may have run): it fails, and the next one reconnects.
///
/// Cloning gives another handle on the same connection.
///
/// ```no_run
/// # async fn run() -> hasp::Result<()> {
/// use redis::AsyncCommands;
///
/// let tls = hasp::Tls::new().with_server_name("redis.internal")?;
/// let mut conn = hasp::Connection::open("rediss://10.0.0.5:6380/", Some(&tls)).await?;
/// let _: () = conn.set("greeting", "hello").await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
}

struct Shared {
    info: ConnectionInfo,
    tls: Connectors,
    config: AsyncConnectionConfig,
    connection_timeout: Duration,
    live: std::sync::Mutex<Live>,
    /// One connect at a time; the commands that waited for one that
    /// failed fail with it.
    connecting: SharedAttempt,
}

/// The connection as the commands find it.
#[derive(Default)]
struct Live {
    /// How many connections were made (a broken one is replaced once,
    /// however many commands saw it break).
    made: u64,
    conn: Option<MultiplexedConnection>,
}

impl Shared {
    fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        // Every update is one or two stores: a panic cannot leave it
        // half-done.
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The live connection and its number, if there is one.
    fn current(&self) -> Option<(u64, MultiplexedConnection)> {
        let live = self.live();
        live.conn.clone().map(|conn| (live.made, conn))
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Connection({})", self.shared.info.addr())
    }
}

/// How long a [`Connection`] waits to connect, and for an answer, unless
/// told otherwise.
const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

impl Connection {
    /// Connects to `url` (`redis://`, `rediss://`: over TLS with `tls`'s
    /// trust, the system's roots without it; `redis+unix://`), waiting up
    /// to 5 s to connect and 5 s for each answer.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a malformed URL or TLS settings that
    /// do not fit; [`Error::Redis`] if the server cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn open(url: &str, tls: Option<&Tls>) -> Result<Self> {
        let info = redis::IntoConnectionInfo::into_connection_info(url)
            .map_err(|e| Error::invalid("url", format!("{url:?}: {e}")))?;
        Self::connect(
            info,
            tls,
            DEFAULT_CONNECTION_TIMEOUT,
            DEFAULT_RESPONSE_TIMEOUT,
        )
        .await
    }

    /// Connects to `info`, as [`Connection::open`], waiting up to
    /// `connection_timeout` to connect (each time) and `response_timeout`
    /// for each answer.
    ///
    /// # Errors
    /// As [`Connection::open`].
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn connect(
        info: ConnectionInfo,
        tls: Option<&Tls>,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Self> {
        let this = Self::new(
            info,
            Connectors::new(tls),
            connection_timeout,
            response_timeout,
        );
        this.connection().await?;
        Ok(this)
    }

    /// A connection to `info` with `tls`'s connectors, made on the first
    /// command.
    pub(crate) fn new(
        info: ConnectionInfo,
        tls: Connectors,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connection_timeout))
            .set_response_timeout(Some(response_timeout));
        Self {
            shared: Arc::new(Shared {
                info,
                tls,
                config,
                connection_timeout,
                live: std::sync::Mutex::new(Live::default()),
                connecting: SharedAttempt::default(),
            }),
        }
    }

    /// Connects now, unless connected (or an attempt that ended while
    /// this one waited failed: then its error).
    #[cfg(feature = "sentinel")]
    pub(crate) async fn ready(&self) -> RedisResult<()> {
        self.connection().await.map(drop)
    }

    /// The server's address and login.
    pub fn info(&self) -> &ConnectionInfo {
        &self.shared.info
    }

    /// The live connection and its number, made now if there is none
    /// (unless an attempt that ended while this command waited failed:
    /// then its error).
    async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        let shared = &self.shared;
        if let Some(current) = shared.current() {
            return Ok(current);
        }
        let connect = async {
            let conn = multiplexed(
                &shared.info,
                &shared.tls,
                shared.config.clone(),
                shared.connection_timeout,
            )
            .await?;
            let mut live = shared.live();
            live.made += 1;
            live.conn = Some(conn.clone());
            Ok((live.made, conn))
        };
        shared.connecting.run(|| shared.current(), connect).await
    }

    /// After a command on connection `made`: a broken connection is
    /// dropped, and the next command makes another.
    fn after<T>(&self, made: u64, result: RedisResult<T>) -> RedisResult<T> {
        if let Err(e) = &result {
            if broke(e) {
                let mut live = self.shared.live();
                if live.made == made {
                    live.conn = None;
                }
            }
        }
        result
    }
}

/// Whether `e` says the connection is gone (not a server's error, nor a
/// reply that was merely slow).
pub(crate) fn broke(e: &RedisError) -> bool {
    (e.is_connection_dropped() || e.is_io_error()) && !e.is_timeout()
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (made, mut conn) = self.connection().await?;
            let result = conn.req_packed_command(cmd).await;
            self.after(made, result)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (made, mut conn) = self.connection().await?;
            let result = conn.req_packed_commands(cmd, offset, count).await;
            self.after(made, result)
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.info.redis_settings().db()
    }
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;

    /// Commands that wait for one attempt to connect to a server that never
    /// answers share its failure: 16 of them fail within about one
    /// connection timeout, not one after the other (16 timeouts).
    #[tokio::test]
    async fn commands_waiting_for_a_failed_connect_share_its_error() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = silent.local_addr().unwrap().port();
        // Accepts and keeps every connection, and never says a word: a TLS
        // hello gets no answer.
        let held = tokio::spawn(async move {
            let mut kept = Vec::new();
            while let Ok((socket, _)) = silent.accept().await {
                kept.push(socket);
            }
        });
        let info =
            redis::IntoConnectionInfo::into_connection_info(format!("rediss://127.0.0.1:{port}/"))
                .unwrap();
        let timeout = Duration::from_millis(500);
        let conn = Connection::new(info, Connectors::default(), timeout, timeout);
        let started = Instant::now();
        let commands = (0..16).map(|_| {
            let mut conn = conn.clone();
            tokio::spawn(async move { redis::cmd("PING").query_async::<String>(&mut conn).await })
        });
        for command in futures_util::future::join_all(commands).await {
            let error = command.unwrap().expect_err("a silent server answered");
            assert!(error.to_string().contains("TLS handshake"), "{error}");
        }
        let took = started.elapsed();
        // One after the other they would take 8 s.
        assert!(took < Duration::from_secs(4), "{took:?}");
        held.abort();
    }
}
